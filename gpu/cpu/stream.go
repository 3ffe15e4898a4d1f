package cpu

import (
	"fmt"
	"sync"
	"time"

	"github.com/strata-ai/strata/gpu"
)

// Stream is an in-order queue of closures. A goroutine is started when work
// arrives at an idle stream and exits when the queue is empty, so streams
// need no closing.
type Stream struct {
	dev  *Device
	mu   sync.Mutex
	idle *sync.Cond
	// queue[head:] holds the work not yet started; running says a
	// goroutine is draining it (or executing its last item). The queue's
	// array is kept when it empties, so that a training step's ops do not
	// allocate a new one.
	queue   []item
	head    int
	running bool
	err     error         // first error since the last Synchronize
	busy    time.Duration // running work, waits excluded (gpu.BusyStream)
}

// item is one queued closure; a wait's time is not busy time.
type item struct {
	f    func() error
	wait bool
}

// Busy is the time the stream ran its work, its waits for events excluded
// (gpu.BusyStream).
func (s *Stream) Busy() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy
}

// Home returns the front end of the stream's device (gpu.Queue).
func (s *Stream) Home() *gpu.Front { return s.dev.front }

func (d *Device) newStream() *Stream {
	s := &Stream{dev: d}
	s.idle = sync.NewCond(&s.mu)
	return s
}

func (s *Stream) enqueue(f func() error) { s.push(item{f: f}) }

func (s *Stream) push(it item) {
	s.mu.Lock()
	if s.head > 0 && len(s.queue) == cap(s.queue) {
		// Move the waiting work to the front rather than grow the array
		// of a stream that has not emptied since it last filled it.
		n := copy(s.queue, s.queue[s.head:])
		clear(s.queue[n:])
		s.queue, s.head = s.queue[:n], 0
	}
	s.queue = append(s.queue, it)
	if !s.running {
		s.running = true
		go s.run()
	}
	s.mu.Unlock()
}

func (s *Stream) run() {
	for {
		s.mu.Lock()
		if s.head == len(s.queue) {
			s.running = false
			s.queue, s.head = s.queue[:0], 0
			s.idle.Broadcast()
			s.mu.Unlock()
			return
		}
		it := s.queue[s.head]
		s.queue[s.head] = item{}
		s.head++
		s.mu.Unlock()
		t0 := time.Now()
		err := it.f()
		d := time.Since(t0)
		s.mu.Lock()
		if err != nil && s.err == nil {
			s.err = err
		}
		if !it.wait {
			s.busy += d
		}
		s.mu.Unlock()
	}
}

// Record marks the current end of the queue in e.
func (s *Stream) Record(ge gpu.Event) {
	e := event(ge)
	ch, at := make(chan struct{}), new(time.Time)
	e.mu.Lock()
	e.ch, e.at = ch, at
	e.mu.Unlock()
	s.enqueue(func() error { *at = time.Now(); close(ch); return nil })
}

// Wait makes later work on s wait for the work e recorded when Wait was
// called. e may belong to any device of this backend.
func (s *Stream) Wait(ge gpu.Event) {
	e := event(ge)
	e.mu.Lock()
	ch := e.ch
	e.mu.Unlock()
	if ch == nil {
		return
	}
	s.push(item{f: func() error { <-ch; return nil }, wait: true})
}

// Synchronize blocks until the queue is empty and returns the first error
// raised since the last Synchronize.
func (s *Stream) Synchronize() error {
	s.mu.Lock()
	for s.running {
		s.idle.Wait()
	}
	err := s.err
	s.err = nil
	s.mu.Unlock()
	return err
}

// Event marks a point in a stream: the channel closed when the stream
// reaches the latest Record.
type Event struct {
	mu sync.Mutex
	ch chan struct{} // nil: never recorded
	at *time.Time    // when the stream reached the record, written before ch is closed
}

func event(ge gpu.Event) *Event {
	e, ok := ge.(*Event)
	if !ok || e == nil {
		panic(fmt.Sprintf("gpu/cpu: event is not a gpu/cpu event (%T)", ge))
	}
	return e
}

func (e *Event) current() chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ch
}

// CompletedAt is when the stream reached the last Record of e (the work
// before it had completed), once it has: gpu.TimedEvent.
func (e *Event) CompletedAt() (time.Time, bool) {
	e.mu.Lock()
	ch, at := e.ch, e.at
	e.mu.Unlock()
	if ch == nil {
		return time.Time{}, false
	}
	select {
	case <-ch:
		return *at, true
	default:
		return time.Time{}, false
	}
}

// Synchronize blocks until the recorded work has completed.
func (e *Event) Synchronize() {
	if ch := e.current(); ch != nil {
		<-ch
	}
}

// Done reports whether the recorded work has completed.
func (e *Event) Done() bool {
	ch := e.current()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
