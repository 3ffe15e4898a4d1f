package nvme

import (
	"os"
	"sync"
)

// live is every Swap of this process that removes its files at Close and
// is not closed yet, with its files' names: what UnlinkLive removes.
var live = liveSwaps{swaps: map[*Swap][]string{}}

type liveSwaps struct {
	sync.Mutex
	swaps map[*Swap][]string
}

func (l *liveSwaps) add(s *Swap) {
	var names []string
	for _, f := range s.files {
		names = append(names, f.f.path)
	}
	l.Lock()
	defer l.Unlock()
	l.swaps[s] = names
}

func (l *liveSwaps) remove(s *Swap) {
	l.Lock()
	defer l.Unlock()
	delete(l.swaps, s)
}

// UnlinkLive removes the names of the swap files of every Swap of this
// process not closed yet, and returns them: for a process about to exit
// without closing its Swaps (a second Ctrl-C), so that no file is left
// behind. The files stay usable through their open descriptors (a transfer
// in flight completes); the kernel frees their space when the process
// exits. Safe to call from any goroutine, while the Swaps are in use.
func UnlinkLive() []string {
	live.Lock()
	defer live.Unlock()
	var removed []string
	for _, names := range live.swaps {
		for _, n := range names {
			if err := os.Remove(n); err == nil {
				removed = append(removed, n)
			}
		}
	}
	return removed
}
