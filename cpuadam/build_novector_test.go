//go:build !amd64 || noasm || purego

package cpuadam

// vectorBuild: this build has only the pure Go kernels (kernels_other.go).
const vectorBuild = false
