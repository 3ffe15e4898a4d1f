package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/strata-ai/strata"

// designDoc holds the import rules: the tables under the two headings below
// are the only list of allowed imports. The test reads them, so the document
// and the code cannot drift apart.
const (
	designDoc         = "docs/DESIGN.md"
	edgesHeading      = "### Edges between Strata's packages"
	thirdPartyHeading = "### Third-party modules"
)

// rules are the import rules of docs/DESIGN.md.
type rules struct {
	// edges: package -> the Strata packages its non-test files may import
	// (beyond internal/). Every package of the module has a row.
	edges map[string]map[string]bool
	// thirdParty: module (an import path prefix) -> the packages whose
	// files, test files included, may import it.
	thirdParty map[string]map[string]bool
}

// backticked finds `names` in a table cell.
var backticked = regexp.MustCompile("`([^`]+)`")

// readTable returns the rows of the first markdown table after heading, as
// cells.
func readTable(text, heading string) ([][]string, error) {
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		return nil, fmt.Errorf("%s: no heading %q", designDoc, heading)
	}
	var rows [][]string
	sc := bufio.NewScanner(strings.NewReader(text[i+len(heading)+2:]))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 || strings.HasPrefix(line, "#") {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for k := range cells {
			cells[k] = strings.TrimSpace(cells[k])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 3 {
		return nil, fmt.Errorf("%s: no table rows under %q", designDoc, heading)
	}
	return rows[2:], nil // header and separator
}

// parseRules reads the two tables of the import rules. A row is
// "| `importer` | `dep`, `dep`, ... or — | why |"; the why is required.
func parseRules(text string) (rules, error) {
	rs := rules{edges: map[string]map[string]bool{}, thirdParty: map[string]map[string]bool{}}
	parse := func(heading string, into map[string]map[string]bool) error {
		rows, err := readTable(text, heading)
		if err != nil {
			return err
		}
		for _, cells := range rows {
			if len(cells) != 3 {
				return fmt.Errorf("%s, %s: row %q has %d cells, want 3", designDoc, heading, strings.Join(cells, "|"), len(cells))
			}
			key := backticked.FindAllStringSubmatch(cells[0], -1)
			if len(key) != 1 {
				return fmt.Errorf("%s, %s: first cell %q must name one `package`", designDoc, heading, cells[0])
			}
			k := key[0][1]
			if into[k] != nil {
				return fmt.Errorf("%s, %s: %s has two rows", designDoc, heading, k)
			}
			if cells[2] == "" {
				return fmt.Errorf("%s, %s: %s: the row must say why", designDoc, heading, k)
			}
			into[k] = map[string]bool{}
			for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
				into[k][m[1]] = true
			}
		}
		return nil
	}
	if err := parse(edgesHeading, rs.edges); err != nil {
		return rs, err
	}
	if err := parse(thirdPartyHeading, rs.thirdParty); err != nil {
		return rs, err
	}
	for pkg, deps := range rs.edges {
		for d := range deps {
			if rs.edges[d] == nil {
				return rs, fmt.Errorf("%s: %s may import %s, which has no row of its own", designDoc, pkg, d)
			}
		}
	}
	for mod, pkgs := range rs.thirdParty {
		for p := range pkgs {
			if rs.edges[p] == nil {
				return rs, fmt.Errorf("%s: %s may be imported by %s, which is not a package of the table of edges", designDoc, mod, p)
			}
		}
	}
	return rs, nil
}

func loadRules(t *testing.T) rules {
	t.Helper()
	b, err := os.ReadFile(designDoc)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := parseRules(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// isInternal says whether p is one of the module's top-level internal/
// packages (nvme/internal/uring is not: it has its own row).
func isInternal(p string) bool { return p == "internal" || strings.HasPrefix(p, "internal/") }

// checkEdge says why pkg may not import dep (both relative to the module;
// "main" is the root), or "" if it may.
func (rs rules) checkEdge(pkg, dep string, isTest bool) string {
	switch {
	case dep == pkg:
		return "" // an external test package imports the package under test
	case dep == "cmd" && !(pkg == "main" && !isTest):
		return "nothing but main imports cmd"
	case dep == "bench" && !(pkg == "cmd" && !isTest):
		return "nothing but cmd imports bench"
	case strings.HasSuffix(dep, "test") && !isTest:
		return dep + " is a test helper, for test files"
	case isInternal(pkg):
		if !isInternal(dep) {
			return "internal/ packages import nothing of Strata but internal/"
		}
		return ""
	case isInternal(dep):
		return ""
	}
	if rs.edges[dep] == nil {
		return "package " + dep + " has no row in " + designDoc
	}
	if isTest {
		return "" // tests may wire any packages together
	}
	allowed, ok := rs.edges[pkg]
	if !ok {
		return "package " + pkg + " has no row in " + designDoc + " (add it with its edges and why)"
	}
	if !allowed[dep] {
		return "edge not named in " + designDoc + " (" + pkg + " may import: " + strings.Join(sorted(allowed), ", ") + ")"
	}
	return ""
}

// thirdPartyModule returns the row of rs.thirdParty that import path p
// belongs to, or "" if none does.
func (rs rules) thirdPartyModule(p string) string {
	best := ""
	for m := range rs.thirdParty {
		if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	return best
}

// checkThirdParty says why pkg may not import the non-standard path p, or
// "" if it may.
func (rs rules) checkThirdParty(pkg, p string) string {
	m := rs.thirdPartyModule(p)
	if m == "" {
		return "third-party import not in the table of " + designDoc
	}
	if !rs.thirdParty[m][pkg] {
		return m + " may be imported only by " + strings.Join(sorted(rs.thirdParty[m]), ", ") + " (" + designDoc + ")"
	}
	return ""
}

func sorted(set map[string]bool) []string {
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// isStd says whether an import path belongs to the standard library (its
// first element has no dot).
func isStd(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return !strings.Contains(first, ".")
}

// walkRepo calls fn for every file of the repository outside .git, hidden
// and underscore directories, installed npm packages (node_modules), and
// testdata when skipTestdata.
func walkRepo(skipTestdata bool, fn func(path string) error) error {
	return filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "node_modules" || (skipTestdata && name == "testdata")) {
				return filepath.SkipDir
			}
			return nil
		}
		return fn(path)
	})
}

func TestImportDirections(t *testing.T) {
	rs := loadRules(t)
	fset := token.NewFileSet()
	seen := map[string]bool{}              // packages with Go files
	usedEdges := map[[2]string]bool{}      // non-test files
	usedThirdParty := map[[2]string]bool{} // module, package; any file
	err := walkRepo(true, func(path string) error {
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		if pkg == "." {
			pkg = "main"
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		isTest := strings.HasSuffix(path, "_test.go")
		seen[pkg] = true
		if !isInternal(pkg) && rs.edges[pkg] == nil {
			t.Errorf("%s: package %s has no row in %s's table of edges", path, pkg, designDoc)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case p == module || strings.HasPrefix(p, module+"/"):
				dep := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
				if dep == "" {
					dep = "main"
				}
				if msg := rs.checkEdge(pkg, dep, isTest); msg != "" {
					t.Errorf("%s imports %s: %s", path, p, msg)
				}
				if !isTest && dep != pkg {
					usedEdges[[2]string{pkg, dep}] = true
				}
			case isStd(p):
			default:
				if msg := rs.checkThirdParty(pkg, p); msg != "" {
					t.Errorf("%s imports %s: %s", path, p, msg)
				}
				usedThirdParty[[2]string{rs.thirdPartyModule(p), pkg}] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The tables stay exact: every row is a package, every edge is used.
	for _, pkg := range sorted(setOf(rs.edges)) {
		if !seen[pkg] {
			t.Errorf("%s has a row for %s, which has no Go files", designDoc, pkg)
		}
		for _, dep := range sorted(rs.edges[pkg]) {
			if !usedEdges[[2]string{pkg, dep}] {
				t.Errorf("%s names the edge %s -> %s, which no non-test file of %s uses: remove it from the table", designDoc, pkg, dep, pkg)
			}
		}
	}
	for _, m := range sorted(setOf(rs.thirdParty)) {
		for _, pkg := range sorted(rs.thirdParty[m]) {
			if !usedThirdParty[[2]string{m, pkg}] {
				t.Errorf("%s lets %s import %s, which none of its files does: remove it from the table", designDoc, pkg, m)
			}
		}
	}
	t.Logf("checked packages: %v", sorted(seen))
}

func setOf[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func TestCheckEdgeRejects(t *testing.T) {
	rs := loadRules(t)
	bad := [][2]string{{"pinned", "nvme"}, {"nvme", "pinned"}, {"model", "engine"}, {"cpuadam", "gpu"},
		{"engine", "cmd"}, {"tier", "bench"}, {"prefetch", "tier"}, {"internal/units", "gpu"},
		{"checkpoint", "tier"}, {"gpu", "cpuadam"}, {"engine", "internal/leaktest"}, {"engine", "gpu/gputest"}, {"bench", "nvme/nvmetest"}, {"engine", "nosuch"}}
	for _, e := range bad {
		if rs.checkEdge(e[0], e[1], false) == "" {
			t.Errorf("edge %s -> %s was allowed", e[0], e[1])
		}
	}
	for _, e := range [][2]string{{"engine", "cmd"}, {"tier", "bench"}} {
		if rs.checkEdge(e[0], e[1], true) == "" {
			t.Errorf("test file edge %s -> %s was allowed", e[0], e[1])
		}
	}
	good := [][2]string{{"engine", "tier"}, {"tier", "nvme"}, {"model", "gpu"}, {"nvme", "nvme/internal/uring"},
		{"cpuadam", "internal/bf16"}, {"main", "cmd"}, {"cmd", "bench"}}
	for _, e := range good {
		if msg := rs.checkEdge(e[0], e[1], false); msg != "" {
			t.Errorf("edge %s -> %s refused: %s", e[0], e[1], msg)
		}
	}
	if msg := rs.checkEdge("prefetch", "tier", true); msg != "" {
		t.Errorf("test file edge prefetch -> tier refused: %s", msg)
	}

	badThird := [][2]string{{"engine", "github.com/urfave/cli/v2"}, {"gpu/cpu", "github.com/ebitengine/purego"},
		{"nvme", "github.com/cilium/ebpf/link"}, {"cmd", "github.com/example/unknown"}, {"engine", "gonum.org/v1/gonum/blas"},
		{"engine", "golang.org/x/sys/unix"}}
	for _, e := range badThird {
		if rs.checkThirdParty(e[0], e[1]) == "" {
			t.Errorf("%s importing %s was allowed", e[0], e[1])
		}
	}
	goodThird := [][2]string{{"cmd", "github.com/urfave/cli/v2"}, {"gpu/cuda", "github.com/ebitengine/purego"},
		{"bench", "github.com/cilium/ebpf/link"}, {"gpu/cpu", "gonum.org/v1/gonum/blas/gonum"}, {"nvme/internal/uring", "golang.org/x/sys/unix"}}
	for _, e := range goodThird {
		if msg := rs.checkThirdParty(e[0], e[1]); msg != "" {
			t.Errorf("%s importing %s refused: %s", e[0], e[1], msg)
		}
	}
}

func TestParseRulesRejects(t *testing.T) {
	table := func(edges, third string) string {
		return "x\n" + edgesHeading + "\n\n| package | may import | why |\n|---|---|---|\n" + edges +
			"\n" + thirdPartyHeading + "\n\n| module | may be imported by | why |\n|---|---|---|\n" + third
	}
	ok := table("| `a` | `b` | a needs b |\n| `b` | — | leaf |\n", "| `m.org/x` | `a` | why |\n")
	rs, err := parseRules(ok)
	if err != nil {
		t.Fatal(err)
	}
	if !rs.edges["a"]["b"] || len(rs.edges["b"]) != 0 || !rs.thirdParty["m.org/x"]["a"] {
		t.Errorf("parsed %+v", rs)
	}
	for name, text := range map[string]string{
		"no why":         table("| `a` | `b` | |\n| `b` | — | leaf |\n", ""),
		"dep has no row": table("| `a` | `b` | why |\n", ""),
		"two rows":       table("| `a` | — | why |\n| `a` | — | why |\n", ""),
		"unknown user":   table("| `a` | — | why |\n", "| `m.org/x` | `z` | why |\n"),
		"no heading":     "| `a` | — | why |\n",
	} {
		if _, err := parseRules(text); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
}

// mdLink finds inline links and images, [text](target) and ![alt](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]*)(?:\s+"[^"]*")?\)`)

// mdRef finds reference definitions, [label]: target.
var mdRef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)

// codeSpan removes inline code spans, whose text is not a link.
var codeSpan = regexp.MustCompile("`[^`]*`")

// TestMarkdownLinks checks that every relative link of every markdown file
// names a file or directory that exists inside the repository.
func TestMarkdownLinks(t *testing.T) {
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	err = walkRepo(false, func(path string) error {
		if !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fenced := false
		for n, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				continue
			}
			var targets []string
			for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
				targets = append(targets, m[1])
			}
			if m := mdRef.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				count++
				if msg := checkLink(root, path, target); msg != "" {
					t.Errorf("%s:%d: link %q %s", path, n+1, target, msg)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d links checked", count)
}

// checkLink says what is wrong with a link to target from the markdown file
// at path (relative to root), or "" if nothing is.
func checkLink(root, path, target string) string {
	if i := strings.Index(target, "#"); i >= 0 {
		target = target[:i]
	}
	if target == "" {
		return "" // an anchor in the same page
	}
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return "" // a web address
	}
	var abs string
	switch {
	case strings.HasPrefix(target, "/"):
		// From the repository root, as GitHub reads it.
		abs = filepath.Join(root, filepath.FromSlash(target))
	case strings.HasPrefix(target, "../"):
		// Up from the page: tools that do not resolve it (and readers of
		// the file alone) take it for a link out of the repository.
		return "climbs out of the page's folder: link from the repository root (/docs/DESIGN.md)"
	default:
		abs = filepath.Join(root, filepath.Dir(path), filepath.FromSlash(target))
	}
	if rel, err := filepath.Rel(root, abs); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "leaves the repository"
	}
	if _, err := os.Stat(abs); err != nil {
		return "names nothing: " + err.Error()
	}
	return ""
}

func TestCheckLinkRejects(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "a", "x.md"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, target string
		ok           bool
	}{
		{"a/b/p.md", "/a/x.md", true},
		{"a/b/p.md", "/a/x.md#part", true},
		{"a/b/p.md", "../x.md", false},
		{"a/b/p.md", "#part", true},
		{"a/b/p.md", "https://example.org/x", true},
		{"p.md", "a/b", true},
		{"p.md", "a/y.md", false},
		{"p.md", "../shared/DESIGN.md", false},
		{"a/p.md", "../../x.md", false},
		{"p.md", "/etc/passwd", false},
		{"a/p.md", "/../x.md", false},
	} {
		if got := checkLink(root, c.path, c.target) == ""; got != c.ok {
			t.Errorf("checkLink(%s, %s) ok = %v, want %v", c.path, c.target, got, c.ok)
		}
	}
}

// modeStrategies are engine's files that hold the strategies chosen in New
// (docs/DESIGN.md, "The host optimizer's schedules"; engine/doc.go, "Modes
// are chosen once, in New"): their code is where the modes differ.
var modeStrategies = map[string]bool{"update.go": true, "params.go": true, "stages.go": true}

// constructionFunc matches the functions New runs to lay the engine out
// (a mode is chosen there, once).
var constructionFunc = regexp.MustCompile(`^(?:(?:New|new|open|check|note|init|reserve|plan)\w*|alloc|allocate|layOut|undoBytes|preflight|isStatic)$`)

// modeSites lists engine's tests of the configuration outside construction
// and the strategies: a condition (if, switch, case, a comparison or a
// logical operator) that reads where the state lives (offload, the tier
// store's presence, offload_param's or the optimizer's tier, the gradient
// on NVMe), the ZeRO stage or the overlap mode.
func modeSites(t *testing.T) []string {
	t.Helper()
	fields := map[string]bool{"offload": true, "stage": true, "gradTiered": true, "overlap": true, "delayed": true, "paramTier": true, "optTier": true}
	calls := map[string]bool{"paramTiered": true, "bwdEnabled": true, "delayed": true}
	fset := token.NewFileSet()
	files, err := filepath.Glob("engine/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var sites []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") || modeStrategies[filepath.Base(path)] {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil || constructionFunc.MatchString(fd.Name.Name) {
				continue
			}
			var tests []ast.Expr
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.IfStmt:
					tests = append(tests, n.Cond)
				case *ast.SwitchStmt:
					if n.Tag != nil {
						tests = append(tests, n.Tag)
					}
				case *ast.CaseClause:
					tests = append(tests, n.List...)
				case *ast.BinaryExpr:
					switch n.Op {
					case token.LAND, token.LOR, token.EQL, token.NEQ, token.LSS, token.GTR, token.LEQ, token.GEQ:
						tests = append(tests, n.X, n.Y)
					}
				case *ast.UnaryExpr:
					if n.Op == token.NOT {
						tests = append(tests, n.X)
					}
				}
				return true
			})
			seen := map[token.Pos]bool{}
			for _, x := range tests {
				ast.Inspect(x, func(n ast.Node) bool {
					var name string
					switch n := n.(type) {
					case *ast.CallExpr:
						if sel, ok := n.Fun.(*ast.SelectorExpr); ok && calls[sel.Sel.Name] {
							name = sel.Sel.Name + "()"
						}
					case *ast.SelectorExpr:
						if fields[n.Sel.Name] {
							name = n.Sel.Name
						}
					case *ast.BinaryExpr:
						if sel, ok := n.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "tiers" && (n.Op == token.EQL || n.Op == token.NEQ) {
							if id, ok := n.Y.(*ast.Ident); ok && id.Name == "nil" {
								name = "tiers " + n.Op.String() + " nil"
							}
						}
					}
					if name != "" && !seen[n.Pos()] {
						seen[n.Pos()] = true
						sites = append(sites, fmt.Sprintf("%s: %s in %s", fset.Position(n.Pos()), name, fd.Name.Name))
					}
					return true
				})
			}
		}
	}
	sort.Strings(sites)
	return sites
}

// TestEngineModeSites holds engine to its rule: each mode is chosen once,
// in New, as a strategy; the rest of its code tests the configuration at
// fewer than 30 places (go test -run TestEngineModeSites -v . lists them).
func TestEngineModeSites(t *testing.T) {
	sites := modeSites(t)
	for _, s := range sites {
		t.Log(s)
	}
	if len(sites) >= 30 {
		t.Errorf("engine tests the configuration at %d places outside New and its strategies (%v), want fewer than 30: choose the mode in New", len(sites), modeStrategies)
	}
}
