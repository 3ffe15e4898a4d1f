// Package gpu defines the interfaces every accelerator backend implements:
// Device (memory against a byte budget, streams, events, copies), Ops (the
// kernels of a GPT training step and an Adam step) and Comm (collectives
// across the devices of one box).
//
// The interfaces are those a CUDA device can honour: all work is enqueued on
// streams and completes asynchronously; events order streams against each
// other; copies between host and device are explicit. Backends: gpu/cpu (real
// math in Go, runs everywhere) and, later, gpu/cuda. gpu/gputest is the
// conformance suite every backend must pass.
//
// Lifecycle: a backend constructor returns the devices and one Comm per
// device. Buffers from Device.Alloc are released with Device.Free after the
// streams that use them have completed. Memory is accounted per Tag (kind and
// purpose); MemStats and OutOfMemoryError say who uses what.
package gpu
