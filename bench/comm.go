package bench

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/units"
)

// CommNet is the job's processes as RunComm uses them (dist.MPI): the
// devices' collectives run on Net, and the anchor (MPI's own all-reduce)
// on the same communicator between rounds.
type CommNet interface {
	gpu.Net
	AllreduceSumF32(send, recv []float32) error
}

// CommOptions is one measurement of the cpu backend's all-reduce across
// the processes of a job, alternating with MPI's own MPI_Allreduce of the
// same bytes.
type CommOptions struct {
	Bytes  int64 // the buffer, fp32 (default 64 MiB)
	Rounds int   // alternating rounds, each one all-reduce of each (default 10)
	Net    CommNet
}

// WithDefaults fills the zero fields.
func (o CommOptions) WithDefaults() CommOptions {
	if o.Bytes == 0 {
		o.Bytes = 64 << 20
	}
	if o.Rounds == 0 {
		o.Rounds = 10
	}
	return o
}

// Validate says what is wrong with o.
func (o CommOptions) Validate() error {
	switch {
	case o.Net == nil:
		return errors.New("bench: comm: no processes (run it under mpirun -np 2 or more)")
	case o.Bytes < 4 || o.Bytes%4 != 0 || o.Bytes > 1<<31-4:
		return fmt.Errorf("bench: comm: --size %d: a multiple of 4 bytes up to 2 GiB", o.Bytes)
	case o.Rounds < 1:
		return fmt.Errorf("bench: comm: --rounds %d: at least 1", o.Rounds)
	}
	return nil
}

// CommResult is what RunComm measured: the medians over the rounds, with
// bus bandwidth as NCCL's tests count it for an all-reduce, 2(N−1)/N ×
// bytes / time.
type CommResult struct {
	Procs        int       `json:"processes"`
	Bytes        int64     `json:"bytes"`
	Rounds       int       `json:"rounds"`
	StrataS      []float64 `json:"strata_s"` // each round's time of the cpu backend's AllReduce
	MPIS         []float64 `json:"mpi_s"`    // each round's MPI_Allreduce
	StrataMedian float64   `json:"strata_median_s"`
	MPIMedian    float64   `json:"mpi_median_s"`
	StrataBusBW  float64   `json:"strata_busbw_bytes_per_s"`
	MPIBusBW     float64   `json:"mpi_busbw_bytes_per_s"`
	Ratio        float64   `json:"ratio"` // StrataBusBW / MPIBusBW
	Identical    bool      `json:"identical"`
}

// RunComm measures, on one cpu device per process, the backend's AllReduce
// (sum, fp32, in global rank order: gpu/cpu's comm_net.go) against MPI's
// own MPI_Allreduce of the same buffer, alternating, after one warm-up of
// each; every process runs it (a collective) and gets the same result.
// Identical says whether the two sums were equal (with 2 processes they
// are: a + b either way).
func RunComm(o CommOptions) (CommResult, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return CommResult{}, err
	}
	n := int(o.Bytes / 4)
	devs, comms, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 2*o.Bytes + 64<<20, Net: o.Net})
	if err != nil {
		return CommResult{}, fmt.Errorf("bench: comm: %w", err)
	}
	d, c := devs[0], comms[0]
	s := d.NewStream()
	buf, err := d.Alloc(n, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "bench comm"})
	if err != nil {
		return CommResult{}, fmt.Errorf("bench: comm: %w", err)
	}
	defer d.Free(buf)
	in := make([]float32, n)
	for i := range in {
		in[i] = float32((i*7+o.Net.Proc()*13)%1024) / 64
	}
	host, out := make([]byte, 4*n), make([]float32, n)
	copy(host, f32Bytes(in))
	strata := func() (float64, error) {
		d.CopyHostToDevice(s, buf, 0, host)
		if err := s.Synchronize(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		c.AllReduce(s, buf, gpu.Sum)
		err := s.Synchronize()
		return time.Since(t0).Seconds(), err
	}
	mpi := func() (float64, error) {
		t0 := time.Now()
		err := o.Net.AllreduceSumF32(in, out)
		return time.Since(t0).Seconds(), err
	}
	if _, err := strata(); err != nil {
		return CommResult{}, fmt.Errorf("bench: comm: %w", err)
	}
	if _, err := mpi(); err != nil {
		return CommResult{}, fmt.Errorf("bench: comm: %w", err)
	}
	res := CommResult{Procs: o.Net.Procs(), Bytes: o.Bytes, Rounds: o.Rounds}
	for range o.Rounds {
		t, err := strata()
		if err != nil {
			return res, fmt.Errorf("bench: comm: %w", err)
		}
		u, err := mpi()
		if err != nil {
			return res, fmt.Errorf("bench: comm: %w", err)
		}
		res.StrataS, res.MPIS = append(res.StrataS, t), append(res.MPIS, u)
	}
	got := make([]byte, 4*n)
	d.CopyDeviceToHost(s, got, buf, 0)
	if err := s.Synchronize(); err != nil {
		return res, fmt.Errorf("bench: comm: %w", err)
	}
	res.Identical = slices.Equal(got, f32Bytes(out))
	res.StrataMedian, res.MPIMedian = units.Median(res.StrataS), units.Median(res.MPIS)
	bus := 2 * float64(res.Procs-1) / float64(res.Procs) * float64(o.Bytes)
	res.StrataBusBW, res.MPIBusBW = bus/res.StrataMedian, bus/res.MPIMedian
	res.Ratio = res.StrataBusBW / res.MPIBusBW
	return res, nil
}

func (r CommResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "all-reduce of %s (fp32 sum) across %d processes, %d alternating rounds, medians:\n", units.FormatBytes(r.Bytes), r.Procs, r.Rounds)
	fmt.Fprintf(&b, "  strata (cpu backend, rank order)  %8.2f ms  bus %s/s\n", 1e3*r.StrataMedian, units.FormatBytes(int64(r.StrataBusBW)))
	fmt.Fprintf(&b, "  MPI_Allreduce (same library)      %8.2f ms  bus %s/s\n", 1e3*r.MPIMedian, units.FormatBytes(int64(r.MPIBusBW)))
	same := "equal"
	if !r.Identical {
		same = "different (MPI's order is its own)"
	}
	fmt.Fprintf(&b, "  ratio %.3f of MPI_Allreduce's bus bandwidth; sums %s\n", r.Ratio, same)
	return b.String()
}

// f32Bytes is v's memory as bytes.
func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}
