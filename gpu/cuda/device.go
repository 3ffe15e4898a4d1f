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
	index int
	g     *gpuCtx
	b     *Backend
	mem   *gpu.Budget
	ops   *Ops
	def   *Stream

	h2d, d2h, d2d, coll atomic.Int64
}

// Index returns the device's rank in its backend.
func (d *Device) Index() int { return d.index }

// Name returns "cuda:<index> (<GPU name>, GPU <ordinal>)".
func (d *Device) Name() string {
	return fmt.Sprintf("cuda:%d (%s, GPU %d)", d.index, d.g.name, d.g.ordinal)
}

// GPU returns the ordinal of the physical GPU the device runs on.
func (d *Device) GPU() int { return d.g.ordinal }

type allocation struct {
	ptr       uint64
	sizeBytes int64
	tag       gpu.Tag
	freed     atomic.Bool
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
func (b *Buffer) DeviceIndex() int { return b.dev.index }

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
	if off < 0 || n < 0 || off+n > b.n {
		panic(fmt.Sprintf("gpu/cuda: slice [%d, %d) of a buffer of %d elements", off, off+n, b.n))
	}
	return &Buffer{dev: b.dev, a: b.a, dt: b.dt, off: b.off + off, n: n, view: true}
}

// Tag returns what the allocation behind b is for.
func (b *Buffer) Tag() gpu.Tag { return b.a.tag }

// Alloc reserves n zeroed elements of dt against the budget, then takes
// them with cuMemAlloc. A request past the budget, or one the GPU itself
// cannot hold, returns *gpu.OutOfMemoryError.
func (d *Device) Alloc(n int, dt gpu.DType, tag gpu.Tag) (gpu.Buffer, error) {
	if n < 0 {
		panic(fmt.Sprintf("gpu/cuda: alloc of %d elements", n))
	}
	if int(tag.Kind) >= gpu.KindCount {
		panic(fmt.Sprintf("gpu/cuda: alloc with unknown kind %d", tag.Kind))
	}
	raw := int64(n) * int64(dt.Size())
	size := (raw + granularityBytes - 1) / granularityBytes * granularityBytes
	if err := d.mem.Reserve(size, tag); err != nil {
		return nil, err
	}

	a := &allocation{sizeBytes: size, tag: tag}
	if raw > 0 {
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
			d.mem.Release(size, tag)
			if res == cudaOutOfMemory {
				return nil, d.mem.OutOfMemory(size, tag)
			}
			return nil, fmt.Errorf("gpu/cuda: alloc %d bytes for %q on %s: %w", size, tag.Purpose, d.Name(), err)
		}
	}
	return &Buffer{dev: d, a: a, dt: dt, n: n}, nil
}

// Free releases a buffer returned by Alloc (cuMemFree waits for the work
// in flight on the GPU). Freeing a view or freeing twice panics.
func (d *Device) Free(gb gpu.Buffer) {
	b, ok := gb.(*Buffer)
	switch {
	case !ok:
		panic(fmt.Sprintf("gpu/cuda: free of a foreign buffer %T", gb))
	case b.dev != d:
		panic(fmt.Sprintf("gpu/cuda: free on %s of a buffer of %s", d.Name(), b.dev.Name()))
	case b.view:
		panic("gpu/cuda: free of a view")
	case !b.a.freed.CompareAndSwap(false, true):
		panic(fmt.Sprintf("gpu/cuda: double free of %q", b.a.tag.Purpose))
	}
	if b.a.ptr != 0 {
		drv := d.g.l.drv
		if err := d.g.do(func() error { return drv.check(drv.cuMemFree(b.a.ptr), "cuMemFree") }); err != nil {
			// The context is broken (a kernel faulted): the memory is gone
			// with it; the accounting still releases it.
			d.def.fail(fmt.Errorf("gpu/cuda: free %q: %w", b.a.tag.Purpose, err))
		}
	}
	d.mem.Release(b.a.sizeBytes, b.a.tag)
}

// MemStats returns the device's memory statistics.
func (d *Device) MemStats() gpu.MemStats { return d.mem.Stats() }

// ResetPeak sets every peak to the current in-use value.
func (d *Device) ResetPeak() { d.mem.ResetPeak() }

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

func (d *Device) buf(gb gpu.Buffer, what string) *Buffer {
	b := anyBuf(gb, what)
	if b.dev != d {
		panic(fmt.Sprintf("gpu/cuda: %s is on %s, not %s", what, b.dev.Name(), d.Name()))
	}
	return b
}

func anyBuf(gb gpu.Buffer, what string) *Buffer {
	b, ok := gb.(*Buffer)
	if !ok || b == nil {
		panic(fmt.Sprintf("gpu/cuda: %s is not a gpu/cuda buffer (%T)", what, gb))
	}
	if b.a.freed.Load() {
		panic(fmt.Sprintf("gpu/cuda: %s (%q) was freed", what, b.a.tag.Purpose))
	}
	return b
}

func (d *Device) stream(gs gpu.Stream) *Stream {
	s, ok := gs.(*Stream)
	if !ok || s == nil {
		panic(fmt.Sprintf("gpu/cuda: stream is not a gpu/cuda stream (%T)", gs))
	}
	if s.dev != d {
		panic(fmt.Sprintf("gpu/cuda: stream of %s used on %s", s.dev.Name(), d.Name()))
	}
	return s
}

func checkRange(what string, off, n, size int64) {
	if off < 0 || n < 0 || off+n > size {
		panic(fmt.Sprintf("gpu/cuda: %s range [%d, %d) outside %d bytes", what, off, off+n, size))
	}
}

// CopyHostToDevice enqueues cuMemcpyHtoDAsync. src must stay valid and
// unchanged until the copy completes; from pageable memory the driver
// stages it and the call returns once src has been read.
func (d *Device) CopyHostToDevice(gs gpu.Stream, gdst gpu.Buffer, dstOffBytes int64, src []byte) {
	s, dst := d.stream(gs), d.buf(gdst, "copy destination")
	checkRange("host-to-device destination", dstOffBytes, int64(len(src)), dst.Bytes())
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
	s, src := d.stream(gs), d.buf(gsrc, "copy source")
	checkRange("device-to-host source", srcOffBytes, int64(len(dst)), src.Bytes())
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
	s, dst, src := d.stream(gs), d.buf(gdst, "copy destination"), anyBuf(gsrc, "copy source")
	checkRange("device-to-device destination", dstOffBytes, n, dst.Bytes())
	checkRange("device-to-device source", srcOffBytes, n, src.Bytes())
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
