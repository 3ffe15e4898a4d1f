package bench

import (
	"fmt"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/pinned"
	"golang.org/x/sys/unix"
)

const hugePageBytes = 2 << 20

// ioBuffers is the memory the bench hands to the kernel for O_DIRECT. A
// block in 4 KiB pages needs one segment per page, and a queue allows
// max_segments of them (254 on virtio): a 1 MiB block of scattered pages
// reaches the disk as two requests. In huge pages a block is a handful of
// segments and goes whole. So the buffers come from a pinned pool with
// 2 MiB alignment (MADV_HUGEPAGE, populated at once); when THP gave no huge
// pages they come from MAP_HUGETLB (pages reserved in vm.nr_hugepages);
// else they stay in 4 KiB pages and note says so, with the fix.
type ioBuffers struct {
	mem       []byte
	hugeBytes int64  // bytes of mem backed by huge pages (from /proc/self/smaps)
	note      string // what the memory is
	pool      *pinned.Pool
	buf       *pinned.Buffer
	hugetlb   []byte // mem's mapping when it came from MAP_HUGETLB
}

// newIOBuffers maps n bytes (rounded up to 2 MiB) for I/O buffers.
func newIOBuffers(n int64) (*ioBuffers, error) {
	size := (n + hugePageBytes - 1) / hugePageBytes * hugePageBytes
	pool, err := pinned.New(pinned.Options{BudgetBytes: size, AlignBytes: hugePageBytes, Lock: pinned.LockNever})
	if err != nil {
		return nil, fmt.Errorf("bench: I/O buffers: %w", err)
	}
	buf, err := pool.Get(n, "bench nvme I/O buffers")
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("bench: I/O buffers: %w", err)
	}
	b := &ioBuffers{mem: buf.Bytes(), pool: pool, buf: buf}
	res := pool.Residency() // the pool's one arena holds the buffer
	thp := res.THPMode
	b.hugeBytes = min(max(res.HugePageBytes, 0), int64(len(b.mem)))
	if b.hugeBytes >= int64(len(b.mem)) {
		b.note = fmt.Sprintf("%s in 2 MiB huge pages (THP %s)", units.FormatBytes(n), thp)
		return b, nil
	}
	thpGot := b.hugeBytes
	if m, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE); err == nil {
		pool.Put(buf)
		pool.Close()
		b.pool, b.buf, b.hugetlb = nil, nil, m
		b.mem, b.hugeBytes = m[:n], n
		b.note = fmt.Sprintf("%s in hugetlb pages (MAP_HUGETLB; THP %s gave %s)", units.FormatBytes(n), thp, units.FormatBytes(thpGot))
		return b, nil
	}
	fix := "echo madvise >/sys/kernel/mm/transparent_hugepage/enabled"
	if thp != "never" {
		fix = "memory is too fragmented for huge pages: echo 1 >/proc/sys/vm/compact_memory"
	}
	b.note = fmt.Sprintf("%s in 4 KiB pages: THP %s gave %s of huge pages and no hugetlb pages are free "+
		"(vm.nr_hugepages), so a block of more than max_segments pages is split by the block layer; "+
		"to fix: %s, or reserve hugetlb pages (vm.nr_hugepages)",
		units.FormatBytes(n), thp, units.FormatBytes(thpGot), fix)
	return b, nil
}

func (b *ioBuffers) close() {
	if b.hugetlb != nil {
		unix.Munmap(b.hugetlb)
		return
	}
	b.pool.Put(b.buf)
	b.pool.Close()
}
