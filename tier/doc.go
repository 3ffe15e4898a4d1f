// Package tier owns where every shard state of the model resides, and moves it.
//
// It knows where each (chunk, rank, state) is (HBM of its device, pinned
// host RAM, an NVMe swap extent), where it is going and who holds it, and
// it executes the moves between those tiers under byte budgets that are
// never exceeded. It does not choose moves: a planner (prefetch.Planner, through
// the small Planner interface declared here) plans them, and a Runner per
// rank hands them to the store.
//
// # The arithmetic it rests on
//
// A 7B-parameter model has 14 GB of bf16 params, 14 GB of bf16 gradients and
// 84 GB of fp32 master weights and Adam moments (16 bytes per parameter).
//
//   - host<->HBM: PCIe 4 x16 gives about 25 GB/s per GPU each way. Params
//     offloaded to host cross it twice per step (forward and backward): 28 GB,
//     about 1.1 s per step on one GPU (1/N of it per rank under ZeRO-3), plus
//     14 GB of gradients down. A step that computes for a few seconds hides it.
//   - host RAM: about 20+ GB/s here for a streaming kernel; CPU Adam touches
//     about 30 B/param, 210 GB per step: about 10 s on this machine. Staging
//     through pinned buffers costs no extra copy: DMA and O_DIRECT use them.
//   - NVMe: a few GB/s per drive (3-7 GB/s for PCIe 4 drives; about 2 GB/s
//     for this machine's virtio disk). Params on NVMe are 14 GB per pass: 7 s
//     at 2 GB/s, so the host tier should keep them between forward and
//     backward. Optimizer state on NVMe is 84 GB read and 84 GB written per
//     step: about 84 s at 2 GB/s, 30 s on a 6 GB/s drive. NVMe is the link
//     that bounds an offloaded step, which is why the host budget keeps as
//     much optimizer state as it can and only the rest spills to NVMe, and
//     why moves are asynchronous: every link must be kept busy while the
//     others work.
//
// # What it owns
//
// A Store holds, for every registered shard state (Register: element count,
// dtype, home tier), one copy per tier at most. The home copy's space is held
// from Register to Unregister; other copies come and go with moves. Each copy
// is valid (holds the newest version of the shard), stale (an older
// version), reserved (Alloc: space without data) or lost (its data failed a
// checksum). The version advances when a Write or Update lease is released, so writing
// one copy makes every other copy stale; a shard is dirty while its home copy
// is not valid.
//
// Moves (Submit, or Fetch and Evict) are shard.Move, the type prefetch plans
// with: Prefetch (a write-behind included) and Demand copy From -> To; WriteBack copies and then drops From; Evict drops
// From, after writing it back (to To, else home) when it is the only valid
// copy; Alloc reserves space. Adjacent tiers are one hop: HBM->host (a
// device-to-host copy on the device's copy stream, completion by event),
// host->HBM, host->NVMe (a swap write, which records a CRC-32C per stripe
// unit), NVMe->host (a swap read, which verifies them). HBM<->NVMe is two
// hops through a pinned staging buffer. A move whose source is still arriving
// waits for it; a move whose source is being written (a Write lease) waits
// for the release. A source that turns stale after Submit (the shard was
// written elsewhere) is still copied, with its version: the copy lands stale.
//
// Completion: each Submit returns an *Op (Wait, Done, Ready channel, Err).
// Instant moves (a clean Evict, Alloc, a copy whose destination is already
// valid) are done when Submit returns; every other move also calls
// Options.OnComplete once, from a store goroutine, after the residency
// reflects its outcome, and wakes the Runner of the shard's rank, so the
// planner learns of completion without polling. An Op is done as soon as
// the residency shows its outcome (a move chained on it, or a lease, never
// sees the landed copy with the Op still pending); OnComplete runs after
// that and may run after Wait has returned.
//
// Leases: Acquire(key, tier, kind) returns the copy's memory (a gpu.Buffer in
// HBM, a []byte of pinned memory in host) and pins it, for an access of that
// kind (shard.Kind, the kind the planner plans with): Read and Update need
// the newest data; Update and Write leases also wait until no move reads the
// copy and make it the newest version at Release. Acquire blocks while a
// move fills that copy (the wait is counted per tier in Stats.Waited). A
// leased copy is never dropped, evicted or overwritten: such a move is
// refused with ErrLeased; eviction never waits (the planner picks unpinned
// victims).
//
// # Runner
//
// A Runner executes one rank's planner on the store. The rank declares each
// access (Use: the planner is told, the runner waits until the shard is
// ready in the access tier, counting the wait as stall, and leases it) and
// ends it when the compute that used it is done (Done with a gpu.Event: a
// waiter goroutine releases the lease the moment the event completes, so
// its room goes back to the planner then). A goroutine per runner reaps
// completed moves (the store wakes the runner of the move's rank), tells
// the planner, and submits the moves it asks for, including those that fall
// due later (Planner.WakeAt). Pause waits for the moves in flight and stops
// new ones until Resume; BeginStep marks a step for the planner. The first
// failure stops the rank: a move that failed (its *MoveError), a move the
// store refused, an access the planner cannot serve; Use and BeginStep
// return it from then on. RunnerOptions.OnMove and OnStall report every
// move and stall to a timeline.
//
// # Errors and faults
//
// Submit refuses what cannot start: *BudgetError (errors.Is ErrBudget) when a
// destination or staging buffer would exceed a budget, listing the tier's
// users by state and by chunk and what of it is in flight; ErrNotResident,
// ErrLost, ErrLeased, ErrBusy, ErrBadMove, ErrUnknown, ErrClosed. A transfer
// that fails completes its Op with a *MoveError naming the shard (chunk, rank,
// state) and the move, wrapping the nvme error that names the file and
// offset. Data is never replaced by zeros or stale bytes:
//
//   - read error (EIO, short read): the destination is freed; the source stays
//     valid, so a retry may succeed.
//   - checksum mismatch: the NVMe copy is marked lost (no longer valid); if it
//     was the only valid copy, Where reports the shard Lost and every later
//     Acquire or move of it fails with ErrLost wrapping the corruption error.
//   - write error: the source stays where it was and valid; the NVMe copy
//     (home or not) holds no valid data until a later write-back succeeds.
//
// The one shard that legitimately reads as zeros is a fresh NVMe home never
// written: Register defines its contents as zeros, and a fetch of it fills
// the destination with zeros without I/O.
//
// # Lifecycle
//
//	s, err := tier.New(tier.Options{Devices: devs, Host: pool, Swap: swap, HostBudgetBytes: ...})
//	s.Register(key, tier.Spec{Elems: n, DType: dtype.F32, Home: shard.NVMe})
//	op, err := s.Submit(shard.Move{Key: key, From: shard.NVMe, To: shard.Host, Reason: shard.Prefetch})
//	l, err := s.Acquire(key, shard.Host, shard.Write) // waits for op
//	... l.Bytes() ...
//	l.Release()
//
//	run, err := tier.NewRunner(s, planner, tier.RunnerOptions{Rank: r})
//	l, err = run.Use(shard.Access{Key: key, Tier: shard.Host, Kind: shard.Update})
//	... compute, then record ev ...
//	run.Done(l, ev)
//	p, err := run.Begin(a) // declare now (its place in the rank's order), wait elsewhere:
//	l, err = run.Await(p)  // from another goroutine, e.g. the one running cpuadam (or run.Abandon(p))
//	run.Close() // before the store
//	s.Close() // cancels moves not started, waits for the rest, frees every copy
//
// Whole-shard I/O while nothing moves (initialisation, restore, a
// checkpoint with the runners paused) is the store's too: WriteHome makes
// given bytes the newest contents and leaves the shard in its home only;
// ReadNewest copies the newest contents from whichever tier holds them
// (from NVMe through a host copy it drops again). A caller outside the
// store and its Runner never builds a Move.
//
// The store owns none of its resources: close it before the swap, the nvme
// engine and the pinned pool.
//
// # Memory rules
//
// Budgets (HBM per device, a sub-budget of the device's memory; host; NVMe)
// are charged before any memory is taken and never exceeded: a destination
// counts from Submit, its source until the move completes and is dropped, a
// staging buffer while its move runs. Charges are what the memory costs:
// elements × dtype size in HBM (allocations and slots tagged
// gpu.ModelState; gpu.Activation for shard.Activation, a saved block input
// brought back for its backward), the pinned buffer's padded size in host, the extent
// (padded to the swap's alignment) in NVMe. Give the planner the same sizes
// (Residency.ChargeBytes; the largest of them is safe for every tier), so
// that the store never refuses a move the planner thought would fit; the
// shards themselves need no alignment. The host pool can be fragmented
// where the budget is not: a host copy or staging buffer that finds no free
// run moves idle host copies (no lease, no move reading or filling them,
// not leaving) out of the way first (pinned.Pool.GetRelocating, under the
// store's lock), so the planner's byte count holds there too. Pinned
// buffers handed to a copy stream or to the swap are leased
// (pinned.Buffer.Lease) until the transfer's completion is reaped. Lease
// memory must not be used after Release. All methods are safe for concurrent use; OnComplete must not
// block or call Close.
//
// HBM memory: after ReserveHBM(states...) (once, after Register, before the
// first move) the HBM copies of the shards of those states live in slots
// taken then, one device allocation per device and slot class (elements
// and dtype; tagged gpu.ModelState, "tier hbm copies", or gpu.Activation,
// "tier hbm inputs", for a class of saved block inputs only),
// min(shards of the class, ⌊budget / size⌋) slots each (SlabBytes, whatever
// states share the budget): the budget never holds more of them, so a
// copy always finds a slot and a move in or out of HBM allocates and frees
// no device memory. Other HBM copies are device allocations of their own
// (purpose the state's name), made outside the store's lock and freed after
// it is released (unlock): nothing that may wait for a device runs under
// the lock, since a device free (cuMemFree) waits for the whole GPU, whose
// streams may wait for a collective of a rank that needs the lock. A slot
// leased at Close is freed with its last Release.
package tier
