//go:build !linux

package bench

import (
	"errors"
	"time"
)

func cpuTime() time.Duration { return 0 }

func processGone(int) bool { return false }

type ioBuffers struct {
	mem       []byte
	hugeBytes int64
	note      string
}

func newIOBuffers(n int64) (*ioBuffers, error) {
	return nil, errors.New("bench: nvme runs on Linux only")
}
func (b *ioBuffers) close() {}

type blockStats struct{}

func startBlockStats([]benchFile) *blockStats { return &blockStats{} }
func (s *blockStats) stop(res *NVMeResult, _ NVMeOptions, _ bool) {
	res.BlockNote = "no block-layer figures: /sys/block needs Linux"
}

type blockTracer struct{}

func startBlockTrace([]benchFile) (*blockTracer, string) {
	return nil, "no device latency: block tracepoints need Linux"
}
func (t *blockTracer) stop() (p50, p99, p999 float64, ios int64, note string) { return }
func (t *blockTracer) avgBytes() int64                                        { return 0 }
