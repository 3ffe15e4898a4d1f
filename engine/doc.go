// Package engine runs the training step of ZeRO stages 0-3 across the local
// devices.
//
// One rank per device, each a goroutine with a compute stream, a
// communication stream and two copy streams; the optimizer on the device or
// on the host (ZeRO-Offload, ZeRO-Infinity). In a job of several processes
// (Options.Procs, procs.go) each process runs its devices' ranks as global
// ranks of the job, with its own tier store and host optimizer, and the
// few host values ranks read from each other are exchanged. docs/DESIGN.md ("One training
// step", "Memory rules") is the design in tables; this is where each part
// of it lives. The memory arithmetic is package estimate, the timeline
// package timeline.
//
// # The model (model.go)
//
// The engine trains a Model: the decoder the config's strata.model names
// (package model's GPT-2 and Llama family, through a thin adapter), or a
// model a Go program defines (Options.Model; docs/library.md). Layout gives
// the chunks (everything below is per chunk), AccessOrder the Params calls
// of one micro-batch (checked at New: model.CheckAccessOrder), InitChunk the
// initial weights, New each rank's Instance (activations, Forward,
// Backward, Losses).
//
// # Modes are chosen once, in New
//
// The configuration space (stage × where the optimizer and params live ×
// overlap) is resolved in New into small strategies the step calls, so
// the step's code does not test the configuration:
//
//   - updater (update.go): the optimizer: deviceUpdate, serialUpdate,
//     pipelinedUpdate (exact, and dpu past its warm-up), backwardUpdate
//     (strata.update_in_backward);
//   - paramPath (params.go), per chunk: resident, gathered after each
//     update (stages 1-2, stage 3's persistent chunks), or tiered (a
//     tier-store state under offload_param);
//   - gradPath (stages.go): the stage's gradient: all-reduced in place
//     (0), reduce-scattered in place (1), or in buckets every micro-batch
//     (2-3);
//   - the rest is data laid out in New: each chunk's optimizer slice
//     (chunkPlan.opt), the ranks that make the norm, the host optimizer's
//     lease window, the failed step's scratch ring. A nil *tiers (no tier
//     store) and a nil timeline.Recorder (no timeline) do nothing.
//
// # One step (Engine.Step, rank.go, hooks.go)
//
// Every rank zeroes what its micro-batches accumulate into, runs its A
// micro-batches (rank r's micro-batch k is the global batch's rows from
// (r·A+k)·B), each backward scaled by 1/(N·A). The model reaches memory
// only through the rank's model.Params hooks: Acquire/Release (stage 3
// gathers into a slot of the gathered ring, at most MaxLiveChunks live,
// prefetching the next chunk; a tiered shard is leased in HBM from the
// tier store for its gather), Grad/GradReady (the gradPath). With
// cpu_checkpointing the hooks are also the model's InputStore (inputs.go).
// Then each rank takes its reduced gradient's sum of squares per chunk and
// hands the gradient to the updater (the host optimizer copies it into its
// host copy in the tier store); the engine adds the sums in rank order,
// clips like torch.nn.utils.clip_grad_norm_, stops with
// model.ErrNonFinite on a NaN or Inf loss or norm before any update (in
// fp16 the step is skipped instead and the loss scale moves: fp16.go), and
// calls the updater. The next step's reads of chunk c wait only for chunk
// c's update (paramReady, an event per chunk). Collectives are issued on
// the communication stream in an order Model.AccessOrder fixes, never by
// timing, so every rank issues the same ones.
//
// # The host optimizer (pending.go, overlap.go, overlap_bwd.go, overlap_dpu.go)
//
// "exact" (the default) runs step t's host update under step t+1's
// devices' work: the rank declares each chunk's state to the tier store
// in the next forward's order (a window inside Step, the rest at points of
// the next pass the access order fixes) and goes on, a goroutine waits for
// each chunk's state (tier.Runner.Await) and runs cpuadam chunk by chunk, and the
// rank publishes chunk c's new params when the next pass first needs it
// (flushChunk) or at its end (finishRun). "serial" updates inside Step,
// the reference; both give the same bits. "dpu" lets the next pass read
// the old params while cpuadam runs. With update_in_backward a chunk's
// update starts as soon as its gradient is on the host, as if the step were
// not clipped, and a step that turns out non-finite or clipped is undone
// (a clipped one then updated after the backward). docs/DESIGN.md ("The host optimizer's
// schedules") has each rule and why. Whatever reads or writes params or
// optimizer state between steps calls settle first.
//
// A rank's pending update of step t is a pendingUpdate (pending.go), a
// small state machine: handing (the backward hands it chunks) -> leasing
// (pending: chunks leased window by window) -> leased (every chunk handed
// to cpuadam) -> computed (cpuadam done, device side owed) -> finished;
// handing -> aborted (a non-finite or clipped step, undone); computed -> dropped (a
// restore). Its schedule (exactSchedule, or dpu's delayedSchedule) is
// fixed when it starts, and the master and moments formats (master.go)
// once in New: no site re-tests the configuration.
//
// # Memory (state.go, workspace.go, tiered.go, staging.go)
//
// A rank's model state on its device is devState (per chunk: params,
// gradients and, with the device optimizer, master, m, v), allocated at New
// and tagged gpu.ModelState. A step allocates no device memory: New takes
// the rings it uses (gathered chunks, gradient buckets, reduce shards, the
// NVMe-bound gradient shards), the tier store's HBM slots and the
// collectives' scratch; Summary.PerDevice[].DeviceAllocsAfterStep1 stays 0.
// With the host optimizer, or with cpu_checkpointing, one tier.Store for
// all ranks holds master, m, v, the reduced gradient, the tiered param
// shards and the saved block inputs, and one prefetch.Planner per rank
// plans their moves through the rank's tier.Runner (the engine declares
// accesses with Use and ends them with Done; it handles no move). The new
// params of chunks the devices hold go up through a pinned upload staging
// outside the store. Budgets: tier.PlanBudgets (docs/DESIGN.md, "Budgets
// per tier"). Before New allocates anything, preflight.go refuses what the
// host cannot give: strata.host_budget, or without it the pool the layout
// needs, with the upload staging, above MemAvailable, past the room
// RLIMIT_AS leaves the process, or above RLIMIT_MEMLOCK where the lock is
// required; and on
// each nvme_path it removes the swap files of killed runs (a note says
// what came back) and refuses a path short of the swap's room.
//
// # Numerics
//
// With A = 1 every stage, N and optimizer placement gives bits identical
// to model.Trainer with Ranks = N: the Comm sums ranks in order in fp32 and
// rounds once, as the Trainer's Cast→Axpy→Cast; Adam is elementwise and the
// device and host paths call the same cpuadam kernels. With A > 1, stages
// 0-1 stay identical; stages 2-3 reduce every micro-batch into a bf16 shard,
// a different grouping of the sum (tests bound it). With clipping on,
// sharded stages sum the squares per shard, a different float64 grouping
// of the norm (relative 1e-15; tests bound it).
//
// # Errors
//
// The hooks return errors (a failed fetch, a device out of memory where a
// ring would have to grow) and the model stops its pass at the first; the
// failed rank still issues every collective its peers issue, on a scratch
// buffer, so they do not hang, and the step returns one error ("engine:
// step S: rank R: " and the cause naming chunk, state and, from NVMe, file)
// before any update. A tier fault fails every later Step; nothing is
// replaced by zeros or stale data. A fault that first shows in the
// optimizer phase stops the ranks that see it; a rank that does not may
// already have updated its shards.
//
// # Checkpoints, data, evaluation, frozen chunks
//
// Options.Init (a ChunkSource: an imported model) is read one chunk at a
// time into every rank's shards, wherever they live, so host memory holds
// one padded chunk whatever the model's size. SaveCheckpoint and
// LoadCheckpoint (checkpoint.go) write and read every
// rank's params, master, m, v and the step through package checkpoint,
// from the devices or the tier store (its WriteHome and ReadNewest). A
// step's rows come from a random-window sampler over a corpus or from a
// Dataset of packed examples, read by global row index (data.go); Eval
// runs the forward alone over an EvalSet through the same hooks (eval.go).
// A frozen chunk (freeze.go, estimate.FrozenChunks) keeps its params only:
// no gradient, reduction, optimizer state, update or share of the norm.
package engine
