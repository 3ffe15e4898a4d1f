package infer

import (
	"container/list"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/shard"
)

// Where a mixture of experts' experts live while it generates
// (Options.Experts).
const (
	ExpertsDevice = "device" // with the rest of the weights (the default)
	ExpertsHost   = "cpu"    // in host RAM, each copied to the device when a token reaches it
	ExpertsNVMe   = "nvme"   // in a file under Options.NVMePath, read with O_DIRECT when a token reaches it
)

// Expert cache policies (Options.ExpertPolicy). TinyLFU is the default:
// over 256 sampled tokens of a Qwen3-MoE-shaped model (128 experts, 8
// routed, a cache of a quarter of them) it hit 0.70 and 0.66 where LRU
// hit 0.64 and 0.58 (TestExpertCacheHitRate, two router skews): expert
// popularity is skewed, and frequency beats recency on it.
const (
	PolicyLRU     = "lru"     // evict the expert used least recently
	PolicyTinyLFU = "tinylfu" // ristretto's TinyLFU admission and sampled-LFU eviction
)

// ExpertStats are an expert store's counters since Load.
type ExpertStats struct {
	// Acquires is the experts the decoder used (routed experts per layer
	// per call), Hits those the cache held, Reads the bytes read from the
	// experts' tier (host RAM or NVMe) for the misses.
	Acquires, Hits int64
	Reads          int64
	// ExpertBytes is one expert's bytes in the device dtype (Reads counts
	// NVMe reads padded to the file's alignment).
	ExpertBytes int64
	// Slots is the cache's experts on the device (Options.ExpertCache) and
	// Policy its policy.
	Slots  int
	Policy string
}

// HitRate is Hits over Acquires (0 before any).
func (s ExpertStats) HitRate() float64 {
	if s.Acquires == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Acquires)
}

// expertStore is the Params of a decoder whose experts live off the
// device: every other chunk resident (model.Weights of them), each expert
// in host RAM or in one NVMe file at its own aligned offset, and a cache
// of Slots experts on the device. As model.ExpertPrefetcher it learns a
// layer's routed experts as soon as the router has run and reads all its
// misses from NVMe at once; the experts no token reached are never read.
// One slot more than the cache holds is the scratch a miss is uploaded
// into: the policy then admits it (the scratch becomes the entry, a
// victim's slot the next scratch) or not. Every upload is enqueued on the
// decoder's stream after the work before it, so a slot is overwritten only
// after the GEMMs that read it.
type expertStore struct {
	*model.Weights
	dev    gpu.Device
	layout *model.Layout
	dt     gpu.DType
	bytes  int64 // one expert's bytes in dt

	host [][]byte // ExpertsHost: per expert chunk (expertIndex), its bytes in dt
	file *nvme.File
	eng  *nvme.Engine
	pad  int64 // ExpertsNVMe: an expert's bytes rounded up to the file's alignment

	slots    []gpu.Buffer
	resident map[int]int // expert chunk -> the slot holding it
	free     []int       // slots holding nothing
	scratch  int         // the slot a miss is uploaded into
	cache    expertCache

	staging []*stagingBuf       // ExpertsNVMe: read buffers, reused once their upload is done
	used    int                 // staging buffers holding the layer's reads
	pending map[int]*stagingBuf // ExpertsNVMe: the layer's misses, read ahead
	stats   ExpertStats
}

type stagingBuf struct {
	b      []byte
	copied gpu.Event // its last upload; nil: none
}

// expertCache is a replacement policy over the experts in the slots.
type expertCache interface {
	// touch records an access to expert chunk c (before it is known to
	// be a hit).
	touch(c int)
	// admit offers c, just uploaded into slot. It returns the chunk
	// evicted for it and that chunk's slot (victim -1: none evicted),
	// or rejected when the policy keeps c out (slot stays free).
	admit(c, slot int) (victim, victimSlot int, rejected bool)
	close()
}

// newExpertStore writes each expert chunk of m's layout to where
// (ExpertsHost, or ExpertsNVMe in a file under dir) and caches slots of
// them on the device under policy; w holds the other chunks.
func newExpertStore(m *Model, w *model.Weights, where, dir string, slots int, policy string) (_ *expertStore, err error) {
	l, dt, s := m.Layout, m.DType, m.Layout.Shape
	es := &expertStore{Weights: w, dev: m.Device, layout: l, dt: dt, bytes: s.ExpertParamCount() * int64(dt.Size()),
		resident: map[int]int{}, pending: map[int]*stagingBuf{}}
	es.stats = ExpertStats{ExpertBytes: es.bytes, Slots: slots, Policy: policy}
	defer func() {
		if err != nil {
			es.close()
		}
	}()
	if es.cache, err = newExpertCache(policy, slots); err != nil {
		return nil, err
	}
	var out []byte
	if where == ExpertsNVMe {
		if dir == "" {
			return nil, errors.New("the experts on NVMe need an NVMe path (--nvme-path DIR)")
		}
		path := filepath.Join(dir, fmt.Sprintf("strata-experts-%d.bin", os.Getpid()))
		if es.file, err = nvme.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
			return nil, fmt.Errorf("the experts' file: %w", err)
		}
		os.Remove(path) // the open file lives on; nothing is left behind
		if es.eng, err = nvme.Open(nvme.Options{}); err != nil {
			return nil, err
		}
		align := es.file.Alignment()
		es.pad = (es.bytes + align - 1) / align * align
		out = aligned(es.pad, align)
	}
	vals := make([]float32, s.ExpertParamCount())
	src := m.Source.Weights()
	for c := range l.Chunks {
		if !l.IsExpert(c) {
			continue
		}
		if err := src.ReadChunk(c, vals); err != nil {
			return nil, fmt.Errorf("--model %s: %w", m.Source.Path, err)
		}
		if where == ExpertsHost {
			b := make([]byte, es.bytes)
			encode(dt, b, vals)
			es.host = append(es.host, b)
			continue
		}
		encode(dt, out[:es.bytes], vals)
		if err := es.eng.WriteAt(es.file, out, int64(es.expertIndex(c))*es.pad); err != nil {
			return nil, fmt.Errorf("write the experts' file: %w", err)
		}
	}
	for i := range slots + 1 {
		buf, err := m.Device.Alloc(int(s.ExpertParamCount()), dt, gpu.Tag{Kind: gpu.ModelState, Purpose: "expert cache"})
		if err != nil {
			return nil, fmt.Errorf("the expert cache (%d experts of %d B on the device): %w", slots+1, es.bytes, err)
		}
		es.slots = append(es.slots, buf)
		if i < slots {
			es.free = append(es.free, i)
		}
	}
	es.scratch = slots
	return es, nil
}

// aligned is n bytes starting at a multiple of align.
func aligned(n, align int64) []byte {
	b := make([]byte, n+align)
	skip := (align - int64(uintptr(unsafe.Pointer(&b[0])))%align) % align
	return b[skip : skip+n]
}

// encode writes v in dt into b (dt.Size() bytes a value).
func encode(dt gpu.DType, b []byte, v []float32) {
	if dt == gpu.F32 {
		copy(dtype.Float32s(b), v)
		return
	}
	dtype.Narrow(dt, dtype.Uint16s(b), v)
}

// expertIndex is chunk c's index among the expert chunks.
func (es *expertStore) expertIndex(c int) int { return c - es.layout.Shape.Layers - 2 }

// PrefetchExperts implements model.ExpertPrefetcher: the misses among a
// layer's routed experts are read from NVMe at once (the engine keeps
// them all in flight), each into a staging buffer whose last upload is
// done, ahead of the decoder's Acquires.
func (es *expertStore) PrefetchExperts(chunks []int) error {
	clear(es.pending)
	es.used = 0
	if es.eng == nil {
		return nil
	}
	var misses []int
	for _, c := range chunks {
		if _, ok := es.resident[c]; !ok {
			misses = append(misses, c)
		}
	}
	return es.read(misses)
}

// read reads chunks from NVMe at once into the next staging buffers.
func (es *expertStore) read(chunks []int) error {
	for len(es.staging) < es.used+len(chunks) {
		es.staging = append(es.staging, &stagingBuf{b: aligned(es.pad, es.file.Alignment())})
	}
	errs := make([]error, len(chunks))
	var wg sync.WaitGroup
	for i, c := range chunks {
		sb := es.staging[es.used+i]
		if sb.copied != nil {
			sb.copied.Synchronize() // its last upload has read it
		}
		es.pending[c] = sb
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = es.eng.ReadAt(es.file, sb.b, int64(es.expertIndex(c))*es.pad)
		}()
	}
	es.used += len(chunks)
	wg.Wait()
	es.stats.Reads += int64(len(chunks)) * es.pad
	return errors.Join(errs...)
}

// Acquire implements model.Params: an expert from its slot, uploaded
// there first on a miss; any other chunk from the weights.
func (es *expertStore) Acquire(s gpu.Stream, c int, pass shard.Phase) (gpu.Buffer, error) {
	if !es.layout.IsExpert(c) {
		return es.Weights.Acquire(s, c, pass)
	}
	es.stats.Acquires++
	es.cache.touch(c)
	if slot, ok := es.resident[c]; ok {
		es.stats.Hits++
		return es.slots[slot], nil
	}
	slot := es.scratch
	switch {
	case es.host != nil:
		es.dev.CopyHostToDevice(s, es.slots[slot], 0, es.host[es.expertIndex(c)])
		es.stats.Reads += es.bytes
	default:
		sb, ok := es.pending[c]
		if !ok { // not read ahead (evicted by an earlier miss of its layer, or not announced): read it now
			if err := es.read([]int{c}); err != nil {
				return nil, fmt.Errorf("infer: read %s: %w", es.layout.Chunks[c].Name, err)
			}
			sb = es.pending[c]
		}
		delete(es.pending, c)
		es.dev.CopyHostToDevice(s, es.slots[slot], 0, sb.b[:es.bytes])
		if sb.copied == nil {
			sb.copied = es.dev.NewEvent()
		}
		s.Record(sb.copied)
	}
	victim, victimSlot, rejected := es.cache.admit(c, slot)
	if !rejected {
		es.resident[c] = slot
		switch {
		case victim >= 0:
			delete(es.resident, victim)
			es.scratch = victimSlot
		case len(es.free) > 0:
			es.scratch, es.free = es.free[len(es.free)-1], es.free[:len(es.free)-1]
		default:
			return nil, fmt.Errorf("infer: the expert cache admitted %s with no slot free", es.layout.Chunks[c].Name)
		}
	}
	return es.slots[slot], nil
}

// Stats is the store's counters since Load.
func (es *expertStore) Stats() ExpertStats { return es.stats }

// close frees the slots and closes the file; the weights are the
// model's to free.
func (es *expertStore) close() {
	if es.cache != nil {
		es.cache.close()
	}
	for _, b := range es.slots {
		es.dev.Free(b)
	}
	es.slots = nil
	if es.eng != nil {
		es.eng.Close()
	}
	if es.file != nil {
		es.file.Close()
	}
}

// newExpertCache is policy's cache of slots experts.
func newExpertCache(policy string, slots int) (expertCache, error) {
	switch policy {
	case PolicyLRU:
		return &lruCache{cap: slots, at: map[int]*list.Element{}}, nil
	case "", PolicyTinyLFU:
		return newTinyLFU(slots)
	}
	return nil, fmt.Errorf("expert cache policy %q: want %s or %s", policy, PolicyLRU, PolicyTinyLFU)
}

// lruCache evicts the expert used least recently.
type lruCache struct {
	cap   int
	order list.List // front: the most recent; values are lruEntry
	at    map[int]*list.Element
}

type lruEntry struct{ chunk, slot int }

func (c *lruCache) touch(chunk int) {
	if e, ok := c.at[chunk]; ok {
		c.order.MoveToFront(e)
	}
}

func (c *lruCache) admit(chunk, slot int) (int, int, bool) {
	if c.cap == 0 {
		return -1, -1, true
	}
	victim, victimSlot := -1, -1
	if c.order.Len() == c.cap {
		back := c.order.Back()
		v := back.Value.(lruEntry)
		victim, victimSlot = v.chunk, v.slot
		c.order.Remove(back)
		delete(c.at, v.chunk)
	}
	c.at[chunk] = c.order.PushFront(lruEntry{chunk, slot})
	return victim, victimSlot, false
}

func (c *lruCache) close() {}

// tinyLFU is ristretto's cache of (chunk, slot) entries: TinyLFU admission
// (a new expert enters only if the sketch counts it more often used than
// the eviction's sampled victim) and sampled-LFU eviction; each Set is
// waited for, so its eviction or rejection is known before Acquire
// returns.
type tinyLFU struct {
	c        *ristretto.Cache[int, lruEntry]
	victims  []lruEntry
	rejected bool
	cap      int
}

func newTinyLFU(slots int) (*tinyLFU, error) {
	t := &tinyLFU{cap: slots}
	if slots == 0 {
		return t, nil
	}
	c, err := ristretto.NewCache(&ristretto.Config[int, lruEntry]{
		NumCounters: int64(max(10*slots, 100)), MaxCost: int64(slots), BufferItems: 64, IgnoreInternalCost: true,
		OnEvict:  func(it *ristretto.Item[lruEntry]) { t.victims = append(t.victims, it.Value) },
		OnReject: func(*ristretto.Item[lruEntry]) { t.rejected = true },
	})
	if err != nil {
		return nil, fmt.Errorf("the expert cache (ristretto): %w", err)
	}
	t.c = c
	return t, nil
}

func (t *tinyLFU) touch(chunk int) {
	if t.c != nil {
		t.c.Get(chunk)
	}
}

func (t *tinyLFU) admit(chunk, slot int) (int, int, bool) {
	if t.c == nil {
		return -1, -1, true
	}
	t.victims, t.rejected = t.victims[:0], false
	if !t.c.Set(chunk, lruEntry{chunk, slot}, 1) {
		return -1, -1, true // dropped
	}
	t.c.Wait()
	switch {
	case t.rejected:
		return -1, -1, true
	case len(t.victims) > 1:
		panic(fmt.Sprintf("infer: ristretto evicted %d experts for one of cost 1", len(t.victims)))
	case len(t.victims) == 1:
		return t.victims[0].chunk, t.victims[0].slot, false
	}
	return -1, -1, false
}

func (t *tinyLFU) close() {
	if t.c != nil {
		t.c.Close()
	}
}
