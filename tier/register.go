package tier

import (
	"fmt"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
)

// FixedIO is what the store registers its pinned arenas and swap files
// with: the io_uring engine under the swap (*nvme.Engine). Registered
// buffers save the kernel pinning each page per request; registered files
// save a file table lookup.
type FixedIO interface {
	RegisterBuffers(bufs ...[]byte) error
	RegisterFiles(files ...*nvme.File) error
}

// Registration says what the store registered with Options.FixedIO, and why
// not when it could not (Note), for the caller to show.
type Registration struct {
	Buffers, Files int    // arenas and swap files registered
	Note           string // a registration that failed and its cause; "" when all went well or none was asked
}

// register registers the pool's arenas and the swap files with
// Options.FixedIO. A failure is not an error: the I/O runs with plain
// buffers or files, and Registration().Note says why (pinning the arenas
// needs RLIMIT_MEMLOCK room or CAP_IPC_LOCK).
func (s *Store) register() {
	io := s.opts.FixedIO
	if io == nil || s.swap == nil {
		return
	}
	var notes []string
	// The pool's arenas are mapped at its New and fixed until its Close:
	// io_uring takes them as one table, once.
	arenas := s.pool.Arenas()
	if err := io.RegisterBuffers(arenas...); err != nil {
		var total int64
		for _, a := range arenas {
			total += int64(len(a))
		}
		notes = append(notes, fmt.Sprintf("fixed buffers off: the pinned arenas (%s) could not be registered with io_uring (%v); swap I/O uses plain buffers",
			units.FormatBytes(total), err))
	} else {
		s.reg.Buffers = len(arenas)
	}
	files := s.swap.Files()
	if err := io.RegisterFiles(files...); err != nil {
		notes = append(notes, fmt.Sprintf("fixed files off: the swap files could not be registered with io_uring (%v)", err))
	} else {
		s.reg.Files = len(files)
	}
	for i, n := range notes {
		if i > 0 {
			s.reg.Note += "; "
		}
		s.reg.Note += n
	}
}

// unregister undoes register (at Close, with nothing in flight).
func (s *Store) unregister() error {
	var err error
	if s.reg.Buffers > 0 {
		err = s.opts.FixedIO.RegisterBuffers()
		s.reg.Buffers = 0
	}
	if s.reg.Files > 0 {
		if e := s.opts.FixedIO.RegisterFiles(); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return fmt.Errorf("tier: unregister from io_uring: %w", err)
	}
	return nil
}

// Registration says what New registered with Options.FixedIO.
func (s *Store) Registration() Registration { return s.reg }
