package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cuBLASLt: bf16 GEMMs with fp32 accumulation on the tensor cores, the
// algorithm chosen by cublasLtMatmulAlgoGetHeuristic once per shape. The
// binding follows cublasLt.h of CUDA 12.6 (testdata/cublaslt/, checked by
// cublaslt_test.go); the library is loaded at the first bf16 GEMM from the
// folder cuBLAS came from. Where it is missing, or has no algorithm for a
// shape, Gemm takes the cublasGemmEx path (ltStatus says which).

// EnvCublasLt set to "off" (or "0", "false") keeps bf16 GEMMs on
// cublasGemmEx, for comparisons.
const EnvCublasLt = "STRATA_CUBLASLT"

// cublasLtAPI is the part of libcublasLt the backend calls.
type cublasLtAPI struct {
	path string

	cublasLtCreate                       func(h *uintptr) int32
	cublasLtDestroy                      func(h uintptr) int32
	cublasLtGetVersion                   func() uint64
	cublasLtMatmulDescCreate             func(d *uintptr, compute int32, scale int32) int32
	cublasLtMatmulDescDestroy            func(d uintptr) int32
	cublasLtMatmulDescSetAttribute       func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatrixLayoutCreate           func(l *uintptr, typ int32, rows, cols uint64, ld int64) int32
	cublasLtMatrixLayoutDestroy          func(l uintptr) int32
	cublasLtMatmulPreferenceCreate       func(p *uintptr) int32
	cublasLtMatmulPreferenceDestroy      func(p uintptr) int32
	cublasLtMatmulPreferenceSetAttribute func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatmulAlgoGetHeuristic       func(h, desc, a, b, c, d, pref uintptr, requested int32, res *ltHeuristicResult, returned *int32) int32
	cublasLtMatmul                       func(h, desc uintptr, alpha unsafe.Pointer, a uint64, aDesc uintptr, b uint64, bDesc uintptr,
		beta unsafe.Pointer, c uint64, cDesc uintptr, d uint64, dDesc uintptr, algo *ltMatmulAlgo, ws uint64, wsBytes uint64, stream uintptr) int32
}

// cublasLt.h enumerators the backend uses (values checked against the
// header by TestCublasLtHeader).
const (
	ltDescComputeType  = 0  // CUBLASLT_MATMUL_DESC_COMPUTE_TYPE
	ltDescScaleType    = 1  // CUBLASLT_MATMUL_DESC_SCALE_TYPE
	ltDescTransA       = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	ltDescTransB       = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	ltDescEpilogue     = 7  // CUBLASLT_MATMUL_DESC_EPILOGUE
	ltDescBiasPointer  = 8  // CUBLASLT_MATMUL_DESC_BIAS_POINTER
	ltDescBiasDataType = 26 // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE

	ltEpilogueDefault  = 1  // CUBLASLT_EPILOGUE_DEFAULT
	ltEpilogueBias     = 4  // CUBLASLT_EPILOGUE_BIAS
	ltEpilogueGelu     = 32 // CUBLASLT_EPILOGUE_GELU
	ltEpilogueGeluBias = 36 // CUBLASLT_EPILOGUE_GELU_BIAS

	ltPrefSearchMode        = 0 // CUBLASLT_MATMUL_PREF_SEARCH_MODE
	ltPrefMaxWorkspaceBytes = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	ltSearchBestFit         = 0 // CUBLASLT_SEARCH_BEST_FIT
	ltPrefReductionMask     = 3 // CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK
	ltPrefMinAlignA         = 5 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES (B, C, D: 6, 7, 8)

	ltReductionInplace     = 1 // CUBLASLT_REDUCTION_SCHEME_INPLACE
	ltReductionComputeType = 2 // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
	ltReductionOutputType  = 4 // CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE
)

// ltMatmulAlgo is cublasLtMatmulAlgo_t: uint64_t data[8].
type ltMatmulAlgo struct{ data [8]uint64 }

// ltHeuristicResult is cublasLtMatmulHeuristicResult_t (96 bytes on LP64).
type ltHeuristicResult struct {
	algo          ltMatmulAlgo
	workspaceSize uint64
	state         int32
	wavesCount    float32
	reserved      [4]int32
}

// ltWorkspaceBytes is the most workspace a heuristic may ask for (32 MiB,
// what PyTorch gives cuBLASLt on Hopper).
const ltWorkspaceBytes = 32 << 20

func loadCublasLt(cublasPath string, sp searchPath) (*cublasLtAPI, error) {
	paths := sameFolder(cublasPath, libCublasLt)
	paths = append(paths, libCublasLt.names...)
	var h uintptr
	var path string
	var errs []string
	for _, p := range paths {
		if handle, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			h, path = handle, p
			break
		} else {
			errs = append(errs, err.Error())
		}
	}
	if h == 0 {
		var err error
		if h, path, err = dlopenFirst(libCublasLt, sp, fileExists); err != nil {
			return nil, fmt.Errorf("cuda: %w (also tried beside %s: %v)", err, cublasPath, lastN(errs, 2))
		}
	}
	c := &cublasLtAPI{path: path}
	t := &symbolTable{handle: h, lib: "libcublasLt"}
	t.bind(&c.cublasLtCreate, "cublasLtCreate", false)
	t.bind(&c.cublasLtDestroy, "cublasLtDestroy", false)
	t.bind(&c.cublasLtGetVersion, "cublasLtGetVersion", false)
	t.bind(&c.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate", false)
	t.bind(&c.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy", false)
	t.bind(&c.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute", false)
	t.bind(&c.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate", false)
	t.bind(&c.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy", false)
	t.bind(&c.cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate", false)
	t.bind(&c.cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy", false)
	t.bind(&c.cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute", false)
	t.bind(&c.cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic", false)
	t.bind(&c.cublasLtMatmul, "cublasLtMatmul", false)
	if t.err != nil {
		return nil, t.err
	}
	return c, nil
}

// ltLayout is one cublasLtMatrixLayoutCreate's arguments (column-major).
type ltLayout struct {
	typ        int32
	rows, cols uint64
	ld         int64
}

// ltGemmShape is the column-major problem cuBLASLt solves for the
// row-major C[m×n] = op(A)·op(B): Cᵀ = op(B)ᵀ·op(A)ᵀ, so cuBLASLt's A is
// our B and its B our A; each layout describes the stored matrix (before
// its op), as cublasLtMatmul wants.
type ltGemmShape struct {
	opA, opB int32 // cuBLASLt's transa (for our B), transb (for our A)
	// align: the byte alignment of cuBLASLt's A, B and C (= D) pointers,
	// at most 256 (buffers may be views at any element offset, and the
	// heuristic must not pick an algorithm that needs more).
	align      [3]uint32
	a, b, c    ltLayout
	m, n, k    int
	aT, bT, cT int32
}

// ptrAlign is the largest power of two dividing p, at most 256.
func ptrAlign(p uint64) uint32 {
	a := uint32(256)
	for a > 1 && p%uint64(a) != 0 {
		a /= 2
	}
	return a
}

// ldBytes is a layout's leading dimension in bytes.
func ldBytes(l ltLayout) uint64 {
	if l.typ == cudaR16BF || l.typ == cudaR16F {
		return uint64(l.ld) * 2
	}
	return uint64(l.ld) * 4
}

func newLtGemmShape(transA, transB bool, m, n, k int, aT, bT, cT int32) ltGemmShape {
	s := ltGemmShape{opA: cublasOpN, opB: cublasOpN, m: m, n: n, k: k, aT: aT, bT: bT, cT: cT}
	// cuBLASLt's A = our B: stored n×k column-major (row-major k×n) unless transB.
	s.a = ltLayout{typ: bT, rows: uint64(n), cols: uint64(k), ld: int64(n)}
	if transB {
		s.opA, s.a = cublasOpT, ltLayout{typ: bT, rows: uint64(k), cols: uint64(n), ld: int64(k)}
	}
	// cuBLASLt's B = our A: stored k×m column-major (row-major m×k) unless transA.
	s.b = ltLayout{typ: aT, rows: uint64(k), cols: uint64(m), ld: int64(k)}
	if transA {
		s.opB, s.b = cublasOpT, ltLayout{typ: aT, rows: uint64(m), cols: uint64(k), ld: int64(m)}
	}
	s.c = ltLayout{typ: cT, rows: uint64(n), cols: uint64(m), ld: int64(n)}
	return s
}

// ltPlan is a shape's heuristic answer, kept for the process.
type ltPlan struct {
	algo      ltMatmulAlgo
	workspace uint64
}

// ltState is the process's cuBLASLt: loaded once, one handle per GPU, one
// plan per (GPU, shape).
var ltState struct {
	once   sync.Once
	api    *cublasLtAPI
	err    error // why cuBLASLt is not used at all
	mu     sync.Mutex
	handle map[*gpuCtx]uintptr
	plans  map[ltPlanKey]*ltPlan // nil: no algorithm for the shape
	missed string                // the last shape without an algorithm
}

type ltPlanKey struct {
	g     *gpuCtx
	shape ltGemmShape
}

func ltLoad(l *lib) (*cublasLtAPI, error) {
	ltState.once.Do(func() {
		var api *cublasLtAPI
		var err error
		if envOff(EnvCublasLt) {
			err = fmt.Errorf("disabled by %s=%s", EnvCublasLt, os.Getenv(EnvCublasLt))
		} else {
			api, err = loadCublasLt(l.blas.path, newSearchPath(os.Getenv(EnvLibDir), filepath.Glob))
		}
		ltState.mu.Lock()
		ltState.api, ltState.err = api, err
		ltState.handle = map[*gpuCtx]uintptr{}
		ltState.plans = map[ltPlanKey]*ltPlan{}
		ltState.mu.Unlock()
	})
	ltState.mu.Lock()
	defer ltState.mu.Unlock()
	return ltState.api, ltState.err
}

// GemmPath says which library runs bf16 GEMMs: cuBLASLt (bf16 tensor
// cores, fp32 accumulation) or cublasGemmEx, and why not cuBLASLt.
func GemmPath() string {
	ltState.mu.Lock()
	defer ltState.mu.Unlock()
	switch {
	case ltState.api == nil && ltState.err == nil:
		return "bf16 GEMMs: cuBLASLt not loaded yet (loaded at the first bf16 GEMM); f32 GEMMs: cublasGemmEx fp32"
	case ltState.err != nil:
		return fmt.Sprintf("bf16 GEMMs: cublasGemmEx (cuBLASLt unavailable: %v); f32 GEMMs: cublasGemmEx fp32", ltState.err)
	case ltState.missed != "":
		return fmt.Sprintf("bf16 GEMMs: cuBLASLt %s, fp32 accumulation (cublasGemmEx where no heuristic answers, last %s); f32 GEMMs: cublasGemmEx fp32", ltState.api.path, ltState.missed)
	}
	return fmt.Sprintf("bf16 GEMMs: cuBLASLt %s, fp32 accumulation; f32 GEMMs: cublasGemmEx fp32", ltState.api.path)
}

// ltPlanFor returns the GPU's handle and the shape's plan (nil where
// cuBLASLt has no algorithm: the caller falls back to cublasGemmEx).
func ltPlanFor(g *gpuCtx, api *cublasLtAPI, s ltGemmShape, desc uintptr, lay [3]uintptr) (uintptr, *ltPlan, error) {
	ltState.mu.Lock()
	defer ltState.mu.Unlock()
	h, ok := ltState.handle[g]
	if !ok {
		if err := cublasCheck(api.cublasLtCreate(&h), "cublasLtCreate"); err != nil {
			return 0, nil, err
		}
		ltState.handle[g] = h
	}
	key := ltPlanKey{g, s}
	if p, ok := ltState.plans[key]; ok {
		return h, p, nil
	}
	var pref uintptr
	if err := cublasCheck(api.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"); err != nil {
		return 0, nil, err
	}
	defer api.cublasLtMatmulPreferenceDestroy(pref)
	ws := uint64(ltWorkspaceBytes)
	if err := cublasCheck(api.cublasLtMatmulPreferenceSetAttribute(pref, ltPrefMaxWorkspaceBytes, unsafe.Pointer(&ws), 8), "cublasLtMatmulPreferenceSetAttribute"); err != nil {
		return 0, nil, err
	}
	// Split-K only through workspace reductions, not in place in the
	// output (which orders partial sums by counters): the same bits at
	// every run on one GPU model, as cublasGemmEx gives.
	mask := uint32(ltReductionComputeType | ltReductionOutputType)
	if err := cublasCheck(api.cublasLtMatmulPreferenceSetAttribute(pref, ltPrefReductionMask, unsafe.Pointer(&mask), 4), "cublasLtMatmulPreferenceSetAttribute"); err != nil {
		return 0, nil, err
	}
	for i, a := range [4]uint32{s.align[0], s.align[1], s.align[2], s.align[2]} { // A, B, C, D (= C)
		a := a
		if err := cublasCheck(api.cublasLtMatmulPreferenceSetAttribute(pref, ltPrefMinAlignA+int32(i), unsafe.Pointer(&a), 4), "cublasLtMatmulPreferenceSetAttribute"); err != nil {
			return 0, nil, err
		}
	}
	var res ltHeuristicResult
	var n int32
	r := api.cublasLtMatmulAlgoGetHeuristic(h, desc, lay[0], lay[1], lay[2], lay[2], pref, 1, &res, &n)
	var p *ltPlan
	if r == cublasStatusSuccess && n > 0 && res.state == cublasStatusSuccess {
		p = &ltPlan{algo: res.algo, workspace: res.workspaceSize}
	} else {
		ltState.missed = fmt.Sprintf("%d×%d×%d (status %d, %d algorithms)", s.m, s.n, s.k, r, n)
	}
	ltState.plans[key] = p
	return h, p, nil
}

// ltGemm runs C = alpha·op(A)·op(B) + beta·C through cuBLASLt on stream s
// with fp32 compute and scale. It returns false (and no error) where
// cuBLASLt is unavailable, has no algorithm for the shape or refuses the
// call; no GEMM has been enqueued then, and the caller runs cublasGemmEx.
func ltGemm(s *Stream, transA, transB bool, m, n, k int, alpha float32, aPtr uint64, aT int32, bPtr uint64, bT int32, beta float32, cPtr uint64, cT int32) (bool, error) {
	g := s.dev.g
	api, err := ltLoad(g.l)
	if err != nil {
		return false, nil
	}
	sh := newLtGemmShape(transA, transB, m, n, k, aT, bT, cT)
	// The alignment covers the pointer and the leading dimension in bytes
	// (cuBLASLt's requirement is on both); cuBLASLt's A is our B.
	sh.align = [3]uint32{ptrAlign(bPtr | ldBytes(sh.a)), ptrAlign(aPtr | ldBytes(sh.b)), ptrAlign(cPtr | ldBytes(sh.c))}
	var desc uintptr
	if err := cublasCheck(api.cublasLtMatmulDescCreate(&desc, cublasCompute32F, cudaR32F), "cublasLtMatmulDescCreate"); err != nil {
		return false, err
	}
	defer api.cublasLtMatmulDescDestroy(desc)
	for _, a := range []struct {
		attr int32
		v    int32
	}{{ltDescTransA, sh.opA}, {ltDescTransB, sh.opB}, {ltDescEpilogue, ltEpilogueDefault}} {
		v := a.v
		if err := cublasCheck(api.cublasLtMatmulDescSetAttribute(desc, a.attr, unsafe.Pointer(&v), 4), fmt.Sprintf("cublasLtMatmulDescSetAttribute %d", a.attr)); err != nil {
			return false, err
		}
	}
	var lay [3]uintptr
	for i, l := range []ltLayout{sh.a, sh.b, sh.c} {
		if err := cublasCheck(api.cublasLtMatrixLayoutCreate(&lay[i], l.typ, l.rows, l.cols, max(l.ld, 1)), "cublasLtMatrixLayoutCreate"); err != nil {
			return false, err
		}
		defer api.cublasLtMatrixLayoutDestroy(lay[i])
	}
	h, plan, err := ltPlanFor(g, api, sh, desc, lay)
	if err != nil || plan == nil {
		return false, err
	}
	var ws uint64
	if plan.workspace > 0 {
		p, free, err := s.scratch(int64(plan.workspace))
		if err != nil {
			return false, err
		}
		defer free()
		ws = p
	}
	al, be := alpha, beta
	g.blasMu.Lock()
	r := api.cublasLtMatmul(h, desc, unsafe.Pointer(&al), bPtr, lay[0], aPtr, lay[1], unsafe.Pointer(&be),
		cPtr, lay[2], cPtr, lay[2], &plan.algo, ws, plan.workspace, s.h)
	g.blasMu.Unlock()
	if r != cublasStatusSuccess {
		// Refused at launch (the checks are synchronous): this shape goes
		// to cublasGemmEx from now on, and GemmPath says so.
		ltState.mu.Lock()
		ltState.plans[ltPlanKey{g, sh}] = nil
		ltState.missed = fmt.Sprintf("%d×%d×%d (cublasLtMatmul: %v)", m, n, k, cublasCheck(r, "cublasLtMatmul"))
		ltState.mu.Unlock()
		return false, nil
	}
	return true, nil
}
