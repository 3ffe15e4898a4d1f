package cpu

import (
	"fmt"
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
	workers int
	packed  bool    // GEMM through the packed AVX-512 kernel (else gonum)
	def     *Stream // the default stream

	gpu.Ledger                   // index, name, memory accounting, link and driver counters
	front      *gpu.Front        // budget and argument checks
	ops        gpu.Ops           // the kernels behind the front end's checks
	hosts      *gpu.HostRegistry // shared by the backend's devices

	// The kernels' temporaries, kept between calls (pool.go).
	bufs  bufs
	temps keep[temps]
	attn  keep[attnWork]
	packs keep[packedScratch]
	slots keep[slots]
}

func newDevice(index int, o Options, hosts *gpu.HostRegistry) *Device {
	d := &Device{workers: o.Workers, packed: o.Kernel == KernelAVX512, hosts: hosts,
		front: gpu.NewFront("gpu/cpu", index, fmt.Sprintf("cpu:%d", index), o.HBMBytes, granularityBytes)}
	d.Ledger, d.ops = d.front.Ledger(), gpu.CheckedOps[*Stream, *Buffer](d.front, &kernels{d: d})
	d.front.UseHostRegistry(hosts)
	d.def = d.newStream()
	return d
}

// HostRegistrar returns the host memory registered with the backend's
// devices, a pinned.Registrar: it only records the ranges (there is no DMA
// to page-lock for), so that the link counters tell copies of registered
// memory from pageable ones as gpu/cuda's do.
func (d *Device) HostRegistrar() *gpu.HostRegistry { return d.hosts }

// Kernel returns the GEMM kernel: KernelAVX512 or KernelGonum.
func (d *Device) Kernel() string {
	if d.packed {
		return KernelAVX512
	}
	return KernelGonum
}

// Workers returns the number of goroutines one heavy op uses.
func (d *Device) Workers() int { return d.workers }

// allocation is the memory of one Alloc, shared by its views (Free drops
// it, so a use after free fails loudly).
type allocation struct {
	mem []byte
}

// Buffer is a typed view of device memory: an extent (device, accounting,
// dtype, elements) of an allocation's memory.
type Buffer struct {
	gpu.Extent
	dev *Device
	a   *allocation
}

// Slice returns elements [off, off+n) as a view sharing memory.
func (b *Buffer) Slice(off, n int) gpu.Buffer {
	return &Buffer{Extent: b.Sub(off, n), dev: b.dev, a: b.a}
}

// raw returns the bytes of b.
func (b *Buffer) raw() []byte {
	s := b.DType().Size()
	return b.a.mem[b.Offset()*s : (b.Offset()+b.Len())*s : (b.Offset()+b.Len())*s]
}

func (b *Buffer) f32() []float32 {
	if b.Len() == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b.raw()[0])), b.Len())
}

func (b *Buffer) u16() []uint16 {
	if b.Len() == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b.raw()[0])), b.Len())
}

func (b *Buffer) i32() []int32 {
	if b.Len() == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b.raw()[0])), b.Len())
}

func (b *Buffer) f64() []float64 {
	if b.Len() == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&b.raw()[0])), b.Len())
}

// Alloc reserves n zeroed elements of dt against the budget.
func (d *Device) Alloc(n int, dt gpu.DType, tag gpu.Tag) (gpu.Buffer, error) {
	acct, err := d.front.Alloc(n, dt, tag)
	if err != nil {
		return nil, err
	}
	a := &allocation{}
	if raw := n * dt.Size(); raw > 0 {
		d.front.Driver.Allocs.Add(1)
		mem := make([]byte, raw+granularityBytes-1)
		shift := 0
		if r := uintptr(unsafe.Pointer(&mem[0])) % granularityBytes; r != 0 {
			shift = int(granularityBytes - r)
		}
		a.mem = mem[shift : shift+raw : shift+raw]
	}
	return &Buffer{Extent: d.front.Extent(acct, dt, n), dev: d, a: a}, nil
}

// Free releases a buffer returned by Alloc. Freeing a view or freeing twice
// panics.
func (d *Device) Free(gb gpu.Buffer) {
	b := gpu.Free[*Buffer](d.front, gb)
	if b.a.mem != nil {
		d.front.Driver.Frees.Add(1)
	}
	b.a.mem = nil
	d.front.Release(b.Allocation())
}

// Ops returns the device's kernels.
func (d *Device) Ops() gpu.Ops { return d.ops }

// DefaultStream returns the device's default stream.
func (d *Device) DefaultStream() gpu.Stream { return d.def }

// NewStream returns a new stream of this device.
func (d *Device) NewStream() gpu.Stream { return d.newStream() }

// NewEvent returns an event that was never recorded (so it is complete).
func (d *Device) NewEvent() gpu.Event { return &Event{} }

// CopyHostToDevice copies src into dst at dstOffBytes, in order on s.
func (d *Device) CopyHostToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, src []byte) {
	s, dst := gpu.CopyIn[*Stream, *Buffer](d.front, gs, gdst, dstOffBytes, len(src))
	d.front.HostCopy(true, src)
	s.enqueue(func() error {
		copy(dst.raw()[dstOffBytes:], src)
		d.front.Links.HostToDevice.Add(int64(len(src)))
		return nil
	})
}

// CopyDeviceToHost copies len(dst) bytes of src from srcOffBytes, in order on s.
func (d *Device) CopyDeviceToHost(gs gpu.Stream, dst []byte, gsrc gpu.Buffer, srcOffBytes int64) {
	s, src := gpu.CopyOut[*Stream, *Buffer](d.front, gs, gsrc, srcOffBytes, len(dst))
	d.front.HostCopy(false, dst)
	s.enqueue(func() error {
		copy(dst, src.raw()[srcOffBytes:])
		d.front.Links.DeviceToHost.Add(int64(len(dst)))
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
			d.front.Links.DeviceToDevice.Add(n)
		}
		return nil
	})
}
