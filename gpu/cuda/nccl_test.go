package cuda

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// These tests need no GPU and no NCCL: they check the binding (nccl.go)
// against copies of NCCL's public header (testdata/nccl/*.h, each naming
// its source and version).

// cHeader is what ncclHeader reads of a header.
type cHeader struct {
	defines map[string]string
	// enums: typedef name -> member -> every value the header gives it
	// (two where #if branches differ, as ncclNumTypes in 2.17).
	enums  map[string]map[string][]int64
	sizes  map[string]int // typedef struct { char x[N]; } name -> N bytes
	funcs  map[string]cFunc
	source string
}

// cFunc is a function's return type and parameter types, normalized
// ("const void*", "int*", "ncclComm_t").
type cFunc struct {
	ret    string
	params []string
}

var (
	reComment = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	reDefine  = regexp.MustCompile(`(?m)^\s*#\s*define\s+(\w+)\s+(.*?)\s*$`)
	rePreproc = regexp.MustCompile(`(?m)^\s*#.*$`)
	reEnum    = regexp.MustCompile(`typedef enum \{([^}]*)\} (\w+) ;`)
	reCharArr = regexp.MustCompile(`typedef struct \{ char \w+ \[ (\w+) \] ; \} (\w+) ;`)
	reFunc    = regexp.MustCompile(`((?:const )?\w+(?: \*)?) (\w+) \(([^()]*)\) ;`)
	reSpaced  = regexp.MustCompile(`\s*([*(){}\[\];,=])\s*`)
)

// ncclHeader parses the enums, char-array structs, #defines and function
// prototypes of a C header (enough of C for nccl.h's declarations).
func ncclHeader(t *testing.T, path string) cHeader {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := cHeader{defines: map[string]string{}, enums: map[string]map[string][]int64{}, sizes: map[string]int{}, funcs: map[string]cFunc{}, source: filepath.Base(path)}
	text := reComment.ReplaceAllString(string(src), " ")
	for _, m := range reDefine.FindAllStringSubmatch(text, -1) {
		h.defines[m[1]] = m[2]
	}
	text = rePreproc.ReplaceAllString(text, " ")
	// One space around every punctuator, one between words.
	text = strings.Join(strings.Fields(reSpaced.ReplaceAllString(text, " $1 ")), " ")
	for _, m := range reEnum.FindAllStringSubmatch(text, -1) {
		members := map[string][]int64{}
		for _, item := range strings.Split(m[1], ",") {
			name, val, ok := strings.Cut(item, "=")
			name, val = strings.TrimSpace(name), strings.TrimSpace(val)
			if !ok {
				t.Fatalf("%s: enum %s: member %q without a value", h.source, m[2], item)
			}
			v, err := strconv.ParseInt(val, 0, 64)
			if err != nil {
				continue // an expression (ncclMaxRedOp): nothing the binding uses
			}
			members[name] = append(members[name], v)
		}
		h.enums[m[2]] = members
	}
	for _, m := range reCharArr.FindAllStringSubmatch(text, -1) {
		n, err := strconv.Atoi(m[1])
		if err != nil {
			if n, err = strconv.Atoi(h.defines[m[1]]); err != nil {
				t.Fatalf("%s: struct %s: array length %q", h.source, m[2], m[1])
			}
		}
		h.sizes[m[2]] = n
	}
	for _, m := range reFunc.FindAllStringSubmatch(text, -1) {
		f := cFunc{ret: cType(m[1])}
		if p := strings.TrimSpace(m[3]); p != "" && p != "void" {
			for _, param := range strings.Split(p, ",") {
				words := strings.Fields(param)
				if len(words) < 2 {
					t.Fatalf("%s: %s: parameter %q without a name", h.source, m[2], param)
				}
				f.params = append(f.params, cType(strings.Join(words[:len(words)-1], " ")))
			}
		}
		h.funcs[m[2]] = f
	}
	return h
}

// cType writes a C type without spaces before '*': "const void*".
func cType(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), " *", "*") }

// goTypeOf is the Go type the binding must use for each C type of nccl.h,
// and the C type's size on LP64 Linux (amd64, arm64: int and enums 4
// bytes, pointers and size_t 8). Device buffers (void*) are passed as
// uint64 device addresses; communicators and streams, opaque pointers, as
// uintptr.
var goTypeOf = map[string]struct {
	goType string
	cBytes uintptr
}{
	"ncclResult_t":   {"cuda.ncclResult", 4},
	"ncclDataType_t": {"cuda.ncclDataType", 4},
	"ncclRedOp_t":    {"cuda.ncclRedOp", 4},
	"int":            {"int32", 4},
	"int*":           {"*int32", 8},
	"size_t":         {"uint64", 8},
	"const void*":    {"uint64", 8},
	"void*":          {"uint64", 8},
	"const char*":    {"*uint8", 8},
	"ncclComm_t":     {"uintptr", 8},
	"ncclComm_t*":    {"*uintptr", 8},
	"cudaStream_t":   {"uintptr", 8},
	"ncclUniqueId":   {"cuda.ncclUniqueID", ncclUniqueIDBytes},
	"ncclUniqueId*":  {"*cuda.ncclUniqueID", 8},
}

// ncclHeaders are the copies of nccl.h, oldest first; the newest must
// declare every constant the binding names.
var ncclHeaders = []string{"nccl-2.17.h", "nccl-2.31.h"}

func TestNCCLBindingMatchesHeader(t *testing.T) {
	api := reflect.TypeFor[ncclAPI]()
	for _, name := range ncclHeaders {
		h := ncclHeader(t, filepath.Join("testdata", "nccl", name))
		t.Run(name, func(t *testing.T) {
			bound := 0
			for i := range api.NumField() {
				f := api.Field(i)
				if f.Type.Kind() != reflect.Func {
					continue
				}
				bound++
				checkNCCLFunc(t, h, f)
			}
			if bound < 10 {
				t.Fatalf("only %d functions bound in ncclAPI", bound)
			}
			if got := h.sizes["ncclUniqueId"]; got != ncclUniqueIDBytes || unsafe.Sizeof(ncclUniqueID{}) != uintptr(got) {
				t.Errorf("sizeof(ncclUniqueId) = %d in the header, NCCL_UNIQUE_ID_BYTES %s; Go's ncclUniqueID is %d bytes, ncclUniqueIDBytes %d",
					got, h.defines["NCCL_UNIQUE_ID_BYTES"], unsafe.Sizeof(ncclUniqueID{}), ncclUniqueIDBytes)
			}
		})
	}
}

// checkNCCLFunc compares the binding's field f (named as the C function)
// with the header's prototype.
func checkNCCLFunc(t *testing.T, h cHeader, f reflect.StructField) {
	t.Helper()
	cf, ok := h.funcs[f.Name]
	if !ok {
		t.Errorf("%s is bound but not declared in %s", f.Name, h.source)
		return
	}
	if f.Type.NumIn() != len(cf.params) {
		t.Errorf("%s: %d parameters in Go, %d in %s (%v)", f.Name, f.Type.NumIn(), len(cf.params), h.source, cf.params)
		return
	}
	check := func(what, ctype string, gt reflect.Type) {
		want, ok := goTypeOf[ctype]
		switch {
		case !ok:
			t.Errorf("%s: %s has C type %q, which the binding has no Go type for", f.Name, what, ctype)
		case gt.String() != want.goType:
			t.Errorf("%s: %s is %s in Go, want %s for C %q", f.Name, what, gt, want.goType, ctype)
		case gt.Size() != want.cBytes:
			t.Errorf("%s: %s: Go %s is %d bytes, C %q %d", f.Name, what, gt, gt.Size(), ctype, want.cBytes)
		}
	}
	for i, p := range cf.params {
		check("parameter "+strconv.Itoa(i+1), p, f.Type.In(i))
	}
	if f.Type.NumOut() != 1 {
		t.Errorf("%s: %d results in Go", f.Name, f.Type.NumOut())
		return
	}
	check("the result", cf.ret, f.Type.Out(0))
}

// goNCCLConsts returns nccl.go's constants of the enum types, by name:
// each must be a plain integer literal.
func goNCCLConsts(t *testing.T) map[string]struct {
	enum  string
	value int64
} {
	t.Helper()
	enumOf := map[string]string{"ncclResult": "ncclResult_t", "ncclDataType": "ncclDataType_t", "ncclRedOp": "ncclRedOp_t"}
	fset := token.NewFileSet()
	af, err := parser.ParseFile(fset, "nccl.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]struct {
		enum  string
		value int64
	}{}
	for _, decl := range af.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			id, ok := vs.Type.(*ast.Ident)
			if !ok || enumOf[id.Name] == "" {
				continue
			}
			for i, n := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.INT {
					t.Fatalf("nccl.go: %s is not an integer literal", n.Name)
				}
				v, err := strconv.ParseInt(lit.Value, 0, 64)
				if err != nil {
					t.Fatal(err)
				}
				out[n.Name] = struct {
					enum  string
					value int64
				}{enumOf[id.Name], v}
			}
		}
	}
	return out
}

func TestNCCLEnumsMatchHeader(t *testing.T) {
	consts := goNCCLConsts(t)
	if len(consts) < 12 {
		t.Fatalf("found %d enum constants in nccl.go", len(consts))
	}
	for i, name := range ncclHeaders {
		newest := i == len(ncclHeaders)-1
		h := ncclHeader(t, filepath.Join("testdata", "nccl", name))
		for _, e := range []string{"ncclResult_t", "ncclDataType_t", "ncclRedOp_t"} {
			if len(h.enums[e]) < 5 {
				t.Fatalf("%s: enum %s: %d members parsed", name, e, len(h.enums[e]))
			}
		}
		for cname, c := range consts {
			vals, ok := h.enums[c.enum][cname]
			switch {
			case !ok && newest:
				t.Errorf("%s: %s is not a member of %s", name, cname, c.enum)
			case !ok: // newer than this header (ncclTimeout)
			case len(vals) != 1 || vals[0] != c.value:
				t.Errorf("%s: %s = %v, nccl.go says %d", name, cname, vals, c.value)
			}
		}
		// Every name the errors give a result must be its member's.
		if newest {
			for r, rname := range ncclResultNames {
				if vals := h.enums["ncclResult_t"][rname]; len(vals) != 1 || vals[0] != int64(r) {
					t.Errorf("%s: ncclResultNames[%d] = %s, which the header gives %v", name, r, rname, vals)
				}
			}
		}
	}
}

func TestNCCLVersionString(t *testing.T) {
	for code, want := range map[int]string{2708: "2.7.8", 20905: "2.9.5", 21000: "2.10.0", 22304: "2.23.4", 23100: "2.31.0"} {
		if got := ncclVersionString(code); got != want {
			t.Errorf("ncclVersionString(%d) = %s, want %s", code, got, want)
		}
	}
}
