package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/model"
)

// benchState is the "medium" shape (6.4M params) on 2 ranks with the four
// mixed-precision states: 14 bytes per parameter, about 90 MB.
func benchState(b *testing.B) *State {
	s, err := model.Lookup("medium")
	if err != nil {
		b.Fatal(err)
	}
	l, err := model.NewLayout(s)
	if err != nil {
		b.Fatal(err)
	}
	st, err := NewState(l, 2, 3, 2048, MixedPrecisionStates)
	if err != nil {
		b.Fatal(err)
	}
	for r := range st.Data {
		for c := range st.Data[r] {
			for k := range st.Data[r][c] {
				for i := range st.Data[r][c][k] {
					st.Data[r][c][k][i] = byte(i*31 + r + c)
				}
			}
		}
	}
	return st
}

func stateBytes(st *State) int64 {
	var n int64
	for r := range st.Data {
		for c := range st.Data[r] {
			for k := range st.Data[r][c] {
				n += int64(len(st.Data[r][c][k]))
			}
		}
	}
	return n
}

// rawSave is the anchor: the same bytes written as one file per rank
// (a goroutine each), fsynced, into a fresh directory that is renamed into place: the least a
// crash-safe save can do.
func rawSave(dir string, st *State, round int) error {
	tmp := filepath.Join(dir, fmt.Sprintf(".raw-%d", round))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	errs := make([]error, len(st.Data))
	var wg sync.WaitGroup
	for r := range st.Data {
		wg.Add(1)
		go func() { // one writer per rank, as Save
			defer wg.Done()
			f, err := os.Create(filepath.Join(tmp, fmt.Sprintf("r%d", r)))
			if err != nil {
				errs[r] = err
				return
			}
			defer f.Close()
			for c := range st.Data[r] {
				for k := range st.Data[r][c] {
					if _, err := f.Write(st.Data[r][c][k]); err != nil {
						errs[r] = err
						return
					}
				}
			}
			errs[r] = f.Sync()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	final := filepath.Join(dir, fmt.Sprintf("raw-%d", round))
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(dir, fmt.Sprintf("raw-%d", round-1)))
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkSaveVsRaw alternates Save with rawSave of the same bytes and
// reports both rates and the ratio of the medians (save time / raw time).
func BenchmarkSaveVsRaw(b *testing.B) {
	st := benchState(b)
	n := stateBytes(st)
	dir := b.TempDir()
	var save, raw []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st.Step = int64(i)
		t0 := time.Now()
		if err := SaveWith(filepath.Join(dir, "ck"), st, Options{Keep: 1}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := rawSave(dir, st, i); err != nil {
			b.Fatal(err)
		}
		save, raw = append(save, t1.Sub(t0)), append(raw, time.Since(t1))
	}
	ms, mr := median(save), median(raw)
	b.ReportMetric(float64(n)/ms.Seconds()/1e6, "save-MB/s")
	b.ReportMetric(float64(n)/mr.Seconds()/1e6, "raw-MB/s")
	b.ReportMetric(ms.Seconds()/mr.Seconds(), "save/raw")
}

// BenchmarkLoadVsRaw alternates Load (read, CRC-32C, parse, checks) with
// os.ReadFile of the same rank files, a goroutine each (both mostly from
// the page cache),
// and reports the ratio of the medians.
func BenchmarkLoadVsRaw(b *testing.B) {
	st := benchState(b)
	n := stateBytes(st)
	dir := b.TempDir()
	if err := Save(dir, st); err != nil {
		b.Fatal(err)
	}
	m, ckdir, err := ReadManifest(dir)
	if err != nil {
		b.Fatal(err)
	}
	var load, raw []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		errs := make([]error, len(m.Files))
		var wg sync.WaitGroup
		for i, f := range m.Files { // one reader per rank, as Load
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = os.ReadFile(filepath.Join(ckdir, f.Name))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
		load, raw = append(load, t1.Sub(t0)), append(raw, time.Since(t1))
	}
	ml, mr := median(load), median(raw)
	b.ReportMetric(float64(n)/ml.Seconds()/1e6, "load-MB/s")
	b.ReportMetric(float64(n)/mr.Seconds()/1e6, "raw-MB/s")
	b.ReportMetric(ml.Seconds()/mr.Seconds(), "load/raw")
}

// BenchmarkExportImportVsRaw alternates Export (fp32) and Import of the
// "medium" shape with a raw fsynced write and a read of the same bytes, and
// reports the ratios; under Strata's names and under Hugging Face's (the
// Conv1D weights transposed both ways).
func BenchmarkExportImportVsRaw(b *testing.B) {
	for _, names := range []Naming{NamesStrata, NamesHF} {
		b.Run(string(names), func(b *testing.B) { benchExportImport(b, names) })
	}
}

func benchExportImport(b *testing.B, names Naming) {
	s, _ := model.Lookup("medium")
	l, err := model.NewLayout(s)
	if err != nil {
		b.Fatal(err)
	}
	chunks := l.Init(1)
	n := 4 * l.ParamCount()
	raw := make([]byte, n)
	dir := b.TempDir()
	path, rawPath := filepath.Join(dir, "m.safetensors"), filepath.Join(dir, "raw")
	var exp, imp, rw, rr []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := Export(path, l, chunks, ExportOptions{Names: names}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, _, err := Import(path, l, ImportOptions{}); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		f, err := os.Create(rawPath)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Write(raw); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		f.Close()
		t3 := time.Now()
		if _, err := os.ReadFile(rawPath); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		exp, imp = append(exp, t1.Sub(t0)), append(imp, t2.Sub(t1))
		rw, rr = append(rw, t3.Sub(t2)), append(rr, t4.Sub(t3))
	}
	b.ReportMetric(float64(n)/median(exp).Seconds()/1e6, "export-MB/s")
	b.ReportMetric(median(exp).Seconds()/median(rw).Seconds(), "export/raw")
	b.ReportMetric(float64(n)/median(imp).Seconds()/1e6, "import-MB/s")
	b.ReportMetric(median(imp).Seconds()/median(rr).Seconds(), "import/raw")
}

// BenchmarkHFVsRaw measures a Hugging Face directory read chunk by chunk
// (OpenHF, then ReadChunk of every chunk into one buffer: the path of
// `strata train --init`) against os.ReadFile of its weight files, and
// ExportHF of the chunks against one write + fsync of as many bytes, for a
// Llama of 32.9M params in bf16 over three files (GPT-2 in fp32: the
// Conv1D transposes), alternated in one run. From the page cache, the
// read ratio is the CPU cost of the widening (and transposes) on top of
// the copy.
func BenchmarkHFVsRaw(b *testing.B) {
	for _, f := range []fixture{
		{arch: "llama", layers: 8, dim: 512, heads: 8, kvHeads: 2, ffn: 1408, vocab: 32000, maxSeq: 256, dtype: "BF16", prefix: true, shards: 3},
		{arch: "gpt2", layers: 8, dim: 512, heads: 8, ffn: 2048, vocab: 8192, maxSeq: 256, dtype: "F32", prefix: true, shards: 1},
	} {
		b.Run(f.arch+"-"+f.dtype, func(b *testing.B) { benchHF(b, f) })
	}
}

func benchHF(b *testing.B, f fixture) {
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	f.write(b, src, 1)
	m, err := OpenHF(src)
	if err != nil {
		b.Fatal(err)
	}
	m.Close()
	var fileBytes int64
	for _, name := range m.Files {
		fi, _ := os.Stat(filepath.Join(src, name))
		fileBytes += fi.Size()
	}
	dt := dtype.F32
	if f.dtype == "BF16" {
		dt = dtype.BF16
	}
	most := 0
	for _, ch := range m.Layout.Chunks {
		most = max(most, ch.Len)
	}
	buf := make([]float32, most)
	raw := make([]byte, fileBytes)
	var rd, rr, ex, rw []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		m, err := OpenHF(src)
		if err != nil {
			b.Fatal(err)
		}
		for c, ch := range m.Layout.Chunks {
			if err := m.ReadChunk(c, buf[:ch.Len]); err != nil {
				b.Fatal(err)
			}
		}
		m.Close()
		t1 := time.Now()
		for _, name := range m.Files {
			if _, err := os.ReadFile(filepath.Join(src, name)); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		out := filepath.Join(dir, fmt.Sprintf("out-%d", i))
		_, err = ExportHF(out, m.Layout, HFExportOptions{DType: dt, MaxShardBytes: fileBytes / 3}, func(w *ExportWriter) error {
			for c, ch := range m.Layout.Chunks {
				if err := w.F32(c, buf[:ch.Len]); err != nil { // the values do not change the time
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		rf, err := os.Create(filepath.Join(dir, "raw"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := rf.Write(raw); err != nil {
			b.Fatal(err)
		}
		if err := rf.Sync(); err != nil {
			b.Fatal(err)
		}
		rf.Close()
		t4 := time.Now()
		os.RemoveAll(out)
		rd, rr, ex, rw = append(rd, t1.Sub(t0)), append(rr, t2.Sub(t1)), append(ex, t3.Sub(t2)), append(rw, t4.Sub(t3))
	}
	b.ReportMetric(float64(fileBytes)/median(rd).Seconds()/1e6, "read-MB/s")
	b.ReportMetric(median(rd).Seconds()/median(rr).Seconds(), "read/raw")
	b.ReportMetric(median(ex).Seconds()/median(rw).Seconds(), "export/raw")
}
