package pinned

import (
	"fmt"

	"github.com/strata-ai/strata/internal/units"
)

//go:generate go tool stringer -type=LockMode -linecomment -output=lockmode_string.go

// LockMode says whether New pins the arenas in RAM with mlock.
type LockMode int

const (
	// LockIfAllowed tries mlock and, when the kernel refuses (RLIMIT_MEMLOCK
	// without CAP_IPC_LOCK), goes on unlocked and says why in Residency.
	LockIfAllowed LockMode = iota // if-allowed
	// LockRequired makes New fail when mlock is refused.
	LockRequired // required
	// LockNever skips mlock.
	LockNever // never
)

//go:generate go tool stringer -type=PopulateMethod -linecomment -output=populatemethod_string.go

// PopulateMethod says how New faults every page of the arenas in once.
type PopulateMethod int

const (
	// PopulateAuto is PopulateMadvise, falling back to PopulateTouch on
	// kernels older than 5.14. With huge pages, madvise and touch fault at
	// the same speed here, about 2x MAP_POPULATE (bench/README-pinned.md);
	// madvise stays fast when THP is off, as the kernel walks the pages
	// without a fault per page.
	PopulateAuto PopulateMethod = iota // auto
	// PopulateMadvise asks the kernel with madvise(MADV_POPULATE_WRITE), after
	// MADV_HUGEPAGE, so the pages come in as huge pages.
	PopulateMadvise // madvise
	// PopulateTouch writes one byte per page from Go, after MADV_HUGEPAGE.
	PopulateTouch // touch
	// PopulateMapFlag maps with MAP_POPULATE. The pages are faulted in before
	// MADV_HUGEPAGE can be given, so they come in as 4 KiB pages.
	PopulateMapFlag // map-populate
)

// Options configure a Pool. The zero value of every field but BudgetBytes is
// a usable default.
type Options struct {
	// BudgetBytes is the hard cap on pinned host memory. All of it (rounded
	// down to AlignBytes) is mapped, populated and locked by New. Required.
	BudgetBytes int64
	// ArenaSizeBytes is the size of one mapping, and so the largest buffer.
	// Default: the budget, capped at 1 GiB (io_uring's limit for one fixed
	// buffer).
	ArenaSizeBytes int64
	// AlignBytes is the alignment of every buffer's address and padded
	// length: a power of two, at least the page size (4096). Default 4096,
	// which covers O_DIRECT on every device seen here.
	AlignBytes int64
	// Lock: mlock policy. Default LockIfAllowed.
	Lock LockMode
	// Populate: how pages are faulted in at start-up. Default PopulateAuto.
	Populate PopulateMethod
	// NoHugePages skips madvise(MADV_HUGEPAGE).
	NoHugePages bool
}

const (
	defaultAlignBytes    = 4096
	maxDefaultArenaBytes = 1 << 30
	hugePageBytes        = 2 << 20
	minAlignBytes        = 4096
	maxArenaCount        = 1 << 14 // io_uring's IORING_MAX_REG_BUFFERS
)

// withDefaults fills the zero fields.
func (o Options) withDefaults() Options {
	if o.AlignBytes == 0 {
		o.AlignBytes = defaultAlignBytes
	}
	if o.ArenaSizeBytes == 0 && o.AlignBytes > 0 {
		o.ArenaSizeBytes = min(o.BudgetBytes/o.AlignBytes*o.AlignBytes, maxDefaultArenaBytes)
	}
	return o
}

// Validate reports the first problem with o (after defaults are applied).
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case o.BudgetBytes <= 0:
		return fmt.Errorf("pinned: BudgetBytes must be set (the hard cap on pinned host memory), got %d", o.BudgetBytes)
	case o.AlignBytes < minAlignBytes || o.AlignBytes&(o.AlignBytes-1) != 0:
		return fmt.Errorf("pinned: AlignBytes %d must be a power of two of at least %d (the page size)", o.AlignBytes, minAlignBytes)
	case o.BudgetBytes < o.AlignBytes:
		return fmt.Errorf("pinned: BudgetBytes %d is smaller than AlignBytes %d", o.BudgetBytes, o.AlignBytes)
	case o.ArenaSizeBytes <= 0 || o.ArenaSizeBytes%o.AlignBytes != 0:
		return fmt.Errorf("pinned: ArenaSizeBytes %d must be a positive multiple of AlignBytes %d", o.ArenaSizeBytes, o.AlignBytes)
	case (o.BudgetBytes/o.AlignBytes*o.AlignBytes+o.ArenaSizeBytes-1)/o.ArenaSizeBytes > maxArenaCount:
		return fmt.Errorf("pinned: BudgetBytes %s in arenas of %s makes more than %d arenas; raise ArenaSizeBytes",
			units.FormatBytes(o.BudgetBytes), units.FormatBytes(o.ArenaSizeBytes), maxArenaCount)
	case o.Lock < LockIfAllowed || o.Lock > LockNever:
		return fmt.Errorf("pinned: unknown Lock mode %d", int(o.Lock))
	case o.Populate < PopulateAuto || o.Populate > PopulateMapFlag:
		return fmt.Errorf("pinned: unknown Populate method %d", int(o.Populate))
	}
	return nil
}

// String prints the options, defaults applied, so a run can be reproduced.
func (o Options) String() string {
	o = o.withDefaults()
	return fmt.Sprintf("budget=%s arena=%s align=%s lock=%s populate=%s hugepages=%t",
		units.FormatSize(o.BudgetBytes), units.FormatSize(o.ArenaSizeBytes), units.FormatSize(o.AlignBytes),
		o.Lock, o.Populate, !o.NoHugePages)
}

// arenaSizes splits the budget (rounded down to the alignment) into arenas.
func (o Options) arenaSizes() []int64 {
	total := o.BudgetBytes / o.AlignBytes * o.AlignBytes
	var sizes []int64
	for total > 0 {
		n := min(total, o.ArenaSizeBytes)
		sizes = append(sizes, n)
		total -= n
	}
	return sizes
}
