package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// legacyRankFile is the rank file the whole-State writer wrote before the
// streaming save (its writeRankFile, kept here as the reference): the
// header of every tensor, then rank r's shards, chunk by chunk, state by
// state, from memory; and its CRC-32C.
func legacyRankFile(t *testing.T, st *State, r int) ([]byte, uint32) {
	t.Helper()
	var entries []safetensors.Entry
	for c, ch := range st.Chunks {
		for k, s := range st.States {
			entries = append(entries, safetensors.Entry{Name: tensorName(c, s.Kind), DType: s.DType, Shape: []int{ch.ShardElems}, SizeBytes: int64(len(st.Data[r][c][k]))})
		}
	}
	md := map[string]string{"format": FormatName, "strata.rank": strconv.Itoa(r), "strata.devices": strconv.Itoa(st.Devices), hf.MetaStep: strconv.FormatInt(st.Step, 10)}
	hdr, err := safetensors.EncodeEntries(entries, md)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.Write(hdr)
	for c := range st.Chunks {
		for k := range st.States {
			b.Write(st.Data[r][c][k])
		}
	}
	return b.Bytes(), crc32.Checksum(b.Bytes(), castagnoli)
}

// readCheckpointFiles returns the manifest and the rank files of the checkpoint under dir.
func readCheckpointFiles(t *testing.T, dir string) (*Manifest, [][]byte) {
	t.Helper()
	m, path, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files [][]byte
	for _, f := range m.Files {
		b, err := os.ReadFile(filepath.Join(path, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, b)
	}
	return m, files
}

// TestStreamSaveMatchesLegacy: SaveWith (now streaming from a State) and
// SaveStream (from a callback) write the same rank files, byte for byte,
// as the whole-State writer did, with the same sizes and CRC-32Cs in the
// manifest, for N = 1, 2, 4 and another alignment.
func TestStreamSaveMatchesLegacy(t *testing.T) {
	for _, c := range []struct{ devices, align int }{{1, 2048}, {2, 2048}, {4, 2048}, {3, 1}} {
		t.Run(fmt.Sprintf("N=%d align=%d", c.devices, c.align), func(t *testing.T) {
			st := filledState(t, c.devices, c.align, 7)
			withState, stream := t.TempDir(), t.TempDir()
			if err := SaveWith(withState, st, Options{}); err != nil {
				t.Fatal(err)
			}
			calls := 0
			err := SaveStream(stream, st.Meta(), func(ch, k int, whole []byte) error {
				calls++
				per := st.Chunks[ch].ShardElems * st.States[k].DType.Size()
				if len(whole) != st.Devices*per {
					t.Fatalf("chunk %d state %d: whole of %d bytes, want %d", ch, k, len(whole), st.Devices*per)
				}
				for r := range st.Devices {
					copy(whole[r*per:], st.Data[r][ch][k])
				}
				return nil
			}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if want := len(st.Chunks) * len(st.States); calls != want {
				t.Errorf("fill called %d times, want %d", calls, want)
			}
			for _, dir := range []string{withState, stream} {
				m, files := readCheckpointFiles(t, dir)
				for r, b := range files {
					want, crc := legacyRankFile(t, st, r)
					if !bytes.Equal(b, want) {
						t.Errorf("%s: rank %d file differs from the whole-State writer's (%d vs %d bytes)", dir, r, len(b), len(want))
					}
					if m.Files[r].SizeBytes != int64(len(want)) || m.Files[r].CRC32C != crc {
						t.Errorf("%s: rank %d manifest %+v, want %d bytes crc %#x", dir, r, m.Files[r], len(want), crc)
					}
				}
			}
			m1, _ := readCheckpointFiles(t, withState)
			m2, _ := readCheckpointFiles(t, stream)
			m1.Created = m2.Created
			j1, _ := json.Marshal(m1)
			j2, _ := json.Marshal(m2)
			if !bytes.Equal(j1, j2) {
				t.Errorf("manifests differ:\n%s\n%s", j1, j2)
			}
		})
	}
}

// patternByte is the byte i of rank r's shard of chunk c, state k, of the
// memory-bound test's model (padding included: a streamed state need not
// have zero padding).
func patternByte(r, c, k, i int) byte { return byte(i*7 + r*131 + c*17 + k*59 + i>>9) }

func bigState(t *testing.T, devices int) *State {
	t.Helper()
	// 16 blocks of 12·96² parameters: 1.8M params, 25 MB of mixed-precision
	// state over 18 chunks; the largest chunk is a block, 0.45 MB in f32.
	l, err := model.NewLayout(model.Shape{Name: "bound", Layers: 16, Dim: 96, Heads: 4, Vocab: 64, MaxSeq: 16})
	if err != nil {
		t.Fatal(err)
	}
	meta, err := NewState(l, devices, 3, 2048, MixedPrecisionStates)
	if err != nil {
		t.Fatal(err)
	}
	return meta.Meta() // drop the data NewState allocated
}

func heapAllocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// TestStreamMemoryBound is the must-show of the bound: a save and a load of
// a model whose state is 25 MB allocate, in all (every byte the process
// allocates on the heap while they run, counted by the Go runtime, not
// just the live peak), at most k = 2 wholes (two buffers of the largest
// chunk's f32 state across all ranks, = 2·N of its largest shard tensor)
// plus fixed overhead: 256 KiB per rank for the load's CRC pass and 512
// KiB for headers, manifest and goroutines. Then a load that reshards N=2
// to N=3 the same way, its bytes checked against the pattern.
func TestStreamMemoryBound(t *testing.T) {
	const devices = 2
	meta := bigState(t, devices)
	whole := meta.MaxWholeBytes()
	if want := devices * meta.Chunks[1].ShardElems * 4; whole != want {
		t.Fatalf("largest whole %d bytes, want a block's f32 state %d", whole, want)
	}
	var stateBytes int
	for c := range meta.Chunks {
		for k := range meta.States {
			stateBytes += meta.wholeBytes(c, k)
		}
	}
	const overhead = 512 << 10
	bound := 2*whole + overhead
	if stateBytes < 10*bound {
		t.Fatalf("state %d bytes is not much larger than the bound %d", stateBytes, bound)
	}
	dir := t.TempDir()
	fill := func(c, k int, whole []byte) error {
		per := len(whole) / devices
		for r := range devices {
			for i := range per {
				whole[r*per+i] = patternByte(r, c, k, i)
			}
		}
		return nil
	}
	bufStats.mu.Lock()
	bufStats.totalBytes, bufStats.largestBytes = 0, 0
	bufStats.mu.Unlock()
	before := heapAllocated()
	if err := SaveStream(dir, meta, fill, Options{}); err != nil {
		t.Fatal(err)
	}
	saved := heapAllocated() - before
	t.Logf("save of %d bytes of state: %d bytes allocated (largest whole %d; bound %d)", stateBytes, saved, whole, bound)
	if saved > uint64(bound) {
		t.Errorf("save allocated %d bytes, over the bound %d = 2 × %d + %d", saved, bound, whole, overhead)
	}
	if bufStats.totalBytes != int64(2*whole) || bufStats.largestBytes != int64(whole) {
		t.Errorf("save's buffers: %d bytes in all, largest %d; want 2 × %d", bufStats.totalBytes, bufStats.largestBytes, whole)
	}

	before = heapAllocated()
	rd, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = rd.Read(Expect{Shape: meta.Shape, Devices: devices, ShardAlignElems: 2048, States: meta.States}, func(c, k int, whole []byte) error {
		per := len(whole) / devices
		for r := range devices {
			for i := range per {
				if whole[r*per+i] != patternByte(r, c, k, i) {
					return fmt.Errorf("chunk %d state %d rank %d byte %d: %d, want %d", c, k, r, i, whole[r*per+i], patternByte(r, c, k, i))
				}
			}
		}
		checked += len(whole)
		return nil
	})
	rd.Close()
	loaded := heapAllocated() - before
	if err != nil {
		t.Fatal(err)
	}
	if checked != stateBytes {
		t.Errorf("read %d bytes, want %d", checked, stateBytes)
	}
	loadBound := bound + devices*verifyBlockBytes
	t.Logf("load: %d bytes allocated (bound %d)", loaded, loadBound)
	if loaded > uint64(loadBound) {
		t.Errorf("load allocated %d bytes, over the bound %d", loaded, loadBound)
	}

	// Resharded to 3 ranks: the chunk's elements (the first Elems of the
	// saved wholes) in place, zero after them.
	before = heapAllocated()
	rd, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	err = rd.Read(Expect{Shape: meta.Shape, Devices: 3, ShardAlignElems: 64, States: meta.States}, func(c, k int, whole []byte) error {
		ch, sz := meta.Chunks[c], meta.States[k].DType.Size()
		if want := 3 * ShardElems(ch.Elems, 3, 64) * sz; len(whole) != want {
			return fmt.Errorf("chunk %d: whole of %d bytes, want %d", c, len(whole), want)
		}
		per := ch.ShardElems * sz
		for i, b := range whole {
			want := byte(0)
			if i < ch.Elems*sz {
				want = patternByte(i/per, c, k, i%per)
			}
			if b != want {
				return fmt.Errorf("N=3: chunk %d state %d byte %d: %d, want %d", c, k, i, b, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := heapAllocated() - before; got > uint64(loadBound) {
		t.Errorf("resharding load allocated %d bytes, over %d", got, loadBound)
	}
}

// TestStreamErrors: a fill error stops the save, names the chunk, leaves
// nothing and the previous checkpoint loadable; a consumer's error stops
// the read; a reader refuses another shape before reading the files.
func TestStreamErrors(t *testing.T) {
	dir := t.TempDir()
	prev := filledState(t, 2, 2048, 1)
	if err := Save(dir, prev); err != nil {
		t.Fatal(err)
	}
	next := prev.Meta()
	next.Step = 200
	injected := errors.New("device lost")
	err := SaveStream(dir, next, func(c, k int, whole []byte) error {
		if c == 2 && k == 1 {
			return injected
		}
		return nil
	}, Options{})
	if !errors.Is(err, injected) || !strings.Contains(err.Error(), "chunk 2 master") {
		t.Fatalf("fill error: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) || e.Name() == "step-00000200" {
			t.Errorf("failed save left %s", e.Name())
		}
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, got, prev)

	rd, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	n := 0
	err = rd.Read(Expect{Shape: prev.Shape, Devices: 2, ShardAlignElems: 2048, States: prev.States}, func(c, k int, whole []byte) error {
		n++
		if n == 3 {
			return injected
		}
		return nil
	})
	if !errors.Is(err, injected) || n != 3 {
		t.Errorf("consumer error after %d calls: %v", n, err)
	}
	other := prev.Shape
	other.Layers = 3
	if _, err := OpenFor(dir, Expect{Shape: other, Devices: 2, ShardAlignElems: 2048, States: prev.States}); err == nil || !strings.Contains(err.Error(), "cannot change the model's shape") {
		t.Errorf("other shape: %v", err)
	}
}
