// Package cpuadam is Adam and AdamW on the CPU at the speed of memory.
//
// (The helper building issue 3 replaces this doc with the exact formula,
// the kernels and the thread pool; the API in cpuadam.go is the contract
// gpu/cpu and engine code against.)
package cpuadam
