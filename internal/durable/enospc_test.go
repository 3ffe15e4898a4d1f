package durable

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestWriteErrorPathOnce: WriteFile writes its temporary file through
// tempWriter, whose errors leave out the temporary's name (WriteFile's
// error names the file being written), so that a full disk (/dev/full
// here) reads "write F: no space left on device", not "write F: write
// .F.tmp-…: no space left on device".
func TestWriteErrorPathOnce(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip("no /dev/full:", err)
	}
	defer full.Close()
	_, err = tempWriter{full}.Write(make([]byte, 4096))
	if !errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "/dev/full") {
		t.Errorf("error %q: want ENOSPC without the file's name", err)
	}
}
