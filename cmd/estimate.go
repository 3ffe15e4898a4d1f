package cmd

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// estimateCommand is being built; see the open issues.
func estimateCommand() *cli.Command {
	return &cli.Command{
		Name:   "estimate",
		Usage:  "(not built yet)",
		Action: func(*cli.Context) error { return errors.New("estimate: not built yet") },
	}
}
