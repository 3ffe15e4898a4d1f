package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
)

// NVMeOptions configure `strata bench nvme`: one workload of fixed block
// size and queue depth over one file per path, the same shape as
// fio --ioengine=io_uring --direct=1 --bs --iodepth --size.
type NVMeOptions struct {
	// Paths: a file is used (and kept); a directory gets a temporary file
	// strata-bench-nvme.dat that is removed afterwards. Several paths
	// spread the blocks round-robin (several drives without RAID-0).
	Paths        []string
	RW           string        // read, write, randread, randwrite, mixed (default read)
	BlockBytes   int64         // default 1 MiB
	QueueDepth   int           // default 32
	SizeBytes    int64         // per path; default 1 GiB
	Engine       string        // uring (default), pread or auto
	Loops        int           // passes over the file; default 1
	Duration     time.Duration // if set, run passes until it has elapsed (instead of Loops)
	NoFixed      bool          // do not register buffers and files with io_uring
	TraceBlock   bool          // add device latency from the block-layer tracepoints (needs BPF)
	Seed         uint64        // for the random orders
	Progress     func(doneBytes, totalBytes int64, elapsed time.Duration)
	ProgressTick time.Duration // default 1 s
}

var nvmeRWs = []string{"read", "write", "randread", "randwrite", "mixed"}

// Validate fills defaults and checks ranges.
func (o *NVMeOptions) Validate() error {
	if len(o.Paths) == 0 {
		return errors.New("bench: nvme: no --path given")
	}
	if o.RW == "" {
		o.RW = "read"
	}
	if !slices.Contains(nvmeRWs, o.RW) {
		return fmt.Errorf("bench: nvme: --rw %q: want one of %s", o.RW, strings.Join(nvmeRWs, ", "))
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
		o.Engine = nvme.EngineUring
	}
	if o.Loops == 0 {
		o.Loops = 1
	}
	if o.ProgressTick == 0 {
		o.ProgressTick = time.Second
	}
	switch {
	case o.BlockBytes < 512 || o.BlockBytes > 64*units.MiB:
		return fmt.Errorf("bench: nvme: --bs %d: want 512 B .. 64 MiB", o.BlockBytes)
	case o.QueueDepth < 1 || o.QueueDepth > 1024:
		return fmt.Errorf("bench: nvme: --qd %d: want 1..1024", o.QueueDepth)
	case o.SizeBytes < o.BlockBytes:
		return fmt.Errorf("bench: nvme: --size %s is smaller than --bs %s", units.FormatBytes(o.SizeBytes), units.FormatSize(o.BlockBytes))
	case o.SizeBytes%o.BlockBytes != 0:
		return fmt.Errorf("bench: nvme: --size %s is not a multiple of --bs %s", units.FormatBytes(o.SizeBytes), units.FormatSize(o.BlockBytes))
	case o.Loops < 1:
		return fmt.Errorf("bench: nvme: --loops %d: want >= 1", o.Loops)
	case o.Duration < 0:
		return fmt.Errorf("bench: nvme: --duration %v: want >= 0", o.Duration)
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
	if o.NoFixed {
		s += " --no-fixed"
	}
	return s
}

// NVMeResult is one run. MB are 10^6 bytes.
type NVMeResult struct {
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
	// Device-level latency (block_rq_issue → block_rq_complete), with --trace-block.
	DeviceP50us  float64 `json:"device_p50_us,omitempty"`
	DeviceP99us  float64 `json:"device_p99_us,omitempty"`
	DeviceP999us float64 `json:"device_p999_us,omitempty"`
	DeviceIOs    int64   `json:"device_ios,omitempty"`
	TraceNote    string  `json:"trace_note,omitempty"` // why there is no device latency
}

// benchFile is one file of the workload.
type benchFile struct {
	f       *nvme.File
	path    string
	created bool // remove at the end
}

// RunNVMe runs the workload once and measures it.
func RunNVMe(opts NVMeOptions) (NVMeResult, error) {
	if err := opts.Validate(); err != nil {
		return NVMeResult{}, err
	}
	eng, err := nvme.Open(nvme.Options{Engine: opts.Engine, QueueDepth: opts.QueueDepth})
	if err != nil {
		return NVMeResult{}, fmt.Errorf("bench: %w", err)
	}
	defer eng.Close()
	files, err := openBenchFiles(eng, opts)
	defer closeBenchFiles(files)
	if err != nil {
		return NVMeResult{}, err
	}
	mem, err := mapAligned(int64(opts.QueueDepth) * opts.BlockBytes)
	if err != nil {
		return NVMeResult{}, err
	}
	defer unmapAligned(mem)
	fillRandom(mem, opts.Seed+1)
	if eng.Info().Engine == nvme.EngineUring && !opts.NoFixed {
		if err := eng.RegisterBuffers(mem); err != nil {
			return NVMeResult{}, fmt.Errorf("bench: %w", err)
		}
		fs := make([]*nvme.File, len(files))
		for i, f := range files {
			fs[i] = f.f
		}
		if err := eng.RegisterFiles(fs...); err != nil {
			return NVMeResult{}, fmt.Errorf("bench: %w", err)
		}
	}
	res := NVMeResult{Engine: eng.Info().Engine, EngineInfo: eng.Info().String(), RW: opts.RW, BlockBytes: opts.BlockBytes,
		QueueDepth: opts.QueueDepth, SizeBytes: opts.SizeBytes, Paths: opts.Paths}
	var tracer *blockTracer
	if opts.TraceBlock {
		var note string
		tracer, note = startBlockTrace(files)
		res.TraceNote = note
	}
	m, err := runWorkload(eng, files, mem, opts)
	if tracer != nil {
		res.DeviceP50us, res.DeviceP99us, res.DeviceP999us, res.DeviceIOs, res.TraceNote = tracer.stop()
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

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

const benchFileName = "strata-bench-nvme.dat"

func openBenchFiles(eng *nvme.Engine, opts NVMeOptions) ([]benchFile, error) {
	var files []benchFile
	for _, p := range opts.Paths {
		name, created := p, false
		st, err := os.Stat(p)
		switch {
		case err == nil && st.IsDir():
			name = filepath.Join(p, benchFileName)
			created = true
		case err == nil && !st.Mode().IsRegular():
			return files, fmt.Errorf("bench: nvme: --path %s is neither a directory nor a regular file", p)
		case os.IsNotExist(err):
			if _, derr := os.Stat(filepath.Dir(p)); derr != nil {
				return files, fmt.Errorf("bench: nvme: --path %s: neither it nor its directory exists", p)
			}
		case err != nil:
			return files, fmt.Errorf("bench: nvme: --path %s: %w", p, err)
		}
		var have int64
		if st, err := os.Stat(name); err == nil {
			have = st.Size()
		}
		if need := opts.SizeBytes - have; need > 0 {
			free, err := nvme.FreeBytes(filepath.Dir(name))
			if err != nil {
				return files, fmt.Errorf("bench: %w", err)
			}
			if need > free {
				return files, fmt.Errorf("bench: nvme: %s needs %s more, only %s free on its filesystem: %w",
					name, units.FormatBytes(need), units.FormatBytes(free), nvme.ErrNoSpace)
			}
		}
		f, err := nvme.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return files, fmt.Errorf("bench: %w", err)
		}
		files = append(files, benchFile{f: f, path: name, created: created})
		if opts.BlockBytes%f.Alignment() != 0 {
			return files, fmt.Errorf("bench: nvme: --bs %d is not a multiple of the I/O alignment %d of %s (%s)",
				opts.BlockBytes, f.Alignment(), name, f.AlignmentSource())
		}
		if have < opts.SizeBytes {
			if err := f.Allocate(opts.SizeBytes); err != nil {
				return files, fmt.Errorf("bench: %w", err)
			}
			// Preallocated blocks read as zeros without touching the
			// device; a read workload needs them written once.
			if opts.RW != "write" && opts.RW != "randwrite" {
				if err := fillFile(eng, f, have, opts.SizeBytes); err != nil {
					return files, err
				}
			}
		}
	}
	return files, nil
}

func closeBenchFiles(files []benchFile) {
	for _, f := range files {
		f.f.Close()
		if f.created {
			os.Remove(f.path)
		}
	}
}

// fillFile writes [from, to) with random data, 1 MiB at a time, 16 in flight.
func fillFile(eng *nvme.Engine, f *nvme.File, from, to int64) error {
	const chunk = units.MiB
	from = from / chunk * chunk
	mem, err := mapAligned(16 * chunk)
	if err != nil {
		return err
	}
	defer unmapAligned(mem)
	fillRandom(mem, 7)
	for off := from; off < to; {
		var c nvme.Completion
		var reqs []*nvme.Request
		for i := 0; i < 16 && off < to; i++ {
			n := min(chunk, to-off)
			reqs = append(reqs, &nvme.Request{Op: nvme.OpWrite, File: f, Buf: mem[int64(i)*chunk : int64(i)*chunk+n], Offset: off, Wait: &c})
			off += n
		}
		if err := eng.Submit(reqs...); err != nil {
			return fmt.Errorf("bench: prepare %s: %w", f.Path(), err)
		}
		if err := c.Wait(); err != nil {
			return fmt.Errorf("bench: prepare %s: %w", f.Path(), err)
		}
	}
	if err := eng.Sync(f); err != nil {
		return fmt.Errorf("bench: prepare %s: %w", f.Path(), err)
	}
	return nil
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

// runWorkload keeps QueueDepth requests in flight: each completion is
// collected on one goroutine, which resubmits the freed requests in a batch.
func runWorkload(eng *nvme.Engine, files []benchFile, mem []byte, opts NVMeOptions) (measured, error) {
	nf := int64(len(files))
	blocksPerFile := opts.SizeBytes / opts.BlockBytes
	total := blocksPerFile * nf // blocks per pass
	order := func(pass int) []int64 { return nil }
	if strings.HasPrefix(opts.RW, "rand") {
		r := rand.New(rand.NewPCG(opts.Seed, 1))
		order = func(pass int) []int64 {
			p := make([]int64, total)
			for i := range p {
				p[i] = int64(i)
			}
			r.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
			return p
		}
	}
	qd := opts.QueueDepth
	reqs := make([]nvme.Request, qd)
	issued := make([]time.Time, qd)
	var m measured
	pass, next := 0, int64(0)
	perm := order(0)
	loops := opts.Loops
	if opts.Duration > 0 {
		loops = 1 << 30
	}
	var deadline time.Time
	// assign points r at block number next of the current pass; false when
	// the workload has no more blocks to issue.
	assign := func(r *nvme.Request) bool {
		if next == total {
			pass++
			if pass >= loops || (opts.Duration > 0 && time.Now().After(deadline)) {
				return false
			}
			next = 0
			perm = order(pass)
		}
		b := next
		if perm != nil {
			b = perm[next]
		}
		bf := &files[b%nf]
		r.File = bf.f
		r.Offset = (b / nf) * opts.BlockBytes
		switch opts.RW {
		case "read", "randread":
			r.Op = nvme.OpRead
		case "write", "randwrite":
			r.Op = nvme.OpWrite
		default: // mixed: every other block is written while its neighbours are read
			r.Op = nvme.OpRead
			if next%2 == 1 {
				r.Op = nvme.OpWrite
			}
		}
		next++
		return true
	}
	expected := total * int64(loops) * opts.BlockBytes
	m.latUs = make([]float64, 0, min(total*int64(loops), 1<<22))
	// Each completion reissues its own request from the completion
	// callback (a slot is always free: exactly QueueDepth requests exist),
	// so the io_uring engine batches them into its next enter. mu guards
	// the counters: the pread engine calls Done from several workers.
	var (
		mu       sync.Mutex
		inflight int
		firstErr error
		finished = make(chan struct{})
	)
	var eng2 nvme.Device = eng
	onDone := func(r *nvme.Request) {
		now := time.Now()
		mu.Lock()
		i := r.Tag
		if r.Err != nil && firstErr == nil {
			firstErr = r.Err
		}
		m.latUs = append(m.latUs, float64(now.Sub(issued[i]).Nanoseconds())/1e3)
		m.bytes += int64(r.N)
		if r.Op == nvme.OpRead {
			m.readBytes += int64(r.N)
		} else {
			m.writeBytes += int64(r.N)
		}
		again := firstErr == nil && assign(r)
		if again {
			issued[i] = time.Now()
		} else {
			inflight--
		}
		last := inflight == 0
		mu.Unlock()
		if again {
			if err := eng2.Submit(r); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				inflight--
				last = inflight == 0
				mu.Unlock()
			}
		}
		if last {
			close(finished)
		}
	}
	for i := range reqs {
		reqs[i].Tag = uint64(i)
		reqs[i].Buf = mem[int64(i)*opts.BlockBytes : int64(i+1)*opts.BlockBytes]
		reqs[i].Done = onDone
	}
	cpu0 := cpuTime()
	start := time.Now()
	deadline = start.Add(opts.Duration)
	batch := make([]*nvme.Request, 0, qd)
	mu.Lock()
	for i := range reqs {
		if !assign(&reqs[i]) {
			break
		}
		issued[i] = time.Now()
		batch = append(batch, &reqs[i])
	}
	inflight = len(batch)
	mu.Unlock()
	if err := eng.Submit(batch...); err != nil {
		return m, fmt.Errorf("bench: %w", err)
	}
	tick := time.NewTicker(opts.ProgressTick)
	defer tick.Stop()
wait:
	for {
		select {
		case <-finished:
			break wait
		case now := <-tick.C:
			if opts.Progress != nil {
				mu.Lock()
				done := m.bytes
				mu.Unlock()
				exp := expected
				if opts.Duration > 0 {
					exp = 0
				}
				opts.Progress(done, exp, now.Sub(start))
			}
		}
	}
	m.elapsed = time.Since(start)
	m.cpu = cpuTime() - cpu0
	if firstErr != nil {
		return m, fmt.Errorf("bench: %w", firstErr)
	}
	return m, nil
}
