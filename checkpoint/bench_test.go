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

	"github.com/strata-ai/strata/internal/durable"
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
	if err := durable.SyncDir(tmp); err != nil {
		return err
	}
	final := filepath.Join(dir, fmt.Sprintf("raw-%d", round))
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if err := durable.SyncDir(dir); err != nil {
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
