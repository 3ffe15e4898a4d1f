// Package timeline records what a training run's streams, transfers and
// host optimizer did, and when.
//
// A Tracer (handed to an engine as engine.Options.Trace) records what every rank's streams,
// the runners' tier-store moves and the host optimizer did, and when, as
// Chrome trace events (ph "X" complete events, ts and dur in µs), so that
// Perfetto (ui.perfetto.dev) or chrome://tracing can show the overlap of
// compute, collectives and transfers. Off (nil) it costs one nil check per
// hook: every method of a nil Recorder does nothing.
//
// # Tracks
//
// Tracks (pid, tid):
//
//	pid 0         "engine"       tid 0 steps: "step N" from the first rank's
//	                             backward to the last rank's optimizer end
//	pid 1+r       "device r"     tid 1 compute stream: "fwd|bwd <chunk>" from
//	                             the Acquire to the Release of a chunk, as the
//	                             stream runs it; "adam <chunk> (device)"
//	                             tid 2 comm stream: "allgather", "reducescatter",
//	                             "allreduce", "grad to host", "upload"
//	                             tid 3 shard waits: the rank waiting in
//	                             tier.Runner.Use for a shard to reach a tier
//	                             tid 4 optimizer: the rank's optimizer phase
//	                             tid 5 cpu adam: cpuadam on one chunk shard
//	                             tid 7 optimizer-state waits: cpuadam waiting
//	                             for a chunk's master, m, v, gradient or param
//	                             copy to reach host memory (the rank declared
//	                             them and went on: not the devices' stall)
//	                             tid 200+k host->hbm, 300+k hbm->host: the
//	                             tier store's moves on the device's links
//	pid 1000      "nvme"         tid 100+k nvme->host (reads), 400+k
//	                             host->nvme (writes)
//
// Moves that overlap on one link (several in flight) go to lanes k = 0, 1,
// ... so that no track holds overlapping spans.
//
// # Clocks
//
// How the times are taken: stream spans (compute, comm) are bracketed by
// two gpu.Events recorded on the stream; a watcher goroutine per stream
// (streamClock, clock.go) waits for each event in stream order and
// takes its time: the backend's stamp where the event has one
// (gpu.TimedEvent: the CPU backend stamps it as its stream reaches it;
// the CUDA backend adds cuEventElapsedTime from an anchor event to the
// host time the anchor completed),
// else the host clock when the watcher sees it complete (late by the
// watcher's wake-up, never early). The span starts when the stream reached
// its first event (its waits satisfied, the work before it done) and ends
// when the stream has run its work, in the stream's order. Shard waits, cpuadam and the optimizer phase are host
// times around synchronous code on the rank's goroutine. A move spans from
// the runner's Submit (or, when it copies a copy still arriving, from that
// copy's arrival) to its completion (Submit plus tier.Op.Duration); bytes
// are what it put on the link (tier.Op.Bytes), so per link they add up to
// the store's counters.
//
// # Limits
//
// Not recorded: the model's compute outside a chunk's Acquire..Release (the
// embedding backward, the loss), moves the engine makes outside the
// planners (initial values, Params and Master reads), and individual NVMe
// requests (a move is one span however many requests it takes).
//
// Memory: at most Options.MaxEvents events are kept; later ones are
// counted in Dropped and the JSON says so.
//
// # Overlap
//
// Overlap (overlap.go) reads the exposed transfer time off the
// events: interval arithmetic on the spans, with no clock and no engine.
// Each rank's Recorder also keeps a busy log, with or without a Tracer:
// its compute stream's spans, cpuadam's runs and the optimizer-state
// waits; Take reads the host optimizer's exposed time off it (Exposure),
// by the same arithmetic.
package timeline
