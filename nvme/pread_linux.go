package nvme

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// preadBackend serves requests with pread/pwrite workers: one per slot, at
// most preadWorkers.
type preadBackend struct {
	e    *Engine
	work chan int32
	wg   sync.WaitGroup
}

func newPreadBackend(e *Engine) *preadBackend {
	b := &preadBackend{e: e, work: make(chan int32, e.opts.QueueDepth)}
	n := preadWorkerCount(e.opts.QueueDepth)
	b.wg.Add(n)
	for range n {
		go b.worker()
	}
	return b
}

func (b *preadBackend) issue(slots []int32) {
	for _, idx := range slots {
		b.work <- idx // never blocks: the queue holds every slot
	}
}

func (b *preadBackend) worker() {
	defer b.wg.Done()
	for idx := range b.work {
		for b.e.result(idx, b.transfer(b.e.slots[idx])) {
		}
	}
}

// transfer does one system call for r and returns bytes or -errno.
func (b *preadBackend) transfer(r *Request) int {
	var n int
	var err error
	switch r.Op {
	case OpSync:
		err = unix.Fdatasync(r.File.fd)
	case OpRead:
		n, err = unix.Pread(r.File.fd, r.Buf[r.done:], r.Offset+int64(r.done))
	case OpWrite:
		n, err = unix.Pwrite(r.File.fd, r.Buf[r.done:], r.Offset+int64(r.done))
	}
	if err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			return -int(errno)
		}
		return -int(unix.EIO)
	}
	return n
}

func (b *preadBackend) registerBuffers([][]byte) error { return nil }
func (b *preadBackend) registerFiles([]*File) error    { return nil }

func (b *preadBackend) close() error {
	close(b.work)
	b.wg.Wait()
	return nil
}
