package prefetch

import (
	"fmt"
	"time"

	"github.com/strata-ai/strata/shard"
)

// Trace is the recorded sequence of accesses of one training step. The
// planner treats it as cyclic: step t+1 repeats step t.
type Trace struct {
	Accesses []shard.Access
}

// Compute is the sum of the compute of every access: the step time with no stall.
func (t Trace) Compute() time.Duration {
	var d time.Duration
	for _, a := range t.Accesses {
		d += a.Compute
	}
	return d
}

// Validate checks the trace alone: access tiers, sizes and durations.
func (t Trace) Validate() error {
	size := map[shard.Key]int64{}
	for i, a := range t.Accesses {
		if a.Tier != shard.HBM && a.Tier != shard.Host {
			return fmt.Errorf("prefetch: access %d (%s): compute cannot use a shard in %s", i, a.Key, a.Tier)
		}
		if a.Kind > shard.Write || a.Phase > shard.Optimizer {
			return fmt.Errorf("prefetch: access %d (%s): unknown kind or phase", i, a.Key)
		}
		if a.SizeBytes <= 0 {
			return fmt.Errorf("prefetch: access %d (%s): size %d B is not positive", i, a.Key, a.SizeBytes)
		}
		if a.Compute < 0 {
			return fmt.Errorf("prefetch: access %d (%s): negative compute %v", i, a.Key, a.Compute)
		}
		if s, ok := size[a.Key]; ok && s != a.SizeBytes {
			return fmt.Errorf("prefetch: access %d (%s): size %d B differs from an earlier %d B", i, a.Key, a.SizeBytes, s)
		}
		size[a.Key] = a.SizeBytes
	}
	return nil
}

// Recorder builds a Trace from the accesses of one step as they happen.
// The compute of an access is measured as the time from its Ready to the
// next Begin (or to Finish for the last one). The zero value is ready to use.
type Recorder struct {
	accesses []shard.Access
	beginAt  []time.Duration
	readyAt  []time.Duration
	ready    []bool
	timed    int // 1 + the index of the latest access not skipped (Skip); 0: none
}

// Add appends an access whose compute is already known (Access.Compute).
func (r *Recorder) Add(a shard.Access) {
	r.closeLast(-1)
	r.appendDone(a)
	r.timed = len(r.accesses)
}

// appendDone appends a with nothing left to time.
func (r *Recorder) appendDone(a shard.Access) {
	r.accesses = append(r.accesses, a)
	r.beginAt = append(r.beginAt, 0)
	r.readyAt = append(r.readyAt, 0)
	r.ready = append(r.ready, true)
}

// Skip appends a conditional access the step passed over: no compute of
// its own; the time until the next Begin stays the compute of the access
// before it.
func (r *Recorder) Skip(a shard.Access) {
	a.Compute = 0
	r.appendDone(a)
}

// Begin records that access a starts at now (its shard may not be ready yet);
// it returns the access's index in the recording.
func (r *Recorder) Begin(a shard.Access, now time.Duration) int {
	r.closeLast(now)
	a.Compute = 0
	r.accesses = append(r.accesses, a)
	r.beginAt = append(r.beginAt, now)
	r.readyAt = append(r.readyAt, now)
	r.ready = append(r.ready, false)
	r.timed = len(r.accesses)
	return len(r.accesses) - 1
}

// Ready records that access i found its shard ready at now.
func (r *Recorder) Ready(i int, now time.Duration) {
	if i < 0 || i >= len(r.accesses) {
		panic(fmt.Sprintf("prefetch: recorder: ready for access %d of %d", i, len(r.accesses)))
	}
	r.readyAt[i] = now
	r.ready[i] = true
}

// closeLast measures the compute of the last access if it was timed (now >= 0).
func (r *Recorder) closeLast(now time.Duration) {
	n := r.timed
	if n == 0 || now < 0 || r.accesses[n-1].Compute != 0 {
		return
	}
	from := r.beginAt[n-1]
	if r.ready[n-1] {
		from = r.readyAt[n-1]
	}
	if d := now - from; d > 0 {
		r.accesses[n-1].Compute = d
	}
}

// Len is the number of accesses recorded.
func (r *Recorder) Len() int { return len(r.accesses) }

// Finish closes the last access at now and returns the trace; the recorder
// is empty afterwards.
func (r *Recorder) Finish(now time.Duration) Trace {
	r.closeLast(now)
	t := Trace{Accesses: r.accesses}
	*r = Recorder{}
	return t
}
