package cmd

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// benchGemmCommand is being built; see the open issues.
func benchGemmCommand() *cli.Command {
	return &cli.Command{
		Name:   "gemm",
		Usage:  "(not built yet)",
		Action: func(*cli.Context) error { return errors.New("gemm: not built yet") },
	}
}
