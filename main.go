// Command strata trains models that do not fit in GPU memory on one box.
package main

import (
	"os"

	"github.com/strata-ai/strata/cmd"
)

func main() { os.Exit(cmd.Main(os.Args)) }
