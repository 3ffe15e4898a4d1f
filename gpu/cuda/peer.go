package cuda

import (
	"fmt"
	"strings"
	"sync"
)

// Peer access: without it a copy between two GPUs (cuMemcpyAsync over
// unified addressing) is staged through host memory, at PCIe speed, where
// NVLink would carry it directly. The first backend over a set of GPUs
// enables it (cuCtxEnablePeerAccess, in each GPU's primary context, for
// every other GPU that cuDeviceCanAccessPeer allows); it then holds for
// the process, as the primary contexts do.

// cudaPeerAccessAlreadyEnabled is CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
// another user of the primary context (NCCL) enabled it first.
const cudaPeerAccessAlreadyEnabled cuResult = 704

// gpuPair is an ordered pair of GPU ordinals: from reads to.
type gpuPair struct{ from, to int }

// peerMiss is a pair without peer access and why: "" where the hardware
// does not allow it, the driver's error where enabling it failed (too many
// peers, for one).
type peerMiss struct {
	gpuPair
	why string
}

var (
	peerMu   sync.Mutex
	peerSeen = map[gpuPair]*peerMiss{} // pairs asked about so far: nil where access is on
)

// enablePeers enables peer access between every ordered pair of gpus
// that allows it and returns the pairs without it (whose copies go
// through host memory).
func enablePeers(drv *driverAPI, gpus []*gpuCtx) []peerMiss {
	peerMu.Lock()
	defer peerMu.Unlock()
	var out []peerMiss
	for _, a := range gpus {
		for _, b := range gpus {
			if a == b {
				continue
			}
			p := gpuPair{a.ordinal, b.ordinal}
			m, seen := peerSeen[p]
			if !seen {
				m = enablePeer(drv, a, b)
				peerSeen[p] = m
			}
			if m != nil {
				out = append(out, *m)
			}
		}
	}
	return out
}

// enablePeer lets a's context read and write b's memory when the hardware
// allows it; nil when it does.
func enablePeer(drv *driverAPI, a, b *gpuCtx) *peerMiss {
	miss := &peerMiss{gpuPair: gpuPair{a.ordinal, b.ordinal}}
	var can int32
	if err := drv.check(drv.cuDeviceCanAccessPeer(&can, a.dev, b.dev), "cuDeviceCanAccessPeer"); err != nil {
		miss.why = err.Error()
		return miss
	}
	if can == 0 {
		return miss
	}
	err := a.do(func() error {
		if r := drv.cuCtxEnablePeerAccess(b.ctx, 0); r != cudaPeerAccessAlreadyEnabled {
			return drv.check(r, "cuCtxEnablePeerAccess")
		}
		return nil
	})
	if err != nil {
		miss.why = err.Error()
		return miss
	}
	return nil
}

// describePeers says how gpus GPUs reach each other: nothing with one GPU,
// else whether every pair has peer access, or which pairs do not.
func describePeers(gpus int, misses []peerMiss) string {
	switch {
	case gpus < 2:
		return ""
	case len(misses) == 0:
		return fmt.Sprintf("peer access between all %d GPUs", gpus)
	}
	var b strings.Builder
	b.WriteString("no peer access from")
	for i, m := range misses {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " GPU %d to %d", m.from, m.to)
		if m.why != "" {
			fmt.Fprintf(&b, " (%s)", m.why)
		}
	}
	b.WriteString(": those copies are staged through host memory")
	return b.String()
}
