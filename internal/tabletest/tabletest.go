// Package tabletest writes the Parquet and Arrow files of the tests with
// an independent writer: apache-arrow and parquet-wasm from npm
// (data/testdata/npm/gen.mjs, arrow-rs's parquet crate), sharing no code
// with the arrow-go reader under test.
package tabletest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Fixture is one file of gen.mjs's spec.
type Fixture struct {
	Name         string           `json:"name"`
	Format       string           `json:"format"` // parquet, arrow-stream, arrow-file
	Compression  string           `json:"compression,omitempty"`
	Dictionary   *bool            `json:"dictionary,omitempty"`
	RowGroupRows int              `json:"row_group_rows,omitempty"`
	BatchRows    int              `json:"batch_rows,omitempty"`
	Schema       []Field          `json:"schema"`
	Rows         []map[string]any `json:"rows"`
}

// Field is a column: its name and gen.mjs's type ("string",
// "list<struct<role:string,content:string>>", ...).
type Field struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// Write writes files under dir with the npm writer. It fails the test,
// never skips it, when node or the packages are missing.
func Write(t testing.TB, dir string, files ...Fixture) {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	gen := filepath.Join(filepath.Dir(self), "..", "..", "data", "testdata", "npm", "gen.mjs")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed: the Parquet and Arrow fixtures are written by %s; run .ci/setup", gen)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(gen), "node_modules", "apache-arrow")); err != nil {
		t.Fatalf("the npm packages of %s are not installed: run .ci/setup (or npm ci in %s)", gen, filepath.Dir(gen))
	}
	spec, err := json.Marshal(map[string]any{"out": dir, "files": files})
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(specPath, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("node", gen, specPath).CombinedOutput(); err != nil {
		t.Fatalf("node %s: %v\n%s", gen, err, out)
	}
}
