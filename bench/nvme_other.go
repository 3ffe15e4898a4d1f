//go:build !linux

package bench

import (
	"errors"
	"time"
)

func mapAligned(n int64) ([]byte, error) { return nil, errors.New("bench: nvme runs on Linux only") }
func unmapAligned([]byte)                {}
func cpuTime() time.Duration             { return 0 }

type blockTracer struct{}

func startBlockTrace([]benchFile) (*blockTracer, string) {
	return nil, "no device latency: block tracepoints need Linux"
}
func (t *blockTracer) stop() (p50, p99, p999 float64, ios int64, note string) { return }
