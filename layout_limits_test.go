package main

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The limits of issue 41 on the code's shape: a thin command line over the
// library, functions a reader takes in at once, and an estimate that runs
// without the I/O stack.
const (
	maxFuncLines = 150  // any non-test function, the body included
	maxCmdLines  = 4500 // cmd's non-test code: flags, calls and printing
)

// goFile is a parsed non-test Go file of the module.
type goFile struct {
	path, pkg string // pkg: the directory, relative ("." for main)
	fset      *token.FileSet
	file      *ast.File
	lines     int
}

// sourceFiles parses every non-test Go file outside testdata.
func sourceFiles(t *testing.T) []goFile {
	t.Helper()
	var out []goFile
	fset := token.NewFileSet()
	err := walkRepo(true, func(path string) error {
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		out = append(out, goFile{path: path, pkg: filepath.Dir(path), fset: fset, file: f, lines: fset.File(f.Pos()).LineCount()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFunctionLength(t *testing.T) {
	for _, f := range sourceFiles(t) {
		for _, d := range f.file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := f.fset.Position(fd.Pos()).Line, f.fset.Position(fd.End()).Line
			if n := end - start + 1; n > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines (at most %d outside tests)", f.path, start, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
}

func TestCmdIsThin(t *testing.T) {
	total := 0
	for _, f := range sourceFiles(t) {
		if f.pkg != "cmd" {
			continue
		}
		total += f.lines
		base := filepath.Base(f.path)
		for _, im := range f.file.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if p == module+"/bench" && !strings.HasPrefix(base, "bench_") {
				t.Errorf("%s imports bench: only the strata bench commands' files (cmd/bench_*.go) may", f.path)
			}
		}
	}
	if total > maxCmdLines {
		t.Errorf("cmd's non-test code is %d lines, over %d: the logic belongs in the library", total, maxCmdLines)
	}
}

// TestEstimateWithoutIO: strata estimate's arithmetic imports none of the
// I/O stack, so a program that only sizes a run links no io_uring.
func TestEstimateWithoutIO(t *testing.T) {
	deps := map[string][]string{}
	for _, f := range sourceFiles(t) {
		for _, im := range f.file.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if rel, ok := strings.CutPrefix(p, module+"/"); ok {
				deps[filepath.ToSlash(f.pkg)] = append(deps[filepath.ToSlash(f.pkg)], rel)
			}
		}
	}
	seen := map[string]string{} // package -> the package that imports it
	var visit func(p, from string)
	visit = func(p, from string) {
		if _, ok := seen[p]; ok {
			return
		}
		seen[p] = from
		for _, d := range deps[p] {
			visit(d, p)
		}
	}
	visit("estimate", "")
	for _, io := range []string{"nvme", "nvme/internal/uring", "pinned", "tier"} {
		if from, ok := seen[io]; ok {
			chain := []string{io}
			for p := from; p != ""; p = seen[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			t.Errorf("estimate depends on %s: %s", io, strings.Join(chain, " -> "))
		}
	}
}

// TestPackageDocs: every public package (outside internal/, not a
// command) says what it is in one short sentence, as go doc's package
// lists show it, and has a runnable Example a reader can start from.
func TestPackageDocs(t *testing.T) {
	const maxSynopsis = 100
	type pkgInfo struct {
		doc      string
		main     bool
		examples int
	}
	pkgs := map[string]*pkgInfo{}
	fset := token.NewFileSet()
	err := walkRepo(true, func(path string) error {
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		if dir == "." || isInternal(dir) || strings.Contains(dir, "/internal/") || strings.HasPrefix(dir, "internal/") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		p := pkgs[dir]
		if p == nil {
			p = &pkgInfo{}
			pkgs[dir] = p
		}
		if strings.HasSuffix(path, "_test.go") {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Example") {
					p.examples++
				}
			}
			return nil
		}
		p.main = p.main || f.Name.Name == "main"
		if f.Doc != nil && p.doc == "" {
			p.doc = f.Doc.Text()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, p := range pkgs {
		if p.main {
			continue // a command: its test runs it
		}
		syn := (&doc.Package{}).Synopsis(p.doc)
		switch {
		case p.doc == "":
			t.Errorf("%s: no package doc", dir)
		case len(syn) > maxSynopsis || !strings.HasSuffix(syn, "."):
			t.Errorf("%s: the package doc's first sentence is %d characters (at most %d): %q", dir, len(syn), maxSynopsis, syn)
		}
		if p.examples == 0 {
			t.Errorf("%s: no runnable Example (an example_test.go with func Example...)", dir)
		}
	}
}
