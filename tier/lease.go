package tier

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// Lease pins one copy of a shard: it cannot be dropped, evicted or
// overwritten until Release.
type Lease struct {
	s        *Store
	e        *entry
	tier     shard.Tier
	kind     shard.Kind
	dev      gpu.Buffer
	host     []byte
	released atomic.Bool
}

// Acquire leases the shard's copy in tier t (HBM or host) for an access of
// the given kind and returns it. It blocks while a move fills that copy
// (and, for Update and Write, while moves read it); the time blocked is
// counted in Stats.Waited. It fails with ErrNotResident when there is no
// copy there (the move that was to fill it failed: its error is wrapped
// too), or, for Read and Update, when the copy does not hold the newest
// data; ErrLost when its data was found corrupt.
func (s *Store) Acquire(key shard.Key, t shard.Tier, kind shard.Kind) (*Lease, error) {
	if t != shard.HBM && t != shard.Host {
		return nil, fmt.Errorf("tier: acquire %s in %s: only hbm and host copies are addressable: %w", key, t, ErrBadMove)
	}
	if kind > shard.Write {
		return nil, fmt.Errorf("tier: acquire %s in %s: unknown access %s: %w", key, t, kind, ErrBadMove)
	}
	writes := kind != shard.Read
	s.mu.Lock()
	defer s.mu.Unlock()
	var t0 time.Time
	for {
		if s.closed {
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, ErrClosed)
		}
		e := s.entries[key]
		if e == nil {
			return nil, fmt.Errorf("tier: acquire %s: %w", key, ErrUnknown)
		}
		if err := s.tierOK(t, key.Rank); err != nil {
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, err)
		}
		c := &e.copies[t]
		if c.present && (c.incoming != nil || (writes && c.readers > 0)) {
			if t0.IsZero() {
				t0 = time.Now()
			}
			s.waiting++
			s.cond.Wait()
			s.waiting--
			continue
		}
		if !t0.IsZero() {
			s.waited[t] += time.Since(t0)
			s.waits[t]++
		}
		switch {
		case !c.present && c.failed != nil:
			return nil, fmt.Errorf("tier: acquire %s in %s: %w: %w", key, t, ErrNotResident, inner{c.failed})
		case !c.present:
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, ErrNotResident)
		case c.leaving:
			return nil, fmt.Errorf("tier: acquire %s in %s: being written back and dropped: %w", key, t, ErrNotResident)
		case kind != shard.Write && !e.valid(c):
			return nil, fmt.Errorf("tier: acquire %s in %s: %w", key, t, e.whyInvalid(c))
		}
		c.leases++
		if writes {
			c.writeLeases++
		}
		l := &Lease{s: s, e: e, tier: t, kind: kind}
		if t == shard.HBM {
			l.dev = c.m.dev
		} else {
			l.host = c.m.host.Bytes()[:e.storedBytes:e.storedBytes]
		}
		return l, nil
	}
}

// Key is the leased shard.
func (l *Lease) Key() shard.Key { return l.e.key }

// Tier is where the leased copy lives.
func (l *Lease) Tier() shard.Tier { return l.tier }

// Buffer is the leased HBM copy (nil for a host lease).
func (l *Lease) Buffer() gpu.Buffer { return l.dev }

// Bytes is the leased host copy, exactly the shard's size (nil for an HBM
// lease). It is pinned memory: it must not be used after Release.
func (l *Lease) Bytes() []byte { return l.host }

// Release ends the lease. Releasing an Update or Write lease makes the copy the newest
// version of the shard. Releasing twice panics.
func (l *Lease) Release() {
	if !l.released.CompareAndSwap(false, true) {
		panic(fmt.Sprintf("tier: lease of %s in %s released twice", l.e.key, l.tier))
	}
	s := l.s
	s.mu.Lock()
	defer s.unlock()
	c := &l.e.copies[l.tier]
	c.leases--
	if l.kind != shard.Read {
		c.writeLeases--
		l.e.version++
		c.version, c.blank, c.lost, c.failed, c.orphan = l.e.version, false, nil, nil, false
	}
	if s.closed && c.leases == 0 {
		s.dropLocked(l.e, l.tier)
		s.removeIfEmptyLocked(l.e)
	}
	s.cond.Broadcast()
}
