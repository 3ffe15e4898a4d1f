package gpu

import (
	"fmt"
	"maps"
	"sync"
)

// Budget is a device's byte budget and the accounting every backend
// reports in MemStats: the bytes in use and their peaks, in all, by Kind
// and by Tag.Purpose. Backends charge an allocation before they take the
// memory and release it when they free it, so every backend accounts the
// same way and fails the same way. Safe for concurrent use.
type Budget struct {
	device int

	mu        sync.Mutex
	budget    int64
	inUse     int64
	peak      int64
	inUseKind [KindCount]int64
	peakKind  [KindCount]int64
	purpose   map[string]int64
}

// NewBudget returns the empty accounting of device (its index in errors)
// with a budget of budgetBytes.
func NewBudget(device int, budgetBytes int64) *Budget {
	return &Budget{device: device, budget: budgetBytes, purpose: map[string]int64{}}
}

// Reserve charges sizeBytes to tag. When that would exceed the budget it
// charges nothing and returns an *OutOfMemoryError naming the request and
// what holds the device.
func (b *Budget) Reserve(sizeBytes int64, tag Tag) error {
	if int(tag.Kind) >= KindCount || sizeBytes < 0 {
		panic("gpu: reserve of a bad kind or size")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inUse+sizeBytes > b.budget {
		return b.oomLocked(sizeBytes, tag)
	}
	b.inUse += sizeBytes
	b.peak = max(b.peak, b.inUse)
	b.inUseKind[tag.Kind] += sizeBytes
	b.peakKind[tag.Kind] = max(b.peakKind[tag.Kind], b.inUseKind[tag.Kind])
	b.purpose[tag.Purpose] += sizeBytes
	return nil
}

// Release gives back what Reserve charged to tag.
func (b *Budget) Release(sizeBytes int64, tag Tag) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inUse -= sizeBytes
	b.inUseKind[tag.Kind] -= sizeBytes
	if b.purpose[tag.Purpose] -= sizeBytes; b.purpose[tag.Purpose] == 0 {
		delete(b.purpose, tag.Purpose)
	}
}

// OutOfMemory is the error of a request that the budget allowed but the
// device itself could not hold (a backend whose memory is shared): the
// same *OutOfMemoryError as Reserve's, with the accounting as it is now.
func (b *Budget) OutOfMemory(sizeBytes int64, tag Tag) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.oomLocked(sizeBytes, tag)
}

func (b *Budget) oomLocked(sizeBytes int64, tag Tag) error {
	return &OutOfMemoryError{Device: b.device, RequestedBytes: sizeBytes, Tag: tag, Stats: b.statsLocked()}
}

// Stats returns the accounting now.
func (b *Budget) Stats() MemStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statsLocked()
}

func (b *Budget) statsLocked() MemStats {
	return MemStats{BudgetBytes: b.budget, InUseBytes: b.inUse, PeakBytes: b.peak,
		InUseByKind: b.inUseKind, PeakByKind: b.peakKind, InUseByPurpose: maps.Clone(b.purpose)}
}

// ResetPeak sets every peak to the bytes in use now.
func (b *Budget) ResetPeak() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.peak = b.inUse
	b.peakKind = b.inUseKind
}

// MaxDevices is the most devices one backend makes.
const MaxDevices = 1024

// ValidateDevices says what is wrong with the options every backend
// takes: the number of devices, in [1, MaxDevices], and each device's
// budget, at least 0. pkg names the backend's package in the error.
func ValidateDevices(pkg string, devices int, hbmBytes int64) error {
	switch {
	case devices < 1 || devices > MaxDevices:
		return fmt.Errorf("%s: devices %d must be in [1, %d]", pkg, devices, MaxDevices)
	case hbmBytes < 0:
		return fmt.Errorf("%s: hbm bytes %d must be >= 0", pkg, hbmBytes)
	}
	return nil
}
