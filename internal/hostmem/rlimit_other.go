//go:build !linux

package hostmem

// AddressSpaceLimit reports no limit off Linux: nothing is checked.
func AddressSpaceLimit() (bytes int64, ok bool) { return 0, false }
