package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"golang.org/x/sys/unix"
)

// NVMeOptions configure `strata bench nvme`: one workload of fixed block
// size and queue depth over one file per path, the same shape as
// fio --ioengine=io_uring --direct=1 --bs --iodepth --size.
//
// Zero fields are not valid: WithDefaults fills them, and callers apply it
// only to what the user left unset (cmd uses the flags it was given), so
// that an explicit 0 reaches Validate and is refused.
type NVMeOptions struct {
	// Paths: a directory gets a temporary file strata-bench-nvme-*.dat
	// (created with O_EXCL, removed afterwards, also on errors and when
	// the run is stopped through its context); an existing file is kept,
	// and only read: a write run on it, or a read run that would extend
	// it, is refused unless Force. Several paths spread the blocks
	// round-robin (several drives without RAID-0); each must name a
	// different file.
	Paths      []string
	Force      bool   // allow writing into, and extending, an existing file
	RW         string // read, write, randread, randwrite, mixed (default read)
	BlockBytes int64  // default 1 MiB
	QueueDepth int    // default 32
	SizeBytes  int64  // per path; default 1 GiB
	Engine     string // auto (default: io_uring, else pread, and Info says why), uring or pread
	// Loops is the number of passes over the files (default 1); Duration,
	// instead, runs passes until it has elapsed. One of them, not both.
	Loops    int
	Duration time.Duration
	// SubmitBatch is nvme.Options.SubmitBatch: the most requests io_uring
	// hands to the kernel per io_uring_enter (default 1: none merged by
	// the block plug; larger values show what merging does).
	SubmitBatch  int
	NoFixed      bool   // do not register buffers and files with io_uring
	TraceBlock   bool   // add device latency from the block-layer tracepoints (needs BPF)
	Seed         uint64 // for the random orders
	Progress     func(doneBytes, totalBytes int64, elapsed time.Duration)
	ProgressTick time.Duration // default 1 s; used only with Progress
}

var nvmeRWs = []string{"read", "write", "randread", "randwrite", "mixed"}

// WithDefaults returns o with its zero fields set to the defaults (Loops only
// when Duration is not set either).
func (o NVMeOptions) WithDefaults() NVMeOptions {
	if o.RW == "" {
		o.RW = "read"
	}
	if o.BlockBytes == 0 {
		o.BlockBytes = units.MiB
	}
	if o.QueueDepth == 0 {
		o.QueueDepth = 32
	}
	if o.SizeBytes == 0 {
		o.SizeBytes = units.GiB
	}
	if o.Engine == "" {
		o.Engine = nvme.EngineAuto
	}
	if o.SubmitBatch == 0 {
		o.SubmitBatch = 1
	}
	if o.Loops == 0 && o.Duration == 0 {
		o.Loops = 1
	}
	if o.ProgressTick == 0 {
		o.ProgressTick = time.Second
	}
	return o
}

// Validate checks o as given; it changes nothing (see WithDefaults).
func (o NVMeOptions) Validate() error {
	if len(o.Paths) == 0 {
		return errors.New("bench: nvme: no --path given")
	}
	seen := map[string]string{}
	for _, p := range o.Paths {
		c := filepath.Clean(p)
		if first, ok := seen[c]; ok {
			return fmt.Errorf("bench: nvme: --path %s and --path %s are the same place: give each drive once", first, p)
		}
		seen[c] = p
	}
	if !slices.Contains(nvmeRWs, o.RW) {
		return fmt.Errorf("bench: nvme: --rw %q: want one of %s", o.RW, strings.Join(nvmeRWs, ", "))
	}
	switch o.Engine {
	case nvme.EngineAuto, nvme.EngineUring, nvme.EnginePread:
	default:
		return fmt.Errorf("bench: nvme: --engine %q: want auto, uring or pread", o.Engine)
	}
	switch {
	case o.BlockBytes < 512 || o.BlockBytes > 64*units.MiB:
		return fmt.Errorf("bench: nvme: --bs %d: want 512 B .. 64 MiB", o.BlockBytes)
	case o.QueueDepth < 1 || o.QueueDepth > 1024:
		return fmt.Errorf("bench: nvme: --qd %d: want 1..1024", o.QueueDepth)
	case o.SubmitBatch < 1 || o.SubmitBatch > 1024:
		return fmt.Errorf("bench: nvme: --submit-batch %d: want 1..1024", o.SubmitBatch)
	case o.SizeBytes < 1:
		return fmt.Errorf("bench: nvme: --size %d: want > 0", o.SizeBytes)
	case o.SizeBytes < o.BlockBytes:
		return fmt.Errorf("bench: nvme: --size %s is smaller than --bs %s", units.FormatBytes(o.SizeBytes), units.FormatSize(o.BlockBytes))
	case o.SizeBytes%o.BlockBytes != 0:
		return fmt.Errorf("bench: nvme: --size %s is not a multiple of --bs %s", units.FormatBytes(o.SizeBytes), units.FormatSize(o.BlockBytes))
	case o.Duration < 0:
		return fmt.Errorf("bench: nvme: --duration %v: want > 0", o.Duration)
	case o.Duration > 0 && o.Loops != 0:
		return fmt.Errorf("bench: nvme: --loops %d and --duration %v: give one or the other", o.Loops, o.Duration)
	case o.Duration == 0 && o.Loops < 1:
		return fmt.Errorf("bench: nvme: --loops %d: want >= 1", o.Loops)
	case o.Progress != nil && o.ProgressTick <= 0:
		return fmt.Errorf("bench: nvme: progress tick %v: want > 0", o.ProgressTick)
	}
	return nil
}

func (o NVMeOptions) String() string {
	s := fmt.Sprintf("--rw %s --bs %s --qd %d --size %s --engine %s", o.RW, units.FormatSize(o.BlockBytes), o.QueueDepth,
		units.FormatSize(o.SizeBytes), o.Engine)
	for _, p := range o.Paths {
		s += " --path " + p
	}
	if o.Duration > 0 {
		s += " --duration " + o.Duration.String()
	} else {
		s += fmt.Sprintf(" --loops %d", o.Loops)
	}
	if o.SubmitBatch != 1 {
		s += fmt.Sprintf(" --submit-batch %d", o.SubmitBatch)
	}
	if o.NoFixed {
		s += " --no-fixed"
	}
	if o.Force {
		s += " --force"
	}
	return s
}

// NVMeResult is one run. MB are 10^6 bytes.
type NVMeResult struct {
	// Reclaimed says what the run removed of killed runs' temporary files
	// (removeDeadBenchFiles), a line a directory.
	Reclaimed  []string `json:"reclaimed,omitempty"`
	Engine     string   `json:"engine"`
	EngineInfo string   `json:"engine_info"`
	RW         string   `json:"rw"`
	BlockBytes int64    `json:"bs"`
	QueueDepth int      `json:"qd"`
	SizeBytes  int64    `json:"size"`
	Paths      []string `json:"paths"`
	Bytes      int64    `json:"bytes"`
	Seconds    float64  `json:"seconds"`
	MBps       float64  `json:"mbps"`
	ReadMBps   float64  `json:"read_mbps,omitempty"`
	WriteMBps  float64  `json:"write_mbps,omitempty"`
	IOPS       float64  `json:"iops"`
	P50us      float64  `json:"p50_us"`
	P99us      float64  `json:"p99_us"`
	P999us     float64  `json:"p999_us"`
	CPUSeconds float64  `json:"cpu_s"`
	CPUsPerGB  float64  `json:"cpu_s_per_gb"`
	// SubmitBatch is the most SQEs per io_uring_enter; Enters and SQEs
	// are the engine's count of the io_uring_enter calls that submitted
	// over the workload and of the SQEs they took (0 with pread).
	SubmitBatch int    `json:"submit_batch"`
	Enters      uint64 `json:"enters"`
	SQEs        uint64 `json:"sqes"`
	// Device-level latency (block_rq_issue → block_rq_complete), with --trace-block.
	DeviceP50us  float64 `json:"device_p50_us,omitempty"`
	DeviceP99us  float64 `json:"device_p99_us,omitempty"`
	DeviceP999us float64 `json:"device_p999_us,omitempty"`
	DeviceIOs    int64   `json:"device_ios,omitempty"`
	// DeviceAvgBytes is the average size of the requests the tracer saw
	// issued (rq->__data_len at block_rq_issue).
	DeviceAvgBytes int64  `json:"device_avg_bytes,omitempty"`
	TraceNote      string `json:"trace_note,omitempty"` // why there is no device latency
	// Buffers says what memory the I/O buffers are in (huge pages, or why
	// not); HugePageBytes of BufferBytes are backed by huge pages.
	Buffers       string `json:"buffers"`
	BufferBytes   int64  `json:"buffer_bytes"`
	HugePageBytes int64  `json:"huge_page_bytes"`
	// The block layer's view of the run (/sys/dev/block/MAJ:MIN/stat
	// deltas of the devices holding the files, in the run's direction;
	// other processes' I/O to them included): requests and their average
	// size, and BlockNote, a warning when requests were split below the
	// block size (with the likely cause), or why there are no figures.
	BlockRequests int64  `json:"block_requests"`
	BlockAvgBytes int64  `json:"block_avg_bytes"`
	BlockDevices  string `json:"block_devices,omitempty"`
	BlockNote     string `json:"block_note,omitempty"`
}

// benchFile is one file of the workload.
type benchFile struct {
	f       *nvme.File
	path    string
	created bool // remove at the end
}

// RunNVMe runs the workload once and measures it. opts must pass Validate
// (apply WithDefaults to what the user left unset first). When ctx is done
// the run stops issuing requests, lets those in flight complete, removes
// its temporary files and returns an error wrapping context.Cause(ctx).
func RunNVMe(ctx context.Context, opts NVMeOptions) (NVMeResult, error) {
	if err := opts.Validate(); err != nil {
		return NVMeResult{}, err
	}
	eng, err := nvme.Open(nvme.Options{Engine: opts.Engine, QueueDepth: opts.QueueDepth, SubmitBatch: opts.SubmitBatch})
	if err != nil {
		return NVMeResult{}, fmt.Errorf("bench: %w", err)
	}
	defer eng.Close()
	files, reclaimed, err := openBenchFiles(ctx, eng, opts)
	defer closeBenchFiles(files)
	if err != nil {
		return NVMeResult{}, err
	}
	buf, err := newIOBuffers(int64(opts.QueueDepth) * opts.BlockBytes)
	if err != nil {
		return NVMeResult{}, err
	}
	defer buf.close()
	mem := buf.mem
	fillRandom(mem, opts.Seed+1)
	var fixedNote string
	if eng.Info().Engine == nvme.EngineUring && !opts.NoFixed {
		if fixedNote, err = registerFixed(eng, files, mem); err != nil {
			return NVMeResult{}, err
		}
	}
	info := eng.Info().String()
	if fixedNote != "" {
		info += "; " + fixedNote
	}
	res := NVMeResult{Engine: eng.Info().Engine, EngineInfo: info, RW: opts.RW, BlockBytes: opts.BlockBytes,
		QueueDepth: opts.QueueDepth, SizeBytes: opts.SizeBytes, Paths: opts.Paths,
		Buffers: buf.note, BufferBytes: int64(len(mem)), HugePageBytes: buf.hugeBytes, Reclaimed: reclaimed}
	var tracer *blockTracer
	if opts.TraceBlock {
		var note string
		tracer, note = startBlockTrace(files)
		res.TraceNote = note
	}
	stats := startBlockStats(files)
	st0 := eng.Stats()
	m, err := runWorkload(ctx, eng, files, mem, opts)
	stats.stop(&res, opts, buf.hugeBytes == int64(len(mem)))
	st := eng.Stats()
	res.SubmitBatch, res.Enters, res.SQEs = opts.SubmitBatch, st.Enters-st0.Enters, st.SQEs-st0.SQEs
	if tracer != nil {
		res.DeviceP50us, res.DeviceP99us, res.DeviceP999us, res.DeviceIOs, res.TraceNote = tracer.stop()
		res.DeviceAvgBytes = tracer.avgBytes()
	}
	if err != nil {
		return res, err
	}
	res.Bytes = m.bytes
	res.Seconds = m.elapsed.Seconds()
	res.MBps = float64(m.bytes) / 1e6 / res.Seconds
	res.ReadMBps = float64(m.readBytes) / 1e6 / res.Seconds
	res.WriteMBps = float64(m.writeBytes) / 1e6 / res.Seconds
	if opts.RW != "mixed" {
		res.ReadMBps, res.WriteMBps = 0, 0
	}
	res.IOPS = float64(len(m.latUs)) / res.Seconds
	slices.Sort(m.latUs)
	res.P50us, res.P99us, res.P999us = percentile(m.latUs, 0.50), percentile(m.latUs, 0.99), percentile(m.latUs, 0.999)
	res.CPUSeconds = m.cpu.Seconds()
	res.CPUsPerGB = res.CPUSeconds / (float64(m.bytes) / 1e9)
	return res, nil
}

// registerFixed registers the buffers and files with io_uring. Pinning the
// buffers needs RLIMIT_MEMLOCK room or CAP_IPC_LOCK; without them
// (ENOMEM, EPERM) the run goes on with plain buffers and the returned note
// says so.
func registerFixed(eng *nvme.Engine, files []benchFile, mem []byte) (note string, err error) {
	if err := eng.RegisterBuffers(mem); err != nil {
		if !errors.Is(err, unix.ENOMEM) && !errors.Is(err, unix.EPERM) {
			return "", fmt.Errorf("bench: %w", err)
		}
		note = fmt.Sprintf("fixed buffers off: %s could not be pinned (%v); running with plain buffers",
			units.FormatBytes(int64(len(mem))), err)
	}
	fs := make([]*nvme.File, len(files))
	for i, f := range files {
		fs[i] = f.f
	}
	if err := eng.RegisterFiles(fs...); err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	return note, nil
}

// SweepTolerance is how far below the best MB/s a sweep setting may be and
// still be recommended for holding fewer bytes in flight.
const SweepTolerance = 0.03

// BestNVMeSetting picks the setting a sweep recommends: it finds the highest
// MB/s first, then, among the results within tolerance of it (MBps >=
// best × (1 - tolerance)), the one with the fewest bytes in flight (bs × qd),
// which holds the least pinned memory for the same bandwidth; ties go to the
// higher MB/s, then to the earlier result. It returns an index into results,
// or -1 if there are none.
func BestNVMeSetting(results []NVMeResult, tolerance float64) int {
	top := -1
	for i, r := range results {
		if top < 0 || r.MBps > results[top].MBps {
			top = i
		}
	}
	if top < 0 {
		return -1
	}
	floor := results[top].MBps * (1 - tolerance)
	best := top
	for i, r := range results {
		if r.MBps < floor {
			continue
		}
		inflight, bestInflight := r.BlockBytes*int64(r.QueueDepth), results[best].BlockBytes*int64(results[best].QueueDepth)
		if inflight < bestInflight || (inflight == bestInflight && r.MBps > results[best].MBps) {
			best = i
		}
	}
	return best
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func fillRandom(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

type measured struct {
	bytes, readBytes, writeBytes int64
	elapsed                      time.Duration
	cpu                          time.Duration
	latUs                        []float64
}

// blockOrder hands out the blocks of a workload pass after pass: in order,
// or for the rand workloads in a new random permutation each pass. Blocks
// go round-robin over the files.
type blockOrder struct {
	files    []benchFile
	opts     NVMeOptions
	total    int64      // blocks per pass
	loops    int        // passes at most
	rng      *rand.Rand // nil: sequential
	perm     []int64    // this pass's order; nil: sequential
	pass     int
	next     int64     // index of the next block in this pass
	deadline time.Time // with Duration: no pass starts after it
	stop     <-chan struct{}
	stopped  bool // stop was closed: no more blocks were handed out
}

func newBlockOrder(files []benchFile, opts NVMeOptions) *blockOrder {
	o := &blockOrder{files: files, opts: opts, total: opts.SizeBytes / opts.BlockBytes * int64(len(files)), loops: opts.Loops}
	if opts.Duration > 0 {
		o.loops = 1 << 30
	}
	if strings.HasPrefix(opts.RW, "rand") {
		o.rng = rand.New(rand.NewPCG(opts.Seed, 1))
	}
	o.perm = o.order()
	return o
}

// order is the block order of a new pass: nil for sequential workloads.
func (o *blockOrder) order() []int64 {
	if o.rng == nil {
		return nil
	}
	p := make([]int64, o.total)
	for i := range p {
		p[i] = int64(i)
	}
	o.rng.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// expectedBytes is what the whole workload transfers; 0 with Duration
// (unknown).
func (o *blockOrder) expectedBytes() int64 {
	if o.opts.Duration > 0 {
		return 0
	}
	return o.total * int64(o.loops) * o.opts.BlockBytes
}

// assign points r at the next block; false when the workload has no more
// blocks to issue.
func (o *blockOrder) assign(r *nvme.Request) bool {
	select {
	case <-o.stop:
		o.stopped = true
		return false
	default:
	}
	if o.next == o.total {
		o.pass++
		if o.pass >= o.loops || (o.opts.Duration > 0 && time.Now().After(o.deadline)) {
			return false
		}
		o.next = 0
		o.perm = o.order()
	}
	b := o.next
	if o.perm != nil {
		b = o.perm[o.next]
	}
	nf := int64(len(o.files))
	r.File = o.files[b%nf].f
	r.Offset = (b / nf) * o.opts.BlockBytes
	switch o.opts.RW {
	case "read", "randread":
		r.Op = nvme.OpRead
	case "write", "randwrite":
		r.Op = nvme.OpWrite
	default: // mixed: every other block is written while its neighbours are read
		r.Op = nvme.OpRead
		if o.next%2 == 1 {
			r.Op = nvme.OpWrite
		}
	}
	o.next++
	return true
}

// inflight keeps a fixed set of requests in flight: each completion is
// counted and reissues its own request from the completion callback (a
// slot is always free: exactly QueueDepth requests exist), so the io_uring
// engine batches them into its next enter. mu guards everything but dev
// and finished: the pread engine calls Done from several workers.
type inflight struct {
	dev      nvme.Device
	order    *blockOrder
	issued   []time.Time // per request Tag: when it was last submitted
	mu       sync.Mutex
	m        measured
	count    int // requests submitted and not yet retired
	firstErr error
	finished chan struct{} // closed when the last request retires
}

// done is every request's Done callback.
func (w *inflight) done(r *nvme.Request) {
	now := time.Now()
	w.mu.Lock()
	i := r.Tag
	if r.Err != nil && w.firstErr == nil {
		w.firstErr = r.Err
	}
	w.m.latUs = append(w.m.latUs, float64(now.Sub(w.issued[i]).Nanoseconds())/1e3)
	w.m.bytes += int64(r.N)
	if r.Op == nvme.OpRead {
		w.m.readBytes += int64(r.N)
	} else {
		w.m.writeBytes += int64(r.N)
	}
	again := w.firstErr == nil && w.order.assign(r)
	if again {
		w.issued[i] = time.Now()
	} else {
		w.count--
	}
	last := w.count == 0
	w.mu.Unlock()
	if again {
		if err := w.dev.Submit(r); err != nil {
			w.mu.Lock()
			if w.firstErr == nil {
				w.firstErr = err
			}
			w.count--
			last = w.count == 0
			w.mu.Unlock()
		}
	}
	if last {
		close(w.finished)
	}
}

// start assigns a block to each request and submits them in one batch.
func (w *inflight) start(reqs []nvme.Request) error {
	batch := make([]*nvme.Request, 0, len(reqs))
	w.mu.Lock()
	for i := range reqs {
		if !w.order.assign(&reqs[i]) {
			break
		}
		w.issued[i] = time.Now()
		batch = append(batch, &reqs[i])
	}
	w.count = len(batch)
	w.mu.Unlock()
	if len(batch) == 0 { // stopped before the first request
		close(w.finished)
		return nil
	}
	if err := w.dev.Submit(batch...); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// wait returns when the last request has retired, telling opts.Progress
// (when set) the bytes done at each tick.
func (w *inflight) wait(start time.Time, opts NVMeOptions) {
	var tick <-chan time.Time
	if opts.Progress != nil {
		t := time.NewTicker(opts.ProgressTick)
		defer t.Stop()
		tick = t.C
	}
	expected := w.order.expectedBytes()
	for {
		select {
		case <-w.finished:
			return
		case now := <-tick:
			w.mu.Lock()
			done := w.m.bytes
			w.mu.Unlock()
			opts.Progress(done, expected, now.Sub(start))
		}
	}
}

// runWorkload keeps QueueDepth requests in flight over files until the
// workload's passes (or its duration) are done, and measures them.
func runWorkload(ctx context.Context, eng *nvme.Engine, files []benchFile, mem []byte, opts NVMeOptions) (measured, error) {
	order := newBlockOrder(files, opts)
	order.stop = ctx.Done()
	w := &inflight{dev: eng, order: order, issued: make([]time.Time, opts.QueueDepth), finished: make(chan struct{})}
	w.m.latUs = make([]float64, 0, min(order.total*int64(order.loops), 1<<22))
	reqs := make([]nvme.Request, opts.QueueDepth)
	for i := range reqs {
		reqs[i].Tag = uint64(i)
		reqs[i].Buf = mem[int64(i)*opts.BlockBytes : int64(i+1)*opts.BlockBytes]
		reqs[i].Done = w.done
	}
	cpu0 := cpuTime()
	start := time.Now()
	order.deadline = start.Add(opts.Duration)
	if err := w.start(reqs); err != nil {
		return w.m, err
	}
	w.wait(start, opts)
	w.m.elapsed = time.Since(start)
	w.m.cpu = cpuTime() - cpu0
	if w.firstErr != nil {
		return w.m, fmt.Errorf("bench: %w", w.firstErr)
	}
	if ctx.Err() != nil && order.stopped {
		return w.m, fmt.Errorf("bench: nvme: stopped after %s: %w", units.FormatBytes(w.m.bytes), context.Cause(ctx))
	}
	return w.m, nil
}
