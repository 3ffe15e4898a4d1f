package cuda

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// EnvLibDir names the environment variable that overrides the library
// search: a list of folders separated by ':' searched before anything else.
const EnvLibDir = "STRATA_CUDA_LIB_DIR"

// library is one shared library the backend loads, with the file names it
// may have, newest first.
type library struct {
	what  string   // "driver", "nvrtc", "cublas"
	names []string // sonames, most preferred first
}

var (
	libDriver = library{what: "driver", names: []string{"libcuda.so.1", "libcuda.so"}}
	libNVRTC  = library{what: "nvrtc", names: []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}}
	// cuBLAS needs cuBLASLt, which is loaded first from the same folder.
	libCublasLt = library{what: "cublasLt", names: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}}
	libCublas   = library{what: "cublas", names: []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"}}
)

// systemDirs are the folders of a system CUDA installation and of the
// driver, searched after the override.
var systemDirs = []string{
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/targets/x86_64-linux/lib",
	"/usr/local/nvidia/lib64",
	"/usr/local/nvidia/lib",
	"/usr/lib/x86_64-linux-gnu",
	"/usr/lib64",
}

// pythonGlobs find the site-packages folders of Python installations whose
// nvidia-* wheels carry the libraries (nvidia/cu13/lib,
// nvidia/cuda_nvrtc/lib, nvidia/cublas/lib, ...).
var pythonGlobs = []string{
	"/usr/lib/python3*/site-packages",
	"/usr/lib/python3*/dist-packages",
	"/usr/local/lib/python3*/site-packages",
	"/usr/local/lib/python3*/dist-packages",
	"/opt/*/.venv/lib/python3*/site-packages",
	"/opt/*/lib/python3*/site-packages",
	"/opt/conda/lib/python3*/site-packages",
}

// searchPath is where the libraries are looked for, in three groups tried
// in order: the override (EnvLibDir), the system folders, and the
// nvidia/*/lib folders of Python installations. Between the system folders
// and the Python folders come the bare sonames, left to the dynamic loader
// (LD_LIBRARY_PATH and the ldconfig cache), so that an installed driver is
// preferred to a copy in a wheel; the override always wins.
type searchPath struct {
	env, system, python []string
}

// newSearchPath builds the search path from the override's value and a
// glob function (filepath.Glob outside tests).
func newSearchPath(env string, glob func(string) ([]string, error)) searchPath {
	var sp searchPath
	seen := map[string]bool{}
	add := func(list *[]string, d string) {
		d = filepath.Clean(d)
		if d != "" && d != "." && !seen[d] {
			seen[d] = true
			*list = append(*list, d)
		}
	}
	for _, d := range strings.Split(env, ":") {
		if d != "" {
			add(&sp.env, d)
		}
	}
	for _, d := range systemDirs {
		add(&sp.system, d)
	}
	for _, g := range pythonGlobs {
		sites, _ := glob(g)
		sort.Strings(sites)
		for _, site := range sites {
			libs, _ := glob(filepath.Join(site, "nvidia", "*", "lib"))
			sort.Strings(libs)
			// cu13/cu12 (where the CUDA 13 wheels put every library)
			// before the per-library folders of older wheels.
			sort.SliceStable(libs, func(i, j int) bool { return isCUDir(libs[i]) && !isCUDir(libs[j]) })
			for _, l := range libs {
				add(&sp.python, l)
			}
		}
	}
	return sp
}

func isCUDir(lib string) bool {
	return strings.HasPrefix(filepath.Base(filepath.Dir(lib)), "cu1")
}

// candidates returns the paths to try for lib, in order: each name in each
// override folder, each name in each system folder (those that exist), the
// bare names, each name in each Python folder.
func (sp searchPath) candidates(lib library, exists func(string) bool) []string {
	var out []string
	inDirs := func(dirs []string) {
		for _, d := range dirs {
			for _, n := range lib.names {
				if p := filepath.Join(d, n); exists(p) {
					out = append(out, p)
				}
			}
		}
	}
	inDirs(sp.env)
	inDirs(sp.system)
	out = append(out, lib.names...)
	inDirs(sp.python)
	return out
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
