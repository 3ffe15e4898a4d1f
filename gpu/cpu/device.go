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
	front   *gpu.Front // budget and argument checks
	workers int
	packed  bool // GEMM through the packed AVX-512 kernel (else gonum)
	k       *kernels
	ops     gpu.Ops // k behind the front end's checks
	def     *Stream

	h2d, d2h, d2d, coll atomic.Int64
}

func newDevice(index int, o Options) *Device {
	d := &Device{workers: o.Workers, packed: o.Kernel == KernelAVX512,
		front: gpu.NewFront("gpu/cpu", index, fmt.Sprintf("cpu:%d", index), o.HBMBytes, granularityBytes)}
	d.k = &kernels{d: d}
	d.ops = gpu.CheckedOps[*Stream, *Buffer](d.front, d.k)
	d.def = d.newStream()
	return d
}

// Index returns the device's rank in its backend.
func (d *Device) Index() int { return d.front.Index() }

// Name returns "cpu:<index>".
func (d *Device) Name() string { return d.front.Name() }

// Kernel returns the GEMM kernel: KernelAVX512 or KernelGonum.
func (d *Device) Kernel() string {
	if d.packed {
		return KernelAVX512
	}
	return KernelGonum
}

// Workers returns the number of goroutines one heavy op uses.
func (d *Device) Workers() int { return d.workers }

// allocation is one Alloc: its accounting and its aligned memory.
type allocation struct {
	*gpu.Allocation
	mem []byte
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
func (b *Buffer) DeviceIndex() int { return b.dev.Index() }

// Slice returns elements [off, off+n) as a view sharing memory.
func (b *Buffer) Slice(off, n int) gpu.Buffer {
	b.dev.front.CheckSlice(off, n, b.n)
	return &Buffer{dev: b.dev, a: b.a, dt: b.dt, off: b.off + off, n: n, view: true}
}

// Tag returns what the allocation behind b is for.
func (b *Buffer) Tag() gpu.Tag { return b.a.Tag }

// Home, Allocation and IsView are what the front end checks (gpu.Resident).
func (b *Buffer) Home() *gpu.Front { return b.dev.front }

func (b *Buffer) Allocation() *gpu.Allocation {
	if b == nil {
		return nil
	}
	return b.a.Allocation
}

func (b *Buffer) IsView() bool { return b.view }

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
	acct, err := d.front.Alloc(n, dt, tag)
	if err != nil {
		return nil, err
	}
	a := &allocation{Allocation: acct}
	if raw := n * dt.Size(); raw > 0 {
		mem := make([]byte, raw+granularityBytes-1)
		shift := 0
		if r := uintptr(unsafe.Pointer(&mem[0])) % granularityBytes; r != 0 {
			shift = int(granularityBytes - r)
		}
		a.mem = mem[shift : shift+raw : shift+raw]
	}
	return &Buffer{dev: d, a: a, dt: dt, n: n}, nil
}

// Free releases a buffer returned by Alloc. Freeing a view or freeing twice
// panics.
func (d *Device) Free(gb gpu.Buffer) {
	b := gpu.Free[*Buffer](d.front, gb)
	b.a.mem = nil
	d.front.Release(b.a.Allocation)
}

// MemStats returns the device's memory statistics.
func (d *Device) MemStats() gpu.MemStats { return d.front.MemStats() }

// ResetPeak sets every peak to the current in-use value.
func (d *Device) ResetPeak() { d.front.ResetPeak() }

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
	return gpu.BufferOf[*Buffer](d.front, gb, what)
}

// stream checks that gs is a stream of d.
func (d *Device) stream(gs gpu.Stream) *Stream { return gpu.StreamOf[*Stream](d.front, gs) }

// CopyHostToDevice copies src into dst at dstOffBytes, in order on s.
func (d *Device) CopyHostToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, src []byte) {
	s, dst := gpu.CopyIn[*Stream, *Buffer](d.front, gs, gdst, dstOffBytes, len(src))
	s.enqueue(func() error {
		copy(dst.raw()[dstOffBytes:], src)
		d.h2d.Add(int64(len(src)))
		return nil
	})
}

// CopyDeviceToHost copies len(dst) bytes of src from srcOffBytes, in order on s.
func (d *Device) CopyDeviceToHost(gs gpu.Stream, dst []byte, gsrc gpu.Buffer, srcOffBytes int64) {
	s, src := gpu.CopyOut[*Stream, *Buffer](d.front, gs, gsrc, srcOffBytes, len(dst))
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
	s, dst, src := gpu.CopyAcross[*Stream, *Buffer](d.front, gs, gdst, dstOffBytes, gsrc, srcOffBytes, n)
	s.enqueue(func() error {
		copy(dst.raw()[dstOffBytes:dstOffBytes+n], src.raw()[srcOffBytes:srcOffBytes+n])
		if src.dev != d {
			d.d2d.Add(n)
		}
		return nil
	})
}
