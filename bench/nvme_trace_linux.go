package bench

// blockTracer measures device latency from block:block_rq_issue to
// block:block_rq_complete with a BPF program (cilium/ebpf).
type blockTracer struct{}

// startBlockTrace attaches the tracer, or says why it cannot.
func startBlockTrace(files []benchFile) (*blockTracer, string) {
	return nil, "not built yet"
}

func (t *blockTracer) stop() (p50, p99, p999 float64, ios int64, note string) { return 0, 0, 0, 0, "" }
