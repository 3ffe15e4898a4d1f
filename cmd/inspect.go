package cmd

import (
	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/source"
)

// inspectCommand is `strata inspect PATH`: the tensors and metadata of a
// safetensors file, or the summary of a training checkpoint with its
// checksums verified.
func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "list a safetensors file's tensors, or summarise and verify a training checkpoint",
		UsageText: "strata inspect [--json] [--no-verify] PATH",
		Description: "PATH is a .safetensors file (the header is validated; tensors are listed with dtype, shape,\n" +
			"parameters and bytes, with the metadata), or a checkpoint, named as --resume names it: a run's\n" +
			"--out directory or its checkpoints/ (the \"latest\" is inspected), a step-NNNNNNNN directory, or its manifest.json. For a checkpoint it\n" +
			"prints the manifest (step, devices, stage, shape, states, files) and verifies every rank file's\n" +
			"size and CRC-32C; a mismatch makes the command fail.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			&cli.BoolFlag{Name: "no-verify", Usage: "checkpoints: do not read the rank files to verify their checksums"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("inspect: want one PATH, got %d arguments", c.NArg())
			}
			in, err := checkpoint.Inspect(c.Context, c.Args().First(), checkpoint.InspectOptions{NoVerify: c.Bool("no-verify")})
			if in == nil {
				return err
			}
			printNote(c.App.ErrWriter, in.Note)
			write := in.WriteText
			if c.Bool("json") {
				write = in.WriteJSON
			}
			if werr := write(c.App.Writer); werr != nil && err == nil {
				return werr
			}
			return err // a rank file that failed verification, after the table that names it
		},
	}
}

// resolveCheckpoint finds the checkpoint a user names, the same way for
// train --resume, inspect and export (source.FindCheckpoint): a checkpoint
// directory, its manifest.json, a directory of checkpoints or a run's
// --out directory; with the directory of checkpoints holding it and a note
// for stderr when "latest" could not be read.
func resolveCheckpoint(path string) (dir, list, note string, err error) {
	return source.FindCheckpoint(path)
}
