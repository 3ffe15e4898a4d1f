package model

import (
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// writeCorpus writes text to a file in a temporary directory and opens it.
func writeCorpus(t *testing.T, text []byte) (*FileCorpus, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "corpus.bin")
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCorpus(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, path
}

// TestFileCorpusSameBatches: a sampler reading a file gives exactly the
// batches of the in-memory sampler over the same bytes, for several seeds,
// steps, first rows, row counts and window lengths (down to a file of one
// window, seq+1 bytes).
func TestFileCorpusSameBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	text := make([]byte, 4099)
	for i := range text {
		text[i] = byte(rng.Uint32()) // every byte value, 0 and 255 included
	}
	fc, _ := writeCorpus(t, text)
	if fc.Len() != int64(len(text)) {
		t.Fatalf("Len %d, want %d", fc.Len(), len(text))
	}
	for _, seq := range []int{1, 7, 64, 255} {
		for _, seed := range []uint64{0, 1, 42, 1 << 40} {
			mem, err := NewSampler(Encode(text), seq, seed)
			if err != nil {
				t.Fatal(err)
			}
			file, err := NewCorpusSampler(fc, seq, seed)
			if err != nil {
				t.Fatal(err)
			}
			for _, step := range []int{0, 1, 2, 17, 1000, 1 << 20} {
				for _, rows := range [][2]int{{0, 1}, {0, 4}, {3, 5}, {64, 2}} {
					want := must(t)(mem.Batch(step, rows[0], rows[1]))
					got := must(t)(file.Batch(step, rows[0], rows[1]))
					if !slices.Equal(got.IDs, want.IDs) || !slices.Equal(got.Targets, want.Targets) || got.Rows != want.Rows || got.Seq != want.Seq {
						t.Fatalf("seq %d seed %d step %d rows %v: the file's batch differs from the in-memory one", seq, seed, step, rows)
					}
				}
			}
		}
	}
	// A file of exactly seq+1 bytes: one window, the whole file.
	one, _ := writeCorpus(t, text[:33])
	s, err := NewCorpusSampler(one, 32, 9)
	if err != nil {
		t.Fatal(err)
	}
	b := must(t)(s.Batch(5, 0, 2))
	if want := Encode(text[:33]); !slices.Equal(b.IDs[:32], want[:32]) || !slices.Equal(b.Targets[32:], want[1:]) {
		t.Fatal("a file of seq+1 bytes is not read whole")
	}
	if _, err := NewCorpusSampler(one, 33, 9); !errors.Is(err, ErrCorpusTooShort) {
		t.Fatalf("33 bytes for seq 33: %v, want ErrCorpusTooShort", err)
	}
}

// TestOpenCorpusRefuses: what is not a regular file (a character device, a
// directory, a named pipe) is refused, naming the file and what it is,
// without blocking on the pipe.
func TestOpenCorpusRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, what := range map[string]string{"/dev/zero": "a character device", dir: "a directory", fifo: "a named pipe"} {
		c, err := OpenCorpus(path)
		if !errors.Is(err, ErrNotRegular) {
			if c != nil {
				c.Close()
			}
			t.Fatalf("%s: %v, want ErrNotRegular", path, err)
		}
		if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, what) {
			t.Errorf("%s: %q does not name the file and %q", path, msg, what)
		}
	}
	if _, err := OpenCorpus(filepath.Join(dir, "nope")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestFileCorpusReadError: a file that shrinks under a running sampler
// makes the batch return an error naming the file and the offset.
func TestFileCorpusReadError(t *testing.T) {
	fc, path := writeCorpus(t, []byte(strings.Repeat("abcdefgh", 512)))
	s, err := NewCorpusSampler(fc, 16, 3)
	if err != nil {
		t.Fatal(err)
	}
	must(t)(s.Batch(0, 0, 8))
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.Batch(1, 0, 8)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read past the end: %v, want io.ErrUnexpectedEOF", err)
	}
	if w := s.Window(1, 0); !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "offset "+strconv.FormatInt(w, 10)) {
		t.Errorf("%q does not name %s and offset %d", err, path, w)
	}
	if err := (Tokens{1, 2, 3}).Read(2, make([]int32, 2)); err == nil {
		t.Error("Tokens read past the end")
	}
}
