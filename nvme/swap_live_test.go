//go:build linux

package nvme

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestUnlinkLive: a process about to exit without closing its swaps
// removes their files' names: the files of every open swap, none of a
// closed one's, while the swap stays usable (its extents read back) and
// its Close after that is not an error.
func TestUnlinkLive(t *testing.T) {
	e := openEngine(t, EnginePread, 4)
	d1, d2 := diskDir(t), diskDir(t)
	a := newSwap(t, e, []string{d1, d2}, 4<<20)
	b := newSwap(t, e, []string{d1}, 4<<20)
	names := func(d string) []string {
		m, _ := filepath.Glob(filepath.Join(d, "*.swap"))
		return m
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	x, err := a.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	src := alignedBuf(t, 1<<20)
	fill(src, 7)
	if err := a.Write(x, src); err != nil {
		t.Fatal(err)
	}
	before := append(names(d1), names(d2)...)
	if len(before) != 2 {
		t.Fatalf("swap files %v, want a's two", before)
	}
	removed := UnlinkLive()
	slices.Sort(removed)
	slices.Sort(before)
	if !slices.Equal(removed, before) {
		t.Fatalf("UnlinkLive removed %v, want %v", removed, before)
	}
	if left := append(names(d1), names(d2)...); len(left) != 0 {
		t.Fatalf("left %v", left)
	}
	dst := alignedBuf(t, 1<<20)
	if err := a.Read(x, dst); err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("read after unlink: %v (equal %v)", err, bytes.Equal(dst, src))
	}
	a.Free(x)
	if err := a.Close(); err != nil {
		t.Fatalf("Close after UnlinkLive: %v", err)
	}
	if _, err := os.Stat(before[0]); !os.IsNotExist(err) {
		t.Fatalf("%s: %v", before[0], err)
	}
}
