package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// TestNCCLCallingConvention needs no GPU and no NCCL, only a C compiler:
// it compiles, from the copy of nccl.h, a library whose functions have
// the header's own prototypes (the compiler holds them to it) and record
// the bytes of every argument they receive, then calls each through the
// binding's Go function type with purego, as the backend calls libnccl,
// and compares what arrived with what was passed. This is what parsing
// cannot check: that purego puts each argument where the System V ABI
// says, ncclCommInitRank's 128-byte ncclUniqueId on the stack by value
// and the int after it in a register included.
func TestNCCLCallingConvention(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skipf("libnccl is a Linux library; this is %s", runtime.GOOS)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler (cc) to build the recording library: %v", err)
	}
	hdr, err := filepath.Abs(filepath.Join("testdata", "nccl", ncclHeaders[len(ncclHeaders)-1]))
	if err != nil {
		t.Fatal(err)
	}
	h := ncclHeader(t, hdr)
	api := reflect.TypeFor[ncclAPI]()
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "rec.c"), filepath.Join(dir, "librec.so")
	if err := os.WriteFile(src, []byte(recordingLibrary(t, hdr, h, api)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	handle, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	var (
		recArg   func(i int32, out *byte) int32 // copies argument i, returns its size
		recCalls func() int32
	)
	purego.RegisterLibFunc(&recArg, handle, "rec_arg")
	purego.RegisterLibFunc(&recCalls, handle, "rec_calls")
	for i := range api.NumField() {
		f := api.Field(i)
		if f.Type.Kind() != reflect.Func {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			sym, err := purego.Dlsym(handle, f.Name)
			if err != nil {
				t.Fatal(err)
			}
			fn := reflect.New(f.Type)
			purego.RegisterFunc(fn.Interface(), sym)
			before := recCalls()
			args := make([]reflect.Value, f.Type.NumIn())
			keep := make([]any, 0, len(args))
			for j := range args {
				args[j], keep = sentinel(f.Type.In(j), j, keep)
			}
			res := fn.Elem().Call(args)
			runtime.KeepAlive(keep)
			if recCalls() != before+1 {
				t.Fatalf("the call did not reach %s", f.Name)
			}
			for j, a := range args {
				got := make([]byte, 256)
				n := recArg(int32(j), &got[0])
				if want := valueBytes(a); string(got[:n]) != string(want) {
					t.Errorf("argument %d (%s): %d bytes % x arrived, % x passed", j+1, a.Type(), n, got[:n], want)
				}
			}
			checkResult(t, f.Type.Out(0), res[0], len(args))
		})
	}
}

// recordingLibrary writes the C library: the header, then one definition
// per bound function, with the header's parameter types, recording each
// argument and returning 100 + its argument count (a const char* result:
// the string "rec").
func recordingLibrary(t *testing.T, hdr string, h cHeader, api reflect.Type) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#include <stddef.h>\n#include <string.h>\ntypedef struct CUstream_st* cudaStream_t;\n#define __CUDA_BF16_TYPES_EXIST__ 1\n#include %q\n", hdr)
	b.WriteString(`static unsigned char args[16][256];
static int sizes[16];
static int calls;
int rec_arg(int i, unsigned char* out) { memcpy(out, args[i], sizes[i]); return sizes[i]; }
int rec_calls(void) { return calls; }
#define REC(i, x) do { memcpy(args[i], &(x), sizeof(x)); sizes[i] = sizeof(x); } while (0)
`)
	for i := range api.NumField() {
		name := api.Field(i).Name
		if api.Field(i).Type.Kind() != reflect.Func {
			continue
		}
		cf, ok := h.funcs[name]
		if !ok {
			t.Fatalf("%s is not declared in %s", name, h.source)
		}
		var params, recs []string
		for j, p := range cf.params {
			params = append(params, fmt.Sprintf("%s a%d", p, j))
			recs = append(recs, fmt.Sprintf("REC(%d, a%d);", j, j))
		}
		if len(params) == 0 {
			params = []string{"void"}
		}
		ret := fmt.Sprintf("return (%s)%d;", cf.ret, 100+len(cf.params))
		if cf.ret == "const char*" {
			ret = `return "rec";`
		}
		fmt.Fprintf(&b, "%s %s(%s) { %s calls++; %s }\n", cf.ret, name, strings.Join(params, ", "), strings.Join(recs, " "), ret)
	}
	return b.String()
}

// sentinel returns a value of type ty distinct in every byte from the
// other arguments' (pointers point at Go memory kept alive in keep).
func sentinel(ty reflect.Type, j int, keep []any) (reflect.Value, []any) {
	v := reflect.New(ty).Elem()
	pattern := func(n uintptr) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(0x11*(j+1) + 3*i + 1)
		}
		return p
	}
	switch ty.Kind() {
	case reflect.Pointer:
		target := reflect.New(ty.Elem())
		keep = append(keep, target.Interface())
		v.Set(target)
	case reflect.Struct, reflect.Int32, reflect.Uint64, reflect.Uintptr:
		p := pattern(ty.Size())
		if ty.Kind() == reflect.Int32 {
			p[3] &= 0x3f // a positive int, as an enum value is
		}
		copy(unsafe.Slice((*byte)(v.Addr().UnsafePointer()), ty.Size()), p)
	default:
		panic("sentinel for " + ty.String())
	}
	return v, keep
}

// valueBytes is what the C side should receive for a: its bytes, or for a
// pointer the address.
func valueBytes(a reflect.Value) []byte {
	if a.Kind() == reflect.Pointer {
		p := a.Pointer()
		return unsafe.Slice((*byte)(unsafe.Pointer(&p)), unsafe.Sizeof(p))
	}
	c := reflect.New(a.Type())
	c.Elem().Set(a)
	return unsafe.Slice((*byte)(c.UnsafePointer()), a.Type().Size())
}

func checkResult(t *testing.T, ty reflect.Type, res reflect.Value, nargs int) {
	t.Helper()
	switch ty.Kind() {
	case reflect.Int32:
		if res.Int() != int64(100+nargs) {
			t.Errorf("result %d, want %d", res.Int(), 100+nargs)
		}
	case reflect.Pointer:
		if s := goString(res.Interface().(*byte)); s != "rec" {
			t.Errorf("result %q, want \"rec\"", s)
		}
	default:
		t.Errorf("result of type %s", ty)
	}
}
