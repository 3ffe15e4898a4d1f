package gpu

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
)

// DType re-exports the element types a Buffer can hold.
type DType = dtype.DType

const (
	F32  = dtype.F32
	BF16 = dtype.BF16
	I32  = dtype.I32
	F64  = dtype.F64
	F16  = dtype.F16 // IEEE binary16: fp16 mixed precision
	// U8 is bytes: a buffer of packed codes (NF4 or INT8 weights, Dequantize)
	// whose layout an op defines.
	U8 = dtype.U8
)

// NF4 and INT8 name the coded formats of Dequantize (dtype.Codecs: internal/nf4,
// internal/absmax8): a U8 buffer of their Bytes(n) holds one on a device.
const (
	NF4  = dtype.NF4
	INT8 = dtype.INT8
)

//go:generate go tool stringer -type=Kind -linecomment -output=kind_string.go

// Kind classifies an allocation for memory accounting. The engine reports the
// peak of model-state bytes (params, grads, optimizer state) separately from
// activations and workspace, so every allocation says which it is.
type Kind uint8

const (
	// ModelState: parameters, gradients, master weights, Adam moments
	ModelState Kind = iota // model-state
	// Activation: saved activations and their gradients
	Activation // activation
	// Workspace: temporaries: gathered chunks, buckets, scratch
	Workspace // workspace
	kindCount
)

// KindCount is the number of allocation kinds.
const KindCount = int(kindCount)

// Tag says what an allocation is for: its kind and a short purpose
// ("param chunk 3", "grad bucket", "attn probs").
type Tag struct {
	Kind    Kind
	Purpose string
}

// Buffer is device memory: a typed, contiguous run of elements. A Buffer may
// be a view (Slice) of a larger allocation; views share memory and are never
// freed themselves.
type Buffer interface {
	DType() DType
	Len() int                // elements
	Bytes() int64            // Len() * DType().Size()
	DeviceIndex() int        // the device that owns the memory
	Slice(off, n int) Buffer // elements [off, off+n) as a view; panics when out of range
}

// MemStats describes the memory of one device. Bytes are rounded to the
// device's allocation granularity.
type MemStats struct {
	BudgetBytes    int64
	InUseBytes     int64
	PeakBytes      int64
	InUseByKind    [KindCount]int64
	PeakByKind     [KindCount]int64 // peak of each kind on its own
	InUseByPurpose map[string]int64 // current bytes per Tag.Purpose
}

func (m MemStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "in use %s of %s (peak %s)", units.FormatBytes(m.InUseBytes), units.FormatBytes(m.BudgetBytes), units.FormatBytes(m.PeakBytes))
	for k := Kind(0); k < kindCount; k++ {
		fmt.Fprintf(&b, "; %s %s (peak %s)", k, units.FormatBytes(m.InUseByKind[k]), units.FormatBytes(m.PeakByKind[k]))
	}
	purposes := make([]string, 0, len(m.InUseByPurpose))
	for p := range m.InUseByPurpose {
		purposes = append(purposes, p)
	}
	sort.Slice(purposes, func(i, j int) bool { return m.InUseByPurpose[purposes[i]] > m.InUseByPurpose[purposes[j]] })
	if len(purposes) > 0 {
		b.WriteString("; by purpose:")
		for _, p := range purposes {
			fmt.Fprintf(&b, " %s=%s", p, units.FormatBytes(m.InUseByPurpose[p]))
		}
	}
	return b.String()
}

// OutOfMemoryError is returned by Device.Alloc when the budget cannot hold a
// request. It carries the device's statistics at the moment of failure.
type OutOfMemoryError struct {
	Device         int
	RequestedBytes int64
	Tag            Tag
	Stats          MemStats
}

func (e *OutOfMemoryError) Error() string {
	return fmt.Sprintf("gpu: device %d out of memory: %s for %s %q does not fit: %s",
		e.Device, units.FormatBytes(e.RequestedBytes), e.Tag.Kind, e.Tag.Purpose, e.Stats)
}

// LinkCounters count bytes moved on each link since the device was created.
type LinkCounters struct {
	HostToDevice   int64
	DeviceToHost   int64
	DeviceToDevice int64 // copies between buffers of different devices
	Collective     int64 // bytes this device sent in collectives
	// HostToDevicePageable and DeviceToHostPageable are the bytes of
	// HostToDevice and DeviceToHost whose host memory was not registered
	// with the backend (HostRegistry): on a GPU such copies are staged by
	// the driver and do not overlap.
	HostToDevicePageable int64
	DeviceToHostPageable int64
}

// DriverCounters count the device's calls that take memory from its
// driver or give it back (gpu/cuda: cuMemAlloc, cuMemAllocAsync, cuMemFree,
// cuMemFreeAsync; gpu/cpu: the Go allocations behind Alloc and the
// collectives' scratch), since the device was created. A training step
// that takes all its memory from rings sized at start adds none: on a GPU
// a free waits for the device to go idle.
type DriverCounters struct {
	Allocs, Frees int64
}

// Total is Allocs + Frees.
func (c DriverCounters) Total() int64 { return c.Allocs + c.Frees }

// Device is one accelerator. All methods are safe for concurrent use.
type Device interface {
	Index() int
	Name() string

	// Alloc reserves n elements of dt against the byte budget. Memory is
	// zeroed. It returns *OutOfMemoryError when the budget cannot hold it.
	Alloc(n int, dt DType, tag Tag) (Buffer, error)
	// Free releases a buffer returned by Alloc (not a view). Work queued on
	// streams that uses it must have completed; freeing twice panics.
	Free(b Buffer)
	MemStats() MemStats
	// ResetPeak sets every peak to the current in-use value.
	ResetPeak()

	// DefaultStream is the stream ops use when the caller has no other.
	DefaultStream() Stream
	NewStream() Stream
	NewEvent() Event

	// Asynchronous copies, ordered on s. Host memory should be pinned
	// (pinned.Pool) for copies to overlap on a real GPU; it must stay valid
	// and unchanged until the copy completes. Offsets and lengths are bytes.
	CopyHostToDevice(s Stream, dst Buffer, dstOffBytes int64, src []byte)
	CopyDeviceToHost(s Stream, dst []byte, src Buffer, srcOffBytes int64)
	// CopyDeviceToDevice copies n bytes; src may live on another device.
	CopyDeviceToDevice(s Stream, dst Buffer, dstOffBytes int64, src Buffer, srcOffBytes int64, n int64)

	Ops() Ops
	Counters() LinkCounters
	// DriverCounters returns the device's driver allocations and frees so far.
	DriverCounters() DriverCounters
}

// Stream is an in-order queue of work on one device. Work is enqueued
// without blocking the caller.
type Stream interface {
	// Record marks the current end of the queue in e.
	Record(e Event)
	// Wait makes later work on this stream wait until e has completed. e
	// may belong to a stream of any device.
	Wait(e Event)
	// Synchronize blocks until all queued work has completed and returns
	// the first error any of it raised since the last Synchronize.
	Synchronize() error
}

// Event marks a point in a stream.
type Event interface {
	// Synchronize blocks until the recorded work has completed. An event
	// that was never recorded is complete.
	Synchronize()
	// Done reports whether the recorded work has completed, without blocking.
	Done() bool
}

// BusyStream is a Stream that counts the time it spent running its work,
// its waits for events excluded: the CPU backend's streams. An engine sums
// it over a step to tell compute from waiting (a compute span bracketed by
// events also holds the waits enqueued inside it).
type BusyStream interface {
	Stream
	// Busy is the total time the stream ran work since it was created.
	Busy() time.Duration
}

// TimedEvent is an Event that knows when the work it recorded completed,
// on the host clock: the CPU backend stamps it as its stream reaches it,
// the CUDA backend adds the device time since an anchor event
// (cuEventElapsedTime) to the host time the anchor completed.
// Timelines use it where a backend offers it; other events are timed by a
// host goroutine that waits on them, late by its wake-up (on a busy host,
// by as long as the other goroutines keep every core).
type TimedEvent interface {
	Event
	// CompletedAt is when the recorded work completed; false while it has
	// not, or when the event was never recorded.
	CompletedAt() (time.Time, bool)
}
