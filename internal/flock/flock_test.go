package flock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTryLock: a second open file of a locked file is refused with ErrHeld
// naming the holder; another process holding it is named by its pid; the
// lock goes with the holder's close.
func TestTryLock(t *testing.T) {
	name := filepath.Join(t.TempDir(), "lock")
	a, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := TryLock(int(a.Fd())); err != nil {
		t.Fatal(err)
	}
	b, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = TryLock(int(b.Fd()))
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "held by pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock: %v, want ErrHeld naming pid %d", err, os.Getpid())
	}
	a.Close()
	if err := TryLock(int(b.Fd())); err != nil {
		t.Fatalf("after the holder's close: %v", err)
	}
	b.Close()

	// Another process: flock(1) holds it while it sleeps.
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1) to hold the lock from another process")
	}
	cmd := exec.Command("flock", name, "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	c, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; ; i++ {
		err = TryLock(int(c.Fd()))
		if err != nil || i > 2000 {
			break
		}
		syscallUnlock(c)
		time.Sleep(5 * time.Millisecond) // flock(1) has not taken it yet
	}
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "held by pid "+strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("lock held by flock(1), pid %d: %v", cmd.Process.Pid, err)
	}
}

func syscallUnlock(f *os.File) { unlock(int(f.Fd())) }
