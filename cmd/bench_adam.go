package cmd

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// benchAdamCommand is being built; see the open issues.
func benchAdamCommand() *cli.Command {
	return &cli.Command{
		Name:   "adam",
		Usage:  "(not built yet)",
		Action: func(*cli.Context) error { return errors.New("adam: not built yet") },
	}
}
