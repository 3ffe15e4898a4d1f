package bench

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// blockTracer measures device latency, from block:block_rq_issue to
// block:block_rq_complete, with two small BPF programs on the raw
// tracepoints (no tracefs needed). The issue program keeps requests whose
// rq->part->bd_dev is a device holding one of the files (offsets from the
// kernel's BTF) and records the time per struct request pointer (args[0]);
// the complete program turns it into a histogram of log2 octaves split in 8
// linear sub-buckets (12.5% resolution). Every request to those devices is
// counted, other processes' included.
type blockTracer struct {
	start, hist *ebpf.Map
	sizes       *ebpf.Map // [0]: requests issued, [1]: their bytes (rq->__data_len)
	progs       []*ebpf.Program
	issued      uint64 // read from sizes by stop
	issuedBytes uint64
	links       []link.Link
}

const (
	histSubBits  = 3
	histBuckets  = 64 << histSubBits
	traceMaxReqs = 1 << 16
)

// startBlockTrace attaches the tracer, or returns nil and says exactly why not.
func startBlockTrace(files []benchFile) (*blockTracer, string) {
	_ = rlimit.RemoveMemlock() // kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK
	partOff, devOff, lenOff, err := requestOffsets()
	if err != nil {
		return nil, "no device latency: " + err.Error()
	}
	var devs []uint32
	for _, f := range files {
		var st unix.Stat_t
		if err := unix.Fstat(f.f.Fd(), &st); err != nil {
			return nil, fmt.Sprintf("no device latency: stat %s: %v", f.path, err)
		}
		// The kernel's dev_t is MKDEV(major, minor) = major<<20 | minor.
		d := unix.Major(st.Dev)<<20 | unix.Minor(st.Dev)
		if !slices.Contains(devs, d) {
			devs = append(devs, d)
		}
	}
	t := &blockTracer{}
	t.start, err = ebpf.NewMap(&ebpf.MapSpec{Name: "strata_rq_start", Type: ebpf.LRUHash, KeySize: 8, ValueSize: 8, MaxEntries: traceMaxReqs})
	if err != nil {
		return nil, traceWhyNot("create BPF map", err)
	}
	t.hist, err = ebpf.NewMap(&ebpf.MapSpec{Name: "strata_rq_hist", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: histBuckets})
	if err != nil {
		t.close()
		return nil, traceWhyNot("create BPF map", err)
	}
	t.sizes, err = ebpf.NewMap(&ebpf.MapSpec{Name: "strata_rq_sizes", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	if err != nil {
		t.close()
		return nil, traceWhyNot("create BPF map", err)
	}
	for _, tp := range []struct {
		name string
		ins  asm.Instructions
	}{{"block_rq_issue", issueProgram(t.start.FD(), t.sizes.FD(), partOff, devOff, lenOff, devs)}, {"block_rq_complete", completeProgram(t.start.FD(), t.hist.FD())}} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "strata_" + tp.name[:12], Type: ebpf.RawTracepoint, License: "GPL", Instructions: tp.ins})
		if err != nil {
			t.close()
			return nil, traceWhyNot("load BPF program for "+tp.name, err)
		}
		t.progs = append(t.progs, prog)
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: prog})
		if err != nil {
			t.close()
			return nil, traceWhyNot("attach to raw tracepoint block:"+tp.name, err)
		}
		t.links = append(t.links, l)
	}
	return t, ""
}

func traceWhyNot(what string, err error) string {
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Sprintf("no device latency: %s: %v (needs CAP_BPF and CAP_PERFMON, or root; check kernel.unprivileged_bpf_disabled)", what, err)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Sprintf("no device latency: %s: %v (kernel too old or built without BPF raw tracepoints)", what, err)
	}
	return fmt.Sprintf("no device latency: %s: %v", what, err)
}

// requestOffsets finds offsetof(struct request, part),
// offsetof(struct block_device, bd_dev) and offsetof(struct request,
// __data_len) in the running kernel's BTF.
func requestOffsets() (partOff, devOff, lenOff int16, err error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("kernel BTF unavailable (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF): %w", err)
	}
	off := func(structName, member string) (int16, error) {
		var st *btf.Struct
		if err := spec.TypeByName(structName, &st); err != nil {
			return 0, fmt.Errorf("kernel BTF lacks struct %s: %w", structName, err)
		}
		for _, m := range st.Members {
			if m.Name == member {
				return int16(m.Offset.Bytes()), nil
			}
		}
		return 0, fmt.Errorf("kernel BTF: struct %s has no member %s", structName, member)
	}
	if partOff, err = off("request", "part"); err != nil {
		return 0, 0, 0, err
	}
	if lenOff, err = off("request", "__data_len"); err != nil {
		return 0, 0, 0, err
	}
	devOff, err = off("block_device", "bd_dev")
	return partOff, devOff, lenOff, err
}

// issueProgram: if rq->part->bd_dev is one of devs, sizes[0] += 1,
// sizes[1] += rq->__data_len and start[rq] = ktime_get_ns().
func issueProgram(startFD, sizesFD int, partOff, devOff, lenOff int16, devs []uint32) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),               // r6 = ctx (struct bpf_raw_tracepoint_args)
		asm.LoadMem(asm.R7, asm.R6, 0, asm.DWord), // r7 = args[0]: struct request *rq
		asm.StoreMem(asm.RFP, -8, asm.R7, asm.DWord),
		// bpf_probe_read_kernel(fp-16, 8, &rq->part)
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -16),
		asm.Mov.Imm(asm.R2, 8),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Add.Imm(asm.R3, int32(partOff)),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R3, asm.RFP, -16, asm.DWord),
		asm.JEq.Imm(asm.R3, 0, "out"),
		// bpf_probe_read_kernel(fp-24, 4, &part->bd_dev)
		asm.Add.Imm(asm.R3, int32(devOff)),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -24),
		asm.Mov.Imm(asm.R2, 4),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.RFP, -24, asm.Word),
	}
	for _, d := range devs {
		ins = append(ins, asm.JEq.Imm(asm.R1, int32(d), "match"))
	}
	ins = append(ins,
		asm.Ja.Label("out"),
		// bpf_probe_read_kernel(fp-32, 4, &rq->__data_len)
		asm.Mov.Reg(asm.R1, asm.RFP).WithSymbol("match"),
		asm.Add.Imm(asm.R1, -32),
		asm.Mov.Imm(asm.R2, 4),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Add.Imm(asm.R3, int32(lenOff)),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, "timing"),
		asm.LoadMem(asm.R8, asm.RFP, -32, asm.Word),
	)
	for _, add := range []struct {
		key int64
		reg asm.Register
	}{{0, asm.R9}, {1, asm.R8}} {
		ins = append(ins,
			asm.Mov.Imm(asm.R9, 1),
			asm.StoreImm(asm.RFP, -36, add.key, asm.Word),
			asm.LoadMapPtr(asm.R1, sizesFD),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -36),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "timing"),
			asm.StoreXAdd(asm.R0, add.reg, asm.DWord),
		)
	}
	ins = append(ins,
		asm.FnKtimeGetNs.Call().WithSymbol("timing"),
		asm.StoreMem(asm.RFP, -16, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, startFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -16),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	return ins
}

// completeProgram: d = now - start[rq]; delete start[rq]; hist[bucket(d)]++.
// bucket(d) = e<<3 | (d >> (e-3)) & 7 with e = floor(log2 d), for e >= 3.
func completeProgram(startFD, histFD int) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R1, asm.R6, 0, asm.DWord), // args[0]: struct request *
		asm.StoreMem(asm.RFP, -8, asm.R1, asm.DWord),
		asm.LoadMapPtr(asm.R1, startFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.DWord), // start time
		asm.FnKtimeGetNs.Call(),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Sub.Reg(asm.R8, asm.R7), // r8 = latency in ns
		asm.LoadMapPtr(asm.R1, startFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapDeleteElem.Call(),
		// r9 = floor(log2(r8)) by binary search, unrolled.
		asm.Mov.Imm(asm.R9, 0),
		asm.Mov.Reg(asm.R1, asm.R8),
	}
	for _, sh := range []int32{32, 16, 8, 4, 2, 1} {
		skip := fmt.Sprintf("log2_%d", sh)
		ins = append(ins,
			asm.Mov.Reg(asm.R2, asm.R1),
			asm.RSh.Imm(asm.R2, sh),
			asm.JEq.Imm(asm.R2, 0, skip),
			asm.Mov.Reg(asm.R1, asm.R2),
			asm.Add.Imm(asm.R9, sh),
			asm.Mov.Imm(asm.R2, 0).WithSymbol(skip), // no-op landing pad
		)
	}
	ins = append(ins,
		asm.Mov.Imm(asm.R3, 0), // sub-bucket
		asm.JLT.Imm(asm.R9, histSubBits, "index"),
		asm.Mov.Reg(asm.R2, asm.R9),
		asm.Sub.Imm(asm.R2, histSubBits),
		asm.Mov.Reg(asm.R3, asm.R8),
		asm.RSh.Reg(asm.R3, asm.R2),
		asm.And.Imm(asm.R3, 1<<histSubBits-1),
		asm.Mov.Reg(asm.R1, asm.R9).WithSymbol("index"),
		asm.LSh.Imm(asm.R1, histSubBits),
		asm.Or.Reg(asm.R1, asm.R3),
		asm.And.Imm(asm.R1, histBuckets-1),
		asm.StoreMem(asm.RFP, -12, asm.R1, asm.Word),
		asm.LoadMapPtr(asm.R1, histFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -12),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	return ins
}

// stop detaches, reads the requests issued and their bytes, and turns the
// histogram into percentiles (bucket midpoints).
func (t *blockTracer) stop() (p50, p99, p999 float64, ios int64, note string) {
	for _, l := range t.links {
		l.Close()
	}
	t.links = nil
	for i, dst := range []*uint64{&t.issued, &t.issuedBytes} {
		if err := t.sizes.Lookup(uint32(i), dst); err != nil {
			t.close()
			return 0, 0, 0, 0, fmt.Sprintf("no device latency: read BPF request sizes: %v", err)
		}
	}
	counts := make([]uint64, histBuckets)
	for i := range counts {
		if err := t.hist.Lookup(uint32(i), &counts[i]); err != nil {
			t.close()
			return 0, 0, 0, 0, fmt.Sprintf("no device latency: read BPF histogram: %v", err)
		}
	}
	t.close()
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0, 0, 0, 0, "no device latency: no block requests reached the devices of the files (page cache, or a filesystem without a block device)"
	}
	q := func(f float64) float64 {
		want := uint64(f*float64(total) + 0.5)
		var seen uint64
		for i, c := range counts {
			seen += c
			if seen >= max(want, 1) {
				e, s := i>>histSubBits, i&(1<<histSubBits-1)
				if e < histSubBits {
					return float64(uint64(1)<<e) / 1e3
				}
				w := float64(uint64(1) << (e - histSubBits))
				return (float64(uint64(1)<<e) + (float64(s)+0.5)*w) / 1e3
			}
		}
		return 0
	}
	return q(0.5), q(0.99), q(0.999), int64(total), ""
}

func (t *blockTracer) close() {
	for _, l := range t.links {
		l.Close()
	}
	for _, p := range t.progs {
		p.Close()
	}
	if t.start != nil {
		t.start.Close()
	}
	if t.hist != nil {
		t.hist.Close()
	}
	if t.sizes != nil {
		t.sizes.Close()
	}
}

// avgBytes is the average size of the requests the issue program counted
// (read after stop); 0 when none.
func (t *blockTracer) avgBytes() int64 {
	if t.issued == 0 {
		return 0
	}
	return int64(t.issuedBytes / t.issued)
}
