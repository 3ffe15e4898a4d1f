package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/strata-ai/strata/gpu"
)

// The NCCL path (Options.NCCL): one NCCL communicator over the backend's
// ranks, made once at New (ncclGetUniqueId, then ncclCommInitRank for
// every rank between ncclGroupStart and ncclGroupEnd, as NCCL asks of one
// thread that initializes several ranks). A round runs as the rank-order
// path's do: the rank that completes it checks that the calls agree (calls
// that disagree are an error at Synchronize, not a hang), then, from one
// locked OS thread, issues every rank's NCCL call between ncclGroupStart
// and ncclGroupEnd, each on the group's stream of its rank after that
// rank's arrival event; the rank's own stream waits for them through its
// flag. NCCL's reductions follow its algorithms (rings, trees; bf16 rounded
// at every hop), not rank order: results are identical on every rank but
// may differ in the last bits from the rank-order path and between runs
// whose algorithm choice differs. NCCL needs one GPU per rank.

// ncclComms is the communicator's NCCL handle of each rank.
type ncclComms struct {
	api   *ncclAPI
	comms []uintptr
}

// newNCCLComms makes one NCCL communicator over b's ranks, or says why it
// cannot (no library, ranks sharing a GPU, an NCCL error). With net (a job
// of several processes) the communicator is the job's: every process's
// ranks (initNCCL).
func newNCCLComms(b *Backend, net gpu.Net) (*ncclComms, error) {
	n := len(b.devs)
	if n > len(b.l.gpus) {
		return nil, fmt.Errorf("%d ranks on %d GPU(s): NCCL needs a GPU per rank", n, len(b.l.gpus))
	}
	api, err := loadNCCL(newSearchPath(os.Getenv(EnvLibDir), filepath.Glob))
	if err != nil {
		return nil, err
	}
	nc := &ncclComms{api: api}
	nc.comms, err = initNCCL(api, net, n, func(r int, f func() error) error { return b.devs[r].g.do(f) })
	if err != nil {
		nc.destroy(b)
		return nil, err
	}
	return nc, nil
}

// initNCCL makes the NCCL communicator of local ranks 0..n−1 (on(r, f) runs
// f on rank r's GPU thread) and returns each one's handle. One process: the
// ranks are 0..n−1 of n. A job of several (net): process 0 calls
// ncclGetUniqueId and sends the id's 128 bytes to the others (net.Bcast: the
// bootstrap, not a collective of the job's data), and this process's
// ranks are the global ranks Proc()·n .. Proc()·n+n−1 of Procs()·n.
// ncclCommInitRank runs for every local rank between ncclGroupStart and
// ncclGroupEnd, on one locked thread, as NCCL asks of a thread that
// initializes several ranks. On an error the handles made so far are
// returned with it (to destroy).
func initNCCL(api *ncclAPI, net gpu.Net, n int, on func(r int, f func() error) error) ([]uintptr, error) {
	world, base := n, 0
	if net != nil {
		world, base = n*net.Procs(), n*net.Proc()
	}
	var id ncclUniqueID
	if net == nil || net.Proc() == 0 {
		if err := api.check(api.ncclGetUniqueId(&id), "ncclGetUniqueId"); err != nil {
			return nil, err
		}
	}
	if net != nil {
		if err := net.Bcast(id.Internal[:], 0); err != nil {
			return nil, fmt.Errorf("the NCCL unique id from process 0: %w", err)
		}
	}
	comms := make([]uintptr, n)
	// ncclGroupStart and ncclGroupEnd keep their state per thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := api.check(api.ncclGroupStart(), "ncclGroupStart"); err != nil {
		return nil, err
	}
	var errs []error
	for r := range n {
		errs = append(errs, on(r, func() error {
			return api.check(api.ncclCommInitRank(&comms[r], int32(world), id, int32(base+r)), "ncclCommInitRank rank %d of %d", base+r, world)
		}))
	}
	errs = append(errs, api.check(api.ncclGroupEnd(), "ncclGroupEnd (ncclCommInitRank of %d ranks)", n))
	return comms, errors.Join(errs...)
}

// destroy frees every rank's communicator (its streams synchronized).
func (nc *ncclComms) destroy(b *Backend) error {
	var errs []error
	if nc == nil {
		return nil
	}
	for r, c := range nc.comms {
		if c == 0 {
			continue
		}
		errs = append(errs, b.devs[r].g.do(func() error { return nc.api.check(nc.api.ncclCommDestroy(c), "ncclCommDestroy rank %d", r) }))
		nc.comms[r] = 0
	}
	return errors.Join(errs...)
}

// describe says which NCCL runs.
func (nc *ncclComms) describe() string {
	return fmt.Sprintf("nccl %s (%s)", ncclVersionString(nc.api.version), nc.api.path)
}

// ncclCheck refuses, before any NCCL call, a round NCCL would compute
// wrongly: a send and recv of one rank that overlap other than in NCCL's
// in-place forms.
func ncclCheck(rd *round) error {
	for r, cl := range rd.Calls {
		var ok bool
		switch cl.Kind {
		case gpu.CollAllGather:
			ok = inPlaceOrApart(bufExtent(cl.Recv), bufExtent(cl.Send), r)
		case gpu.CollReduceScatter:
			ok = inPlaceOrApart(bufExtent(cl.Send), bufExtent(cl.Recv), r)
		default:
			continue
		}
		if !ok {
			return fmt.Errorf("gpu/cuda: collective %d (%s): rank %d's send and recv overlap other than in place (its own slot), which NCCL does not compute; strata.deterministic (the rank-order path) does",
				rd.Seq, cl.Kind, r)
		}
	}
	return nil
}

// ncclTransfer enqueues a round's NCCL calls on the group's streams.
func (g *group) ncclTransfer(rd *round) error {
	n := g.size
	c0 := rd.Calls[0]
	if err := ncclCheck(rd); err != nil {
		return err
	}
	// Each rank's NCCL call follows its own arrival; a barrier follows
	// every rank's.
	for r := range n {
		qs := []int{r}
		if c0.Kind == gpu.CollBarrier {
			qs = readOrder(r, n)
		}
		err := g.on(r, func(cs *Stream) error {
			return g.waitEvents(cs, qs, func(q int) uintptr { return rd.Ranks[q].arrived })
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.Seq, c0.Kind, r, err)
		}
	}
	if c0.Kind == gpu.CollBarrier {
		return nil
	}
	api := g.nccl.api
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := api.check(api.ncclGroupStart(), "ncclGroupStart"); err != nil {
		return fmt.Errorf("gpu/cuda: collective %d (%s): %w", rd.Seq, c0.Kind, err)
	}
	var errs []error
	for r := range n {
		errs = append(errs, g.on(r, func(cs *Stream) error { return g.ncclCall(rd.Calls[r], g.nccl.comms[r], cs.h) }))
	}
	errs = append(errs, api.check(api.ncclGroupEnd(), "ncclGroupEnd"))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gpu/cuda: collective %d (%s): %w", rd.Seq, c0.Kind, err)
	}
	g.countLinks(rd)
	return nil
}

// ncclCall issues one rank's NCCL call on stream s.
func (g *group) ncclCall(cl call, comm, s uintptr) error {
	api := g.nccl.api
	if cl.Send.Len() == 0 { // every rank's, since the calls agree
		return nil
	}
	t := ncclType(cl.Send.DType())
	switch cl.Kind {
	case gpu.CollAllGather:
		return api.check(api.ncclAllGather(cl.Send.Ptr(), cl.Recv.Ptr(), uint64(cl.Send.Len()), t, comm, s), "ncclAllGather %d elements of %s", cl.Send.Len(), cl.Send.DType())
	case gpu.CollReduceScatter:
		return api.check(api.ncclReduceScatter(cl.Send.Ptr(), cl.Recv.Ptr(), uint64(cl.Recv.Len()), t, ncclOp(cl.Op), comm, s), "ncclReduceScatter %d elements of %s", cl.Recv.Len(), cl.Recv.DType())
	case gpu.CollAllReduce:
		return api.check(api.ncclAllReduce(cl.Send.Ptr(), cl.Recv.Ptr(), uint64(cl.Send.Len()), t, ncclOp(cl.Op), comm, s), "ncclAllReduce %d elements of %s", cl.Send.Len(), cl.Send.DType())
	case gpu.CollBroadcast:
		return api.check(api.ncclBroadcast(cl.Send.Ptr(), cl.Recv.Ptr(), uint64(cl.Send.Len()), t, int32(cl.Root), comm, s), "ncclBroadcast %d elements of %s from rank %d", cl.Send.Len(), cl.Send.DType(), cl.Root)
	}
	return nil
}
