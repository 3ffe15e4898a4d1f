package nvmetest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// ExampleDir shows a test that needs O_DIRECT: Dir gives it an empty
// directory on a filesystem that does direct I/O, removed after the test,
// or skips it, naming each candidate tried. Dir needs the *testing.T of a
// running test, so this example has no Output line: go test compiles it
// but does not run it.
func ExampleDir() {
	testSwapFile := func(t *testing.T) {
		dir := nvmetest.Dir(t)
		f, err := nvme.OpenFile(filepath.Join(dir, "swap"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Allocate(1 << 20); err != nil {
			t.Fatal(err)
		}
	}
	_ = testSwapFile // in a _test.go file: func TestSwapFile(t *testing.T)
}

// Example_candidates prints the directories Dir tries, in order: "" is the
// test's own temporary directory, then /var/tmp.
func Example_candidates() {
	fmt.Printf("%q\n", nvmetest.Candidates)
	// Output: ["" "/var/tmp"]
}
