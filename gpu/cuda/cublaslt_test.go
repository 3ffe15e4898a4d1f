package cuda

import (
	"math/rand/v2"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// These tests need no GPU and no cuBLASLt: the binding (cublaslt.go) is
// checked against an excerpt of NVIDIA's cublasLt.h (CUDA 12.6,
// testdata/cublaslt/cublasLt-12.6.h, which names its source), and the
// row-major to column-major mapping against a plain GEMM.

const cublasLtHeader = "testdata/cublaslt/cublasLt-12.6.h"

// ltHeader is what parseLtHeader reads: enumerators (expressions of
// earlier enumerators and literals joined by '|' evaluated), the byte size
// of each typedef'd struct, and each function's parameter types.
type ltHeader struct {
	enums   map[string]int64
	structs map[string][]string // struct -> its fields' C types, in order ("uint64_t[8]")
	funcs   map[string][]string
}

var (
	reLtEnum   = regexp.MustCompile(`typedef enum \{([^}]*)\} (\w+) ;`)
	reLtStruct = regexp.MustCompile(`typedef struct \{([^}]*)\} (\w+) ;`)
	reLtFunc   = regexp.MustCompile(`\w+ (?:\* )?(cublasLt\w+) \(([^()]*)\) ;`)
)

func parseLtHeader(t *testing.T) ltHeader {
	t.Helper()
	src, err := os.ReadFile(cublasLtHeader)
	if err != nil {
		t.Fatal(err)
	}
	text := reComment.ReplaceAllString(string(src), " ")
	text = strings.ReplaceAll(text, "CUBLASWINAPI", " ")
	text = strings.Join(strings.Fields(reSpaced.ReplaceAllString(text, " $1 ")), " ")
	h := ltHeader{enums: map[string]int64{}, structs: map[string][]string{}, funcs: map[string][]string{}}
	for _, m := range reLtEnum.FindAllStringSubmatch(text, -1) {
		for _, item := range strings.Split(m[1], ",") {
			name, expr, ok := strings.Cut(item, "=")
			if strings.TrimSpace(item) == "" {
				continue
			}
			if !ok {
				t.Fatalf("%s: enum %s: member %q without a value", cublasLtHeader, m[2], item)
			}
			var v int64
			for _, term := range strings.Split(strings.NewReplacer("(", " ", ")", " ").Replace(expr), "|") {
				term = strings.TrimSpace(term)
				if x, err := strconv.ParseInt(term, 0, 64); err == nil {
					v |= x
				} else if x, ok := h.enums[term]; ok {
					v |= x
				} else {
					t.Fatalf("%s: %s = %s: unknown term %q", cublasLtHeader, name, expr, term)
				}
			}
			h.enums[strings.TrimSpace(name)] = v
		}
	}
	for _, m := range reLtStruct.FindAllStringSubmatch(text, -1) {
		var fields []string
		for _, f := range strings.Split(m[1], ";") {
			w := strings.Fields(f)
			if len(w) == 0 {
				continue
			}
			typ := w[0]
			if len(w) == 5 && w[2] == "[" { // "uint64_t data [ 8 ]"
				typ += "[" + w[3] + "]"
			}
			fields = append(fields, typ)
		}
		h.structs[m[2]] = fields
	}
	for _, m := range reLtFunc.FindAllStringSubmatch(text, -1) {
		var params []string
		if p := strings.TrimSpace(m[2]); p != "void" {
			for _, param := range strings.Split(p, ",") {
				arr := strings.Contains(param, "[ ]")
				w := strings.Fields(strings.ReplaceAll(param, "[ ]", ""))
				typ := cType(strings.Join(w[:len(w)-1], " "))
				if arr {
					typ += "*"
				}
				if deviceBuffer[w[len(w)-1]] {
					typ = "device " + typ
				}
				params = append(params, typ)
			}
		}
		h.funcs[m[1]] = params
	}
	return h
}

// deviceBuffer names the pointer parameters of cublasLtMatmul that are
// device memory (passed as uint64 addresses, not Go pointers).
var deviceBuffer = map[string]bool{"A": true, "B": true, "C": true, "D": true, "workspace": true}

// ltCTypes are the C types of the excerpt, their sizes on LP64 Linux and
// the Go kind a purego binding must pass them as.
var ltCTypes = map[string]struct {
	bytes uintptr
	kind  reflect.Kind
}{
	"cublasLtHandle_t": {8, reflect.Uintptr}, "cublasLtMatmulDesc_t": {8, reflect.Uintptr},
	"cublasLtMatrixLayout_t": {8, reflect.Uintptr}, "cublasLtMatmulPreference_t": {8, reflect.Uintptr},
	"cudaStream_t":      {8, reflect.Uintptr},
	"cublasLtHandle_t*": {8, reflect.Pointer}, "cublasLtMatmulDesc_t*": {8, reflect.Pointer},
	"cublasLtMatrixLayout_t*": {8, reflect.Pointer}, "cublasLtMatmulPreference_t*": {8, reflect.Pointer},
	"const cublasLtMatmulAlgo_t*": {8, reflect.Pointer}, "cublasLtMatmulHeuristicResult_t*": {8, reflect.Pointer},
	"int*":        {8, reflect.Pointer},
	"const void*": {8, reflect.UnsafePointer}, // host values (alpha, beta, attribute buffers)
	// device buffers as uint64 addresses
	"device const void*": {8, reflect.Uint64}, "device void*": {8, reflect.Uint64},
	"cudaDataType": {4, reflect.Int32}, "cudaDataType_t": {4, reflect.Int32}, "cublasComputeType_t": {4, reflect.Int32},
	"cublasLtMatmulDescAttributes_t": {4, reflect.Int32}, "cublasLtMatmulPreferenceAttributes_t": {4, reflect.Int32},
	"int": {4, reflect.Int32}, "uint64_t": {8, reflect.Uint64}, "int64_t": {8, reflect.Int64}, "size_t": {8, reflect.Uint64},
}

func TestCublasLtHeader(t *testing.T) {
	h := parseLtHeader(t)
	for name, got := range map[string]int64{
		"CUBLASLT_MATMUL_DESC_COMPUTE_TYPE": ltDescComputeType, "CUBLASLT_MATMUL_DESC_SCALE_TYPE": ltDescScaleType,
		"CUBLASLT_MATMUL_DESC_TRANSA": ltDescTransA, "CUBLASLT_MATMUL_DESC_TRANSB": ltDescTransB,
		"CUBLASLT_MATMUL_DESC_EPILOGUE": ltDescEpilogue, "CUBLASLT_MATMUL_DESC_BIAS_POINTER": ltDescBiasPointer,
		"CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE": ltDescBiasDataType,
		"CUBLASLT_EPILOGUE_DEFAULT":           ltEpilogueDefault, "CUBLASLT_EPILOGUE_BIAS": ltEpilogueBias,
		"CUBLASLT_EPILOGUE_GELU": ltEpilogueGelu, "CUBLASLT_EPILOGUE_GELU_BIAS": ltEpilogueGeluBias,
		"CUBLASLT_MATMUL_PREF_SEARCH_MODE": ltPrefSearchMode, "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES": ltPrefMaxWorkspaceBytes,
		"CUBLASLT_SEARCH_BEST_FIT": ltSearchBestFit, "CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK": ltPrefReductionMask,
		"CUBLASLT_REDUCTION_SCHEME_INPLACE": ltReductionInplace, "CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE": ltReductionComputeType,
		"CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE":      ltReductionOutputType,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES": ltPrefMinAlignA, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES": ltPrefMinAlignA + 1,
		"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES": ltPrefMinAlignA + 2, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES": ltPrefMinAlignA + 3,
	} {
		want, ok := h.enums[name]
		if !ok {
			t.Errorf("%s: no enumerator %s", cublasLtHeader, name)
		} else if got != want {
			t.Errorf("%s = %d in cublaslt.go, %d in %s", name, got, want, cublasLtHeader)
		}
	}
	if n := len(h.enums); n < 50 {
		t.Fatalf("parsed only %d enumerators", n)
	}
	// Struct sizes: the semi-opaque uint64_t arrays and the heuristic result.
	size := func(fields []string) (n uintptr) {
		for _, f := range fields {
			base, count, _ := strings.Cut(strings.TrimSuffix(f, "]"), "[")
			c := uintptr(1)
			if count != "" {
				x, _ := strconv.Atoi(count)
				c = uintptr(x)
			}
			var b, align uintptr
			switch base {
			case "uint64_t", "size_t":
				b, align = 8, 8
			case "int", "float", "cublasStatus_t":
				b, align = 4, 4
			case "cublasLtMatmulAlgo_t":
				b, align = 64, 8
			default:
				t.Fatalf("field type %s", base)
			}
			n = (n+align-1)/align*align + b*c
		}
		return (n + 7) / 8 * 8
	}
	for name, got := range map[string]uintptr{
		"cublasLtMatmulAlgo_t":            unsafe.Sizeof(ltMatmulAlgo{}),
		"cublasLtMatmulHeuristicResult_t": unsafe.Sizeof(ltHeuristicResult{}),
	} {
		fields, ok := h.structs[name]
		if !ok {
			t.Fatalf("%s: no struct %s", cublasLtHeader, name)
		}
		if want := size(fields); got != want {
			t.Errorf("%s: %d bytes in Go, %d in C (%v)", name, got, want, fields)
		}
	}
	var r ltHeuristicResult
	if off := unsafe.Offsetof(r.workspaceSize); off != 64 {
		t.Errorf("workspaceSize at %d, want 64", off)
	}
	if off := unsafe.Offsetof(r.state); off != 72 {
		t.Errorf("state at %d, want 72", off)
	}
	// Functions: every bound symbol, its parameter count and kinds.
	api := reflect.TypeOf(cublasLtAPI{})
	bound := 0
	for i := range api.NumField() {
		f := api.Field(i)
		if f.Type.Kind() != reflect.Func {
			continue
		}
		bound++
		params, ok := h.funcs[f.Name]
		if !ok {
			t.Errorf("%s not declared in %s", f.Name, cublasLtHeader)
			continue
		}
		if f.Type.NumIn() != len(params) {
			t.Errorf("%s: %d parameters in Go, %d in C %v", f.Name, f.Type.NumIn(), len(params), params)
			continue
		}
		for j, p := range params {
			ct, ok := ltCTypes[p]
			if !ok {
				t.Errorf("%s parameter %d: C type %q not in the table", f.Name, j, p)
				continue
			}
			if in := f.Type.In(j); in.Kind() != ct.kind || in.Size() != ct.bytes {
				t.Errorf("%s parameter %d: Go %s (%d bytes), C %s wants %s (%d bytes)", f.Name, j, in, in.Size(), p, ct.kind, ct.bytes)
			}
		}
		if f.Type.NumOut() != 1 {
			t.Errorf("%s: %d results", f.Name, f.Type.NumOut())
		}
	}
	if bound != 13 {
		t.Errorf("%d functions bound, the test expects 13", bound)
	}
}

// TestLtGemmShape runs the column-major problem newLtGemmShape describes
// (cuBLASLt's semantics: D = op(A)·op(B) on column-major stored matrices
// of the layouts' rows, cols and ld) on row-major data, and compares it
// with the row-major product C = op(A)·op(B). Sums of a few small
// integers in float64: exact, so equality is the tolerance.
func TestLtGemmShape(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ m, n, k int }{{3, 5, 7}, {1, 4, 2}, {6, 1, 3}} {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				m, n, k := tc.m, tc.n, tc.k
				a := make([]float64, m*k) // stored m×k, or k×m when ta
				b := make([]float64, k*n) // stored k×n, or n×k when tb
				for i := range a {
					a[i] = float64(rng.IntN(7) - 3)
				}
				for i := range b {
					b[i] = float64(rng.IntN(7) - 3)
				}
				at := func(i, p int) float64 { // op(A)[i][p]
					if ta {
						return a[p*m+i]
					}
					return a[i*k+p]
				}
				bt := func(p, j int) float64 {
					if tb {
						return b[j*k+p]
					}
					return b[p*n+j]
				}
				s := newLtGemmShape(ta, tb, m, n, k, cudaR16BF, cudaR16BF, cudaR32F)
				if s.c.rows != uint64(n) || s.c.cols != uint64(m) || s.c.ld != int64(n) || s.c.typ != cudaR32F {
					t.Fatalf("C layout %+v", s.c)
				}
				// Column-major element (r, c) of a stored layout, then op.
				colMajor := func(buf []float64, l ltLayout, op int32, r, c int) float64 {
					if op == cublasOpT {
						r, c = c, r
					}
					if uint64(r) >= l.rows || uint64(c) >= l.cols {
						t.Fatalf("index (%d,%d) outside layout %+v", r, c, l)
					}
					return buf[c*int(l.ld)+r]
				}
				for i := range m {
					for j := range n {
						var want, got float64
						for p := range k {
							want += at(i, p) * bt(p, j)
							// cuBLASLt's D(r=j, c=i) = Σ opA(LtA)(j,p)·opB(LtB)(p,i), LtA = our B, LtB = our A.
							got += colMajor(b, s.a, s.opA, j, p) * colMajor(a, s.b, s.opB, p, i)
						}
						if got != want {
							t.Fatalf("transA %v transB %v %d×%d×%d: C[%d][%d] = %v through the layouts, %v", ta, tb, m, n, k, i, j, got, want)
						}
					}
				}
			}
		}
	}
}

func TestPtrAlign(t *testing.T) {
	for p, want := range map[uint64]uint32{0: 256, 0x7f0000000000: 256, 0x7f0000000100: 256, 0x7f0000000080: 128, 0x7f0000000002: 2, 0x7f0000000006: 2, 0x7f0000000010: 16, 1: 1} {
		if got := ptrAlign(p); got != want {
			t.Errorf("ptrAlign(%#x) = %d, want %d", p, got, want)
		}
	}
	// A bf16 layout with ld 3 (6 bytes) at a 256-aligned pointer: 2.
	if got := ptrAlign(0x7f0000000000 | ldBytes(ltLayout{typ: cudaR16BF, ld: 3})); got != 2 {
		t.Errorf("bf16 ld 3: alignment %d, want 2", got)
	}
	if got := ptrAlign(0x7f0000000000 | ldBytes(ltLayout{typ: cudaR32F, ld: 64})); got != 256 {
		t.Errorf("f32 ld 64: alignment %d, want 256", got)
	}
}
