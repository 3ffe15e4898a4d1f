package cuda

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// These tests need no GPU: they check the Go side's kernel launches
// against kernels.cu's declarations, and the launch arithmetic.

// kernelParams parses kernels.cu's extern "C" kernels into their
// parameter kinds: "ptr" (any pointer), "int", "unsigned", "i64", "float".
func kernelParams(t *testing.T) map[string][]string {
	t.Helper()
	re := regexp.MustCompile(`extern "C" __global__ void (?:__launch_bounds__\(\w+\) )?(\w+)\(([^)]*)\)`)
	out := map[string][]string{}
	for _, m := range re.FindAllStringSubmatch(kernelSource, -1) {
		var kinds []string
		for _, p := range strings.Split(m[2], ",") {
			p = strings.Join(strings.Fields(p), " ")
			switch {
			case p == "":
				continue
			case strings.Contains(p, "*"):
				kinds = append(kinds, "ptr")
			case strings.HasPrefix(p, "int "), strings.HasPrefix(p, "i64 "), strings.HasPrefix(p, "float "), strings.HasPrefix(p, "unsigned "),
				strings.HasPrefix(p, "RopeFreqs "):
				kinds = append(kinds, strings.Fields(p)[0])
			default:
				t.Fatalf("kernel %s: parameter %q of an unknown kind", m[1], p)
			}
		}
		out[m[1]] = kinds
	}
	return out
}

// launchSite is one launch in the Go source: the kernel, the kinds of the
// arguments as the kernel receives them, and the block size when it is a
// constant.
type launchSite struct {
	pos    string
	kernel string
	kinds  []string
	block  int64 // -1: not a constant
}

// goLaunches type-checks the package's non-test Go files and returns every
// call of Stream.launch, Stream.launchN and gpuCtx.launch.
func goLaunches(t *testing.T) []launchSite {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var parsed []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, af)
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check("github.com/strata-ai/strata/gpu/cuda", fset, parsed, info); err != nil {
		t.Fatalf("type-checking the package: %v", err)
	}
	kind := func(e ast.Expr) string {
		switch tv := info.Types[e]; tv.Type.String() {
		case "github.com/strata-ai/strata/gpu/cuda.devPtr":
			return "ptr"
		case "int32":
			return "int"
		case "uint32":
			return "unsigned"
		case "int64":
			return "i64"
		case "float32":
			return "float"
		case "*github.com/strata-ai/strata/gpu/cuda.ropeFreqs":
			return "RopeFreqs" // passed by value: launch hands the driver the array's address
		default:
			return "unpackable " + tv.Type.String()
		}
	}
	var sites []launchSite
	for _, af := range parsed {
		ast.Inspect(af, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			recv := info.Types[sel.X].Type
			if recv == nil {
				return true
			}
			var nameAt, blockAt, argsAt int
			switch r := recv.String(); {
			case sel.Sel.Name == "launch" && r == "*github.com/strata-ai/strata/gpu/cuda.Stream":
				nameAt, blockAt, argsAt = 0, 2, 3
			case sel.Sel.Name == "launchN" && r == "*github.com/strata-ai/strata/gpu/cuda.Stream":
				nameAt, blockAt, argsAt = 0, -1, 2
			case sel.Sel.Name == "launch" && r == "*github.com/strata-ai/strata/gpu/cuda.gpuCtx":
				nameAt, blockAt, argsAt = 1, 3, 5
			default:
				return true
			}
			site := launchSite{pos: fset.Position(call.Pos()).String(), block: 256}
			var names []string
			switch arg := call.Args[nameAt].(type) {
			case *ast.BasicLit:
				name, _ := strconv.Unquote(arg.Value)
				names = []string{name}
			case *ast.CallExpr:
				// dequantKernel(c): the kernel of each codec of the table.
				if id, ok := arg.Fun.(*ast.Ident); ok && id.Name == "dequantKernel" {
					for i := range dtype.Codecs {
						names = append(names, dequantKernel(&dtype.Codecs[i]))
					}
				}
			}
			if len(names) == 0 {
				return true // the generic launchers themselves pass name through
			}
			if blockAt >= 0 {
				site.block = -1
				if v := info.Types[call.Args[blockAt]].Value; v != nil {
					site.block, _ = strconv.ParseInt(v.ExactString(), 10, 64)
				}
			}
			for _, a := range call.Args[argsAt:] {
				site.kinds = append(site.kinds, kind(a))
			}
			for _, name := range names {
				site.kernel = name
				sites = append(sites, site)
			}
			return true
		})
	}
	return sites
}

// TestLaunchArguments: every launch passes the kernel's parameters in
// number, order and size (a mismatch would read garbage on the GPU, not
// fail to compile), and every kernel is launched somewhere.
func TestLaunchArguments(t *testing.T) {
	params := kernelParams(t)
	sites := goLaunches(t)
	launched := map[string]bool{}
	for _, s := range sites {
		want, ok := params[s.kernel]
		if !ok {
			t.Errorf("%s: launches %s, which kernels.cu does not declare", s.pos, s.kernel)
			continue
		}
		launched[s.kernel] = true
		if !slices.Equal(s.kinds, want) {
			t.Errorf("%s: %s launched with %v, the kernel takes %v", s.pos, s.kernel, s.kinds, want)
		}
	}
	for k := range params {
		if !launched[k] {
			t.Errorf("kernel %s is never launched", k)
		}
	}
	if len(sites) < len(params) {
		t.Errorf("found %d launch sites for %d kernels", len(sites), len(params))
	}
}

// TestLaunchBlockSizes: kernels that reduce over NT threads with
// block_sum_d/block_max_f, or are built for a fixed block (the attention
// kernels' __launch_bounds__), are launched with exactly that many.
func TestLaunchBlockSizes(t *testing.T) {
	want := map[string]int64{
		"layernorm_fwd": rowThreads, "layernorm_bwd_dx": rowThreads, "rmsnorm_fwd": rowThreads, "rmsnorm_bwd_dx": rowThreads,
		"xent_fwd": rowThreads, "xent_bwd": rowThreads, "sumsq_partial": 256, "sumsq_final": 256, "check_ids": 256, "check_pos": 256,
		"attn_fwd": attnFwdThreads, "attn_bwd_dkv": attnBwdThreads, "attn_bwd_dq": attnBwdThreads, "attn_cached": rowThreads,
		"attn_fwd_tc": attnTCThreads, "attn_bwd_dkv_tc": attnTCThreads, "attn_bwd_dq_tc": attnTCThreads,
		"attn_fwd_wide": attnWideFwdThreads, "attn_bwd_dkv_wide": attnWideBwdThreads, "attn_bwd_dq_wide": attnWideBwdThreads,
	}
	seen := map[string]bool{}
	for _, s := range goLaunches(t) {
		if w, ok := want[s.kernel]; ok {
			seen[s.kernel] = true
			if s.block != w {
				t.Errorf("%s: %s launched with %d threads a block, want %d", s.pos, s.kernel, s.block, w)
			}
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("no launch of %s found", k)
		}
	}
	for _, c := range []struct {
		def  string
		want int
	}{
		{"ATT_D", attnMaxHeadDim}, {"AF_BQ", attnFwdRows}, {"AF_BK", attnFwdRows}, {"AF_NT", attnFwdThreads},
		{"AB_BQ", attnBwdRows}, {"AB_BK", attnBwdRows}, {"AB_NT", attnBwdThreads}, {"NT", rowThreads}, {"VEC", vecElems},
		{"ATT_WD", attnWideHeadDim}, {"AFW_BQ", attnWideFwdRows}, {"AFW_BK", attnWideFwdRows}, {"AFW_NT", attnWideFwdThreads},
		{"ABW_BQ", attnWideBwdRows}, {"ABW_BK", attnWideBwdRows}, {"ABW_NT", attnWideBwdThreads},
		{"TC_BQ", attnTCRows}, {"TC_NT", attnTCThreads}, {"ROPE_MAX_FREQS", len(ropeFreqs{})},
		{"GLU_SILU", int(gluActs[gpu.Silu])}, {"GLU_GELU_TANH", int(gluActs[gpu.GeluTanh])},
	} {
		if !regexp.MustCompile(`(?m)^#define ` + c.def + ` ` + strconv.Itoa(c.want) + `\b`).MatchString(kernelSource) {
			t.Errorf("kernels.cu: %s is not %d", c.def, c.want)
		}
	}
}

// TestAttnShapes: the grids cover every query and key row once, with
// partial last tiles, and grouped-query attention has one dK/dV block per
// key/value head.
func TestAttnShapes(t *testing.T) {
	for _, c := range []struct {
		batch, seq, heads, kv, headDim int
		want                           attnShape
	}{
		{1, 1, 1, 1, 64, attnShape{fwdTiles: 1, bwdTiles: 1, fwdGrid: 1, dqGrid: 1, dkvGrid: 1, tcTiles: 1, tcGrid: 1, tcKVGrid: 1}},
		{2, 32, 4, 4, 64, attnShape{fwdTiles: 1, bwdTiles: 2, fwdGrid: 8, dqGrid: 16, dkvGrid: 16, tcTiles: 1, tcGrid: 8, tcKVGrid: 8}},
		{2, 33, 4, 4, 128, attnShape{fwdTiles: 2, bwdTiles: 3, fwdGrid: 16, dqGrid: 24, dkvGrid: 24, tcTiles: 1, tcGrid: 8, tcKVGrid: 8}},
		{2, 65, 4, 4, 64, attnShape{fwdTiles: 3, bwdTiles: 5, fwdGrid: 24, dqGrid: 40, dkvGrid: 40, tcTiles: 2, tcGrid: 16, tcKVGrid: 16}},
		{3, 100, 8, 2, 64, attnShape{fwdTiles: 4, bwdTiles: 7, fwdGrid: 96, dqGrid: 168, dkvGrid: 42, tcTiles: 2, tcGrid: 48, tcKVGrid: 12}},
		{1, 0, 8, 2, 64, attnShape{}},
		// past 128: the wide kernels' tiles, 16 rows forward, 8 backward
		{2, 33, 4, 4, 129, attnShape{wide: true, fwdTiles: 3, bwdTiles: 5, fwdGrid: 24, dqGrid: 40, dkvGrid: 40, tcTiles: 1, tcGrid: 8, tcKVGrid: 8}},
		{3, 100, 8, 2, 256, attnShape{wide: true, fwdTiles: 7, bwdTiles: 13, fwdGrid: 168, dqGrid: 312, dkvGrid: 78, tcTiles: 2, tcGrid: 48, tcKVGrid: 12}},
		{1, 0, 8, 2, 256, attnShape{wide: true}},
	} {
		if got := attnShapes(c.batch, c.seq, c.heads, c.kv, c.headDim); got != c.want {
			t.Errorf("attnShapes(%d, %d, %d, %d, %d) = %+v, want %+v", c.batch, c.seq, c.heads, c.kv, c.headDim, got, c.want)
		}
	}
	if err := attnCheck("attention", 1, 8, 2, 1, 257); err == nil || !strings.Contains(err.Error(), "at most 256") {
		t.Errorf("head dimension 257: %v", err)
	}
	for _, d := range []int{128, 129, 256} {
		if err := attnCheck("attention", 1, 8, 2, 1, d); err != nil {
			t.Errorf("head dimension %d: %v", d, err)
		}
	}
	if err := attnCheck("attention", 1<<20, 1<<20, 64, 8, 64); err == nil {
		t.Error("a grid past 2^31 blocks was accepted")
	}
	if err := attnCheck("attention", 1<<19, 1<<20, 64, 8, 256); err == nil {
		t.Error("a grid of the wide kernels past 2^31 blocks was accepted")
	}
}

// TestTensorCoreDispatch: the mma.sync attention kernels run for q, k, v
// (and dout) of one 16-bit float type, head dimensions that are multiples
// of 16 up to 128, on sm_80 and later, unless STRATA_TC_ATTENTION turns
// them off.
func TestTensorCoreDispatch(t *testing.T) {
	buf := func(dt gpu.DType) *Buffer { return &Buffer{Extent: gpu.Scratch(dt, 1)} }
	h100 := &kernels{d: &Device{g: &gpuCtx{major: 9}}}
	v100 := &kernels{d: &Device{g: &gpuCtx{major: 7}}}
	for _, c := range []struct {
		o       *kernels
		qkv     gpu.DType
		dout    *Buffer
		headDim int
		env     string
		want    bool
		why     string
	}{
		{h100, gpu.BF16, nil, 64, "", true, "bf16, D 64"},
		{h100, gpu.F16, buf(gpu.F16), 128, "", true, "f16 with f16 dout"},
		{h100, gpu.BF16, buf(gpu.BF16), 16, "on", true, "D 16, any other setting"},
		{h100, gpu.F32, nil, 64, "", false, "fp32 q, k, v"},
		{h100, gpu.BF16, nil, 40, "", false, "D not a multiple of 16"},
		{h100, gpu.BF16, buf(gpu.BF16), 256, "", false, "D 256: the wide fp32 kernels"},
		{h100, gpu.F16, nil, 144, "", false, "D 144, past the tensor-core kernels' 128"},
		{h100, gpu.BF16, buf(gpu.F32), 64, "", false, "fp32 dout"},
		{h100, gpu.BF16, buf(gpu.F16), 64, "", false, "f16 dout under bf16 q, k, v"},
		{v100, gpu.BF16, nil, 64, "", false, "sm_70"},
		{h100, gpu.BF16, nil, 64, "off", false, "turned off"},
		{h100, gpu.BF16, nil, 64, " FALSE", false, "turned off (case, space)"},
		{h100, gpu.BF16, nil, 64, "0", false, "turned off (0)"},
	} {
		t.Setenv(EnvTensorCoreAttention, c.env)
		if got := c.o.tensorCores(buf(c.qkv), c.dout, c.headDim); got != c.want {
			t.Errorf("%s: tensorCores = %v, want %v", c.why, got, c.want)
		}
	}
}
