package tier

import (
	"errors"
	"fmt"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// Submit starts a move. Evict of a copy that another copy backs, Alloc, and
// moves whose destination already holds the newest data complete before
// Submit returns (Op.Done is true; OnComplete is not called). Every other
// move runs asynchronously. The error of Submit means nothing was started:
// a *BudgetError when a destination or a staging buffer does not fit, or
// ErrUnknown, ErrNotResident, ErrLost, ErrLeased, ErrBusy, ErrBadMove,
// ErrClosed. The error of the Op (a *MoveError) is a transfer that failed.
func (s *Store) Submit(m shard.Move) (*Op, error) {
	if m.Reason >= shard.Reason(shard.ReasonCount) {
		return nil, fmt.Errorf("tier: %s: %w", m, ErrBadMove)
	}
	s.mu.Lock()
	defer s.unlock()
	if s.closed {
		return nil, fmt.Errorf("tier: %s: %w", m, ErrClosed)
	}
	e := s.entries[m.Key]
	if e == nil {
		return nil, fmt.Errorf("tier: %s: %w", m, ErrUnknown)
	}
	var op *Op
	var err error
	switch m.Reason {
	case shard.Alloc:
		op, err = s.allocLocked(e, m)
	case shard.Evict:
		op, err = s.evictLocked(e, m)
	default:
		op, err = s.transferLocked(e, m, m.Reason == shard.WriteBack, m)
	}
	if err != nil {
		return nil, err
	}
	s.submitted++
	if op.Done() {
		s.instant++
	}
	return op, nil
}

// Fetch copies the shard from one tier to another (a Prefetch move).
func (s *Store) Fetch(key shard.Key, from, to shard.Tier) (*Op, error) {
	return s.Submit(shard.Move{Key: key, From: from, To: to, Reason: shard.Prefetch})
}

// Evict drops the shard's copy in from. A dirty copy (the only one holding
// the newest data) is first written back to the home tier, and dropped when
// that completes; a clean one is dropped at once. The home copy is never
// evicted, and a leased copy or one a move is using is refused (ErrLeased,
// ErrBusy): eviction never waits.
func (s *Store) Evict(key shard.Key, from shard.Tier) (*Op, error) {
	s.mu.Lock()
	var home shard.Tier
	if e := s.entries[key]; e != nil {
		home = e.spec.Home
	}
	s.mu.Unlock()
	return s.Submit(shard.Move{Key: key, From: from, To: home, Reason: shard.Evict})
}

func (s *Store) allocLocked(e *entry, m shard.Move) (*Op, error) {
	t := m.To
	if err := s.tierOK(t, e.key.Rank); err != nil {
		return nil, fmt.Errorf("tier: %s: %w", m, err)
	}
	c := &e.copies[t]
	if c.present {
		return doneOp(m), nil // the space is there
	}
	if err := s.reserveLocked(e, t, e.charge[t], "copy"); err != nil {
		return nil, err
	}
	op := newOp(m)
	c.present, c.incoming, c.version = true, op, 0
	s.wg.Add(1)
	s.mu.Unlock()
	mm, err := s.allocMem(e, t)
	s.mu.Lock()
	s.wg.Done()
	c.incoming = nil
	close(op.done)
	s.cond.Broadcast()
	if err != nil {
		*c = replica{}
		s.unreserveLocked(e, t, e.charge[t])
		return nil, fmt.Errorf("tier: %s: %w", m, err)
	}
	c.m = mm
	return op, nil
}

func (s *Store) evictLocked(e *entry, m shard.Move) (*Op, error) {
	from := m.From
	if err := s.tierOK(from, e.key.Rank); err != nil {
		return nil, fmt.Errorf("tier: %s: %w", m, err)
	}
	c := &e.copies[from]
	switch {
	case !c.present:
		return nil, fmt.Errorf("tier: %s: no copy there: %w", m, ErrNotResident)
	case from == e.spec.Home:
		return nil, fmt.Errorf("tier: %s: the home copy is never evicted: %w", m, ErrBadMove)
	case c.leases > 0:
		return nil, fmt.Errorf("tier: %s: %d leases: %w", m, c.leases, ErrLeased)
	case c.incoming != nil || c.readers > 0 || c.leaving:
		return nil, fmt.Errorf("tier: %s: %w", m, ErrBusy)
	}
	if e.valid(c) && !e.survivesElsewhere(from) {
		to := m.To
		if to == from || s.tierOK(to, e.key.Rank) != nil {
			to = e.spec.Home
		}
		return s.transferLocked(e, shard.Move{ID: m.ID, Key: m.Key, From: from, To: to, SizeBytes: m.SizeBytes, Reason: shard.WriteBack}, true, m)
	}
	s.dropLocked(e, from)
	return doneOp(m), nil
}

// whyInvalid explains why copy c of e holds no usable data.
func (e *entry) whyInvalid(c *replica) error {
	switch {
	case c.lost != nil:
		return fmt.Errorf("%w: %w", ErrLost, inner{c.lost})
	case c.version == 0 && c.failed != nil:
		return fmt.Errorf("%w: never completed: %w", ErrNotResident, inner{c.failed})
	case c.version == 0:
		return fmt.Errorf("%w: reserved, never written", ErrNotResident)
	}
	return fmt.Errorf("%w: stale (a newer version was written elsewhere)", ErrNotResident)
}

// transferLocked starts a copy m.From -> m.To, dropping the source when it
// completes if drop. orig is the move reported to the caller.
func (s *Store) transferLocked(e *entry, m shard.Move, drop bool, orig shard.Move) (*Op, error) {
	from, to := m.From, m.To
	for _, t := range []shard.Tier{from, to} {
		if err := s.tierOK(t, e.key.Rank); err != nil {
			return nil, fmt.Errorf("tier: %s: %w", orig, err)
		}
	}
	if from == to {
		return nil, fmt.Errorf("tier: %s: source and destination are one tier: %w", orig, ErrBadMove)
	}
	src, dst := &e.copies[from], &e.copies[to]
	switch {
	case !src.present:
		if src.failed != nil {
			return nil, fmt.Errorf("tier: %s: no copy in %s: %w: %w", orig, from, ErrNotResident, inner{src.failed})
		}
		return nil, fmt.Errorf("tier: %s: no copy in %s: %w", orig, from, ErrNotResident)
	case src.leaving:
		return nil, fmt.Errorf("tier: %s: the %s copy is being written back and dropped: %w", orig, from, ErrBusy)
	case src.incoming == nil && !e.valid(src):
		return nil, fmt.Errorf("tier: %s: the %s copy: %w", orig, from, e.whyInvalid(src))
	case drop && from == e.spec.Home:
		return nil, fmt.Errorf("tier: %s: the home copy is never dropped: %w", orig, ErrBadMove)
	case drop && src.leases > 0:
		return nil, fmt.Errorf("tier: %s: the %s copy has %d leases: %w", orig, from, src.leases, ErrLeased)
	case drop && src.readers > 0:
		return nil, fmt.Errorf("tier: %s: the %s copy is the source of %d moves: %w", orig, from, src.readers, ErrBusy)
	case e.valid(dst) && !dst.leaving && drop && src.incoming != nil:
		// Nothing to copy, and the source cannot be dropped while it arrives.
		return nil, fmt.Errorf("tier: %s: the %s copy is still arriving: %w", orig, from, ErrBusy)
	case e.valid(dst) && !dst.leaving:
		// The destination already holds the newest data: nothing to copy
		// (a source still arriving brings no newer version; the
		// destination may be what it arrives from).
		if drop {
			s.dropLocked(e, from)
		}
		return doneOp(orig), nil
	case dst.present && dst.leases > 0:
		return nil, fmt.Errorf("tier: %s: the %s copy has %d leases: %w", orig, to, dst.leases, ErrLeased)
	case dst.present && (dst.incoming != nil || dst.readers > 0 || dst.leaving):
		return nil, fmt.Errorf("tier: %s: the %s copy: %w", orig, to, ErrBusy)
	}
	twoHop := from != shard.Host && to != shard.Host
	newDst := !dst.present
	if newDst {
		if err := s.reserveLocked(e, to, e.charge[to], "copy"); err != nil {
			return nil, err
		}
	}
	if twoHop {
		if err := s.reserveLocked(e, shard.Host, e.charge[shard.Host], "staging"); err != nil {
			if newDst {
				s.unreserveLocked(e, to, e.charge[to])
			}
			return nil, err
		}
		e.stagingBytes += e.charge[shard.Host]
	}
	op := newOp(orig)
	if newDst {
		*dst = replica{present: true}
	}
	prevVersion, prevFailed := dst.version, dst.failed
	dst.incoming, dst.newDst, dst.version, dst.failed = op, newDst, 0, nil
	src.readers++
	src.leaving = drop
	s.inFlight++
	s.wg.Add(1)

	var stage *pinned.Buffer
	if newDst || twoHop {
		s.mu.Unlock()
		var dm mem
		var err error
		if newDst {
			dm, err = s.allocMem(e, to)
		}
		if err == nil && twoHop {
			if stage, err = s.hostBuffer(e.ioBytes, "staging"); err != nil {
				s.freeMem(e, dm)
			}
		}
		s.mu.Lock()
		if err != nil {
			src.readers--
			src.leaving = false
			if newDst {
				*dst = replica{}
				s.unreserveLocked(e, to, e.charge[to])
			} else {
				dst.incoming, dst.version, dst.failed = nil, prevVersion, prevFailed // as it was
			}
			if twoHop {
				s.unreserveLocked(e, shard.Host, e.charge[shard.Host])
				e.stagingBytes -= e.charge[shard.Host]
			}
			s.inFlight--
			s.wg.Done()
			s.cond.Broadcast()
			return nil, fmt.Errorf("tier: %s: %w", orig, err)
		}
		if newDst {
			dst.m = dm
		}
	}
	go s.run(e, op, from, to, drop, stage)
	return op, nil
}

// run executes a transfer started by transferLocked.
func (s *Store) run(e *entry, op *Op, from, to shard.Tier, drop bool, stage *pinned.Buffer) {
	defer s.wg.Done()
	src, dst := &e.copies[from], &e.copies[to]
	s.mu.Lock()
	for !s.closed && (src.incoming != nil || src.writeLeases > 0) {
		s.cond.Wait() // the source is still arriving, or being written
	}
	var err error
	var ver uint64
	var blank bool
	switch {
	case s.closed:
		err = ErrClosed
	case !src.present || src.version == 0 || src.lost != nil:
		// Its own move failed: there is nothing to copy. (A source that
		// is merely stale now, because the shard was written elsewhere
		// after Submit, is copied with its version: the destination lands
		// stale, as the planner expects.)
		err = fmt.Errorf("the %s copy: %w", from, e.whyInvalid(src))
	default:
		ver, blank = src.version, src.blank
	}
	sm, dm := src.m, dst.m
	s.mu.Unlock()

	var links [shard.LinkCount]linkCounters
	if err == nil {
		err = s.transfer(e, from, to, sm, dm, stage, blank, &links)
	}

	s.mu.Lock()
	src.readers--
	src.leaving = false
	if src.orphan && src.readers == 0 && src.leases == 0 {
		s.dropLocked(e, from)
	}
	dst.incoming = nil
	if stage != nil {
		s.pool.Put(stage)
		s.unreserveLocked(e, shard.Host, e.charge[shard.Host])
		e.stagingBytes -= e.charge[shard.Host]
	}
	if err == nil {
		dst.version, dst.blank, dst.lost, dst.failed = ver, false, nil, nil
		if drop {
			s.dropLocked(e, from)
		}
		s.completed++
	} else {
		err = &MoveError{Move: op.move, Err: err}
		if from == shard.NVMe && src.present && errors.Is(err, nvme.ErrCorrupt) {
			src.version, src.lost = 0, err // the extent's data is known bad
		}
		switch {
		case dst.newDst && dst.readers > 0:
			dst.version, dst.orphan = 0, true // moves wait on it: the last one drops it
		case dst.newDst:
			s.dropLocked(e, to)
		default:
			dst.version = 0 // partly overwritten
		}
		dst.failed = err
		s.failed++
	}
	dst.newDst = false
	for l := range links {
		s.links[l].bytes += links[l].bytes
		s.links[l].moves += links[l].moves
		s.links[l].busy += links[l].busy
	}
	op.err = err
	op.took = time.Since(op.start)
	for _, l := range links {
		op.bytes += l.bytes
	}
	s.inFlight--
	s.flightTime += op.took
	// Done turns true under the lock that publishes the outcome: a move
	// chained on this one, or a lease, that sees the landed copy also sees
	// this Op done.
	close(op.done)
	s.cond.Broadcast()
	runner := s.runners[e.key.Rank]
	s.unlock()
	if cb := s.opts.OnComplete; cb != nil {
		cb(op.move, err)
	}
	if runner != nil {
		runner.wake()
	}
}

// transfer moves the data (no lock held). Pinned buffers handed to a copy
// engine or to the kernel are leased until the transfer completes.
func (s *Store) transfer(e *entry, from, to shard.Tier, sm, dm mem, stage *pinned.Buffer, blank bool, links *[shard.LinkCount]linkCounters) error {
	hop := func(l shard.Link, n int64, f func() error) error {
		t0 := time.Now()
		s.active[l].enter(t0)
		err := f()
		s.active[l].exit(time.Now())
		if err == nil {
			links[l].bytes += n
			links[l].moves++
			links[l].busy += time.Since(t0)
		}
		return err
	}
	// hostSide is the host buffer of the hop that touches the host: the
	// staging buffer of a two-hop move, else the host copy.
	switch {
	case from == shard.HBM && to == shard.Host:
		return hop(shard.HBMToHost, e.storedBytes, func() error { return s.download(e, sm.dev, dm.host) })
	case from == shard.Host && to == shard.HBM:
		return hop(shard.HostToHBM, e.storedBytes, func() error { return s.upload(e, sm.host, dm.dev) })
	case from == shard.Host && to == shard.NVMe:
		return hop(shard.HostToNVMe, e.ioBytes, func() error { return s.write(sm.host, dm.ext) })
	case from == shard.NVMe && to == shard.Host:
		if blank {
			clear(dm.host.Bytes())
			return nil
		}
		return hop(shard.NVMeToHost, e.ioBytes, func() error { return s.read(sm.ext, dm.host) })
	case from == shard.HBM && to == shard.NVMe:
		if err := hop(shard.HBMToHost, e.storedBytes, func() error { return s.download(e, sm.dev, stage) }); err != nil {
			return err
		}
		return hop(shard.HostToNVMe, e.ioBytes, func() error { return s.write(stage, dm.ext) })
	case from == shard.NVMe && to == shard.HBM:
		if blank {
			clear(stage.Bytes())
		} else if err := hop(shard.NVMeToHost, e.ioBytes, func() error { return s.read(sm.ext, stage) }); err != nil {
			return err
		}
		return hop(shard.HostToHBM, e.storedBytes, func() error { return s.upload(e, stage, dm.dev) })
	}
	panic(fmt.Sprintf("tier: transfer %s -> %s", from, to))
}

// download copies a device buffer into a pinned buffer on the device's
// device-to-host stream and waits for the copy's event.
func (s *Store) download(e *entry, src gpu.Buffer, dst *pinned.Buffer) error {
	if e.spec.coded() {
		return fmt.Errorf("tier: %s: its %s HBM copy is decoded from %s and read-only: it is not written back: %w", e.key, e.spec.DType, e.spec.Stored, ErrBadMove)
	}
	r := e.key.Rank
	dst.Lease()
	defer dst.Release()
	st := s.d2h[r]
	s.devs[r].CopyDeviceToHost(st, dst.Bytes()[:e.sizeBytes], src, 0)
	ev := s.devs[r].NewEvent()
	st.Record(ev)
	ev.Synchronize()
	return nil
}

// upload copies a pinned buffer into a device buffer on the device's
// host-to-device stream and waits for the copy's event; a coded shard's
// bytes go to the device's codec scratch and are decoded into dst there.
func (s *Store) upload(e *entry, src *pinned.Buffer, dst gpu.Buffer) error {
	r := e.key.Rank
	src.Lease()
	defer src.Release()
	st := s.h2d[r]
	if e.spec.coded() {
		return s.uploadCoded(e, src, dst)
	}
	s.devs[r].CopyHostToDevice(st, dst, 0, src.Bytes()[:e.sizeBytes])
	ev := s.devs[r].NewEvent()
	st.Record(ev)
	ev.Synchronize()
	return nil
}

// write stores a pinned buffer in an extent (the swap records a CRC-32C per
// stripe unit).
func (s *Store) write(src *pinned.Buffer, x *nvme.Extent) error {
	src.Lease()
	defer src.Release()
	return s.swap.Write(x, src.Bytes())
}

// read fills a pinned buffer from an extent and verifies its checksums.
func (s *Store) read(x *nvme.Extent, dst *pinned.Buffer) error {
	dst.Lease()
	defer dst.Release()
	return s.swap.Read(x, dst.Bytes())
}
