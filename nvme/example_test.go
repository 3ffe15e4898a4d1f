package nvme_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/pinned"
)

// directIODir makes a temporary directory on the first of the candidates
// that the package's tests use (nvmetest.Candidates; "" is os.TempDir())
// whose filesystem does direct I/O.
func directIODir() (string, error) {
	var errs []error
	for _, base := range nvmetest.Candidates {
		dir, err := os.MkdirTemp(base, "nvme-example-")
		if err == nil {
			if err = nvme.ProbeDirectIO(dir); err == nil {
				return dir, nil
			}
			os.RemoveAll(dir)
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

// Example keeps 64 KiB in swap space on a filesystem that does direct I/O:
// the engine (io_uring, or pread workers where io_uring is refused) writes
// a pinned buffer to an extent and reads it back.
func Example() {
	dir, err := directIODir()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	eng, err := nvme.Open(nvme.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Close()
	swap, err := nvme.NewSwap(eng, nvme.SwapOptions{Paths: []string{dir}, SizeBytes: 4 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer swap.Close()
	pool, err := pinned.New(pinned.Options{BudgetBytes: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	buf, err := pool.Get(64<<10, "example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Put(buf)

	want := bytes.Repeat([]byte("strata"), 1000)
	copy(buf.Bytes(), want)
	ext, err := swap.Alloc(buf.Len())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer swap.Free(ext)
	if err := swap.Write(ext, buf.Bytes()); err != nil {
		fmt.Println(err)
		return
	}
	clear(buf.Bytes())
	if err := swap.Read(ext, buf.Bytes()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ext.SizeBytes(), "bytes; read back:", bytes.HasPrefix(buf.Bytes(), want))
	fmt.Println(swap.FreeBytes(), "bytes free")
	// Output:
	// 65536 bytes; read back: true
	// 4128768 bytes free
}
