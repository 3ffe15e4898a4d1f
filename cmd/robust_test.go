package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalWhileTokenizing: the first SIGINT while `strata train` tokenizes
// a JSONL file that takes seconds stops the tokenizing within a bounded
// number of lines: the run exits 130 with the interrupt's message well
// before the tokenizing would have ended, and leaves no token file.
func TestSignalWhileTokenizing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes a 256 MiB JSONL file and tokenizes it in a child process")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "big.jsonl")
	size := int64(256 << 20)
	if raceEnabled {
		size = 64 << 20
	}
	writeChatFile(t, path, size)
	cfgPath := writeFile(t, "data.json", dataConfig)
	out := filepath.Join(dir, "run")
	c := startChild(t, "", "", "train", "--no-progress", "--config", cfgPath, "--data", path, "--steps", "2", "--out", out)
	c.waitStderr(t, "tokenizer: bytes")
	time.Sleep(300 * time.Millisecond) // well inside the tokenizing
	if c.ended() {
		t.Fatalf("the child ended before the signal:\n%s", c.stderr.String())
	}
	t0 := time.Now()
	c.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan int, 1)
	go func() { done <- c.wait() }()
	var st int
	select {
	case st = <-done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-done
		t.Fatalf("the child went on for 20 s after SIGINT during tokenizing:\n%s", c.stderr.String())
	}
	took := time.Since(t0)
	stderr := c.stderr.String()
	if st != 130 {
		t.Errorf("exit status %d, want 130\n%s", st, stderr)
	}
	if took > 2*time.Second {
		t.Errorf("the child ended %v after SIGINT during tokenizing, want under 2 s\n%s", took, stderr)
	}
	if strings.Contains(stderr, "tokenized in") {
		t.Errorf("the tokenizing went on to the end after SIGINT:\n%s", stderr)
	}
	for _, want := range []string{"stopping before training starts", "stopped before the first step; nothing was written"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	for _, d := range []string{dir, out} {
		if m, _ := filepath.Glob(filepath.Join(d, "strata-*.tokens")); len(m) > 0 {
			t.Errorf("a token file was left behind: %v", m)
		}
	}
	if ents, err := os.ReadDir(out); err == nil && len(ents) > 1 { // strata.lock at most
		t.Errorf("the stopped run wrote into --out: %v", ents)
	}
}
