package cpu_test

import (
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/units"
)

// TestStreamBusyExcludesWaits: a stream's busy time (gpu.BusyStream) counts
// the work it ran, not the time it waited for another stream's event. The
// waiting stream runs one small copy while the other runs eight large ones:
// counted with its wait, its busy time would be the other's.
func TestStreamBusyExcludesWaits(t *testing.T) {
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 160 * units.MiB, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	const big = 32 << 20
	buf, err := d.Alloc(big, gpu.U8, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, big)
	worker, waiter := d.NewStream(), d.NewStream()
	for range 8 {
		d.CopyHostToDevice(worker, buf, 0, src)
	}
	ev := d.NewEvent()
	worker.Record(ev)
	waiter.Wait(ev)
	d.CopyHostToDevice(waiter, buf, 0, src[:4096])
	for _, s := range []gpu.Stream{worker, waiter} {
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	wb, ok := worker.(gpu.BusyStream)
	if !ok {
		t.Fatalf("the CPU backend's stream %T is not a gpu.BusyStream", worker)
	}
	busy, waited := wb.Busy(), waiter.(gpu.BusyStream).Busy()
	if busy <= 0 {
		t.Fatalf("the stream that copied 256 MiB was busy %v", busy)
	}
	if waited*4 > busy {
		t.Fatalf("the waiting stream was busy %v, the working one %v: its wait counted as work", waited, busy)
	}
}
