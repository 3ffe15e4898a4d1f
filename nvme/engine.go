package nvme

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
)

// Engine kinds for Options.Engine.
const (
	EngineAuto  = "auto"  // io_uring, else pread workers (Info says why)
	EngineUring = "uring" // io_uring only; Open fails if it cannot be set up
	EnginePread = "pread" // pread/pwrite worker pool
)

// Options configure an Engine. The zero value means the defaults.
type Options struct {
	Engine     string // EngineAuto (default), EngineUring or EnginePread
	QueueDepth int    // requests in flight at most; default 32, at most 4096
	// SubmitBatch is the most SQEs the io_uring backend hands to the kernel
	// in one io_uring_enter; default 1, at most 4096 (the pread backend
	// ignores it). At 1 every request reaches the block layer as the
	// caller sized it, as with fio's default iodepth_batch_submit=1: io_uring
	// opens a block plug for a submission of several SQEs (more than two
	// since Linux 5.16, two or more before), and the plug merges adjacent
	// requests up to the queue's max_sectors_kb. On a disk served per
	// request (virtio, measured in bench/README-nvme.md) that leaves fewer,
	// larger requests in flight and costs 10-25 % of throughput. A larger
	// value saves system calls (one per request at 1) and lets adjacent
	// small requests merge.
	SubmitBatch int
}

// Validate fills defaults and checks the ranges.
func (o *Options) Validate() error {
	if o.Engine == "" {
		o.Engine = EngineAuto
	}
	if o.QueueDepth == 0 {
		o.QueueDepth = 32
	}
	if o.SubmitBatch == 0 {
		o.SubmitBatch = 1
	}
	switch o.Engine {
	case EngineAuto, EngineUring, EnginePread:
	default:
		return fmt.Errorf("nvme: engine %q: want auto, uring or pread", o.Engine)
	}
	if o.QueueDepth < 1 || o.QueueDepth > 4096 {
		return fmt.Errorf("nvme: queue depth %d: want 1..4096", o.QueueDepth)
	}
	if o.SubmitBatch < 1 || o.SubmitBatch > 4096 {
		return fmt.Errorf("nvme: submit batch %d: want 1..4096 SQEs per io_uring_enter", o.SubmitBatch)
	}
	return nil
}

func (o Options) String() string {
	return fmt.Sprintf("engine=%s queue_depth=%d submit_batch=%d", o.Engine, o.QueueDepth, o.SubmitBatch)
}

// Info says which backend runs and why.
type Info struct {
	Engine            string // "uring" or "pread"
	FallbackReason    string // why io_uring is not used, when Engine is "pread" by fallback
	QueueDepth        int
	SubmitBatch       int // SQEs per io_uring_enter at most (io_uring only)
	SQEntries         uint32
	CQEntries         uint32
	RegisteredBuffers int
	RegisteredFiles   int
}

func (i Info) String() string {
	if i.Engine == EngineUring {
		return fmt.Sprintf("io_uring (queue depth %d, sq %d, cq %d, %d SQE%s per enter, fixed buffers %d, fixed files %d)",
			i.QueueDepth, i.SQEntries, i.CQEntries, i.SubmitBatch, plural(i.SubmitBatch), i.RegisteredBuffers, i.RegisteredFiles)
	}
	s := fmt.Sprintf("pread/pwrite workers (%d, queue depth %d)", preadWorkerCount(i.QueueDepth), i.QueueDepth)
	if i.FallbackReason != "" {
		s += "; io_uring not used: " + i.FallbackReason
	}
	return s
}

// Stats are the engine's counters since Open.
type Stats struct {
	Requests       uint64
	BytesRead      uint64
	BytesWritten   uint64
	Retries        uint64 // EINTR/EAGAIN resubmissions
	ShortResubmits uint64 // short transfers resubmitted for the rest
	Errors         uint64
	// FixedBuffers and FixedFiles count the io_uring submissions (first
	// tries and resubmissions) that used a registered buffer (READ_FIXED,
	// WRITE_FIXED) and a registered file.
	FixedBuffers uint64
	FixedFiles   uint64
	// Enters counts the io_uring_enter calls that handed SQEs to the
	// kernel, SQEs the SQEs they handed over (requests, resubmissions,
	// fsyncs, Close's wake-up); SQEs/Enters is the batch each submission
	// was, at most Options.SubmitBatch.
	Enters uint64
	SQEs   uint64
}

// Engine is the request engine: a fixed table of QueueDepth slots served by
// an io_uring backend or a pread worker pool. It is safe for concurrent use.
type Engine struct {
	opts  Options
	info  Info
	slots []*Request
	free  chan int32
	be    backend

	gate   sync.RWMutex // Submit holds it shared; Close exclusively
	closed atomic.Bool

	requests, bytesRead, bytesWritten, retries, shorts, errs atomic.Uint64
	fixedBufs, fixedFiles                                    atomic.Uint64 // SQEs issued with a fixed buffer / file
	enters, sqes                                             atomic.Uint64 // io_uring_enter calls that submitted, SQEs they took

	// resHook, set only by tests before any I/O, rewrites the result of a
	// transfer attempt (to simulate short transfers, EAGAIN, EINTR).
	resHook func(r *Request, res int) int
}

type backend interface {
	issue(slots []int32)
	registerBuffers(bufs [][]byte) error
	registerFiles(files []*File) error
	close() error
}

// preadWorkers caps the pread backend's workers. Each is an OS thread
// blocked in a system call; the slots beyond them wait in its work queue.
// The swap's queue depth is at least 512 (engine.SwapQueueDepth) so that
// io_uring always has requests for the drive; through pread, 64 workers
// moved a 4 GiB mixed run at that depth 1.1-1.3x faster than 512 did, at
// 0.34-0.46x the CPU per GB (bench/README-nvme.md, "The pread workers").
const preadWorkers = 64

// preadWorkerCount is the pread backend's workers for a queue depth.
func preadWorkerCount(queueDepth int) int { return min(queueDepth, preadWorkers) }

// maxAttempts bounds consecutive EINTR/EAGAIN retries of one request.
const maxAttempts = 1000

// Open starts an engine.
func Open(opts Options) (*Engine, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, slots: make([]*Request, opts.QueueDepth), free: make(chan int32, opts.QueueDepth)}
	for i := range opts.QueueDepth {
		e.free <- int32(i)
	}
	e.info.QueueDepth = opts.QueueDepth
	if opts.Engine != EnginePread {
		be, err := uringSetup(e)
		if err == nil {
			e.be = be
			e.info.Engine = EngineUring
			return e, nil
		}
		if opts.Engine == EngineUring {
			return nil, fmt.Errorf("nvme: %w", err)
		}
		e.info.FallbackReason = err.Error() + "; falling back to pread workers"
	}
	e.be = newPreadBackend(e)
	e.info.Engine = EnginePread
	return e, nil
}

// Info says which backend runs, and why.
func (e *Engine) Info() Info { return e.info }

// Options returns the options the engine runs with (defaults filled in).
func (e *Engine) Options() Options { return e.opts }

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	return Stats{Requests: e.requests.Load(), BytesRead: e.bytesRead.Load(), BytesWritten: e.bytesWritten.Load(),
		Retries: e.retries.Load(), ShortResubmits: e.shorts.Load(), Errors: e.errs.Load(),
		FixedBuffers: e.fixedBufs.Load(), FixedFiles: e.fixedFiles.Load(), Enters: e.enters.Load(), SQEs: e.sqes.Load()}
}

// RegisterBuffers registers caller-owned buffers with the kernel (io_uring
// fixed buffers); requests whose Buf lies inside one use READ_FIXED and
// WRITE_FIXED. Call it while no request is in flight; the buffers must stay
// mapped until Close. A pread engine only records them.
func (e *Engine) RegisterBuffers(bufs ...[]byte) error {
	e.gate.Lock()
	defer e.gate.Unlock()
	if e.closed.Load() {
		return fmt.Errorf("nvme: register buffers: %w", ErrClosed)
	}
	if err := e.be.registerBuffers(bufs); err != nil {
		return fmt.Errorf("nvme: register buffers: %w", err)
	}
	e.info.RegisteredBuffers = len(bufs)
	return nil
}

// RegisterFiles registers files with the kernel (io_uring fixed files), which
// saves a file table lookup per request. It replaces an earlier registration.
// Call it while no request is in flight; the files must stay open until Close
// or the next RegisterFiles.
func (e *Engine) RegisterFiles(files ...*File) error {
	e.gate.Lock()
	defer e.gate.Unlock()
	if e.closed.Load() {
		return fmt.Errorf("nvme: register files: %w", ErrClosed)
	}
	if err := e.be.registerFiles(files); err != nil {
		return fmt.Errorf("nvme: register files: %w", err)
	}
	e.info.RegisteredFiles = len(files)
	return nil
}

// Submit validates every request, then queues them in batches, blocking while
// all QueueDepth slots are busy. Each queued request completes exactly once:
// N and Err are set, then Done is called and Wait is released.
func (e *Engine) Submit(reqs ...*Request) error {
	for _, r := range reqs {
		if err := validate(r); err != nil {
			return err
		}
	}
	e.gate.RLock()
	defer e.gate.RUnlock()
	if e.closed.Load() {
		return fmt.Errorf("nvme: submit: %w", ErrClosed)
	}
	for _, r := range reqs {
		r.done, r.N, r.Err = 0, 0, nil
		if r.Wait != nil {
			r.Wait.add(1)
		}
	}
	var local [64]int32
	batch := local[:0]
	for _, r := range reqs {
		var idx int32
		select {
		case idx = <-e.free:
		default:
			// The table is full: send what is prepared, then wait for a slot.
			if len(batch) > 0 {
				e.be.issue(batch)
				batch = batch[:0]
			}
			idx = <-e.free
		}
		e.slots[idx] = r
		e.requests.Add(1)
		batch = append(batch, idx)
		if len(batch) == cap(local) {
			e.be.issue(batch)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		e.be.issue(batch)
	}
	return nil
}

// result takes the outcome of one transfer attempt of slot idx (bytes, or a
// negative errno) and says whether the backend must issue the slot again for
// the rest (or a retry). Otherwise the request is completed and the slot freed.
func (e *Engine) result(idx int32, res int) (again bool) {
	r := e.slots[idx]
	if e.resHook != nil {
		res = e.resHook(r, res)
	}
	switch {
	case res < 0:
		errno := syscall.Errno(-res)
		if errno == syscall.EINTR || errno == syscall.EAGAIN {
			e.retries.Add(1)
			if r.tries++; r.tries < maxAttempts {
				return true
			}
		}
		e.finish(idx, r, &IOError{Op: r.Op, Path: r.File.path, Offset: r.Offset, Length: len(r.Buf),
			DoneBytes: r.done, Hint: errnoHint(errno), Err: errno})
	case r.Op == OpSync:
		e.finish(idx, r, nil)
	case res == 0:
		cause := io.ErrUnexpectedEOF
		hint := "end of file"
		if r.Op == OpWrite {
			cause, hint = io.ErrShortWrite, "the device accepted no more bytes"
		}
		e.finish(idx, r, &IOError{Op: r.Op, Path: r.File.path, Offset: r.Offset, Length: len(r.Buf),
			DoneBytes: r.done, Hint: hint, Err: cause})
	default:
		r.done += res
		if r.done < len(r.Buf) {
			e.shorts.Add(1)
			return true
		}
		if r.done > len(r.Buf) {
			panic(fmt.Sprintf("nvme: kernel reported %d bytes for a %d-byte request", r.done, len(r.Buf)))
		}
		e.finish(idx, r, nil)
	}
	return false
}

// fail completes slot idx with err, for a request the backend could not
// hand to the kernel (the bytes done by earlier attempts are kept).
func (e *Engine) fail(idx int32, err error) {
	r := e.slots[idx]
	var errno syscall.Errno
	hint := ""
	if errors.As(err, &errno) {
		hint = errnoHint(errno)
	}
	e.finish(idx, r, &IOError{Op: r.Op, Path: r.File.path, Offset: r.Offset, Length: len(r.Buf),
		DoneBytes: r.done, Hint: hint, Err: err})
}

func (e *Engine) finish(idx int32, r *Request, err error) {
	e.slots[idx] = nil
	r.tries = 0
	if err != nil {
		e.errs.Add(1)
	} else if r.Op == OpRead {
		e.bytesRead.Add(uint64(r.done))
	} else if r.Op == OpWrite {
		e.bytesWritten.Add(uint64(r.done))
	}
	e.free <- idx
	complete(r, err)
}

// ReadAt reads len(buf) bytes at off and waits.
func (e *Engine) ReadAt(f *File, buf []byte, off int64) error { return do(e, OpRead, f, buf, off) }

// WriteAt writes buf at off and waits.
func (e *Engine) WriteAt(f *File, buf []byte, off int64) error { return do(e, OpWrite, f, buf, off) }

// Sync flushes f's data to the device (fdatasync) and waits.
func (e *Engine) Sync(f *File) error { return do(e, OpSync, f, nil, 0) }

// Close waits for the requests in flight, then stops the backend. Submit
// after Close returns ErrClosed.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	// Wait for Submit calls that got past the closed check; later ones see
	// closed and fail fast, so completion callbacks that resubmit cannot
	// block the drain below.
	e.gate.Lock()
	e.gate.Unlock()
	for range e.opts.QueueDepth {
		<-e.free
	}
	if err := e.be.close(); err != nil {
		return fmt.Errorf("nvme: close: %w", err)
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
