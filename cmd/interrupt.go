package cmd

import (
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// interrupts turns the first SIGINT or SIGTERM of a long command into a
// request to stop at the next safe point (train: after the current step,
// with a checkpoint); a second one ends the process at once with status
// 130, as an uncaught SIGINT would.
type interrupts struct {
	sig  chan os.Signal
	done chan struct{}
	got  atomic.Value // os.Signal
}

func watchInterrupts() *interrupts {
	in := &interrupts{sig: make(chan os.Signal, 2), done: make(chan struct{})}
	signal.Notify(in.sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-in.done:
			return
		case s := <-in.sig:
			in.got.Store(s)
		}
		select {
		case <-in.done:
		case <-in.sig:
			os.Exit(130)
		}
	}()
	return in
}

// requested returns the signal that asked to stop, or nil.
func (in *interrupts) requested() os.Signal {
	s, _ := in.got.Load().(os.Signal)
	return s
}

// stop restores the default handling.
func (in *interrupts) stop() {
	signal.Stop(in.sig)
	close(in.done)
}

// interruptedError ends a command that stopped early on a signal: status
// 130, the shell's for SIGINT.
type interruptedError struct{ msg string }

func (e interruptedError) Error() string { return e.msg }
func (e interruptedError) ExitCode() int { return 130 }
