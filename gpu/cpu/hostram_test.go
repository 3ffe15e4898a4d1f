package cpu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/units"
)

// The CPU backend's devices are host RAM: a budget the host cannot hold
// (devices × hbm bytes above MemAvailable) is refused with what to lower;
// one that fits passes; an overflowing product is refused, not wrapped.
func TestCheckHostRAM(t *testing.T) {
	meminfo := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(meminfo, []byte("MemTotal:       16777216 kB\nMemFree:         1000 kB\nMemAvailable:    8388608 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkHostRAM(2, 4*units.GiB, meminfo); err != nil {
		t.Errorf("2 × 4 GiB on 8 GiB available: %v", err)
	}
	err := checkHostRAM(2, 5*units.GiB, meminfo)
	want := "cpu: 2 devices × hbm_bytes 5.00 GiB = 10.00 GiB, but the host has 8.00 GiB available (MemAvailable in " + meminfo +
		"), and the CPU backend's devices live in host RAM: lower strata.hbm_bytes to at most 4.00 GiB per device, or use fewer devices"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	if err := checkHostRAM(4, 1<<62, meminfo); err == nil || !strings.Contains(err.Error(), "more than 2^63 bytes") {
		t.Errorf("overflowing product: %v", err)
	}
	if err := checkHostRAM(1, 1<<62, filepath.Join(t.TempDir(), "none")); err != nil {
		t.Errorf("no meminfo: nothing to check, got %v", err)
	}
	// The real host: a petabyte per device is more than it has.
	if _, err := os.Stat(meminfoPath); err != nil {
		t.Skipf("no %s on this system: %v", meminfoPath, err)
	}
	if err := CheckHostRAM(1, 1<<50); err == nil {
		t.Error("1 PiB on this host: accepted")
	}
}
