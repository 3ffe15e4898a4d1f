package gpu

import (
	"fmt"
	"sync/atomic"
)

// Front is the checked front end of one device of a backend: it holds the
// device's budget and link counters (which Ledger reports) and checks
// every argument of Device, Ops and Comm calls against the contracts of
// this package before the backend sees them, so every backend refuses the
// same calls with the same messages. A broken contract panics with the
// backend's name ("gpu/cpu: ..."); an operating error (out of memory,
// calls that disagree) is returned.
//
// A backend makes one Front per device (NewFront), places its buffers on
// it (Extent) and names it as its streams' home (Queue), and implements
// Ops and Comm behind CheckedOps and CheckedComm, which call the backend
// with arguments already checked and resolved to its own types. Safe for
// concurrent use.
type Front struct {
	backend          string
	index            int
	name             string
	granularityBytes int64
	mem              *Budget

	// Links counts the bytes the device moved, as LinkCounters reports
	// them; the backend adds to them as it moves data (the pageable
	// bytes through HostCopy).
	Links struct {
		HostToDevice, DeviceToHost, DeviceToDevice, Collective atomic.Int64
		HostToDevicePageable, DeviceToHostPageable             atomic.Int64
	}
	// Driver counts the backend's calls that take device memory from its
	// driver and give it back, as DriverCounters reports them.
	Driver struct{ Allocs, Frees atomic.Int64 }

	hosts atomic.Pointer[HostRegistry] // the host memory registered with the backend; nil: none
}

// NewFront returns the front end of device index of backend (the prefix
// of its panics, "gpu/cpu"), named name in messages ("cpu:0"), with a
// budget of budgetBytes charged in multiples of granularityBytes.
func NewFront(backend string, index int, name string, budgetBytes, granularityBytes int64) *Front {
	if granularityBytes < 1 {
		panic("gpu: front end with a granularity below one byte")
	}
	return &Front{backend: backend, index: index, name: name, granularityBytes: granularityBytes, mem: NewBudget(index, budgetBytes)}
}

// Ledger returns the device's report of itself, for the backend's Device
// to embed.
func (f *Front) Ledger() Ledger { return Ledger{f: f} }

// Ledger is what every backend's device reports the same way: its index
// and name, its memory accounting and its link counters (Device's Index,
// Name, MemStats, ResetPeak and Counters). Backends embed it.
type Ledger struct{ f *Front }

// Index returns the device's index in its backend.
func (l Ledger) Index() int { return l.f.index }

// Name returns the device's name.
func (l Ledger) Name() string { return l.f.name }

// MemStats returns the device's memory accounting.
func (l Ledger) MemStats() MemStats { return l.f.mem.Stats() }

// ResetPeak sets every peak to the bytes in use now.
func (l Ledger) ResetPeak() { l.f.mem.ResetPeak() }

// Counters returns the bytes moved on each link so far.
func (l Ledger) Counters() LinkCounters {
	k := &l.f.Links
	return LinkCounters{HostToDevice: k.HostToDevice.Load(), DeviceToHost: k.DeviceToHost.Load(),
		DeviceToDevice: k.DeviceToDevice.Load(), Collective: k.Collective.Load(),
		HostToDevicePageable: k.HostToDevicePageable.Load(), DeviceToHostPageable: k.DeviceToHostPageable.Load()}
}

// DriverCounters returns the driver allocations and frees so far.
func (l Ledger) DriverCounters() DriverCounters {
	return DriverCounters{Allocs: l.f.Driver.Allocs.Load(), Frees: l.f.Driver.Frees.Load()}
}

// UseHostRegistry names the host memory registered with the device's
// backend: copies from or to memory outside it count as pageable.
func (f *Front) UseHostRegistry(r *HostRegistry) { f.hosts.Store(r) }

// HostCopy counts the bytes of a copy of host memory mem (toDevice:
// host-to-device) that is not registered with the backend on the pageable
// counter of its direction. The backend calls it for every host copy, next
// to the link's own counter.
func (f *Front) HostCopy(toDevice bool, mem []byte) {
	if len(mem) == 0 || f.hosts.Load().Contains(mem) {
		return
	}
	if toDevice {
		f.Links.HostToDevicePageable.Add(int64(len(mem)))
	} else {
		f.Links.DeviceToHostPageable.Add(int64(len(mem)))
	}
}

// HostPieces cuts host memory mem at the boundaries of the registered
// ranges it spans (HostRegistry.Split): a backend copies each piece on its
// own, from one registration.
func (f *Front) HostPieces(mem []byte) [][]byte { return f.hosts.Load().Split(mem) }

// Panicf panics with the backend's name before the message: a broken
// contract found by the backend itself.
func (f *Front) Panicf(format string, args ...any) {
	panic(f.backend + ": " + fmt.Sprintf(format, args...))
}

// Errorf returns an error with the backend's name before the message.
func (f *Front) Errorf(format string, args ...any) error {
	return fmt.Errorf(f.backend+": "+format, args...)
}

// Allocation is the accounting of one Device.Alloc, shared by the buffer
// Alloc returns and every view of it.
type Allocation struct {
	SizeBytes int64 // charged to the budget: the request rounded up to the granularity
	Tag       Tag
	freed     atomic.Bool
}

// Freed reports whether the buffer was freed.
func (a *Allocation) Freed() bool { return a.freed.Load() }

// Alloc checks an allocation request, rounds it up to the granularity and
// charges it to the budget. It returns *OutOfMemoryError, charging
// nothing, when the budget cannot hold it. The backend then takes the
// memory; if it cannot, it calls Refund (and OutOfMemory for the error).
func (f *Front) Alloc(n int, dt DType, tag Tag) (*Allocation, error) {
	if n < 0 {
		f.Panicf("alloc of %d elements", n)
	}
	if int(tag.Kind) >= KindCount {
		f.Panicf("alloc with unknown kind %d", tag.Kind)
	}
	raw := int64(n) * int64(dt.Size())
	size := (raw + f.granularityBytes - 1) / f.granularityBytes * f.granularityBytes
	if err := f.mem.Reserve(size, tag); err != nil {
		return nil, err
	}
	return &Allocation{SizeBytes: size, Tag: tag}, nil
}

// Refund gives back the charge of an allocation whose memory the backend
// could not take.
func (f *Front) Refund(a *Allocation) { f.mem.Release(a.SizeBytes, a.Tag) }

// OutOfMemory is the error of an allocation the budget allowed but the
// device could not hold: the *OutOfMemoryError of Alloc, with the
// accounting as it is now.
func (f *Front) OutOfMemory(a *Allocation) error { return f.mem.OutOfMemory(a.SizeBytes, a.Tag) }

// Release gives back the charge of an allocation the backend has freed
// (after Free checked it).
func (f *Front) Release(a *Allocation) { f.mem.Release(a.SizeBytes, a.Tag) }

// Resident is what the front end reads of a backend's buffer besides the
// Buffer methods: the device that owns it, its allocation, whether it is a
// view and where in the allocation it starts. Backends get these methods
// by embedding an Extent.
type Resident interface {
	Buffer
	Home() *Front
	Allocation() *Allocation
	IsView() bool
	Offset() int
}

// Extent is the backend-independent part of a buffer: the front end of its
// device, the accounting of its allocation, its dtype, the elements
// [Offset, Offset+Len) of the allocation it covers, and whether it is a
// view. A backend's Buffer embeds it next to where the memory is, which
// gives it the Buffer and Resident methods but Slice.
type Extent struct {
	home   *Front
	alloc  *Allocation
	dt     DType
	off, n int
	view   bool
}

// Extent returns the extent of a new allocation a of n elements of dt on
// f's device.
func (f *Front) Extent(a *Allocation, dt DType, n int) Extent {
	return Extent{home: f, alloc: a, dt: dt, n: n}
}

// Scratch returns the extent of n elements of dt on no device: what a
// backend's own kernels use to view their scratch memory as a buffer. The
// front end refuses such a buffer.
func Scratch(dt DType, n int) Extent { return Extent{dt: dt, n: n} }

// Sub checks that elements [off, off+n) lie in e (Buffer.Slice) and
// returns the extent of a view of them.
func (e *Extent) Sub(off, n int) Extent {
	if off < 0 || n < 0 || off+n > e.n {
		msg := fmt.Sprintf("slice [%d, %d) of a buffer of %d elements", off, off+n, e.n)
		if e.home == nil { // a Scratch extent: no backend to name
			panic("gpu: " + msg)
		}
		e.home.Panicf("%s", msg)
	}
	return Extent{home: e.home, alloc: e.alloc, dt: e.dt, off: e.off + off, n: n, view: true}
}

func (e *Extent) DType() DType            { return e.dt }
func (e *Extent) Len() int                { return e.n }
func (e *Extent) Bytes() int64            { return int64(e.n) * int64(e.dt.Size()) }
func (e *Extent) DeviceIndex() int        { return e.home.index }
func (e *Extent) Home() *Front            { return e.home }
func (e *Extent) Allocation() *Allocation { return e.alloc }
func (e *Extent) IsView() bool            { return e.view }

// Offset returns the index of the first element in the allocation.
func (e *Extent) Offset() int { return e.off }

// Tag returns what the allocation behind the buffer is for.
func (e *Extent) Tag() Tag { return e.alloc.Tag }

// Queue is what the front end reads of a backend's stream: the device
// that owns it.
type Queue interface {
	Stream
	Home() *Front
}

// BufferOf checks that b is a live buffer of this backend (type B) on f's
// device and returns it.
func BufferOf[B Resident](f *Front, b Buffer, what string) B {
	rb := AnyBufferOf[B](f, b, what)
	if h := rb.Home(); h != f {
		f.Panicf("%s is on %s, not %s", what, h.name, f.name)
	}
	return rb
}

// AnyBufferOf checks that b is a live buffer of this backend (type B), on
// any of its devices, and returns it.
func AnyBufferOf[B Resident](f *Front, b Buffer, what string) B {
	rb, ok := b.(B)
	var none B
	if !ok || any(rb) == any(none) || rb.Allocation() == nil {
		f.Panicf("%s is not a %s buffer (%T)", what, f.backend, b)
	}
	if a := rb.Allocation(); a.Freed() {
		f.Panicf("%s (%q) was freed", what, a.Tag.Purpose)
	}
	return rb
}

// StreamOf checks that s is a stream of this backend (type S) on f's
// device and returns it.
func StreamOf[S Queue](f *Front, s Stream) S {
	rs, ok := s.(S)
	var none S
	if !ok || any(rs) == any(none) {
		f.Panicf("stream is not a %s stream (%T)", f.backend, s)
	}
	if h := rs.Home(); h != f {
		f.Panicf("stream of %s used on %s", h.name, f.name)
	}
	return rs
}

// Free checks that b is a buffer Alloc returned on f's device (not a
// view, not freed before), marks it freed and returns it. The backend
// releases the memory, then calls Release.
func Free[B Resident](f *Front, b Buffer) B {
	rb, ok := b.(B)
	var none B
	switch {
	case !ok || any(rb) == any(none) || rb.Allocation() == nil:
		f.Panicf("free of a foreign buffer %T", b)
	case rb.Home() != f:
		f.Panicf("free on %s of a buffer of %s", f.name, rb.Home().name)
	case rb.IsView():
		f.Panicf("free of a view")
	case !rb.Allocation().freed.CompareAndSwap(false, true):
		f.Panicf("double free of %q", rb.Allocation().Tag.Purpose)
	}
	return rb
}

// checkRange checks that bytes [off, off+n) lie in a buffer of size bytes.
func (f *Front) checkRange(what string, off, n, size int64) {
	if off < 0 || n < 0 || off+n > size {
		f.Panicf("%s range [%d, %d) outside %d bytes", what, off, off+n, size)
	}
}

// CopyIn checks a host-to-device copy of n bytes into dst at dstOffBytes
// on s and returns the stream and buffer.
func CopyIn[S Queue, B Resident](f *Front, s Stream, dst Buffer, dstOffBytes int64, n int) (S, B) {
	rs, rd := StreamOf[S](f, s), BufferOf[B](f, dst, "copy destination")
	f.checkRange("host-to-device destination", dstOffBytes, int64(n), rd.Bytes())
	return rs, rd
}

// CopyOut checks a device-to-host copy of n bytes from src at srcOffBytes
// on s and returns the stream and buffer.
func CopyOut[S Queue, B Resident](f *Front, s Stream, src Buffer, srcOffBytes int64, n int) (S, B) {
	rs, rb := StreamOf[S](f, s), BufferOf[B](f, src, "copy source")
	f.checkRange("device-to-host source", srcOffBytes, int64(n), rb.Bytes())
	return rs, rb
}

// CopyAcross checks a device-to-device copy of n bytes on s into dst (on
// f's device) from src (on any device of the backend) and returns the
// stream and buffers.
func CopyAcross[S Queue, B Resident](f *Front, s Stream, dst Buffer, dstOffBytes int64, src Buffer, srcOffBytes, n int64) (S, B, B) {
	rs, rd, rb := StreamOf[S](f, s), BufferOf[B](f, dst, "copy destination"), AnyBufferOf[B](f, src, "copy source")
	f.checkRange("device-to-device destination", dstOffBytes, n, rd.Bytes())
	f.checkRange("device-to-device source", srcOffBytes, n, rb.Bytes())
	return rs, rd, rb
}
