package cpu_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dist"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/mpitest"
)

// TestCommAcrossProcesses runs the collectives across processes (Open MPI
// under mpirun) as 2 processes × 2 devices and 3 × 1, each process
// comparing its ranks' outputs with one process of 4 (3) devices given
// the same inputs: the bits must be equal.
func TestCommAcrossProcesses(t *testing.T) {
	if mpitest.Child() {
		t.Skip("the parent's test")
	}
	for _, c := range []struct{ np, local int }{{2, 2}, {3, 1}} {
		mpitest.Run(t, c.np, "TestCommAcrossProcessesChild", "STRATA_TEST_LOCAL="+strconv.Itoa(c.local))
	}
}

// netRun is one process's devices joined with the others' and the same
// world in this process alone.
type netRun struct {
	t               *testing.T
	m               *dist.MPI
	local, proc, n  int
	devs, ref       []*cpu.Device
	comms, refComms []gpu.Comm
	streams, refSts []gpu.Stream
	k               int // the next case's number (inputs' seed)
}

func TestCommAcrossProcessesChild(t *testing.T) {
	if !mpitest.Child() {
		t.Skip("runs under mpirun (TestCommAcrossProcesses)")
	}
	m, err := dist.OpenMPI()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	local, _ := strconv.Atoi(os.Getenv("STRATA_TEST_LOCAL"))
	r := &netRun{t: t, m: m, local: local, proc: m.Proc(), n: m.Procs() * local}
	var rc []gpu.Comm
	r.devs, r.comms, err = cpu.New(cpu.Options{Devices: local, Net: m, HBMBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r.ref, rc, err = cpu.New(cpu.Options{Devices: r.n, HBMBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r.refComms = rc
	for l, c := range r.comms {
		if c.Rank() != r.proc*local+l || c.Size() != r.n {
			t.Fatalf("comm %d is rank %d of %d, want %d of %d", l, c.Rank(), c.Size(), r.proc*local+l, r.n)
		}
		r.streams = append(r.streams, r.devs[l].NewStream())
	}
	for _, d := range r.ref {
		r.refSts = append(r.refSts, d.NewStream())
	}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16, gpu.F64} {
		for _, op := range []gpu.ReduceOp{gpu.Sum, gpu.Avg} {
			for _, n := range []int{1001, 3, 64 * r.n} { // uneven segments, empty ones, even
				r.check(fmt.Sprintf("all-reduce %s op %d len %d", dt, op, n), dt, n, n, func(c gpu.Comm, s gpu.Stream, in, out gpu.Buffer) {
					c.AllReduce(s, in, op)
				}, true)
			}
			r.check(fmt.Sprintf("reduce-scatter %s op %d", dt, op), dt, 37*r.n, 37, func(c gpu.Comm, s gpu.Stream, in, out gpu.Buffer) {
				c.ReduceScatter(s, in, out, op)
			}, false)
		}
		r.check(fmt.Sprintf("all-gather %s", dt), dt, 37, 37*r.n, func(c gpu.Comm, s gpu.Stream, in, out gpu.Buffer) {
			c.AllGather(s, in, out)
		}, false)
		for _, root := range []int{0, r.n - 1} {
			r.check(fmt.Sprintf("broadcast %s root %d", dt, root), dt, 129, 129, func(c gpu.Comm, s gpu.Stream, in, out gpu.Buffer) {
				c.Broadcast(s, in, root)
			}, true)
		}
	}
	r.disagree()
	fmt.Printf("comm child ok: process %d of %d\n", r.proc, m.Procs())
}

// inputs is global rank g's input of case k: n values of dt.
func inputs(k, g, n int, dt gpu.DType) []byte {
	rng := rand.New(rand.NewPCG(uint64(k), uint64(g)))
	b := make([]byte, n*dt.Size())
	for i := range n {
		v := float32(rng.NormFloat64() * 3)
		switch dt {
		case gpu.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case gpu.F64:
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(rng.NormFloat64()))
		default:
			u := []uint16{0}
			dtype.Narrow(dt, u, []float32{v})
			binary.LittleEndian.PutUint16(b[2*i:], u[0])
		}
	}
	return b
}

// check runs one collective (call) on every rank of both worlds, each
// rank's input of inLen elements from inputs, output outLen elements (in
// place: the input buffer is the output), and compares the bits.
func (r *netRun) check(name string, dt gpu.DType, inLen, outLen int, call func(c gpu.Comm, s gpu.Stream, in, out gpu.Buffer), inPlace bool) {
	t := r.t
	r.k++
	run := func(devs []*cpu.Device, comms []gpu.Comm, sts []gpu.Stream, base int) [][]byte {
		ins, outs := make([]gpu.Buffer, len(devs)), make([]gpu.Buffer, len(devs))
		for i, d := range devs {
			var err error
			if ins[i], err = d.Alloc(inLen, dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"}); err != nil {
				t.Fatal(err)
			}
			d.CopyHostToDevice(sts[i], ins[i], 0, inputs(r.k, base+i, inLen, dt))
			outs[i] = ins[i]
			if !inPlace {
				if outs[i], err = d.Alloc(outLen, dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"}); err != nil {
					t.Fatal(err)
				}
			}
			call(comms[i], sts[i], ins[i], outs[i])
		}
		got := make([][]byte, len(devs))
		for i, d := range devs {
			got[i] = make([]byte, outs[i].Bytes())
			d.CopyDeviceToHost(sts[i], got[i], outs[i], 0)
			if err := sts[i].Synchronize(); err != nil {
				t.Fatalf("%s: rank %d: %v", name, base+i, err)
			}
			d.Free(ins[i])
			if !inPlace {
				d.Free(outs[i])
			}
		}
		return got
	}
	got := run(r.devs, r.comms, r.streams, r.proc*r.local)
	want := run(r.ref, r.refComms, r.refSts, 0)
	for l := range got {
		if g := r.proc*r.local + l; !bytes.Equal(got[l], want[g]) {
			t.Errorf("%s: rank %d: bits differ from one process's", name, g)
		}
	}
}

// disagree: the last process calls with another length; every rank of
// every process gets the error, and the next round works.
func (r *netRun) disagree() {
	t := r.t
	n := 16
	if r.proc == r.m.Procs()-1 {
		n = 17
	}
	bufs := make([]gpu.Buffer, r.local)
	for l, d := range r.devs {
		var err error
		if bufs[l], err = d.Alloc(n, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"}); err != nil {
			t.Fatal(err)
		}
		r.comms[l].AllReduce(r.streams[l], bufs[l], gpu.Sum)
	}
	for l := range r.devs {
		err := r.streams[l].Synchronize()
		if err == nil || !strings.Contains(err.Error(), "processes disagree") {
			t.Errorf("rank %d: a disagreement across processes gave %v", r.proc*r.local+l, err)
		}
		r.devs[l].Free(bufs[l])
	}
	r.check("all-reduce after a disagreement", gpu.F32, 100, 100, func(c gpu.Comm, s gpu.Stream, in, out gpu.Buffer) {
		c.AllReduce(s, in, gpu.Sum)
	}, true)
}
