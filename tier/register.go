package tier

import (
	"fmt"
	"slices"
	"sync"

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

// registrar is the pool's pinned.Registrar for a FixedIO: io_uring takes one
// table of fixed buffers, so every change registers the whole set again.
type registrar struct {
	io   FixedIO
	mu   sync.Mutex
	mems map[int][]byte
}

func (r *registrar) Register(arenaIndex int, mem []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mems[arenaIndex] = mem
	if err := r.io.RegisterBuffers(r.sortedLocked()...); err != nil {
		// Not registered: the pool's rollback must not put it back.
		delete(r.mems, arenaIndex)
		return err
	}
	return nil
}

func (r *registrar) Unregister(arenaIndex int, _ []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.mems, arenaIndex)
	return r.io.RegisterBuffers(r.sortedLocked()...)
}

func (r *registrar) sortedLocked() [][]byte {
	idx := make([]int, 0, len(r.mems))
	for i := range r.mems {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	out := make([][]byte, len(idx))
	for k, i := range idx {
		out[k] = r.mems[i]
	}
	return out
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
	r := &registrar{io: io, mems: map[int][]byte{}}
	if err := s.pool.AddRegistrar(r); err != nil {
		var total int64
		for _, a := range s.pool.Arenas() {
			total += int64(len(a))
		}
		notes = append(notes, fmt.Sprintf("fixed buffers off: the pinned arenas (%s) could not be registered with io_uring (%v); swap I/O uses plain buffers",
			units.FormatBytes(total), err))
	} else {
		s.reg.Buffers = len(s.pool.Arenas())
		s.registrar = r
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
	if s.registrar != nil {
		err = s.pool.RemoveRegistrar(s.registrar)
		s.registrar = nil
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
