package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
	"github.com/strata-ai/strata/shard"
)

// filledState is a State of the tiny layout over devices ranks with every
// element of every state set from seed, and zero padding.
func filledState(t testing.TB, devices, align int, seed uint64) *State {
	t.Helper()
	st, err := NewState(tinyLayout(t), devices, 3, align, MixedPrecisionStates)
	if err != nil {
		t.Fatal(err)
	}
	st.Step = 100
	st.Config = []byte(`{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}}`)
	rng := rand.New(rand.NewPCG(seed, 1))
	for c, ch := range st.Chunks {
		for k, s := range st.States {
			sz := s.DType.Size()
			full := make([]byte, ch.Elems*sz)
			for i := range full {
				full[i] = byte(rng.Uint32())
			}
			per := ch.ShardElems * sz
			for r := range devices {
				lo := min(r*per, len(full))
				copy(st.Shard(r, c, k), full[lo:min(lo+per, len(full))])
			}
		}
	}
	return st
}

func sameState(t *testing.T, got, want *State) {
	t.Helper()
	if got.Step != want.Step || got.Devices != want.Devices || got.Stage != want.Stage || got.Shape != want.Shape ||
		got.ShardAlignElems != want.ShardAlignElems || len(got.States) != len(want.States) {
		t.Fatalf("header differs: got step %d devices %d stage %d shape %v align %d states %v", got.Step, got.Devices, got.Stage, got.Shape, got.ShardAlignElems, got.States)
	}
	var a, b bytes.Buffer
	if err := json.Compact(&a, got.Config); err != nil {
		t.Fatal(err)
	}
	json.Compact(&b, want.Config)
	if a.String() != b.String() {
		t.Errorf("config %s, want %s", a.String(), b.String())
	}
	for r := range want.Data {
		for c := range want.Data[r] {
			for k := range want.Data[r][c] {
				if !bytes.Equal(got.Data[r][c][k], want.Data[r][c][k]) {
					t.Fatalf("rank %d chunk %d state %v differs", r, c, want.States[k])
				}
			}
		}
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := filledState(t, 2, 2048, 1)
	if err := Save(dir, st); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, got, st)
	m, checks, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(checks) != 2 || checks[0].Err != nil || checks[1].Err != nil || m.Step != 100 || m.ParamCount() != tinyLayout(t).ParamCount() {
		t.Errorf("verify: %+v %+v", m, checks)
	}
	// A rank file is itself a valid safetensors file.
	h, _, err := safetensors.ReadFile(filepath.Join(dir, "step-00000100", "rank-00001.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if h.Metadata["strata.rank"] != "1" || len(h.Tensors) != len(st.Chunks)*4 {
		t.Errorf("rank file header: %v, %d tensors", h.Metadata, len(h.Tensors))
	}
}

// TestCrashLeavesPreviousLoadable stops a save at every point, as a failed
// write or a crash would, and checks that the previous checkpoint still
// loads, and that the next save succeeds and cleans up.
func TestCrashLeavesPreviousLoadable(t *testing.T) {
	points := []string{"write rank-00000.safetensors", "write rank-00001.safetensors", "manifest", "rename", "latest"}
	for _, point := range points {
		for _, crash := range []bool{false, true} {
			t.Run(point+map[bool]string{true: " crash", false: " error"}[crash], func(t *testing.T) {
				dir := t.TempDir()
				prev := filledState(t, 2, 2048, 1)
				if err := Save(dir, prev); err != nil {
					t.Fatal(err)
				}
				next := filledState(t, 2, 2048, 2)
				next.Step = 200
				injected := errors.New("injected EIO")
				if crash {
					injected = ErrCrash
				}
				err := SaveWith(dir, next, Options{Hook: func(p string) error {
					if p == point {
						return injected
					}
					return nil
				}})
				if !errors.Is(err, injected) {
					t.Fatalf("save: %v, want the injected error", err)
				}
				got, err := Load(dir)
				if err != nil {
					t.Fatalf("previous checkpoint: %v", err)
				}
				sameState(t, got, prev)
				if !crash {
					ents, _ := os.ReadDir(dir)
					for _, e := range ents {
						if strings.HasPrefix(e.Name(), tmpPrefix) {
							t.Errorf("failed save left %s", e.Name())
						}
					}
				}
				if err := Save(dir, next); err != nil {
					t.Fatal(err)
				}
				got, err = Load(dir)
				if err != nil {
					t.Fatal(err)
				}
				sameState(t, got, next)
				ls, err := List(dir)
				if err != nil {
					t.Fatal(err)
				}
				ents, _ := os.ReadDir(dir)
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				if ls.Latest != "step-00000200" || len(names) != 3 { // latest, step 100, step 200 (or 200.1 after a crash past rename)
					t.Errorf("directory holds %v, latest %q", names, ls.Latest)
				}
			})
		}
	}
}

func TestCorruptionNamesFile(t *testing.T) {
	dir := t.TempDir()
	if err := Save(dir, filledState(t, 2, 2048, 1)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "step-00000100", "rank-00001.safetensors")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(dir)
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "rank-00001.safetensors: crc32c") {
		t.Fatalf("load of a corrupted file: %v", err)
	}
	t.Log(err)
	_, checks, err := Verify(dir)
	if err != nil || checks[0].Err != nil || !errors.Is(checks[1].Err, ErrChecksum) {
		t.Errorf("verify: %v %v", checks, err)
	}
	if err := os.WriteFile(path, b[:len(b)-10], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err = Load(dir); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("load of a truncated file: %v", err)
	}
	os.Remove(path)
	if _, err = Load(dir); err == nil || !strings.Contains(err.Error(), "rank-00001.safetensors") {
		t.Fatalf("load with a file missing: %v", err)
	}
}

func gatherAll(st *State) [][][]byte {
	out := make([][][]byte, len(st.Chunks))
	for c := range st.Chunks {
		for k := range st.States {
			out[c] = append(out[c], st.Gather(c, k))
		}
	}
	return out
}

func TestReshard(t *testing.T) {
	dir := t.TempDir()
	st2 := filledState(t, 2, 2048, 3)
	want := gatherAll(st2)
	if err := Save(dir, st2); err != nil {
		t.Fatal(err)
	}
	e := Expect{Shape: st2.Shape, Devices: 4, ShardAlignElems: 2048, States: MixedPrecisionStates}
	st4, err := LoadFor(dir, e)
	if err != nil {
		t.Fatal(err)
	}
	if st4.Devices != 4 || st4.Chunks[1].ShardElems != ShardElems(st4.Chunks[1].Elems, 4, 2048) {
		t.Fatalf("resharded to %d devices, shard %d", st4.Devices, st4.Chunks[1].ShardElems)
	}
	if err := st4.Validate(); err != nil {
		t.Fatal(err)
	}
	dir4 := t.TempDir()
	if err := Save(dir4, st4); err != nil {
		t.Fatal(err)
	}
	e.Devices, e.ShardAlignElems = 1, 1 // N=1 without padding
	st1, err := LoadFor(dir4, e)
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]*State{"N=4": st4, "N=1": st1} {
		got := gatherAll(st)
		for c := range want {
			for k := range want[c] {
				if !bytes.Equal(got[c][k], want[c][k]) {
					t.Fatalf("%s: chunk %d state %d differs from N=2", name, c, k)
				}
			}
		}
		// The padding is zero.
		for c, ch := range st.Chunks {
			for k, s := range st.States {
				last := st.Data[st.Devices-1][c][k]
				used := ch.Elems*s.DType.Size() - (st.Devices-1)*ch.ShardElems*s.DType.Size()
				for i := max(used, 0); i < len(last); i++ {
					if last[i] != 0 {
						t.Fatalf("%s: chunk %d padding byte %d is %d", name, c, i, last[i])
					}
				}
			}
		}
	}
	if st1.Chunks[0].ShardElems != st1.Chunks[0].Elems {
		t.Errorf("N=1 align 1: shard %d, chunk %d", st1.Chunks[0].ShardElems, st1.Chunks[0].Elems)
	}
}

func TestLoadForRefuses(t *testing.T) {
	dir := t.TempDir()
	st := filledState(t, 2, 2048, 1)
	if err := Save(dir, st); err != nil {
		t.Fatal(err)
	}
	other := st.Shape
	other.Layers = 3
	_, err := LoadFor(dir, Expect{Shape: other, Devices: 2, ShardAlignElems: 2048, States: MixedPrecisionStates})
	if err == nil || !strings.Contains(err.Error(), "cannot change the model's shape") {
		t.Errorf("other shape: %v", err)
	}
	fp32 := []StateSpec{{shard.Param, dtype.F32}, {shard.AdamM, dtype.F32}, {shard.AdamV, dtype.F32}}
	_, err = LoadFor(dir, Expect{Shape: st.Shape, Devices: 2, ShardAlignElems: 2048, States: fp32})
	if err == nil || !strings.Contains(err.Error(), "the run needs [param f32") {
		t.Errorf("other precision: %v", err)
	}
	t.Log(err)
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no checkpoint in") {
		t.Errorf("empty dir: %v", err)
	}
}

func TestKeepAndSameStep(t *testing.T) {
	dir := t.TempDir()
	st := filledState(t, 1, 2048, 1)
	for _, step := range []int64{1, 2, 3, 3} {
		st.Step = step
		if err := SaveWith(dir, st, Options{Keep: 2}); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Latest != "step-00000003.1" || strings.Join(ls.Names(), ",") != "step-00000003,step-00000003.1" {
		t.Errorf("listing %+v", ls)
	}
	got, err := Load(filepath.Join(dir, "step-00000003")) // a checkpoint directory itself
	if err != nil || got.Step != 3 {
		t.Errorf("load of a step directory: %v", err)
	}
}

func TestExportState(t *testing.T) {
	l := tinyLayout(t)
	st, err := NewState(l, 2, 3, 2048, MixedPrecisionStates)
	if err != nil {
		t.Fatal(err)
	}
	want := l.Init(9)
	k := st.StateIndex(shard.Master)
	for c := range want {
		padded := make([]float32, 2*st.Chunks[c].ShardElems)
		copy(padded, want[c])
		for r := range 2 {
			s := st.Chunks[c].ShardElems
			copy(st.Shard(r, c, k), dtype.Bytes(padded[r*s:(r+1)*s]))
		}
	}
	path := filepath.Join(t.TempDir(), "final.safetensors")
	if err := ExportState(path, st, hf.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _, err := hf.Import(path, l, hf.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for c := range want {
		for i := range want[c] {
			if got[c][i] != want[c][i] {
				t.Fatalf("chunk %d %d: %v, want %v", c, i, got[c][i], want[c][i])
			}
		}
	}
	_ = model.EmbeddingChunk
}

func TestSaveRejectsBadState(t *testing.T) {
	dir := t.TempDir()
	st := filledState(t, 2, 2048, 1)
	st.Config = []byte(`{"a":`)
	if err := Save(dir, st); err == nil || !strings.Contains(err.Error(), "config is not valid JSON") {
		t.Errorf("bad config: %v", err)
	}
	st = filledState(t, 2, 2048, 1)
	st.Data[1][2][3] = st.Data[1][2][3][:8]
	if err := Save(dir, st); err == nil || !strings.Contains(err.Error(), "rank 1 chunk 2 adam_v: 8 bytes") {
		t.Errorf("short shard: %v", err)
	}
	if err := SaveWith(dir, filledState(t, 1, 2048, 1), Options{Keep: -1}); err == nil {
		t.Error("keep -1: no error")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("refused saves left %d entries", len(ents))
	}
}
