package tier

import (
	"fmt"
	"sync"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/pinned"
)

// Coded shards (Spec.Stored): the host and NVMe copies hold the shard in
// its stored dtype (NF4: a frozen base in 4 bits), and an HBM copy is
// decoded on the device as it arrives: the stored bytes are copied into
// the device's codec scratch on its host-to-device stream and
// gpu.Ops.Dequantize writes the HBM copy from there. The links carry
// the stored bytes (the host-to-device counters count them). One scratch
// per device, as large as the largest coded shard of the states
// ReserveHBM reserves (taken with the slots, counted in SlotBytes; a store
// without ReserveHBM takes it at the first coded upload), used by one
// upload at a time.

type codecScratch struct {
	mu  sync.Mutex
	buf gpu.Buffer // U8
}

// reserveCodec takes each device's codec scratch for the coded shards
// among entries of want (ReserveHBM's), adding its size to bytes.
func (s *Store) reserveCodec(stored []int64, bytes []int64) error {
	for r, n := range stored {
		if n == 0 {
			continue
		}
		buf, err := s.devAlloc(int32(r), int(n), gpu.U8, gpu.Tag{Kind: gpu.Workspace, Purpose: CodecPurpose})
		if err != nil {
			return fmt.Errorf("tier: rank %d: codec scratch of %d bytes: %w", r, n, err)
		}
		s.codec[r].mu.Lock()
		s.codec[r].buf = buf
		s.codec[r].mu.Unlock()
		bytes[r] += buf.Bytes()
	}
	return nil
}

// CodecPurpose is the purpose of the codec scratch's device allocation.
const CodecPurpose = "tier codec scratch"

// uploadCoded copies a coded shard's stored bytes into the device's
// scratch and decodes them into dst (the HBM copy), then waits.
func (s *Store) uploadCoded(e *entry, src *pinned.Buffer, dst gpu.Buffer) error {
	r := e.key.Rank
	cs := &s.codec[r]
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.buf == nil || cs.buf.Len() < int(e.storedBytes) {
		if cs.buf != nil {
			s.devs[r].Free(cs.buf)
			cs.buf = nil
		}
		buf, err := s.devAlloc(r, int(e.storedBytes), gpu.U8, gpu.Tag{Kind: gpu.Workspace, Purpose: CodecPurpose})
		if err != nil {
			return fmt.Errorf("tier: %s: codec scratch: %w", e.key, err)
		}
		cs.buf = buf
	}
	st := s.h2d[r]
	scratch := cs.buf.Slice(0, int(e.storedBytes))
	s.devs[r].CopyHostToDevice(st, scratch, 0, src.Bytes()[:e.storedBytes])
	s.devs[r].Ops().Dequantize(st, e.spec.Stored, scratch, dst, e.spec.Elems)
	ev := s.devs[r].NewEvent()
	st.Record(ev)
	ev.Synchronize()
	return nil
}

// closeCodecLocked frees the scratch buffers once s.mu is released
// (Close, s.mu held; no move in flight).
func (s *Store) closeCodecLocked() {
	for r := range s.codec {
		cs := &s.codec[r]
		cs.mu.Lock()
		if cs.buf != nil {
			s.frees = append(s.frees, pendingFree{int32(r), cs.buf})
			cs.buf = nil
		}
		cs.mu.Unlock()
	}
}
