package cmd_test

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/strata-ai/strata/cmd"
)

// ExampleRun runs `strata estimate --model tiny` in process, as main does,
// and prints the first line of its report: the model and its parameter
// count. Run writes results to stdout and notes to stderr.
func ExampleRun() {
	var stdout bytes.Buffer
	err := cmd.Run([]string{"strata", "estimate", "--model", "tiny"}, &stdout, io.Discard)
	if err != nil {
		fmt.Println(err)
		return
	}
	first, _, _ := strings.Cut(stdout.String(), "\n")
	fmt.Println(first)
	// Output: tiny (L=2 C=32 H=4 V=256 T=64, 0.0M params): Ψ = 35,712 parameters in 4 chunks
}
