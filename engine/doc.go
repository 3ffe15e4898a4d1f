// Package engine runs ZeRO stages 0-3 across the local devices: one rank per
// device, each a goroutine with a compute stream and a communication
// stream, the training step, the optimizer on the device or on the host
// (ZeRO-Offload). Its memory arithmetic, which `strata estimate`, the
// engine's Summary and its tests share, is package estimate.
//
// # The model (model.go)
//
// The engine trains a Model: the decoder the config's strata.model names
// (package model's GPT-2 and Llama family, through a thin adapter), or a
// model a Go program defines (Options.Model; strata.model is then left out
// or names it, and Options.Init is refused). Both go through the same
// methods: Layout (the chunks: everything below is per chunk), AccessOrder
// (the Params calls of one micro-batch, checked at New against the rules
// the hooks, the host optimizer's flush order and the workspace sizing
// rely on: checkAccessOrder), InitChunk, Vocab and MaxSeq (the batches'
// bounds), and New, which makes each rank's Instance: its activations and
// its Forward, Backward and Losses. A custom model's checkpoint records
// its name and tensors instead of a shape (checkpoint.LayoutChunks).
// docs/library.md is the guide for library users.
//
// # One step (Engine.Step)
//
// Every rank zeroes its gradients (stages 0-1), runs its A micro-batches
// (rank r's micro-batch k is the sampler's rows (r·A+k)·B onward, so the
// ranks' micro-batches in rank order are the global batch), each backward
// scaled by 1/(N·A). The model reaches memory only through the rank's
// model.Params hooks (hooks.go), the single place where:
//
//   - stage 3 AllGathers a chunk into a slot of the rank's gathered ring
//     at Acquire (and prefetches the next chunk of Model.AccessOrder), and
//     at Release records an event; a gathered chunk's slot goes back when
//     a new gather needs room (at most Options.MaxLiveChunks live), and
//     the gather into it waits for that event on the communication stream;
//     before each Acquire the rank waits until the compute of the chunk
//     acquired MaxLiveChunks before has run (PyTorch FSDP's
//     limit_all_gathers): the device still has the chunk in between queued,
//     and the rank does not lease param shards in HBM long before the
//     device reads them (run further ahead, its leases held the tier
//     store's HBM room and the accesses behind them waited for room);
//   - stages 0-1 reduce the accumulated gradient of a chunk at its last
//     GradReady: AllReduce(Sum) in place (stage 0), ReduceScatter(Sum) in
//     place into the rank's slice (stage 1);
//   - stages 2-3 hand out a full gradient bucket per chunk and micro-batch
//     (a slot of the bucket ring, zeroed on the compute stream after its
//     last reduction) and at GradReady ReduceScatter it into the rank's
//     persistent gradient shard (the first micro-batch writes the shard,
//     later ones add to it, as DeepSpeed does); the bucket's slot goes back,
//     its reduction as its last use, when the next bucket needs room (at
//     most one waits while the next fills);
//   - with cpu_checkpointing (the hooks are also the model's InputStore,
//     inputs.go) a checkpointed block's input goes to its host home in the
//     tier store after the block's forward and comes back, staged by the
//     planner into one of the store's HBM slots, for its backward.
//
// Activations: each rank's model keeps them as
// estimate.ActivationOptionsFromConfig says, allocated once at New; the
// Summary reports the measured peak beside estimate.Activations.
//
// Then each rank takes the sum of squares of its reduced gradient per chunk
// (with the host optimizer it also copies the shard once into its host copy
// in the tier store); the engine adds them chunk by chunk in rank order
// (stage 0: rank 0's whole chunk), clips like torch.nn.utils.clip_grad_norm_,
// stops with model.ErrNonFinite on a NaN or Inf loss or norm, and runs Adam
// on each rank's slice: gpu.Ops.AdamStep on the device, or cpuadam on the
// host on state leased from the tier store, writing the new bf16 params
// into their host copy in the store (offload_param) or into a pinned upload
// buffer that is copied to the device. Stages 1-2 (and persistent chunks) AllGather the
// updated slices in place. The next step's reads of chunk c wait only for
// chunk c's update (an event per chunk), not for the whole optimizer.
//
// Collectives are issued on the communication stream, in an order fixed by
// Model.AccessOrder and the chunk order, never by timing, so every rank
// issues the same ones. Host copies have two streams of their own (rank.go):
// uploads (the host optimizer's new params) and downloads (the reduced
// gradients to the tier store, the norms), ordered against the collectives
// by events, so that a copy never queues behind a collective's wait.
//
// # Memory of a step (workspace.go)
//
// A step allocates and frees no device memory: on a GPU a free waits for
// the whole device to go idle (and, while a collective's stream waits for
// another rank, for ever). New takes what the steps use, sized from the
// layout: the rings of gathered chunks (MaxLiveChunks slots of the largest
// padded chunk), gradient buckets (three of the largest trainable chunk)
// and reduce shards (A > 1), the gradient shards bound for the tier store
// (optimizer state on NVMe: two, or one per chunk when A > 1), the tier
// store's HBM slots (tier.Store.ReserveHBM: the param shards' copies and,
// with cpu_checkpointing, the restored block inputs') and the collectives'
// scratch (gpu.ScratchReserver); the backends' own scratch for ops grows
// in the first step and is kept. A slot given back carries the event of
// its last use; its next holder's first writer waits for it on its own
// stream. The devices count their driver allocations and frees
// (gpu.DriverCounters): Summary.PerDevice[].DeviceAllocsAfterStep1 stays
// 0, and a device that cannot hold the rings or slots is refused at New
// with the *gpu.OutOfMemoryError naming them.
//
// # The host optimizer under the next step (overlap.go)
//
// strata.overlap "exact" (the default) runs the host optimizer of step t
// under the devices' work of step t+1; "serial" keeps the schedule before
// it (the update inside Step, after the whole backward), as a reference.
// Both give the same bits: the same cpuadam calls on the same bytes.
// Exact splits each rank's update in three parts:
//
//  1. The rank's goroutine declares cpuadam's accesses to its tier.Runner
//     chunk by chunk, in the order the next forward first reads the chunks
//     (forwardOrder), and hands each chunk's leases to the rank's optimizer
//     goroutine (hostRun). When nothing the optimizer leases can leave
//     host RAM (every access a hit, no room needed) it leases every chunk
//     inside Step; else a window (hostWindow: one chunk less than the host
//     budget's staging room holds) inside Step and the rest in the next
//     pass, one more at each
//     chunk's flush (point 3) once the update a window back has given its
//     leases back, and any left before the backward's first gradient
//     write (waitHost): chunk c+1's reads are declared while chunk c
//     updates, and Step returns without waiting for cpuadam. Every lease
//     comes from the rank's goroutine at a point Model.AccessOrder fixes,
//     so each rank's accesses repeat step after step; from the third step
//     the planner's trace repeats (the first step has no pending update in
//     its forward, so the second differs from it: TierStats.Divergences).
//     A settle between steps (a checkpoint, Params, an evaluation) leases
//     the rest outside any step, so the planner re-records at the two
//     steps after it.
//  2. The optimizer goroutine runs cpuadam chunk by chunk into the upload
//     staging (or, with offload_param, the param's host copy in the store),
//     ends the chunk's leases and closes its ready channel. It does host
//     work only: no stream, no collective.
//  3. The rank's goroutine enqueues chunk c's device side (the upload, the
//     AllGather at stages 1-2 and of persistent chunks, paramReady[c])
//     when the next step first needs chunk c: at the Acquire of a
//     replicated chunk, or before the gather of a sharded one (flushChunk,
//     called from the hooks also after a failure, when they drain), and at
//     the end of the rank's pass for any chunk left (finishRun). These
//     points are fixed by Model.AccessOrder, so every rank issues the
//     same collectives in the same order. One exception is timed, and it
//     issues no different collectives: the stage-3 prefetch of the next
//     chunk at an Acquire is skipped while that chunk is still in cpuadam
//     (waiting would hold back the acquired chunk's compute); its gather is
//     then issued at its own Acquire, and in a forward nothing but gathers
//     lie between the two, so the sequence of collectives is the same.
//
// The gradient's host copy is written again in the next backward; the rank
// waits for its optimizer goroutine to end before that write (waitHost).
// Everything that reads or writes params or optimizer state outside a
// step (Params, Master, MasterChunks, checkpoints save and load, the
// timeline, Close) first calls settle, which finishes every rank's pending
// update (in forward order) and waits for the devices. A tier fault while
// leasing inside Step is returned by that Step, as in serial; one while
// leasing in the next pass is kept for its chunk (not updated); the
// update's errors are kept per chunk and returned again by the next Step (its
// pass, finishRun) or by settle (Params, checkpoints), naming the
// optimizer step, chunk, rank, state and file; Close drains the update
// without repeating it. A NaN or Inf loss or norm stops the step before any
// update is issued, as before.
//
// During the backward (overlap_bwd.go): with gradient_clipping 0 or absent
// and the optimizer state in host RAM, a chunk's update does not depend on
// the global norm, so the rank hands chunk c to its step's run in
// reduced(c) (a point Model.AccessOrder fixes; its leases are declared
// there), and cpuadam starts once the gradient's copy to host memory has
// completed, while the backward goes on with the chunks before it. A NaN
// or Inf anywhere in the step must still update nothing: before cpuadam
// writes a chunk's master, m and v during the backward the rank copies
// them (host memory the size of the rank's optimizer state, a note at New
// says how much) and keeps the chunk's leases until the step's verdict; a
// failed step (a hook's error, a non-finite loss or norm) waits for those
// updates, copies master, m and v back and drops the run (the new params
// were only written into the upload staging, which nothing uploads). No
// collective is added: the verdict is the norm every rank already has.
// Chunks whose new param is a tier-store state (offload_param) are updated
// after the norm, as with clipping on.
//
// Measured (whenever the host optimizer runs, with or without a Tracer):
// each rank logs its compute stream's chunk spans (the stream clock),
// cpuadam's runs and the optimizer-phase waits of its runner (the busy
// log of its timeline.Recorder);
// StepStats.HostOpt and Summary.HostOpt give cpuadam's busy time and the
// part of it during which the rank's compute stream was idle (exposed),
// and the same for the waits, summed over the ranks (timeline.Exposure,
// interval arithmetic). With exact a step reports the previous step's update, which
// ran under it. On the CPU backend the streams and cpuadam share the
// cores, so the step time cannot show the gain; the exposed fraction can.
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
// # Lifecycle and memory
//
// New validates the config, lays the chunks out, allocates each rank's
// model state (tagged gpu.ModelState, held until Close), its activations
// (Model.New, gpu.Activation) and the norms buffer, checks that the device
// budget leaves room for the worst-case workspace (gathered chunks, buckets)
// and takes it (the rings above), and initialises every chunk with
// Model.InitChunk(strata.seed), or from
// Options.Init (an imported model: a ChunkSource read one chunk at a time,
// each chunk's uploads to every rank's shards, in whatever tier they live,
// waited for before the next is read, so host memory holds one padded
// chunk whatever the model's size). With the
// host optimizer it starts one cpuadam.Optimizer and the tier store that
// holds its state (below). Step and Run are called from one goroutine;
// Params and Master synchronize and read the shards from where they live,
// as a checkpoint does (MasterChunks hands them over one chunk at a time,
// for exports of models larger than host memory); Summary
// reports measured peaks next to estimate.Memory; SaveCheckpoint and
// LoadCheckpoint (checkpoint.go) write and read every rank's params,
// master, m, v and the step through checkpoint/ (an engine whose store
// moves shards, under offload_param or NVMe offload, is restored before its
// first step); with Options.Trace every step records
// its timeline (package timeline: Chrome trace events, the stream clocks,
// Overlap's exposed transfer time; trace.go: WriteTrace); Close frees
// everything.
// Model state lives in one of two places: each rank's device buffers
// (devState, state.go: params, gradients, and the device optimizer's
// master, m, v) and, with the host optimizer, the tier store (tiered.go).
// Close stops the runners, closes the store, removes the swap files and
// frees the pinned pools.
//
// # Residency of the host optimizer's state (tiered.go)
//
// With the optimizer on the host, ZeRO-Offload (offload_optimizer cpu,
// stages 1-3) and ZeRO-Infinity (stage 3 with offload_param cpu|nvme or
// offload_optimizer nvme) are one system: the engine runs one tier.Store
// for all ranks and one prefetch.Planner per rank (each rank's accesses are
// a fixed sequence, so its trace repeats exactly; a shared planner would
// see the ranks interleaved by timing). Registered per (chunk, rank), each
// the rank's shard: master, adam_m, adam_v (f32), the reduced gradient (as
// the device holds it), and the bf16 param shard of every sharded chunk
// when offload_param is set. Homes: params in offload_param's tier;
// optimizer state in host RAM, or with offload_optimizer nvme on NVMe
// except what strata.host_budget keeps in RAM (whole shards, master then m
// then v, chunk order: the split estimate.Memory prints); the gradient in
// host RAM before any optimizer state, or on NVMe where the host budget is
// full. The param copies the store stages in HBM live in its HBM slots,
// taken at New. With offload_optimizer cpu and no offload_param every home is in
// host RAM and nothing is ever evicted (no NVMe tier, and the planners'
// budget holds every home): each access is a hit and the planner only
// records and leases. The gradient is copied once into its host copy (a
// Write access in backward, on the download stream) and read by cpuadam
// from the store; with the optimizer state on NVMe the device holds it for
// its reduction only (a slot of the gradient ring), given back when that
// copy is done. Persistent chunks stay gathered on the devices.
//
// The new params of the chunks the device holds (every chunk without
// offload_param, the persistent ones with it) are not a store state: cpuadam
// writes them into a pinned upload buffer per (chunk, rank), a plain
// staging area of the tiers object with its own pool, copied to the device
// on the upload stream (the pool also holds each rank's norms, downloaded
// every step). Both pinned pools are registered with the devices
// (Options.HostRegistrar) and the outcome is in the Summary
// (HostRegistration). They are the optimizer's output on its way
// up, not model state; keeping them out of the store keeps them out of
// strata.host_budget and out of the planners' traces, as before the store
// held ZeRO-Offload's state (Summary.HostStagingBytes reports them).
//
// Budgets (tier.PlanBudgets): the tier store's HBM share is what each
// device has left after model state, activations and workspace (at most
// the rank's param shards, and with its HBM slots inside what is left;
// Options.TierHBMBytes overrides), plus room for two restored block inputs
// with cpu_checkpointing; its host budget
// is the homes in RAM plus staging room for TierReadAhead chunks
// (HostStagingBytes) plus one spare shard per rank, or 4/5 of
// strata.host_budget when given (TierHostBudget: the pinned pool is the
// whole budget, the rest absorbs fragmentation); each rank's planner gets
// its share. A store whose shards never leave their host homes
// (ZeRO-Offload) needs no spare or staging room: its budget is the homes
// and its pool the homes plus the pinned arenas' ends. NVMe: one swap file per nvme_path (the union of
// offload_param's and offload_optimizer's), striped in aio.block_size
// units, aio.queue_depth × thread_count requests in flight.
//
// Driving: each rank's model.Params hooks and optimizer declare every
// access to the rank's tier.Runner (params read in HBM before their gather,
// in forward and backward; master, m, v updated and the new param written
// in host memory by cpuadam; a saved block input written in host memory in
// forward and read in HBM in backward) and receive a lease (Use), which they end when
// the compute that reads it has completed (Done with an event: the runner
// releases it the moment the event completes, so the room goes back to the
// planner then, not at the rank's next access). The runner, in tier, runs
// the planner against the store: it reaps completed moves, feeds them to
// the planner, and issues the moves the planner asks for when they fall due
// (WakeAt), so prefetch runs ahead of the compute and across the step
// boundary; the optimizer's read-ahead and write-behind of more than one
// chunk are the planner's moves within the host budget. The
// first step records the trace; a step that diverges falls back to
// on-demand moves and re-records (the planner's rule).
//
// Faults: a move that fails (an NVMe read error, a checksum mismatch, a
// write error) stops the rank: the step returns the store's error, which
// names the shard (chunk, rank, state), the move and, from nvme, the file
// and offset; every later Step fails too. Nothing is replaced by zeros or
// stale data.
//
// # Errors inside a pass
//
// The hooks return errors (a failed fetch; device memory exhausted where a
// ring must grow past what New took, which model.AccessOrder never asks
// for: the gpu's out-of-memory error, which names the purpose), and the
// model stops its pass at the first. The
// failed rank still issues every collective its peers issue, on a scratch
// buffer, to the end of the step (hooks.go says how), so the peers do not
// hang; the step then returns one error, "engine: step S: rank R: " and
// the cause naming the chunk and state (and, from nvme, the file), before
// the optimizer: nothing is updated. A move that failed during the pass
// without a hook waiting for it fails the step there too. After a device
// OOM the next Step runs normally; after a tier fault it fails. A fault
// that first shows in the optimizer phase stops the ranks that see it, but
// a rank that does not may already have updated its shards.
//
// Every step reports the planners' hits, late, missed and dependent
// accesses (prefetch.Stats.Dependent: a forward's read of a param the
// pipelined update had just written), the time
// the ranks waited per access tier, the bytes per link and the peak bytes
// per tier against their budgets (StepStats.Tier), and the optimizer time.
//
// # Data and evaluation (data.go, eval.go)
//
// A step's rows come from a model.Sampler of random windows over a raw
// corpus (Options.Corpus) or from a Dataset of packed examples
// (Options.Dataset, data.Packed), read by global row index: step t reads
// rows (t-1)·G .. (t-1)·G+G-1, rank r's micro-batch k the B rows from
// (r·A+k)·B, so every split of the global batch reads the same rows. Eval
// runs the forward pass alone over an EvalSet, through the same hooks
// (hooks.beginEval: the forward's part of model.AccessOrder), after
// completing the pending host update; it changes no training state.
//
// # Frozen chunks (freeze.go)
//
// estimate.FrozenChunks resolves strata.freeze's patterns to whole
// chunks. A frozen chunk
// keeps its params, which move as params (gathers, tier-store reads),
// and nothing else: no gradient buffer or shard, no reduction, no master,
// m, v, no tier-store state but its param, no upload staging, no update,
// no share of the global norm. The model still calls Grad and GradReady
// for it: Grad returns a scratch of the largest frozen chunk (one per
// rank, Workspace, allocated at New) that its parameter-gradient GEMMs
// write and nothing reads; GradReady does nothing. The Summary reports the
// frozen chunks and the model state they do not keep (estimate.Memory).
// A checkpoint saves a frozen chunk's params, as master its params widened
// and zero m and v; a checkpoint in which a chunk that trains here was
// frozen is refused (its optimizer state is not in it).
//
// "dpu" (overlap_dpu.go), the delayed parameter update of the ZeRO-Offload
// paper: after strata.dpu_warmup_steps exact steps, step t+1's pass reads
// the params step t read (updated with step t-1's gradient) while the host
// updates them with step t's gradient, and the end of the pass uploads them (finishRun, in forward
// order on every rank, after the pass's compute). With offload_param the
// new params wait in the pinned staging too (2 bytes a param beyond the
// host budget) and the end of the pass writes them into the tier store
// (storeDelayed). It needs the host optimizer and bf16 (New refuses it
// otherwise with ErrNotBuilt: in fp32 the params are the master weights,
// and under dpu they lag the update, so a checkpoint could not hold the
// pending one). With state that can leave host RAM the delayed update
// leases its window inside Step and one more chunk at each flush of the
// next pass from the one that lets its cpuadam go (the first of them may
// wait for the update of the chunk a window back). A checkpoint holds the devices' (or the
// store's) params and the updated master, m, v; the upload it owes is
// master rounded to the params' dtype (what cpuadam writes), rebuilt at
// restore, so resume is bit-identical.
package engine
