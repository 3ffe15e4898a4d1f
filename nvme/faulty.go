package nvme

import (
	"fmt"
	"io"
	"sync"
	"syscall"
)

//go:generate go tool stringer -type=FaultKind -linecomment -output=faultkind_string.go

// FaultKind is a failure Faulty injects.
type FaultKind uint8

const (
	// faultNone is no fault (the zero FaultKind).
	faultNone FaultKind = iota // none
	// FaultEIO: the request fails with EIO (a write may be torn: its first half lands)
	FaultEIO // EIO
	// FaultShortRead: a read transfers only the first half, then the device returns nothing more
	FaultShortRead // short read
	// FaultShortWrite: a write transfers only the first half, then the device accepts nothing more
	FaultShortWrite // short write
	// FaultNoSpace: a write fails with ENOSPC, nothing written
	FaultNoSpace // ENOSPC
	// FaultFlipByte: one byte flips silently: in the buffer after a read, on the medium during a write
	FaultFlipByte // flipped byte
)

// Fault says which requests fail and how: the Nth request (1-based, counting
// only requests of Op) and, with Every, each Nth one after it too.
type Fault struct {
	Kind  FaultKind
	Op    Op
	Nth   int
	Every bool
}

// Faulty wraps a Device and injects faults into the requests that match its
// rules. Requests that no rule matches pass through unchanged. It is for
// tests; it is safe for concurrent use.
type Faulty struct {
	dev    Device
	mu     sync.Mutex
	faults []Fault
	counts map[Op]int
	// Injected counts the faults injected so far, by kind.
	injected map[FaultKind]int
}

// NewFaulty wraps dev.
func NewFaulty(dev Device, faults ...Fault) *Faulty {
	for _, f := range faults {
		if f.Nth < 1 || f.Kind == 0 || f.Op == 0 {
			panic(fmt.Sprintf("nvme: bad fault rule %+v", f))
		}
	}
	return &Faulty{dev: dev, faults: faults, counts: map[Op]int{}, injected: map[FaultKind]int{}}
}

// Injected returns how many faults of kind k were injected.
func (d *Faulty) Injected(k FaultKind) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.injected[k]
}

func (d *Faulty) match(op Op) FaultKind {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts[op]++
	n := d.counts[op]
	for _, f := range d.faults {
		if f.Op != op || n < f.Nth {
			continue
		}
		if n == f.Nth || (f.Every && (n-f.Nth)%f.Nth == 0) {
			d.injected[f.Kind]++
			return f.Kind
		}
	}
	return 0
}

// Submit passes requests to the wrapped device, altering the faulty ones.
func (d *Faulty) Submit(reqs ...*Request) error {
	for _, r := range reqs {
		if err := validate(r); err != nil {
			return err
		}
	}
	for _, r := range reqs {
		if err := d.submitOne(r); err != nil {
			return err
		}
	}
	return nil
}

func (d *Faulty) submitOne(r *Request) error {
	kind := d.match(r.Op)
	ioErr := func(done int, hint string, err error) error {
		return &IOError{Op: r.Op, Path: r.File.path, Offset: r.Offset, Length: len(r.Buf), DoneBytes: done, Hint: "injected " + hint, Err: err}
	}
	half := len(r.Buf) / 2 / int(r.File.offsetAlign) * int(r.File.offsetAlign)
	switch {
	case kind == 0 || r.Op == OpSync:
	case kind == FaultNoSpace && r.Op == OpWrite:
		d.failNow(r, ioErr(0, kind.String(), syscall.ENOSPC))
		return nil
	case kind == FaultEIO && r.Op == OpRead:
		d.failNow(r, ioErr(0, kind.String(), syscall.EIO))
		return nil
	case kind == FaultEIO && r.Op == OpWrite: // torn write: the first half lands
		return d.partial(r, half, kind, ioErr, syscall.EIO)
	case kind == FaultShortRead && r.Op == OpRead:
		return d.partial(r, half, kind, ioErr, io.ErrUnexpectedEOF)
	case kind == FaultShortWrite && r.Op == OpWrite:
		return d.partial(r, half, kind, ioErr, io.ErrShortWrite)
	case kind == FaultFlipByte:
		pos := len(r.Buf) / 3
		if r.Op == OpWrite {
			r.Buf[pos] ^= 0x40 // corrupt what lands on the medium
		}
		return d.wrap(r, func() {
			r.Buf[pos] ^= 0x40 // write: restore the caller's data; read: corrupt it
		})
	}
	return d.dev.Submit(r)
}

// partial sends the first n bytes of r to the device, then completes r with
// cause: the rest was never transferred.
func (d *Faulty) partial(r *Request, n int, kind FaultKind, ioErr func(int, string, error) error, cause error) error {
	if n == 0 {
		d.failNow(r, ioErr(0, kind.String(), cause))
		return nil
	}
	inner := &Request{Op: r.Op, File: r.File, Buf: r.Buf[:n], Offset: r.Offset}
	return d.wrapInner(r, inner, func(in *Request) (int, error) {
		if in.Err != nil {
			return in.N, in.Err
		}
		return in.N, ioErr(in.N, kind.String(), cause)
	})
}

// wrap sends r's transfer as is and runs after once the device completed it.
func (d *Faulty) wrap(r *Request, after func()) error {
	inner := &Request{Op: r.Op, File: r.File, Buf: r.Buf, Offset: r.Offset}
	return d.wrapInner(r, inner, func(in *Request) (int, error) {
		after()
		return in.N, in.Err
	})
}

func (d *Faulty) wrapInner(r, inner *Request, outcome func(*Request) (int, error)) error {
	r.done, r.N, r.Err = 0, 0, nil
	if r.Wait != nil {
		r.Wait.add(1)
	}
	inner.Done = func(in *Request) {
		n, err := outcome(in)
		r.done = n
		complete(r, err)
	}
	if err := d.dev.Submit(inner); err != nil {
		if r.Wait != nil {
			r.Wait.finish(nil)
		}
		return err
	}
	return nil
}

// failNow completes r with err without touching the device.
func (d *Faulty) failNow(r *Request, err error) {
	r.done, r.N, r.Err = 0, 0, nil
	if r.Wait != nil {
		r.Wait.add(1)
	}
	complete(r, err)
}

// ReadAt reads through the fault rules and waits.
func (d *Faulty) ReadAt(f *File, buf []byte, off int64) error { return do(d, OpRead, f, buf, off) }

// WriteAt writes through the fault rules and waits.
func (d *Faulty) WriteAt(f *File, buf []byte, off int64) error { return do(d, OpWrite, f, buf, off) }

// Sync passes through.
func (d *Faulty) Sync(f *File) error { return do(d, OpSync, f, nil, 0) }

// Close closes the wrapped device.
func (d *Faulty) Close() error { return d.dev.Close() }
