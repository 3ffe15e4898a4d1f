package cmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain runs this test binary as `strata` when STRATA_TEST_MAIN holds
// the arguments (JSON): the tests' child processes. STRATA_TEST_BLOCK
// ("POINT#N") blocks the child at the N-th pass through a named point of
// the run or of its checkpoint saves (testHook): it prints "AT POINT" on
// stdout, then waits until the file STRATA_TEST_GO exists (without one,
// until it is killed).
//
// In a job of several processes (mpirun), STRATA_TEST_MAIN_P<rank> holds
// the arguments of the process of that rank instead, and
// STRATA_TEST_FAIL_P<rank> ("POINT#N") makes that process fail at the N-th
// pass through the point, and STRATA_TEST_DIR_P<rank> is its working
// directory.
func TestMain(m *testing.M) {
	args := os.Getenv("STRATA_TEST_MAIN")
	if args == "" {
		os.Exit(m.Run())
	}
	rank := os.Getenv("OMPI_COMM_WORLD_RANK")
	if a := os.Getenv("STRATA_TEST_MAIN_P" + rank); rank != "" && a != "" {
		args = a
	}
	if dir := os.Getenv("STRATA_TEST_DIR_P" + rank); rank != "" && dir != "" {
		if err := os.Chdir(dir); err != nil {
			fmt.Fprintln(os.Stderr, "STRATA_TEST_DIR:", err)
			os.Exit(3)
		}
	}
	if fail := os.Getenv("STRATA_TEST_FAIL_P" + rank); rank != "" && fail != "" {
		point, nth, _ := strings.Cut(fail, "#")
		n, _ := strconv.Atoi(nth)
		seen := 0
		testHook = func(p string) error {
			if p == point {
				if seen++; seen == max(n, 1) {
					return fmt.Errorf("injected failure at %s #%d", p, seen)
				}
			}
			return nil
		}
	}
	var argv []string
	if err := json.Unmarshal([]byte(args), &argv); err != nil {
		fmt.Fprintln(os.Stderr, "STRATA_TEST_MAIN:", err)
		os.Exit(3)
	}
	if block := os.Getenv("STRATA_TEST_BLOCK"); block != "" {
		point, nth, _ := strings.Cut(block, "#")
		n, _ := strconv.Atoi(nth)
		var mu sync.Mutex
		seen := 0
		testHook = func(p string) error {
			mu.Lock()
			if p == point {
				seen++
			}
			hit := p == point && seen == max(n, 1)
			mu.Unlock()
			if !hit {
				return nil
			}
			fmt.Printf("AT %s\n", p)
			for goFile := os.Getenv("STRATA_TEST_GO"); ; {
				if _, err := os.Stat(goFile); goFile != "" && err == nil {
					return nil
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	os.Exit(Main(append([]string{"strata"}, argv...)))
}

// child is a `strata` process: this test binary run by TestMain.
type child struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	stderr *lockedBuffer
}

// startChild starts `strata args...` in a process, blocked at block
// ("POINT#N", "" for none) until goFile exists.
func startChild(t *testing.T, block, goFile string, args ...string) *child {
	t.Helper()
	a, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "STRATA_TEST_MAIN="+string(a), "STRATA_TEST_BLOCK="+block, "STRATA_TEST_GO="+goFile)
	c := &child{cmd: cmd, stderr: &lockedBuffer{}}
	cmd.Stderr = c.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.stdout = bufio.NewReader(out)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return c
}

// waitAt reads the child's stdout until it says it is blocked at point.
func (c *child) waitAt(t *testing.T, point string) {
	t.Helper()
	for {
		line, err := c.stdout.ReadString('\n')
		if strings.TrimSpace(line) == "AT "+point {
			return
		}
		if err != nil {
			c.cmd.Wait()
			t.Fatalf("child ended before %q: %v\n%s", point, err, c.stderr.String())
		}
	}
}

// wait drains stdout and returns the exit status.
func (c *child) wait() int {
	io.Copy(io.Discard, c.stdout)
	c.cmd.Wait()
	return c.cmd.ProcessState.ExitCode()
}

// waitStderr waits until the child's stderr holds s, or it ends.
func (c *child) waitStderr(t *testing.T, s string) {
	t.Helper()
	for i := 0; ; i++ {
		if strings.Contains(c.stderr.String(), s) {
			return
		}
		if c.ended() || i > 60000 {
			time.Sleep(50 * time.Millisecond) // what it wrote last
			if strings.Contains(c.stderr.String(), s) {
				return
			}
			t.Fatalf("child's stderr never said %q:\n%s", s, c.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ended says whether the child has exited (a zombie not reaped yet, or
// gone): its state in /proc, since only Wait, which the test calls last,
// sets ProcessState.
func (c *child) ended() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')') // the state follows the command's name
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
