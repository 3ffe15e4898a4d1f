package cuda

import (
	"fmt"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
)

// granularityBytes is the accounting granularity and the alignment
// cuMemAlloc guarantees.
const granularityBytes = 256

// Device is one logical device on a physical GPU: a byte budget over
// cuMemAlloc, streams, and Ops that launch the NVRTC kernels and cuBLAS.
type Device struct {
	g   *gpuCtx  // the physical GPU
	b   *Backend // owns the streams
	def *Stream  // the default stream, made by New

	gpu.Ledger            // index, name, memory accounting, link counters
	front      *gpu.Front // budget and argument checks
	ops        gpu.Ops    // the kernels behind the front end's checks
}

func newDevice(index int, g *gpuCtx, b *Backend, budgetBytes int64) *Device {
	name := fmt.Sprintf("cuda:%d (%s, GPU %d)", index, g.name, g.ordinal)
	d := &Device{g: g, b: b, front: gpu.NewFront("gpu/cuda", index, name, budgetBytes, granularityBytes)}
	d.Ledger, d.ops = d.front.Ledger(), gpu.CheckedOps[*Stream, *Buffer](d.front, &kernels{d: d})
	d.front.UseHostRegistry(b.hosts)
	return d
}

// GPU returns the ordinal of the physical GPU the device runs on.
func (d *Device) GPU() int { return d.g.ordinal }

// allocation is the device memory of one Alloc, shared by its views.
type allocation struct {
	ptr uint64
}

// Buffer is a typed view of device memory: an extent (device, accounting,
// dtype, elements) of an allocation's memory.
type Buffer struct {
	gpu.Extent
	dev *Device
	a   *allocation
}

// Ptr returns the device address of the first element (0 for an empty
// allocation).
func (b *Buffer) Ptr() uint64 {
	if b.a.ptr == 0 {
		return 0
	}
	return b.a.ptr + uint64(b.Offset())*uint64(b.DType().Size())
}

func (b *Buffer) p() devPtr { return devPtr(b.Ptr()) }

// Slice returns elements [off, off+n) as a view sharing memory.
func (b *Buffer) Slice(off, n int) gpu.Buffer {
	return &Buffer{Extent: b.Sub(off, n), dev: b.dev, a: b.a}
}

// Alloc reserves n zeroed elements of dt against the budget, then takes
// them with cuMemAlloc. A request past the budget, or one the GPU itself
// cannot hold, returns *gpu.OutOfMemoryError.
func (d *Device) Alloc(n int, dt gpu.DType, tag gpu.Tag) (gpu.Buffer, error) {
	acct, err := d.front.Alloc(n, dt, tag)
	if err != nil {
		return nil, err
	}
	size := acct.SizeBytes
	a := &allocation{}
	if n*dt.Size() > 0 {
		drv := d.g.l.drv
		var res cuResult
		err := d.g.do(func() error {
			res = drv.cuMemAlloc(&a.ptr, uint64(size))
			if err := drv.check(res, "cuMemAlloc %d bytes", size); err != nil {
				return err
			}
			d.front.Driver.Allocs.Add(1)
			if err := drv.check(drv.cuMemsetD8Async(a.ptr, 0, uint64(size), d.g.internal), "cuMemsetD8Async"); err != nil {
				return err
			}
			return drv.check(drv.cuStreamSynchronize(d.g.internal), "cuStreamSynchronize")
		})
		if err != nil {
			if a.ptr != 0 {
				d.g.do(func() error { drv.cuMemFree(a.ptr); return nil })
				d.front.Driver.Frees.Add(1)
			}
			d.front.Refund(acct)
			if res == cudaOutOfMemory {
				return nil, d.front.OutOfMemory(acct)
			}
			return nil, fmt.Errorf("gpu/cuda: alloc %d bytes for %q on %s: %w", size, tag.Purpose, d.Name(), err)
		}
	}
	return &Buffer{Extent: d.front.Extent(acct, dt, n), dev: d, a: a}, nil
}

// Free releases a buffer returned by Alloc (cuMemFree waits for the work
// in flight on the GPU: never call it holding a lock another rank may
// need). Freeing a view or freeing twice panics.
func (d *Device) Free(gb gpu.Buffer) {
	b := gpu.Free[*Buffer](d.front, gb)
	if b.a.ptr != 0 {
		d.front.Driver.Frees.Add(1)
		drv := d.g.l.drv
		if err := d.g.do(func() error { return drv.check(drv.cuMemFree(b.a.ptr), "cuMemFree") }); err != nil {
			// The context is broken (a kernel faulted): the memory is gone
			// with it; the accounting still releases it.
			d.def.fail(fmt.Errorf("gpu/cuda: free %q: %w", b.Tag().Purpose, err))
		}
	}
	d.front.Release(b.Allocation())
}

// Ops returns the device's kernels.
func (d *Device) Ops() gpu.Ops { return d.ops }

// DefaultStream returns the device's default stream (a non-blocking CUDA
// stream of its own, not the legacy NULL stream).
func (d *Device) DefaultStream() gpu.Stream { return d.def }

// NewStream returns a new stream; it lives until the backend is closed.
func (d *Device) NewStream() gpu.Stream {
	s, err := d.b.newStream(d)
	if err != nil {
		panic(fmt.Sprintf("gpu/cuda: new stream on %s: %v", d.Name(), err))
	}
	return s
}

// NewEvent returns an event that was never recorded (so it is complete).
func (d *Device) NewEvent() gpu.Event { return newEvent(d.g.l.drv) }

// CopyHostToDevice enqueues cuMemcpyHtoDAsync. src must stay valid and
// unchanged until the copy completes; from pageable memory the driver
// stages it and the call returns once src has been read.
func (d *Device) CopyHostToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, src []byte) {
	s, dst := gpu.CopyIn[*Stream, *Buffer](d.front, gs, gdst, dstOffBytes, len(src))
	d.front.Links.HostToDevice.Add(int64(len(src)))
	d.front.HostCopy(true, src)
	if len(src) == 0 {
		return
	}
	drv := d.g.l.drv
	for _, p := range d.front.HostPieces(src) {
		off := uint64(dstOffBytes)
		s.run(func() error {
			return drv.check(drv.cuMemcpyHtoDAsync(dst.Ptr()+off, unsafe.Pointer(&p[0]), uint64(len(p)), s.h), "cuMemcpyHtoDAsync %d bytes", len(p))
		})
		dstOffBytes += int64(len(p))
	}
}

// CopyDeviceToHost enqueues cuMemcpyDtoHAsync of len(dst) bytes.
func (d *Device) CopyDeviceToHost(gs gpu.Stream, dst []byte, gsrc gpu.Buffer, srcOffBytes int64) {
	s, src := gpu.CopyOut[*Stream, *Buffer](d.front, gs, gsrc, srcOffBytes, len(dst))
	d.front.Links.DeviceToHost.Add(int64(len(dst)))
	d.front.HostCopy(false, dst)
	if len(dst) == 0 {
		return
	}
	drv := d.g.l.drv
	for _, p := range d.front.HostPieces(dst) {
		off := uint64(srcOffBytes)
		s.run(func() error {
			return drv.check(drv.cuMemcpyDtoHAsync(unsafe.Pointer(&p[0]), src.Ptr()+off, uint64(len(p)), s.h), "cuMemcpyDtoHAsync %d bytes", len(p))
		})
		srcOffBytes += int64(len(p))
	}
}

// CopyDeviceToDevice copies n bytes with cuMemcpyAsync (unified
// addressing: src may be on another GPU). Copies between two logical
// devices count n bytes on d's DeviceToDevice link.
func (d *Device) CopyDeviceToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, gsrc gpu.Buffer, srcOffBytes int64, n int64) {
	s, dst, src := gpu.CopyAcross[*Stream, *Buffer](d.front, gs, gdst, dstOffBytes, gsrc, srcOffBytes, n)
	if src.dev != d {
		d.front.Links.DeviceToDevice.Add(n)
	}
	if n == 0 {
		return
	}
	drv := d.g.l.drv
	s.run(func() error {
		return drv.check(drv.cuMemcpyAsync(dst.Ptr()+uint64(dstOffBytes), src.Ptr()+uint64(srcOffBytes), uint64(n), s.h), "cuMemcpyAsync %d bytes", n)
	})
}
