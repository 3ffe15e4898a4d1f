package tokenizer

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// benchCorpus is the corpus the benchmarks encode, once per process.
var benchCorpus = sync.OnceValues(func() ([]string, []string) {
	return corpusParts(&testing.B{})
})

// cpuTime is the CPU time this process has used, all threads (GC too).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEncode encodes a part of the corpus with each real vocabulary
// (text: prose and code, about 0.6 MB; random: the generated documents,
// about 1.6 MB, half of it long runs of one character or word), one document
// at a time with the merge cache warm (a dataset pipeline's steady
// state), and runs tokenizers.js on the same documents, its cache warmed
// the same way. Both speeds are taken over CPU time (user and system, all
// threads, so garbage collection counts on both sides), not wall time,
// since this machine is shared: cpu-MB/s is ours, ref-MB/s the
// reference's, x-ref their ratio. A -bench pattern that leaves a
// vocabulary or part out skips its loading and its reference run too.
//
//	go test ./tokenizer -run '^$' -bench Encode -benchtime 5x
func BenchmarkEncode(b *testing.B) {
	text, random := benchCorpus()
	for _, v := range vocabularies {
		load := sync.OnceValues(func() (*Tokenizer, error) { return Load(vocabPath(b, v.pkg)) })
		for _, part := range []struct {
			name string
			docs []string
		}{{"text", text}, {"random", random}} {
			items := make([]item, len(part.docs))
			size := 0
			for i, d := range part.docs {
				items[i] = item{Text: d}
				size += len(d)
			}
			// b.Run calls the function more than once; the reference runs once.
			refMBPerS := sync.OnceValue(func() float64 {
				var ref struct {
					CPUMBPerS float64 `json:"cpu_mb_per_s"`
				}
				runReference(b, "bench", vocabPath(b, v.pkg), items, &ref, "3")
				return ref.CPUMBPerS
			})
			b.Run(fmt.Sprintf("%s/%s", v.name, part.name), func(b *testing.B) {
				tok, err := load()
				if err != nil {
					b.Fatal(err)
				}
				ref := refMBPerS()
				b.SetBytes(int64(size))
				for _, d := range part.docs {
					tok.Encode(d, false)
				}
				b.ResetTimer()
				cpu0 := cpuTime(b)
				for range b.N {
					for _, d := range part.docs {
						tok.Encode(d, false)
					}
				}
				cpu := (cpuTime(b) - cpu0).Seconds()
				mbs := float64(size) * float64(b.N) / cpu / 1e6
				b.ReportMetric(mbs, "cpu-MB/s")
				b.ReportMetric(ref, "ref-MB/s")
				b.ReportMetric(mbs/ref, "x-ref")
			})
		}
	}
}

// BenchmarkPreTokenize splits the written text with the Llama-3 pattern by
// the hand-written matcher and by regexp2: the measurement behind matching
// the known patterns by hand.
func BenchmarkPreTokenize(b *testing.B) {
	docs, _ := benchCorpus()
	size := 0
	for _, d := range docs {
		size += len(d)
	}
	re, err := compileRegexp2(llama3Pattern)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		sp   splitter
	}{{"hand", llamaSplitter{maxDigits: 3}}, {"regexp2", re}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(size))
			for range b.N {
				for _, d := range docs {
					c.sp.split(d, func(string, bool) {})
				}
			}
		})
	}
}

// BenchmarkLoad reads each real tokenizer.json.
func BenchmarkLoad(b *testing.B) {
	for _, v := range vocabularies {
		b.Run(v.name, func(b *testing.B) {
			for range b.N {
				if _, err := Load(vocabPath(b, v.pkg)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
