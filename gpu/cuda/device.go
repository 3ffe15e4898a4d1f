package cuda

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
)

// granularityBytes is the accounting granularity and the alignment
// cuMemAlloc guarantees.
const granularityBytes = 256

// Device is one logical device on a physical GPU: a byte budget over
// cuMemAlloc, streams, and Ops that launch the NVRTC kernels and cuBLAS.
type Device struct {
	front *gpu.Front // budget and argument checks
	g     *gpuCtx
	b     *Backend
	k     *kernels
	ops   gpu.Ops // k behind the front end's checks
	def   *Stream

	h2d, d2h, d2d, coll atomic.Int64
}

// Index returns the device's rank in its backend.
func (d *Device) Index() int { return d.front.Index() }

// Name returns "cuda:<index> (<GPU name>, GPU <ordinal>)".
func (d *Device) Name() string { return d.front.Name() }

func newDevice(index int, g *gpuCtx, b *Backend, budgetBytes int64) *Device {
	name := fmt.Sprintf("cuda:%d (%s, GPU %d)", index, g.name, g.ordinal)
	d := &Device{g: g, b: b, front: gpu.NewFront("gpu/cuda", index, name, budgetBytes, granularityBytes)}
	d.k = &kernels{d: d}
	d.ops = gpu.CheckedOps[*Stream, *Buffer](d.front, d.k)
	return d
}

// GPU returns the ordinal of the physical GPU the device runs on.
func (d *Device) GPU() int { return d.g.ordinal }

// allocation is one Alloc: its accounting and its device memory.
type allocation struct {
	*gpu.Allocation
	ptr uint64
}

// Buffer is a typed view of device memory.
type Buffer struct {
	dev  *Device
	a    *allocation
	dt   gpu.DType
	off  int
	n    int
	view bool
}

func (b *Buffer) DType() gpu.DType { return b.dt }
func (b *Buffer) Len() int         { return b.n }
func (b *Buffer) Bytes() int64     { return int64(b.n) * int64(b.dt.Size()) }
func (b *Buffer) DeviceIndex() int { return b.dev.Index() }

// Ptr returns the device address of the first element (0 for an empty
// allocation).
func (b *Buffer) Ptr() uint64 {
	if b.a.ptr == 0 {
		return 0
	}
	return b.a.ptr + uint64(b.off)*uint64(b.dt.Size())
}

func (b *Buffer) p() devPtr { return devPtr(b.Ptr()) }

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

// Alloc reserves n zeroed elements of dt against the budget, then takes
// them with cuMemAlloc. A request past the budget, or one the GPU itself
// cannot hold, returns *gpu.OutOfMemoryError.
func (d *Device) Alloc(n int, dt gpu.DType, tag gpu.Tag) (gpu.Buffer, error) {
	acct, err := d.front.Alloc(n, dt, tag)
	if err != nil {
		return nil, err
	}
	size := acct.SizeBytes
	a := &allocation{Allocation: acct}
	if n*dt.Size() > 0 {
		drv := d.g.l.drv
		var res cuResult
		err := d.g.do(func() error {
			res = drv.cuMemAlloc(&a.ptr, uint64(size))
			if err := drv.check(res, "cuMemAlloc %d bytes", size); err != nil {
				return err
			}
			if err := drv.check(drv.cuMemsetD8Async(a.ptr, 0, uint64(size), d.g.internal), "cuMemsetD8Async"); err != nil {
				return err
			}
			return drv.check(drv.cuStreamSynchronize(d.g.internal), "cuStreamSynchronize")
		})
		if err != nil {
			if a.ptr != 0 {
				d.g.do(func() error { drv.cuMemFree(a.ptr); return nil })
			}
			d.front.Refund(acct)
			if res == cudaOutOfMemory {
				return nil, d.front.OutOfMemory(acct)
			}
			return nil, fmt.Errorf("gpu/cuda: alloc %d bytes for %q on %s: %w", size, tag.Purpose, d.Name(), err)
		}
	}
	return &Buffer{dev: d, a: a, dt: dt, n: n}, nil
}

// Free releases a buffer returned by Alloc (cuMemFree waits for the work
// in flight on the GPU). Freeing a view or freeing twice panics.
func (d *Device) Free(gb gpu.Buffer) {
	b := gpu.Free[*Buffer](d.front, gb)
	if b.a.ptr != 0 {
		drv := d.g.l.drv
		if err := d.g.do(func() error { return drv.check(drv.cuMemFree(b.a.ptr), "cuMemFree") }); err != nil {
			// The context is broken (a kernel faulted): the memory is gone
			// with it; the accounting still releases it.
			d.def.fail(fmt.Errorf("gpu/cuda: free %q: %w", b.a.Tag.Purpose, err))
		}
	}
	d.front.Release(b.a.Allocation)
}

// MemStats returns the device's memory statistics.
func (d *Device) MemStats() gpu.MemStats { return d.front.MemStats() }

// ResetPeak sets every peak to the current in-use value.
func (d *Device) ResetPeak() { d.front.ResetPeak() }

// Counters returns the bytes moved on each link so far (counted when the
// copy is enqueued).
func (d *Device) Counters() gpu.LinkCounters {
	return gpu.LinkCounters{HostToDevice: d.h2d.Load(), DeviceToHost: d.d2h.Load(), DeviceToDevice: d.d2d.Load(), Collective: d.coll.Load()}
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
	d.h2d.Add(int64(len(src)))
	if len(src) == 0 {
		return
	}
	drv := d.g.l.drv
	s.run(func() error {
		return drv.check(drv.cuMemcpyHtoDAsync(dst.Ptr()+uint64(dstOffBytes), unsafe.Pointer(&src[0]), uint64(len(src)), s.h), "cuMemcpyHtoDAsync %d bytes", len(src))
	})
}

// CopyDeviceToHost enqueues cuMemcpyDtoHAsync of len(dst) bytes.
func (d *Device) CopyDeviceToHost(gs gpu.Stream, dst []byte, gsrc gpu.Buffer, srcOffBytes int64) {
	s, src := gpu.CopyOut[*Stream, *Buffer](d.front, gs, gsrc, srcOffBytes, len(dst))
	d.d2h.Add(int64(len(dst)))
	if len(dst) == 0 {
		return
	}
	drv := d.g.l.drv
	s.run(func() error {
		return drv.check(drv.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), src.Ptr()+uint64(srcOffBytes), uint64(len(dst)), s.h), "cuMemcpyDtoHAsync %d bytes", len(dst))
	})
}

// CopyDeviceToDevice copies n bytes with cuMemcpyAsync (unified
// addressing: src may be on another GPU). Copies between two logical
// devices count n bytes on d's DeviceToDevice link.
func (d *Device) CopyDeviceToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, gsrc gpu.Buffer, srcOffBytes int64, n int64) {
	s, dst, src := gpu.CopyAcross[*Stream, *Buffer](d.front, gs, gdst, dstOffBytes, gsrc, srcOffBytes, n)
	if src.dev != d {
		d.d2d.Add(n)
	}
	if n == 0 {
		return
	}
	drv := d.g.l.drv
	s.run(func() error {
		return drv.check(drv.cuMemcpyAsync(dst.Ptr()+uint64(dstOffBytes), src.Ptr()+uint64(srcOffBytes), uint64(n), s.h), "cuMemcpyAsync %d bytes", n)
	})
}
