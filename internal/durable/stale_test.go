package durable

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs this test binary as a writer when DURABLE_TEST_WRITE names
// a path: WriteFile with a fill that prints "writing" and never returns,
// the export a SIGKILL interrupts.
func TestMain(m *testing.M) {
	if path := os.Getenv("DURABLE_TEST_WRITE"); path != "" {
		WriteFile(path, 16, func(w io.Writer) error {
			io.WriteString(w, "partial")
			os.Stdout.WriteString("writing\n")
			select {}
		})
	}
	os.Exit(m.Run())
}

// deadPid is the pid of a process that has exited.
func deadPid(t *testing.T) int {
	t.Helper()
	c := exec.Command(os.Args[0], "-test.run=^$")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

// TestRemoveStaleKilledWriter: a writer killed inside WriteFile leaves
// .f.tmp-PID-*; while it lives (lock held, pid alive) RemoveStale leaves
// it, once it is killed RemoveStale removes it and says so; the file's
// other temporaries without a pid, and other files', are not touched.
func TestRemoveStaleKilledWriter(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("flock and pids: Linux")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), "DURABLE_TEST_WRITE="+path)
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Process.Kill()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "writing\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, ".model.safetensors.tmp-"+strconv.Itoa(c.Process.Pid)+"-*"))
	if len(tmps) != 1 {
		t.Fatalf("the writer's temporaries: %v", tmps)
	}
	keep := []string{
		filepath.Join(dir, ".model.safetensors.tmp-123456"),                          // an older Strata's: no pid
		filepath.Join(dir, ".other.safetensors.tmp-"+strconv.Itoa(deadPid(t))+"-1"),  // another file's
		filepath.Join(dir, ".model.safetensors.tmp-"+strconv.Itoa(os.Getpid())+"-2"), // a live writer's
		filepath.Join(dir, ".model.safetensors.tmp-notapid-3"),                       // not a pid
	}
	for _, k := range keep {
		if err := os.WriteFile(k, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if removed, err := RemoveStale(dir, "model.safetensors"); err != nil || len(removed) != 0 {
		t.Fatalf("with the writer alive: removed %v, %v", removed, err)
	}
	c.Process.Kill()
	c.Wait()
	removed, err := RemoveStale(dir, "model.safetensors")
	if err != nil || len(removed) != 1 || !strings.Contains(removed[0], tmps[0]) || !strings.Contains(removed[0], "process "+strconv.Itoa(c.Process.Pid)+", which is gone") {
		t.Fatalf("after the kill: removed %q, %v; want %s", removed, err, tmps[0])
	}
	if _, err := os.Stat(tmps[0]); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", tmps[0], err)
	}
	for _, k := range keep {
		if _, err := os.Stat(k); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	// A later write to the same path works, and leaves no temporary of its own.
	if err := WriteFile(path, 16, func(w io.Writer) error { _, err := io.WriteString(w, "x"); return err }); err != nil {
		t.Fatal(err)
	}
	if got, _ := filepath.Glob(filepath.Join(dir, ".model.safetensors.tmp-"+strconv.Itoa(os.Getpid())+"-*")); len(got) != 1 {
		t.Errorf("temporaries of this process after a write: %v, want only the planted one", got)
	}
}

// TestRemoveStaleDirLocked: a dead pid's directory whose lock is held
// (a writer in another pid namespace) stays; once the lock goes, it and
// what it holds are removed; a FIFO under the name is left alone, unopened.
func TestRemoveStaleDirLocked(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("flock and pids: Linux")
	}
	dir := t.TempDir()
	tmp := filepath.Join(dir, ".out.tmp-"+strconv.Itoa(deadPid(t))+"-77")
	if err := os.MkdirAll(filepath.Join(tmp, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "model-00001-of-00002.safetensors"), []byte("part"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, ".out.tmp-"+strconv.Itoa(deadPid(t))+"-78")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	lock, err := os.Open(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if err := LockTemp(lock); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if removed, err := RemoveStale(dir, "out"); err != nil || len(removed) != 0 {
			t.Errorf("lock held: removed %v, %v", removed, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RemoveStale waited on a held lock")
	}
	lock.Close()
	removed, err := RemoveStale(dir, "out")
	if err != nil || len(removed) != 1 || !strings.Contains(removed[0], "temporary directory") {
		t.Fatalf("lock gone: removed %q, %v", removed, err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", tmp, err)
	}
	if _, err := os.Lstat(fifo); err != nil {
		t.Errorf("the FIFO: %v", err)
	}
}
