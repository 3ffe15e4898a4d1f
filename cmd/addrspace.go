package cmd

import (
	"fmt"

	"github.com/strata-ai/strata/internal/hostmem"
)

// checkAddressSpace refuses to start a command that runs a model (train,
// eval, generate) when RLIMIT_AS (`ulimit -v`) leaves the process less
// than hostmem.RunHeadroomBytes beyond what it holds: past it the Go
// runtime would end the process at random, at a thread or a heap arena it
// cannot reserve, with its own stack traces rather than one line. What
// the run plans on top (its pinned pools, the CPU backend's devices) is
// checked when it is sized (engine's preflight, cpu.CheckHostRAM).
func checkAddressSpace(cmd string) error {
	if err := hostmem.CheckAddressSpace("`strata "+cmd+"`", 0); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return nil
}
