package cmd

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// benchNVMeCommand is being built; see the open issues.
func benchNVMeCommand() *cli.Command {
	return &cli.Command{
		Name:   "nvme",
		Usage:  "(not built yet)",
		Action: func(*cli.Context) error { return errors.New("nvme: not built yet") },
	}
}
