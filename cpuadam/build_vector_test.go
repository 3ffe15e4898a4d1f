//go:build amd64 && !noasm && !purego

package cpuadam

// vectorBuild: this build has the assembly kernels (kernels_amd64.go).
const vectorBuild = true
