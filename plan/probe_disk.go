package plan

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
)

// ProbeDisk measures the sequential write, then read, then both at once
// ("mixed": every other block written while its neighbours are read) of a
// file of sizeBytes (0: 256 MiB) in dir at the request size and queue
// depth a run with aio's defaults uses (engine.SwapQueueDepth), through
// the same NVMe engine, the buffers from a pinned pool as a run's. The
// file is removed at the end. When ctx is done the probe stops issuing
// requests, lets those in flight complete and returns an error wrapping
// context.Cause(ctx).
func ProbeDisk(ctx context.Context, dir string, sizeBytes int64) (Disk, error) {
	if sizeBytes == 0 {
		sizeBytes = 256 << 20
	}
	qd := engine.SwapQueueDepth(config.Default().AIO)
	block := int64(config.DefaultAIOBlockSize)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return Disk{}, fmt.Errorf("plan: probe: NVMe path %s is not a directory (%v)", dir, err)
	}
	sizeBytes = max(sizeBytes/block, 2) * block
	eng, err := nvme.Open(nvme.Options{QueueDepth: qd})
	if err != nil {
		return Disk{}, fmt.Errorf("plan: probe %s: %w", dir, err)
	}
	defer eng.Close()
	name := filepath.Join(dir, fmt.Sprintf(".strata-plan-probe-%d-%08x.dat", os.Getpid(), rand.Uint32()))
	f, err := nvme.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Disk{}, fmt.Errorf("plan: probe %s: %w", dir, err)
	}
	defer os.Remove(name)
	defer f.Close()
	if block%f.Alignment() != 0 {
		return Disk{}, fmt.Errorf("plan: probe %s: block %d is not a multiple of the I/O alignment %d", dir, block, f.Alignment())
	}
	if err := f.Allocate(sizeBytes); err != nil {
		return Disk{}, fmt.Errorf("plan: probe %s: %w", dir, err)
	}
	// The requests in flight share probeBuffers buffers: a probe's data is
	// never looked at, so reads may land in a buffer another read fills
	// too, and the memory stays small at a deep queue.
	nbuf := min(qd, probeBuffers)
	pool, err := pinned.New(pinned.Options{BudgetBytes: int64(nbuf) * block, AlignBytes: 4096, Lock: pinned.LockNever})
	if err != nil {
		return Disk{}, fmt.Errorf("plan: probe %s: I/O buffers: %w", dir, err)
	}
	defer pool.Close()
	buf, err := pool.Get(int64(nbuf)*block, "plan disk probe")
	if err != nil {
		return Disk{}, fmt.Errorf("plan: probe %s: I/O buffers: %w", dir, err)
	}
	defer pool.Put(buf)
	mem := buf.Bytes()
	fillRandom(mem)
	d := Disk{Path: dir, BlockBytes: config.DefaultAIOBlockSize}
	// The write pass writes the file the read and mixed passes read.
	for _, rw := range []string{"write", "read", "mixed"} {
		rate, err := diskPass(ctx, eng, f, mem, rw, block, qd, sizeBytes)
		if err != nil {
			return Disk{}, fmt.Errorf("plan: probe %s %s: %w", dir, rw, err)
		}
		switch rw {
		case "write":
			d.WriteBytesPerS = rate
		case "read":
			d.ReadBytesPerS = rate
		default:
			d.MixedBytesPerS = rate
		}
	}
	return d, nil
}

// diskPass keeps qd requests of block bytes in flight over the file's
// sizeBytes in order (rw: write, read, or mixed: the odd blocks written),
// each completion reissuing its request for the next block, and returns
// the bytes per second moved.
func diskPass(ctx context.Context, eng *nvme.Engine, f *nvme.File, mem []byte, rw string, block int64, qd int, sizeBytes int64) (float64, error) {
	blocks, next := sizeBytes/block, int64(0)
	assign := func(r *nvme.Request) bool {
		if next == blocks || ctx.Err() != nil {
			return false
		}
		r.File, r.Offset, r.Op = f, next*block, nvme.OpRead
		if rw == "write" || rw == "mixed" && next%2 == 1 {
			r.Op = nvme.OpWrite
		}
		next++
		return true
	}
	done := make(chan *nvme.Request, qd) // one send per request in flight: never blocks
	reqs := make([]nvme.Request, qd)
	var batch []*nvme.Request
	nbuf := int64(len(mem)) / block
	for i := range reqs {
		b := int64(i) % nbuf
		reqs[i].Buf = mem[b*block : (b+1)*block]
		reqs[i].Done = func(r *nvme.Request) { done <- r }
		if assign(&reqs[i]) {
			batch = append(batch, &reqs[i])
		}
	}
	start := time.Now()
	if err := eng.Submit(batch...); err != nil {
		return 0, err
	}
	var moved int64
	var firstErr error
	for inFlight := len(batch); inFlight > 0; {
		r := <-done
		inFlight--
		moved += int64(r.N)
		if r.Err != nil && firstErr == nil {
			firstErr = r.Err
		}
		if firstErr == nil && assign(r) {
			if err := eng.Submit(r); err != nil {
				firstErr = err
				continue
			}
			inFlight++
		}
	}
	secs := time.Since(start).Seconds()
	switch {
	case firstErr != nil:
		return 0, firstErr
	case ctx.Err() != nil:
		return 0, fmt.Errorf("stopped: %w", context.Cause(ctx))
	}
	return float64(moved) / secs, nil
}

// probeBuffers is how many block-sized buffers the probe's requests share.
const probeBuffers = 32

// fillRandom fills b with pseudo-random bytes, so that no layer below
// writes less than it is given.
func fillRandom(b []byte) {
	r := rand.New(rand.NewPCG(1, 0x5eed))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}
