package cmd

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// trainCommand is being built; see the open issues.
func trainCommand() *cli.Command {
	return &cli.Command{
		Name:   "train",
		Usage:  "(not built yet)",
		Action: func(*cli.Context) error { return errors.New("train: not built yet") },
	}
}
