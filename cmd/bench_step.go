package cmd

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// benchStepCommand is being built; see the open issues.
func benchStepCommand() *cli.Command {
	return &cli.Command{
		Name:   "step",
		Usage:  "(not built yet)",
		Action: func(*cli.Context) error { return errors.New("step: not built yet") },
	}
}
