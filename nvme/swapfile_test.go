//go:build linux

package nvme

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/leaktest"
)

func swapFilesIn(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.swap"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestSwapTwoOnOnePath: two Swaps on one path (two runs sharing an
// nvme_path) get two files, each locked; data written through one is never
// overwritten by the other; Close removes each its own. A fixed FileName
// taken by a live Swap is refused with ErrSwapInUse naming the holder.
func TestSwapTwoOnOnePath(t *testing.T) {
	leaktest.Check(t)
	e := openEngine(t, EnginePread, 4)
	dir := diskDir(t)
	a := newSwap(t, e, []string{dir}, 4<<20)
	b := newSwap(t, e, []string{dir}, 4<<20)
	if got := swapFilesIn(t, dir); len(got) != 2 {
		t.Fatalf("two swaps on one path made files %v, want two", got)
	}
	var exts [2]*Extent
	var bufs [2][]byte
	for i, s := range []*Swap{a, b} {
		x, err := s.Alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		exts[i], bufs[i] = x, alignedBuf(t, 1<<20)
		fill(bufs[i], uint64(100+i))
		if err := s.Write(x, bufs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range []*Swap{a, b} {
		got := alignedBuf(t, 1<<20)
		if err := s.Read(exts[i], got); err != nil {
			t.Fatalf("swap %d: %v", i, err)
		}
		if !bytes.Equal(got, bufs[i]) {
			t.Fatalf("swap %d: data differs", i)
		}
	}
	if st, err := StaleSwapFiles(dir); err != nil || len(st) != 0 {
		t.Fatalf("live swap files listed as stale: %v %v", st, err)
	}
	// A fixed name: the second Swap on it is refused, the first keeps its file.
	fx := newSwapNamed(t, e, dir, "fixed.swap")
	_, err := NewSwap(e, SwapOptions{Paths: []string{dir}, SizeBytes: 1 << 20, StripeBytes: 256 << 10, FileName: "fixed.swap"})
	if !errors.Is(err, ErrSwapInUse) || !strings.Contains(err.Error(), fmt.Sprintf("held by pid %d", os.Getpid())) {
		t.Fatalf("second swap on a locked file: %v, want ErrSwapInUse held by pid %d", err, os.Getpid())
	}
	if _, err := os.Stat(filepath.Join(dir, "fixed.swap")); err != nil {
		t.Fatalf("the refused swap touched the holder's file: %v", err)
	}
	for _, s := range []*Swap{a, b, fx} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := swapFilesIn(t, dir); len(got) != 0 {
		t.Fatalf("files left after Close: %v", got)
	}
}

func newSwapNamed(t *testing.T, dev Device, dir, name string) *Swap {
	t.Helper()
	s, err := NewSwap(dev, SwapOptions{Paths: []string{dir}, SizeBytes: 1 << 20, StripeBytes: 256 << 10, FileName: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSwapPathSpellings: one directory spelled twice (trailing slash,
// relative, through a symlink) in one Swap is refused, naming both
// spellings, and leaves no file.
func TestSwapPathSpellings(t *testing.T) {
	e := openEngine(t, EnginePread, 2)
	dir := diskDir(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{dir + "/", rel, link, dir + "/."} {
		_, err := NewSwap(e, SwapOptions{Paths: []string{dir, other}, SizeBytes: 1 << 20, StripeBytes: 256 << 10})
		if err == nil || !strings.Contains(err.Error(), "are one directory") || !strings.Contains(err.Error(), other) {
			t.Fatalf("paths %s and %s: got %v, want refused as one directory", dir, other, err)
		}
		if got := swapFilesIn(t, dir); len(got) != 0 {
			t.Fatalf("files left after a refused swap: %v", got)
		}
	}
}

const staleChildEnv = "STRATA_NVME_STALE_CHILD"

// TestSwapStaleFromKilledProcess: a child process (this test binary,
// re-executed) opens a swap on a directory and is killed with SIGKILL. While
// it lives, its file is neither listed as stale nor removed; once it is
// dead, StaleSwapFiles and a new Swap's Stale report it (name, size, age),
// and RemoveStaleSwapFiles removes it and nothing else.
func TestSwapStaleFromKilledProcess(t *testing.T) {
	if dir := os.Getenv(staleChildEnv); dir != "" {
		staleChild(dir)
		return
	}
	dir := diskDir(t)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestSwapStaleFromKilledProcess$")
	cmd.Env = append(os.Environ(), staleChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	name := strings.TrimPrefix(strings.TrimSpace(line), "swap ")
	if filepath.Dir(name) == "." || !strings.HasPrefix(filepath.Base(name), fmt.Sprintf("strata-%d-", cmd.Process.Pid)) {
		t.Fatalf("child said %q", line)
	}
	e := openEngine(t, EnginePread, 2)
	mine := newSwap(t, e, []string{dir}, 1<<20)
	if st := mine.Stale(); len(st) != 0 {
		t.Fatalf("a live run's file reported stale: %v", st)
	}
	if rm, err := RemoveStaleSwapFiles(dir); err != nil || len(rm) != 0 {
		t.Fatalf("removed a live run's file: %v %v", rm, err)
	}
	if _, err := os.Stat(name); err != nil {
		t.Fatalf("live run's file: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	st, err := StaleSwapFiles(dir)
	if err != nil || len(st) != 1 || st[0].Path != name || st[0].SizeBytes < 1<<20 || time.Since(st[0].ModTime) > time.Hour {
		t.Fatalf("stale after kill -9: %v %v, want %s of at least 1 MiB", st, err, name)
	}
	again := newSwap(t, e, []string{dir}, 1<<20)
	if st := again.Stale(); len(st) != 1 || st[0].Path != name || !strings.Contains(st[0].String(), name) {
		t.Fatalf("new swap reports stale %v, want %s", st, name)
	}
	rm, err := RemoveStaleSwapFiles(dir)
	if err != nil || len(rm) != 1 || rm[0].Path != name {
		t.Fatalf("removed %v %v, want %s", rm, err, name)
	}
	if got := swapFilesIn(t, dir); len(got) != 2 {
		t.Fatalf("after removing the stale file: %v, want the two live ones", got)
	}
}

// staleChild opens a swap in dir, says its file's name and waits to be killed.
func staleChild(dir string) {
	e, err := Open(Options{Engine: EnginePread, QueueDepth: 2})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s, err := NewSwap(e, SwapOptions{Paths: []string{dir}, SizeBytes: 1 << 20, StripeBytes: 256 << 10})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("swap %s\n", s.Files()[0].Path())
	time.Sleep(time.Hour) // until killed
}

// TestStaleSwapLockOutlivesRun: a killed run's io_uring keeps its swap file
// open, and so locked, until the ring's deferred teardown ends, a moment
// after the process is gone. A swap file named for a pid that no longer
// exists whose lock is released 300 ms later is still removed; one named
// for a live process (this one) and locked is neither waited for nor
// removed.
func TestStaleSwapLockOutlivesRun(t *testing.T) {
	dir := t.TempDir()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(dir, fmt.Sprintf("strata-%d-0123456789ab.swap", gone.Process.Pid))
	live := filepath.Join(dir, fmt.Sprintf("strata-%d-ba9876543210.swap", os.Getpid()))
	hold := func(name string) *os.File {
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		return f
	}
	d, l := hold(dead), hold(live)
	defer l.Close()
	time.AfterFunc(300*time.Millisecond, func() { d.Close() }) // the ring's teardown ends
	start := time.Now()
	rm, err := RemoveStaleSwapFiles(dir)
	if err != nil || len(rm) != 1 || rm[0].Path != dead {
		t.Fatalf("removed %v (%v), want %s", rm, err, dead)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond || waited > deadRunLockWait {
		t.Fatalf("waited %v for the dead run's lock", waited)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("the live run's file: %v", err)
	}
}
