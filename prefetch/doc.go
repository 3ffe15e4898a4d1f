// Package prefetch is the trace-driven planner of the moves between tiers.
//
// It turns the recorded access trace of a training step, the per-tier byte
// budgets, the measured link bandwidths and the measured compute time of
// every access into moves (prefetch, demand, evict, write-back, alloc) that
// the tier store executes.
//
// # The arithmetic it rests on
//
// A 7B-parameter model has 14 GB of bf16 parameters. With parameters on
// NVMe, every step reads them at least once (forward) and, when HBM cannot
// keep them until backward, twice: 14-28 GB per step. At 2-6 GB/s per drive
// that is 2.3-14 s of reading, against a compute time per step of roughly
// 6·Ψ·tokens / FLOP/s = 6·7e9·16k tokens / 400 TFLOP/s ≈ 1.7 s on one H100.
// So NVMe-resident parameters are hidden only with several striped drives,
// a large batch, or HBM/host budgets that keep most of the trace resident;
// the planner's job is to hide what can be hidden and report the rest as
// predicted stall, not to make bandwidth appear.
//
// To hide the latency of a link, the transfer for an access must be in
// flight before the compute reaches it: bytes in flight = bandwidth × lead
// time. A 200 MB chunk shard over a 3 GB/s drive takes 67 ms; if a layer
// computes in 20 ms, the read must start 3-4 layers ahead, so 3-4 shards
// (600-800 MB) per rank are in flight or staged at any time, and that
// memory must come out of the host budget. This is why the prefetch depth
// is not a constant: each transfer is issued at its deadline (the sum of
// the compute of the accesses before it) minus its transfer time minus a
// slack, computed as late as possible per link (ALAP: a link serves one
// transfer at a time, so queued transfers push earlier ones earlier), and
// counted against its destination budget from issue until it is freed.
//
// ALAP holds memory no longer than needed, which matters only in a pool the
// trace overflows. Into a pool it does not overflow (homes plus one copy of
// everything the trace stages there fit the budget: typically HBM holding
// every param shard of the rank) a transfer is issued eagerly, as soon as
// its source is valid: the new params the optimizer writes in host memory
// go up to HBM right away instead of just before the next forward, which
// makes them immune to a late wake-up of the driver and to compute faster
// than the trace measured (Options.DisableEager restores ALAP everywhere).
// Into a pool the trace does overflow, a transfer is still issued early
// when it takes only free room that no access before its own needs: the
// candidates are walked in access order, summing the room each takes per
// pool, and while that prefix fits the free room nothing issued early can
// force an eviction before its own access. After the optimizer has made
// the HBM copies of the old params stale, this uploads the new ones into
// the room they left as soon as they are written.
//
// # What it owns
//
// A Planner holds a model of where every shard state is (its home tier,
// which is always allocated, plus cached copies, dirty or clean, in flight
// or pinned by an access in use) and the trace it plans from. It does no
// I/O, starts no goroutines and never reads the clock: time is an argument
// (a duration since any fixed origin the engine chooses).
//
// # Lifecycle
//
// New(residency, options) starts in recording mode (no trace: every access
// is fetched on demand) unless SetTrace loads one. A tier.Runner (one per
// rank, wired by the engine) then drives it from one goroutine at a time:
//
//	p.BeginStep(now)                     // at the start of every step
//	hit, moves, err := p.Access(a, now)  // before the compute uses a shard; pins it
//	p.Release(a.Key, now)                // when that compute is done (applies writes)
//	p.Completed(m, now)                  // when a transfer it issued lands
//	moves := p.Next(now)                 // after each of the above, and at WakeAt
//	moves := p.Confirm(a, now)           // conditional access a comes in this step
//	moves, err := p.Skip(a, now)         // conditional access a, next, does not
//
// A conditional access (shard.Access.Conditional: a mixture of experts'
// expert, read only by the steps whose tokens reach it) keeps its place in
// the trace, but the plan moves nothing for it until the step confirms it;
// a step that does not need it skips it in its place, which is not a
// divergence (the recording keeps it, with no compute of its own).
//
// Moves come in order; Evict and Alloc are instant (no Completed). A
// WriteBack copies a dirty copy one tier down and frees the source when it
// lands. When an access differs from the trace (another shard at that
// position, extra or missing accesses) the rest of the step is served on
// demand, and at the next BeginStep the recording of that step becomes the
// trace; the planner never panics on divergence (it panics only on broken
// contracts: Release of a shard not in use, Completed of an unknown move).
// Every step's recording refreshes the compute times used for deadlines:
// each access is planned with the shortest compute it took in the last
// Options.ComputeSteps steps of the same accesses (4), because a deadline
// predicted too late makes a prefetch late, one predicted early only holds
// its room longer. Known: where a wait moves between neighbouring accesses
// from step to step (the engine's backward), the least of each is near 0
// and that stretch is predicted as no time, so its reads are all due at
// once; predicting from the steps' least progress instead issued them just
// in time and was measured worse at gpt-5b (bench/README-step.md, "The
// backward's idle drive").
// SetBandwidth replaces the link bandwidths between steps (the engine feeds
// it what the store measured): the next Next plans every transfer with them.
//
// # Eviction
//
// When a budget is full, the victim is the copy whose next use after the
// access being served is furthest away (Belady's MIN). A copy needed before
// that access is never evicted for it (do no harm), a pinned or in-flight
// copy never, and when MIN's victim is busy a prefetch waits for it rather
// than evict a worse one, unless waiting would make it late: when the
// victim is predicted to be free (the end of the access using it, or the
// landing of the move reading or filling it) too late for the transfer to
// land by its deadline, and later than now, the best victim free now goes
// instead (clean first; a dirty one only if its write-back and the transfer
// both fit before the deadline). The access then hits at the cost of at
// most a hidden re-fetch later (Stats.LateVictims counts these; a full HBM
// pool refilled layer by layer is the case: MIN's victim is often the shard
// being computed). Options.WaitForVictim restores MIN's rule, with which
// the planner fetches exactly as many shards as the optimum with uniform
// sizes (tested against an exhaustive oracle; by default it does on the
// traces where no victim was late, and never stalls longer). With
// varied sizes furthest-next-use is a heuristic: on random small traces it
// is never worse than LRU and within 1.25x of the optimal bytes (1.35x with
// two cached tiers). Dirty copies are written back to the next tier down
// before they are freed, and that costs link time on the reverse link;
// but a dirty copy is dropped without a write when another tier, faster or
// slower, holds a valid copy (write-back caching): the new param written by
// the optimizer in host memory and uploaded to HBM leaves host memory at
// once, and reaches its NVMe home only if the HBM copy is evicted in turn.
// A faster copy counts only in a pool the trace does not overflow: in one
// it does, it is evicted before the next write, and its write-back (one
// hop more) would delay the transfer that needs its room; the slower copy
// is written behind instead (testdata/writeback_overflow.txt).
//
// One exception keeps a pipeline flowing: with write-behind on, a prefetch
// does not wait for a victim that an access before its own will update
// (master, m and v are updated back to back: the best victim for the read
// of the next v is often the m being updated now). Once free, that copy is
// dirty, and waiting for its write made every such read one transfer time
// late; the next clean victim costs at most a hidden re-read in the next
// step. TestSimulateSteadyState checks the result: 8 layers × 2 ranks with
// host room for half the optimizer state reach 100 % hits and zero stall
// from the second step on.
//
// # Hits, late, misses and dependent reads
//
// Stats counts each access once, when it begins: a hit finds its copy
// ready; a late one finds a move toward it under way; a miss finds none
// (a demand fetch, or a write waiting for room). A late read whose move
// was issued by the first Next after its source's data came to exist (the
// Release of the write that made it, or the landing of a move issued that
// way) is Dependent instead: no plan could have had it ready, since the
// data did not exist sooner. The case it is for is the engine's pipelined
// host update (overlap exact): cpuadam writes chunk c's new param into
// its host copy and the next forward reads it in HBM right after. A move
// the planner held back (ALAP, no room, a busy link) is not dependent: the
// read stays late or a miss. HitRate is Hits / (Accesses - Dependent); the
// dependent reads' wait is in Stall like every other.
//
// # Write-behind
//
// So that this write is not on the critical path, a copy made dirty by a
// Release (a gradient written in HBM, master/m/v or the new param updated
// in host) is copied to its home as soon as the reverse link (hbm->host,
// host->nvme) has fewer than Options.WriteBehindDepth transfers in flight
// (default 1: an idle link) and no planned one would start before this one
// would end, counted behind those in flight: a Prefetch move with
// Move.WriteBehind set, which keeps the source, so the copy is clean when
// it lands and its eviction later is an instant Evict. It is done only when the home is the
// next tier down (no room is needed: the home is always allocated), only
// in a pool that the trace overflows (homes plus one copy of everything
// the trace stages there exceed the budget; elsewhere nothing is ever
// evicted and the write would be wasted), never for a copy in use or
// being read, and not when the shard's next write is predicted to begin
// before the copy lands (the store lets a write in only when no move reads
// the copy, and Ready models that). With write-behind on, eviction takes a
// clean victim before a dirty one and a prefetch does not wait for a busy
// victim that would still be dirty once free or that is being written
// behind: a later fetch costs hidden read time, a write-back costs stall.
// Options.DisableWriteBehind restores write-back on eviction alone.
// testdata/writebehind.txt and testdata/optimizer_pipeline.txt show the
// stall it removes (19ms to 1ms, and 40.5ms to 0 over three steps).
//
// # Horizon
//
// The plan looks a bounded number of accesses ahead (Options.Window). The
// automatic window (Window 0) is, over every position of the trace, the
// most accesses predicted to start within HorizonChains (4) times the
// lead of the trace per rank planned for: the lead is the longest chain of
// transfers an access can need (every hop from its home at the current
// bandwidths) plus the slack. One lead brings each transfer into view by
// its latest start; the other three cover the transfers queued behind it
// on the same link, as the arithmetic above has 3-4 shards in flight per
// rank; a planner of several ranks queues all of theirs on the one NVMe
// link, hence the factor. It is never fewer
// than MinWindow (32) accesses, which keeps a plan at least a few layers
// deep when compute per access is long against the links, and never more
// than the trace; it is computed with the trace and with SetBandwidth.
// What the planner sees beyond the window, and what a window that cuts
// the trace changes:
//
//   - Eviction sees the whole cycle: the next use of a copy comes from the
//     shard's occurrences in the trace (O(occurrences of that shard)), so
//     Belady's order, do-no-harm and the late-victim rule are those of the
//     whole step. The oracle tests hold unchanged with a window of 2.
//   - ALAP and dispatch see only the transfers of the window: transfers
//     queued on a link beyond it no longer push earlier ones earlier, so
//     where the trace saturates a link past the window a transfer starts
//     when its access comes into view, not as early as the backlog would
//     have it, and the link may idle before: more stall where a burst of
//     reads (the optimizer's, on NVMe) needs more lead than the window
//     holds. A Window at least the trace's length plans the whole step.
//   - Eager issue and markFree reach the accesses of the window. A shard
//     made valid by a write (the new params the optimizer writes in host
//     memory) is followed past the window to its next access, so a
//     transfer into a pool the trace does not overflow still goes as soon
//     as the write ends; a shard valid all along is fetched eagerly when
//     its access enters the window rather than at the step's start.
//   - Write-behind yields to the planned starts of the window's transfers.
//
// # Cost
//
// The runner calls Next after every event (about 12 times per access in
// BenchmarkPlannerStep), but most calls follow nothing but the passing of
// time: Next then keeps the last plan, shifted by the move of the predicted
// start of the next access (ALAP is invariant under a shift of every
// deadline), and returns at once unless a planned start has come. After an
// Access, Release or Completed it builds the plan again: one pass over the
// window (the horizon above), with the transfers each shard needs
// memoized per shard and its state version, so O(W) cheap steps; the
// ALAP pass without a full sort (candidates come in access order, only
// first hops can be out of place); a sort of the due candidates only; and
// an eviction decision that scans the copies held in the pool (a member
// list per pool, not every shard) and orders only as many victims as it
// takes (a heap). Scratch is reused between calls. Nothing per call is
// linear in the trace, so with the window bounded the cost per access does
// not grow with the model (BenchmarkPlannerStepPerRank, 48 to 192 layers
// per rank: see bench/README-prefetch.md); it grows with the window, the
// copies a pool holds and the transfers pending.
//
// # Memory
//
// Per shard state a few dozen bytes, plus the trace (one small record per
// access). Plan and Simulate keep the whole simulated timeline; the
// benchmarks run the same modeled engine keeping none of it.
//
// # Where the code is
//
// planner.go holds the state (shards, pools, accesses and moves under way)
// and the engine-facing methods; adopt.go the adoption of a trace (checks,
// compute history, the pools it overflows); schedule.go the plan
// (candidates, chains of hops, ALAP, dispatch); evict.go makeRoom and the
// choice of victims; writebehind.go the write-behind; sim.go the modeled
// engine of Plan and Simulate.
package prefetch
