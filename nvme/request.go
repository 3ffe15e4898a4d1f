package nvme

import (
	"errors"
	"fmt"
	"sync"
)

//go:generate go tool stringer -type=Op -linecomment -output=op_string.go

// Op is what a request does.
type Op uint8

const (
	OpRead  Op = iota + 1 // read
	OpWrite               // write
	// OpSync: fdatasync of File; Buf and Offset are ignored
	OpSync // sync
)

// Request is one read, write or sync, owned by the caller. Fill Op, File, Buf
// and Offset, optionally Done and Wait, and Submit it; after completion N and
// Err hold the outcome. A request may be reused once it has completed.
type Request struct {
	Op     Op
	File   *File
	Buf    []byte
	Offset int64
	// Tag is for the caller's bookkeeping; the engine does not look at it.
	Tag uint64

	// Done, when set, is called once on completion from an engine goroutine.
	// It must not block and must not wait for other requests. It may Submit
	// requests (its own included) when a slot is sure to be free, e.g. when
	// the caller never has more than QueueDepth requests outstanding: the
	// io_uring engine then batches them into its next io_uring_enter.
	Done func(*Request)
	// Wait, when set, counts this request until it completes.
	Wait *Completion

	// N is the number of bytes transferred; Err is nil only if N == len(Buf).
	N   int
	Err error

	done  int // bytes transferred so far, across resubmissions
	tries int // consecutive EINTR/EAGAIN retries
}

// Device is what the layers above the engine use. Engine and Faulty
// implement it.
type Device interface {
	// Submit queues the requests. It validates all of them first and queues
	// none if one is invalid (the error names it). It blocks while the queue
	// is full. Each queued request completes exactly once.
	Submit(reqs ...*Request) error
	ReadAt(f *File, buf []byte, off int64) error
	WriteAt(f *File, buf []byte, off int64) error
	Sync(f *File) error
	Close() error
}

// Completion counts requests until they complete and collects their errors.
// The zero value is ready to use; it can be reused after Wait returns.
type Completion struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pending int
	errs    []error
}

func (c *Completion) add(n int) {
	c.mu.Lock()
	c.pending += n
	c.mu.Unlock()
}

func (c *Completion) finish(err error) {
	c.mu.Lock()
	c.pending--
	if err != nil {
		c.errs = append(c.errs, err)
	}
	if c.pending == 0 && c.cond != nil {
		c.cond.Broadcast()
	}
	c.mu.Unlock()
}

// Wait blocks until every request counted so far has completed and returns
// their errors joined (nil if all succeeded), then resets the error list.
func (c *Completion) Wait() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cond == nil {
		c.cond = sync.NewCond(&c.mu)
	}
	for c.pending > 0 {
		c.cond.Wait()
	}
	err := errors.Join(c.errs...)
	c.errs = nil
	return err
}

// complete records the outcome and notifies the owner of r.
func complete(r *Request, err error) {
	r.N = r.done
	r.Err = err
	w := r.Wait
	if r.Done != nil {
		r.Done(r)
	}
	if w != nil {
		w.finish(err)
	}
}

// validate checks a request against its file's alignment before any syscall.
func validate(r *Request) error {
	if r.File == nil {
		panic("nvme: request without a file")
	}
	switch r.Op {
	case OpSync:
		return nil
	case OpRead, OpWrite:
	default:
		panic(fmt.Sprintf("nvme: request with unknown op %d", r.Op))
	}
	f := r.File
	var why string
	switch {
	case len(r.Buf) == 0:
		why = "empty buffer"
	case len(r.Buf) > maxRequestBytes:
		return &IOError{Op: r.Op, Path: f.path, Offset: r.Offset, Length: len(r.Buf),
			Err: fmt.Errorf("request larger than %d bytes; split it", maxRequestBytes)}
	case bufAddr(r.Buf)%uintptr(f.memAlign) != 0:
		why = fmt.Sprintf("buffer address %#x is not a multiple of %d", bufAddr(r.Buf), f.memAlign)
	case r.Offset < 0 || r.Offset%f.offsetAlign != 0:
		why = fmt.Sprintf("offset is not a multiple of %d", f.offsetAlign)
	case int64(len(r.Buf))%f.offsetAlign != 0:
		why = fmt.Sprintf("length is not a multiple of %d", f.offsetAlign)
	default:
		return nil
	}
	return &IOError{Op: r.Op, Path: f.path, Offset: r.Offset, Length: len(r.Buf), Hint: why, Err: ErrMisaligned}
}

// maxRequestBytes bounds one request (an SQE length is 32 bits, and the
// kernel caps one transfer just under 2 GiB).
const maxRequestBytes = 1 << 30

// do submits one request on d and waits for it.
func do(d Device, op Op, f *File, buf []byte, off int64) error {
	var c Completion
	r := Request{Op: op, File: f, Buf: buf, Offset: off, Wait: &c}
	if err := d.Submit(&r); err != nil {
		return err
	}
	c.Wait()
	return r.Err
}
