package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cublasAPI is the part of libcublas the backend calls.
type cublasAPI struct {
	path string

	cublasCreate    func(h *uintptr) int32
	cublasDestroy   func(h uintptr) int32
	cublasSetStream func(h uintptr, s uintptr) int32
	cublasGemmEx    func(h uintptr, transa, transb int32, m, n, k int32, alpha unsafe.Pointer,
		a uint64, atype int32, lda int32, b uint64, btype int32, ldb int32, beta unsafe.Pointer,
		c uint64, ctype int32, ldc int32, compute int32, algo int32) int32
}

// cuBLAS constants.
const (
	cublasOpN           = 0
	cublasOpT           = 1
	cudaR32F            = 0
	cudaR16BF           = 14
	cudaR16F            = 2 // IEEE binary16
	cublasCompute32F    = 68
	cublasGemmDefault   = -1
	cublasStatusSuccess = 0
)

func loadCublas(sp searchPath) (*cublasAPI, error) {
	// cuBLASLt first, from the folder cuBLAS will come from, so that
	// cuBLAS's dependency resolves to it.
	_, path, err := dlopenFirst(libCublas, sp, fileExists)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	for _, p := range sameFolder(path, libCublasLt) {
		if fileExists(p) {
			if _, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
				break
			}
		}
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: load %s: %w", path, err)
	}
	c := &cublasAPI{path: path}
	t := &symbolTable{handle: h, lib: "libcublas"}
	t.bind(&c.cublasCreate, "cublasCreate", true)
	t.bind(&c.cublasDestroy, "cublasDestroy", true)
	t.bind(&c.cublasSetStream, "cublasSetStream", true)
	t.bind(&c.cublasGemmEx, "cublasGemmEx", false)
	if t.err != nil {
		return nil, t.err
	}
	return c, nil
}

var cublasStatusNames = map[int32]string{
	1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
	8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR",
}

func cublasCheck(r int32, op string) error {
	if r == cublasStatusSuccess {
		return nil
	}
	return &Error{Op: op, Lib: "cublas", Code: int(r), Name: cublasStatusNames[r]}
}
