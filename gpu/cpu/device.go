package cpu

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
)

// granularityBytes is the allocation granularity and alignment: every
// allocation starts on a 64-byte boundary (a cache line, one AVX-512
// register) and is accounted rounded up to a multiple of it.
const granularityBytes = 64

// Device is one in-process device: host memory behind a byte budget, streams
// run by goroutines, and Ops computed in Go.
type Device struct {
	index   int
	workers int
	packed  bool // GEMM through the packed AVX-512 kernel (else gonum)
	mem     *gpu.Budget
	ops     *Ops
	def     *Stream

	h2d, d2h, d2d, coll atomic.Int64
}

func newDevice(index int, o Options) *Device {
	d := &Device{index: index, workers: o.Workers, mem: gpu.NewBudget(index, o.HBMBytes), packed: o.Kernel == KernelAVX512}
	d.ops = &Ops{d: d}
	d.def = d.newStream()
	return d
}

// Index returns the device's rank in its backend.
func (d *Device) Index() int { return d.index }

// Name returns "cpu:<index>".
func (d *Device) Name() string { return fmt.Sprintf("cpu:%d", d.index) }

// Kernel returns the GEMM kernel: KernelAVX512 or KernelGonum.
func (d *Device) Kernel() string {
	if d.packed {
		return KernelAVX512
	}
	return KernelGonum
}

// Workers returns the number of goroutines one heavy op uses.
func (d *Device) Workers() int { return d.workers }

// allocation is one Alloc: the aligned memory and its accounting.
type allocation struct {
	mem       []byte
	sizeBytes int64 // rounded to granularityBytes
	tag       gpu.Tag
	freed     atomic.Bool
}

// Buffer is a typed view of device memory.
type Buffer struct {
	dev  *Device
	a    *allocation
	dt   gpu.DType
	off  int // elements from the start of the allocation
	n    int
	view bool
}

func (b *Buffer) DType() gpu.DType { return b.dt }
func (b *Buffer) Len() int         { return b.n }
func (b *Buffer) Bytes() int64     { return int64(b.n) * int64(b.dt.Size()) }
func (b *Buffer) DeviceIndex() int { return b.dev.index }

// Slice returns elements [off, off+n) as a view sharing memory.
func (b *Buffer) Slice(off, n int) gpu.Buffer {
	if off < 0 || n < 0 || off+n > b.n {
		panic(fmt.Sprintf("gpu/cpu: slice [%d, %d) of a buffer of %d elements", off, off+n, b.n))
	}
	return &Buffer{dev: b.dev, a: b.a, dt: b.dt, off: b.off + off, n: n, view: true}
}

// Tag returns what the allocation behind b is for.
func (b *Buffer) Tag() gpu.Tag { return b.a.tag }

// raw returns the bytes of b.
func (b *Buffer) raw() []byte {
	s := b.dt.Size()
	return b.a.mem[b.off*s : (b.off+b.n)*s : (b.off+b.n)*s]
}

func (b *Buffer) f32() []float32 {
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b.raw()[0])), b.n)
}

func (b *Buffer) u16() []uint16 {
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b.raw()[0])), b.n)
}

func (b *Buffer) i32() []int32 {
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b.raw()[0])), b.n)
}

func (b *Buffer) f64() []float64 {
	if b.n == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&b.raw()[0])), b.n)
}

// Alloc reserves n zeroed elements of dt against the budget.
func (d *Device) Alloc(n int, dt gpu.DType, tag gpu.Tag) (gpu.Buffer, error) {
	if n < 0 {
		panic(fmt.Sprintf("gpu/cpu: alloc of %d elements", n))
	}
	if int(tag.Kind) >= gpu.KindCount {
		panic(fmt.Sprintf("gpu/cpu: alloc with unknown kind %d", tag.Kind))
	}
	raw := int64(n) * int64(dt.Size())
	size := (raw + granularityBytes - 1) / granularityBytes * granularityBytes
	if err := d.mem.Reserve(size, tag); err != nil {
		return nil, err
	}

	a := &allocation{sizeBytes: size, tag: tag}
	if raw > 0 {
		mem := make([]byte, raw+granularityBytes-1)
		shift := 0
		if r := uintptr(unsafe.Pointer(&mem[0])) % granularityBytes; r != 0 {
			shift = int(granularityBytes - r)
		}
		a.mem = mem[shift : shift+int(raw) : shift+int(raw)]
	}
	return &Buffer{dev: d, a: a, dt: dt, n: n}, nil
}

// Free releases a buffer returned by Alloc. Freeing a view or freeing twice
// panics.
func (d *Device) Free(gb gpu.Buffer) {
	b, ok := gb.(*Buffer)
	switch {
	case !ok:
		panic(fmt.Sprintf("gpu/cpu: free of a foreign buffer %T", gb))
	case b.dev != d:
		panic(fmt.Sprintf("gpu/cpu: free on %s of a buffer of %s", d.Name(), b.dev.Name()))
	case b.view:
		panic("gpu/cpu: free of a view")
	case !b.a.freed.CompareAndSwap(false, true):
		panic(fmt.Sprintf("gpu/cpu: double free of %q", b.a.tag.Purpose))
	}
	d.mem.Release(b.a.sizeBytes, b.a.tag)
	b.a.mem = nil
}

// MemStats returns the device's memory statistics.
func (d *Device) MemStats() gpu.MemStats { return d.mem.Stats() }

// ResetPeak sets every peak to the current in-use value.
func (d *Device) ResetPeak() { d.mem.ResetPeak() }

// Counters returns the bytes moved on each link so far.
func (d *Device) Counters() gpu.LinkCounters {
	return gpu.LinkCounters{HostToDevice: d.h2d.Load(), DeviceToHost: d.d2h.Load(), DeviceToDevice: d.d2d.Load(), Collective: d.coll.Load()}
}

// Ops returns the device's kernels.
func (d *Device) Ops() gpu.Ops { return d.ops }

// DefaultStream returns the device's default stream.
func (d *Device) DefaultStream() gpu.Stream { return d.def }

// NewStream returns a new stream of this device.
func (d *Device) NewStream() gpu.Stream { return d.newStream() }

// NewEvent returns an event that was never recorded (so it is complete).
func (d *Device) NewEvent() gpu.Event { return &Event{} }

// buf checks that gb is a live buffer of d and returns it.
func (d *Device) buf(gb gpu.Buffer, what string) *Buffer {
	b := anyBuf(gb, what)
	if b.dev != d {
		panic(fmt.Sprintf("gpu/cpu: %s is on %s, not %s", what, b.dev.Name(), d.Name()))
	}
	return b
}

// anyBuf checks that gb is a live buffer of this backend on any device.
func anyBuf(gb gpu.Buffer, what string) *Buffer {
	b, ok := gb.(*Buffer)
	if !ok || b == nil {
		panic(fmt.Sprintf("gpu/cpu: %s is not a gpu/cpu buffer (%T)", what, gb))
	}
	if b.a.freed.Load() {
		panic(fmt.Sprintf("gpu/cpu: %s (%q) was freed", what, b.a.tag.Purpose))
	}
	return b
}

// stream checks that gs is a stream of d.
func (d *Device) stream(gs gpu.Stream) *Stream {
	s, ok := gs.(*Stream)
	if !ok || s == nil {
		panic(fmt.Sprintf("gpu/cpu: stream is not a gpu/cpu stream (%T)", gs))
	}
	if s.dev != d {
		panic(fmt.Sprintf("gpu/cpu: stream of %s used on %s", s.dev.Name(), d.Name()))
	}
	return s
}

// CopyHostToDevice copies src into dst at dstOffBytes, in order on s.
func (d *Device) CopyHostToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, src []byte) {
	s, dst := d.stream(gs), d.buf(gdst, "copy destination")
	checkRange("host-to-device destination", dstOffBytes, int64(len(src)), dst.Bytes())
	s.enqueue(func() error {
		copy(dst.raw()[dstOffBytes:], src)
		d.h2d.Add(int64(len(src)))
		return nil
	})
}

// CopyDeviceToHost copies len(dst) bytes of src from srcOffBytes, in order on s.
func (d *Device) CopyDeviceToHost(gs gpu.Stream, dst []byte, gsrc gpu.Buffer, srcOffBytes int64) {
	s, src := d.stream(gs), d.buf(gsrc, "copy source")
	checkRange("device-to-host source", srcOffBytes, int64(len(dst)), src.Bytes())
	s.enqueue(func() error {
		copy(dst, src.raw()[srcOffBytes:])
		d.d2h.Add(int64(len(dst)))
		return nil
	})
}

// CopyDeviceToDevice copies n bytes; dst is on d, src on any device of this
// backend. Copies between two devices count n bytes on d's DeviceToDevice
// link; copies within d count nothing.
func (d *Device) CopyDeviceToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, gsrc gpu.Buffer, srcOffBytes int64, n int64) {
	s, dst, src := d.stream(gs), d.buf(gdst, "copy destination"), anyBuf(gsrc, "copy source")
	checkRange("device-to-device destination", dstOffBytes, n, dst.Bytes())
	checkRange("device-to-device source", srcOffBytes, n, src.Bytes())
	s.enqueue(func() error {
		copy(dst.raw()[dstOffBytes:dstOffBytes+n], src.raw()[srcOffBytes:srcOffBytes+n])
		if src.dev != d {
			d.d2d.Add(n)
		}
		return nil
	})
}

func checkRange(what string, off, n, size int64) {
	if off < 0 || n < 0 || off+n > size {
		panic(fmt.Sprintf("gpu/cpu: %s range [%d, %d) outside %d bytes", what, off, off+n, size))
	}
}
