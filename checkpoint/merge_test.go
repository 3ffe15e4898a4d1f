package checkpoint

import (
	"bytes"
	"context"
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
)

// TestExportMergedKeepsBase: a merged export of a LoRA run that started
// from a Hugging Face directory keeps each tensor's dtype there (F32 or
// BF16): every tensor the adapters leave alone is the base file's bytes
// (not the run's copy, which holds the base rounded to bf16), and every
// adapted one is W + scaling·B·A of the file's W, rounded once to its
// dtype (issue 41: an fp32 base came back in bf16). With an explicit
// DType every tensor is in it.
func TestExportMergedKeepsBase(t *testing.T) {
	base := tinyLayout(t)
	l, err := base.WithLoRA(model.LoRA{R: 4, Alpha: 8, Targets: []string{"all-linear"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, baseDT := range []dtype.DType{dtype.F32, dtype.BF16} {
		t.Run(baseDT.String(), func(t *testing.T) {
			dir := t.TempDir()
			baseDir := filepath.Join(dir, "base")
			// The base directory: the layout's seeded weights with fp32 detail.
			rng := rand.New(rand.NewPCG(1, 2))
			vals := make([][]float32, len(base.Chunks))
			for c := range base.Chunks {
				vals[c] = base.InitChunk(7, c)
				for i := range vals[c] {
					vals[c][i] += float32(rng.NormFloat64()) * 1e-3
				}
			}
			if _, err := hf.ExportDir(baseDir, base, hf.DirOptions{DType: baseDT}, func(w *hf.ExportWriter) error {
				for c, v := range vals {
					if err := w.F32(c, v); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// The run: its params the base rounded to bf16, its adapters random.
			st, err := NewState(l, 2, 3, 1, AdamStates(dtype.F32, dtype.F32))
			if err != nil {
				t.Fatal(err)
			}
			st.Step = 5
			for c, ch := range l.Chunks {
				v := make([]float32, ch.Len)
				if l.IsAdapter(c) {
					for i := range v {
						v[i] = float32(rng.NormFloat64()) * 0.05
					}
				} else {
					for i, x := range vals[c] {
						v[i] = dtype.Round(dtype.BF16, x)
					}
				}
				b := dtype.Bytes(v)
				per := st.Chunks[c].ShardElems * 4
				for r := range st.Devices {
					lo := min(r*per, len(b))
					copy(st.Shard(r, c, 0), b[lo:min(lo+per, len(b))])
				}
			}
			abs, _ := filepath.Abs(baseDir)
			ckpt := filepath.Join(dir, "run")
			if err := SaveWith(ckpt, st, Options{Source: &hf.Source{Path: abs, Format: hf.SourceHF}}); err != nil {
				t.Fatal(err)
			}

			merged := filepath.Join(dir, "merged")
			res, err := Export(context.Background(), ckpt, merged, ExportOptions{Format: FormatHF, Merge: true})
			if err != nil {
				t.Fatal(err)
			}
			if res.DType != baseDT.String() || len(res.Notes) != 0 {
				t.Errorf("exported in %s (notes %q), want the base's %s", res.DType, res.Notes, baseDT)
			}
			// What the merge should give: the file's W, merged in fp32.
			m, err := hf.Open(baseDir)
			if err != nil {
				t.Fatal(err)
			}
			want := make([][]float32, len(base.Chunks))
			for c, ch := range base.Chunks {
				want[c] = make([]float32, ch.Len)
				if err := m.ReadChunk(c, want[c]); err != nil {
					t.Fatal(err)
				}
				if layer := c - model.BlockChunk(0); layer >= 0 && layer < l.Shape.Layers {
					a := l.AdapterChunk(layer)
					adapter := make([]float32, l.Chunks[a].Len)
					copy(adapter, dtype.Float32s(st.Gather(a, 0)))
					if err := l.MergeLoRA(c, want[c], adapter); err != nil {
						t.Fatal(err)
					}
				}
			}
			wantDir := filepath.Join(dir, "want")
			if _, err := hf.ExportDir(wantDir, base, hf.DirOptions{DType: baseDT}, func(w *hf.ExportWriter) error {
				for c, v := range want {
					if err := w.F32(c, v); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			bh, bdata := readTensors(t, baseDir)
			gh, gdata := readTensors(t, merged)
			_, wdata := readTensors(t, wantDir)
			adapted := 0
			for _, ti := range bh.Tensors {
				g, ok := gh.Tensor(ti.Name)
				if !ok || g.DType != ti.DType {
					t.Errorf("%s: %v in the merged export (%s in the base)", ti.Name, g.DType, ti.DType)
					continue
				}
				same := bytes.Equal(gdata[ti.Name], bdata[ti.Name])
				if !bytes.Equal(gdata[ti.Name], wdata[ti.Name]) {
					t.Errorf("%s: not the base file's W merged with the adapters (same as the base: %t)", ti.Name, same)
				}
				if !same {
					adapted++
				}
			}
			if adapted == 0 {
				t.Error("no tensor was merged")
			}

			// An explicit dtype: every tensor in it.
			bf := filepath.Join(dir, "bf16")
			res, err = Export(context.Background(), ckpt, bf, ExportOptions{Format: FormatHF, Merge: true, DType: dtype.BF16})
			if err != nil {
				t.Fatal(err)
			}
			h, _ := readTensors(t, bf)
			for _, ti := range h.Tensors {
				if ti.DType != "BF16" {
					t.Errorf("--dtype bf16: %s is %s", ti.Name, ti.DType)
				}
			}

			// The base directory gone: the run's frozen copy, in fp32, with a note.
			m.Close()
			if err := os.RemoveAll(baseDir); err != nil {
				t.Fatal(err)
			}
			res, err = Export(context.Background(), ckpt, filepath.Join(dir, "gone"), ExportOptions{Format: FormatHF, Merge: true})
			if err != nil {
				t.Fatal(err)
			}
			if res.DType != "f32" || len(res.Notes) == 0 || !strings.Contains(strings.Join(res.Notes, "\n"), "merged into the run's frozen base") {
				t.Errorf("the base gone: exported in %s, notes %q", res.DType, res.Notes)
			}
		})
	}
}

// readTensors reads an exported directory's model.safetensors: its header
// and each tensor's bytes by name.
func readTensors(t *testing.T, dir string) (*safetensors.Header, map[string][]byte) {
	t.Helper()
	h, data, err := safetensors.ReadFile(filepath.Join(dir, hf.WeightsName))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, ti := range h.Tensors {
		out[ti.Name] = data[ti.Name]
	}
	return h, out
}

// TestExportCancelled: an export whose context is cancelled stops before
// a chunk, returns the context's error and writes nothing.
func TestExportCancelled(t *testing.T) {
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "ckpt")
	if err := Save(ckpt, filledState(t, 2, 1, 3)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, f := range []ExportFormat{FormatSafetensors, FormatHF} {
		dst := filepath.Join(dir, string(f))
		_, err := Export(ctx, ckpt, dst, ExportOptions{Format: f})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v, want context.Canceled", f, err)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("%s: a cancelled export left %s (%v)", f, dst, err)
		}
	}
	// Cancelled while it runs: after the first chunk.
	n := 0
	cctx, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	dst := filepath.Join(dir, "mid.safetensors")
	_, err := ExportCheckpoint(&countCtx{Context: cctx, after: 2, n: &n, cancel: cancel2}, dst, ckpt, hf.ExportOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled mid-export: %v", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("a cancelled export left %s (%v)", dst, err)
	}
}

// countCtx cancels itself at its after-th Err call.
type countCtx struct {
	context.Context
	after  int
	n      *int
	cancel context.CancelFunc
}

func (c *countCtx) Err() error {
	if *c.n++; *c.n == c.after {
		c.cancel()
	}
	return c.Context.Err()
}
