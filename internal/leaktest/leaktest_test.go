package leaktest

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// recorder stands in for a testing.TB: it keeps the cleanups and the
// failures so the test can run them and look at them.
type recorder struct {
	testing.TB
	cleanups []func()
	failures []string
}

func (r *recorder) Helper()           {}
func (r *recorder) Cleanup(f func())  { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Error(args ...any) { r.failures = append(r.failures, fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *recorder) finish() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestCheckReportsLeaks(t *testing.T) {
	defer func(g time.Duration) { Grace = g }(Grace)
	Grace = 50 * time.Millisecond

	r := &recorder{TB: t}
	Check(r)
	stop := make(chan struct{})
	go func() { <-stop }()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	r.finish()
	if len(r.failures) != 1 {
		t.Fatalf("failures %q, want one", r.failures)
	}
	msg := r.failures[0]
	for _, want := range []string{"1 goroutines and 1 file descriptors", "-> /proc/", "TestCheckReportsLeaks.func"} {
		if !strings.Contains(msg, want) {
			t.Errorf("report does not contain %q:\n%s", want, msg)
		}
	}

	// The same test with everything released in its cleanups passes.
	r = &recorder{TB: t}
	Check(r)
	stop2 := make(chan struct{})
	go func() { <-stop2 }()
	f2, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	r.Cleanup(func() { close(stop2); f2.Close() })
	close(stop)
	f.Close()
	r.finish()
	if len(r.failures) != 0 {
		t.Fatalf("clean test reported: %q", r.failures)
	}
}

func TestCountFDs(t *testing.T) {
	n0, err := CountFDs()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	n1, _ := CountFDs()
	f.Close()
	n2, _ := CountFDs()
	if n1 != n0+1 || n2 != n0 {
		t.Fatalf("counts %d, %d, %d: want n, n+1, n", n0, n1, n2)
	}
}
