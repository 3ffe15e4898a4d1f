package hf

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/model"
)

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
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
// (Open, then ReadChunk of every chunk into one buffer: the path of
// `strata train --init`) against os.ReadFile of its weight files, and
// ExportDir of the chunks against one write + fsync of as many bytes, for a
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
	m, err := Open(src)
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
		m, err := Open(src)
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
		_, err = ExportDir(out, m.Layout, DirOptions{DType: dt, MaxShardBytes: fileBytes / 3}, func(w *ExportWriter) error {
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
