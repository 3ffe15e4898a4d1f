package cpu

// SetPackedTiles sets the packed GEMM's blocking (multiples of 6 rows and
// 32 columns) and returns a function that restores it. Tests only; no
// device may be running.
func SetPackedTiles(mc, nc, kc int) (restore func()) {
	m, n, k := packedMC, packedNC, packedKC
	packedMC, packedNC, packedKC = mc, nc, kc
	return func() { packedMC, packedNC, packedKC = m, n, k }
}
