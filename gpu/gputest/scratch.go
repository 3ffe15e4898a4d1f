package gputest

import (
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// testScratch: a backend takes the scratch memory of its ops and
// collectives from its driver only until it has met their sizes, so that a
// training step repeated takes none (gpu.DriverCounters): after one round
// of collectives of each kind (AllGather, ReduceScatter, AllReduce, with
// scratch reserved for them ahead, gpu.ScratchReserver, so that their
// first round takes none either) and ops with scratch (a GEMM of mixed
// dtypes, sum of squares) on two devices, a second identical round leaves
// every device's counters as they were and gives the same bits.
func testScratch(t *testing.T, nb NewBackend) {
	const n = 2
	devs, comms := nb(t, n)
	const elems = 4 * 1030 // per rank: an odd multiple of the ranks
	type rankBufs struct {
		s                                  gpu.Stream
		send, gathered, src, full, reduced gpu.Buffer
		a, b, c, norms                     gpu.Buffer
	}
	rs := make([]rankBufs, n)
	for r, d := range devs {
		s := d.NewStream()
		rng := newRand(uint64(70 + r))
		rs[r] = rankBufs{
			s:        s,
			send:     upload(t, d, s, randVals(rng, elems/n, 1), gpu.BF16),
			gathered: alloc(t, d, elems, gpu.BF16),
			src:      upload(t, d, s, randVals(rng, elems, 1), gpu.BF16),
			full:     alloc(t, d, elems, gpu.BF16),
			reduced:  alloc(t, d, elems/n, gpu.BF16),
			a:        upload(t, d, s, randVals(rng, 33*47, 1), gpu.BF16),
			b:        upload(t, d, s, randVals(rng, 47*29, 1), gpu.F32),
			c:        alloc(t, d, 33*29, gpu.F32),
			norms:    alloc(t, d, 2, gpu.F64),
		}
		if sr, ok := comms[r].(gpu.ScratchReserver); ok {
			for _, k := range []gpu.Collective{gpu.CollAllGather, gpu.CollReduceScatter, gpu.CollAllReduce} {
				if err := sr.ReserveScratch(k, elems, gpu.BF16); err != nil {
					t.Fatalf("rank %d: reserve %s scratch: %v", r, k, err)
				}
			}
		}
	}
	collectives := func() {
		for r, d := range devs {
			b := rs[r]
			d.CopyDeviceToDevice(b.s, b.full, 0, b.src, 0, b.src.Bytes()) // the AllReduce sums in place
			comms[r].AllGather(b.s, b.send, b.gathered)
			comms[r].ReduceScatter(b.s, b.gathered, b.reduced, gpu.Sum)
			comms[r].AllReduce(b.s, b.full, gpu.Sum)
		}
	}
	// The collectives' scratch was taken by ReserveScratch: their first
	// round takes none.
	reserved := make([]gpu.DriverCounters, n)
	for r, d := range devs {
		waitStream(t, rs[r].s) // the uploads
		reserved[r] = d.DriverCounters()
	}
	collectives()
	for r, d := range devs {
		waitStream(t, rs[r].s)
		if got := d.DriverCounters(); got != reserved[r] {
			t.Errorf("%s: driver counters %+v after the first round of collectives, %+v after ReserveScratch", d.Name(), got, reserved[r])
		}
	}
	round := func() [][]byte {
		collectives()
		for r, d := range devs {
			b := rs[r]
			d.Ops().Gemm(b.s, false, false, 33, 29, 47, 1, b.a, b.b, 0, b.c)
			d.Ops().SumSquares(b.s, b.full, b.norms, 0)
			d.Ops().SumSquares(b.s, b.c, b.norms, 1)
		}
		var out [][]byte
		for r, d := range devs {
			waitStream(t, rs[r].s)
			for _, x := range []gpu.Buffer{rs[r].gathered, rs[r].reduced, rs[r].full, rs[r].c, rs[r].norms} {
				out = append(out, ReadBytes(t, d, x))
			}
		}
		return out
	}
	first := round()
	before := make([]gpu.DriverCounters, n)
	for r, d := range devs {
		before[r] = d.DriverCounters()
	}
	second := round()
	for r, d := range devs {
		if got := d.DriverCounters(); got != before[r] {
			t.Errorf("%s: driver counters %+v after a repeated round, %+v before", d.Name(), got, before[r])
		}
	}
	for i := range first {
		if string(first[i]) != string(second[i]) {
			t.Errorf("output %d of rank %d differs between two rounds", i%5, i/5)
		}
	}
}
