package checkpoint

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestWriteErrorPathOnce: a rank file's write error (ENOSPC: /dev/full)
// names the file once, not as "write F: write F: no space left on device".
func TestWriteErrorPathOnce(t *testing.T) {
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer f.Close()
	w := &rankWriter{path: "/dev/full", f: f}
	err = w.write(make([]byte, 4096))
	if !errors.Is(err, syscall.ENOSPC) || strings.Count(err.Error(), "/dev/full") != 1 {
		t.Errorf("error %q: want ENOSPC naming /dev/full once", err)
	}
}
