//go:build !amd64 || noasm || purego

package cpuadam

// archKernels: only the pure Go kernels in this build.
func archKernels() (avx2, avx512 *kernelSet) { return nil, nil }
