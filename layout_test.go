package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/strata-ai/strata"

// allowedImports is the direction of dependencies of DESIGN.md, as direct
// imports of non-test files: cmd -> engine -> {model, tier, prefetch, cpuadam,
// checkpoint}, tier -> {gpu, pinned, nvme}, model -> gpu. prefetch, cpuadam,
// pinned and nvme are leaves (internal/ only); pinned and nvme do not import
// each other. Nothing imports cmd; only cmd imports bench. Every package may
// import internal/...
var allowedImports = map[string][]string{
	"":                    {"cmd"},
	"cmd":                 {"*"},
	"bench":               {"engine", "config", "model", "tier", "prefetch", "cpuadam", "checkpoint", "gpu", "gpu/cpu", "gpu/cuda", "pinned", "nvme"},
	"engine":              {"config", "model", "tier", "prefetch", "cpuadam", "checkpoint", "gpu", "pinned", "nvme"},
	"config":              {},
	"checkpoint":          {"model", "gpu", "tier", "nvme"},
	"model":               {"gpu"},
	"tier":                {"gpu", "pinned", "nvme"},
	"gpu":                 {},
	"gpu/cpu":             {"gpu", "cpuadam"},
	"gpu/cuda":            {"gpu", "cpuadam"},
	"gpu/gputest":         {"gpu"},
	"prefetch":            {},
	"cpuadam":             {},
	"pinned":              {},
	"nvme":                {"nvme/internal/uring"},
	"nvme/internal/uring": {},
}

func TestImportDirections(t *testing.T) {
	fset := token.NewFileSet()
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		if pkg == "." {
			pkg = ""
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		isTest := strings.HasSuffix(path, "_test.go")
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p != module && !strings.HasPrefix(p, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			if msg := checkEdge(pkg, dep, isTest); msg != "" {
				t.Errorf("%s imports %s: %s", path, p, msg)
			}
		}
		seen[pkg] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for p := range seen {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	t.Logf("checked packages: %v", pkgs)
}

func checkEdge(pkg, dep string, isTest bool) string {
	if dep == "cmd" && pkg != "" {
		return "nothing imports cmd"
	}
	if dep == "bench" && pkg != "cmd" && pkg != "bench" {
		return "only cmd imports bench"
	}
	if isTest {
		return "" // tests may wire any packages together
	}
	if strings.HasPrefix(pkg, "internal") {
		if !strings.HasPrefix(dep, "internal/") {
			return "internal/ packages import only internal/"
		}
		return ""
	}
	if strings.HasPrefix(dep, "internal/") || dep == "internal" {
		return ""
	}
	if strings.HasPrefix(pkg, "cmd/") {
		pkg = "cmd"
	}
	allowed, ok := allowedImports[pkg]
	if !ok {
		return "package " + pkg + " is not in the layout of DESIGN.md (add it to allowedImports with its edges)"
	}
	for _, a := range allowed {
		if a == "*" || a == dep || strings.HasPrefix(dep, a+"/internal/") {
			return ""
		}
	}
	return "edge not allowed by DESIGN.md (allowed: " + strings.Join(allowed, ", ") + ")"
}

func TestCheckEdgeRejects(t *testing.T) {
	bad := [][2]string{{"pinned", "nvme"}, {"nvme", "pinned"}, {"model", "engine"}, {"cpuadam", "gpu"},
		{"engine", "cmd"}, {"tier", "bench"}, {"prefetch", "tier"}, {"internal/units", "gpu"}}
	for _, e := range bad {
		if checkEdge(e[0], e[1], false) == "" {
			t.Errorf("edge %s -> %s was allowed", e[0], e[1])
		}
	}
	good := [][2]string{{"engine", "tier"}, {"tier", "nvme"}, {"model", "gpu"}, {"nvme", "nvme/internal/uring"}, {"cpuadam", "internal/bf16"}}
	for _, e := range good {
		if msg := checkEdge(e[0], e[1], false); msg != "" {
			t.Errorf("edge %s -> %s refused: %s", e[0], e[1], msg)
		}
	}
}
