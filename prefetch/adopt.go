package prefetch

import (
	"fmt"
	"time"

	"github.com/strata-ai/strata/shard"
)

// SetTrace loads a known trace: planning starts at the next access. It fails,
// naming the shard and the budget, when an access cannot fit at all.
func (p *Planner) SetTrace(tr Trace) error {
	if err := p.checkTrace(tr); err != nil {
		return err
	}
	p.planned = false
	p.adopt(tr)
	return nil
}

func (p *Planner) checkTrace(tr Trace) error {
	if err := tr.Validate(); err != nil {
		return err
	}
	for i, a := range tr.Accesses {
		if err := p.checkAccess(a); err != nil {
			return fmt.Errorf("%w (trace access %d)", err, i)
		}
	}
	return nil
}

func (p *Planner) checkAccess(a shard.Access) error {
	s, ok := p.index[a.Key]
	if !ok {
		return fmt.Errorf("prefetch: %s has no placement", a.Key)
	}
	ks := &p.keys[s]
	if a.Tier != shard.HBM && a.Tier != shard.Host {
		return fmt.Errorf("prefetch: %s: compute cannot use a shard in %s", a.Key, a.Tier)
	}
	if a.SizeBytes != 0 && a.SizeBytes != ks.sizeBytes {
		return fmt.Errorf("prefetch: %s: access of %d B, placement says %d B", a.Key, a.SizeBytes, ks.sizeBytes)
	}
	// The access tier, and every tier a read passes through, must hold it.
	lo, hi := a.Tier, a.Tier
	if a.Kind != shard.Write {
		hi = ks.home
	}
	for t := lo; t <= hi; t++ {
		i := p.poolOf(s, t)
		if b := p.budget[i]; b > 0 && ks.sizes[t] > b {
			return fmt.Errorf("prefetch: %s (%d B) does not fit the %s budget of %d B", a.Key, ks.sizes[t], p.names[i], b)
		}
	}
	return nil
}

func (p *Planner) adopt(tr Trace) {
	p.keepHistory(tr)
	p.known = Trace{Accesses: append([]shard.Access(nil), tr.Accesses...)}
	p.trace = p.trace[:0]
	for i := range p.keys {
		p.keys[i].occ = p.keys[i].occ[:0]
	}
	p.cum = append(p.cum[:0], 0)
	p.confirmed = append(p.confirmed[:0], make([]uint32, len(tr.Accesses))...)
	for i, a := range tr.Accesses {
		s := p.index[a.Key]
		c := a.Compute
		for _, h := range p.hist {
			c = min(c, h[i])
		}
		p.trace = append(p.trace, taccess{slot: s, tier: a.Tier, kind: a.Kind, cond: a.Conditional, compute: c})
		p.keys[s].occ = append(p.keys[s].occ, int32(i))
		p.cum = append(p.cum, p.cum[i]+c)
	}
	p.footprint()
	p.window = p.horizon()
}

// horizon is the number of accesses the plan looks ahead (Options.Window;
// 0: automatic). The automatic window covers, from any position of the
// trace, the accesses predicted to start within HorizonChains × ranks ×
// lead of it, lead being the longest transfer chain an access of the
// trace can need (every hop from its home, at the current bandwidths)
// plus the slack, and ranks the ranks this planner plans for (their
// transfers queue on the same NVMe links): a transfer is planned before
// its latest start, with room for the transfers queued behind it on the
// same links. It is never fewer than MinWindow accesses nor more than the
// trace.
func (p *Planner) horizon() int {
	n := len(p.trace)
	if w := p.opts.Window; w > 0 || n == 0 {
		return min(w, n)
	}
	ranks := 0 // that share the NVMe links: one HBM pool each
	for _, id := range p.poolIDs {
		if id.tier == shard.HBM {
			ranks++
		}
	}
	span := time.Duration(HorizonChains*max(ranks, 1)) * (p.longestChain() + p.opts.Slack)
	// at(e): the compute of trace accesses 0..e-1, cyclically (e < 2n).
	at := func(e int) time.Duration {
		if e <= n {
			return p.cum[e]
		}
		return p.cum[n] + p.cum[e-n]
	}
	most, e := 0, 0
	for i := 0; i < n && most < n; i++ {
		e = max(e, i)
		for e < i+n && at(e)-at(i) <= span {
			e++
		}
		most = max(most, e-i)
	}
	return min(max(most, MinWindow), n)
}

// longestChain is the longest transfer time, summed over its hops, that
// an access of the trace can need: the read of its shard from its home.
func (p *Planner) longestChain() time.Duration {
	var most time.Duration
	for _, a := range p.trace {
		if a.kind == shard.Write {
			continue
		}
		ks := &p.keys[a.slot]
		var d time.Duration
		for from := ks.home; from != a.tier; {
			to := from - 1
			if from < a.tier {
				to = from + 1
			}
			if l, ok := shard.LinkOf(from, to); ok {
				d += p.opts.TransferTime(l, ks.linkBytes())
			}
			from = to
		}
		most = max(most, d)
	}
	return most
}

// keepHistory records the compute times of tr among the last
// Options.ComputeSteps traces of the same accesses (a trace with other
// accesses starts the history again). adopt plans each access with the
// shortest of them: compute measured on a busy machine varies from step to
// step, and a deadline predicted too late makes a prefetch late, while one
// predicted too early only holds its room a little longer.
func (p *Planner) keepHistory(tr Trace) {
	same := len(tr.Accesses) == len(p.known.Accesses)
	for i := 0; same && i < len(tr.Accesses); i++ {
		same = p.known.Accesses[i].SameSlot(tr.Accesses[i])
	}
	if !same {
		p.hist = p.hist[:0]
	}
	n := p.opts.ComputeSteps
	if n == 0 {
		n = 4
	}
	var h []time.Duration
	for len(p.hist) >= n { // reuse the oldest one's slice
		h = p.hist[0][:0]
		p.hist = append(p.hist[:0], p.hist[1:]...)
	}
	for _, a := range tr.Accesses {
		h = append(h, a.Compute)
	}
	p.hist = append(p.hist, h)
}

// footprint marks the pools whose budget is smaller than what the trace
// would keep in them if nothing were ever evicted: the homes there plus one
// copy of every shard an access needs there or stages through there. Only
// in those pools can a dirty copy have to be evicted, so only there is a
// write-behind worth its link time.
func (p *Planner) footprint() {
	fp := make([]int64, len(p.used))
	seen := make(map[[2]int32]bool)
	addTo := func(s int32, t shard.Tier) {
		pi := p.poolOf(s, t)
		for pi >= len(fp) {
			fp = append(fp, 0)
		}
		if t == p.keys[s].home || seen[[2]int32{s, int32(t)}] {
			return
		}
		seen[[2]int32{s, int32(t)}] = true
		fp[pi] += p.keys[s].sizes[t]
	}
	for i := range p.keys {
		ks := &p.keys[i]
		for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
			if t == ks.home || ks.copies[t] != absent {
				pi := p.poolOf(int32(i), t)
				for pi >= len(fp) {
					fp = append(fp, 0)
				}
				fp[pi] += ks.sizes[t]
				seen[[2]int32{int32(i), int32(t)}] = true
			}
		}
	}
	for _, a := range p.trace {
		addTo(a.slot, a.tier)
		if a.kind != shard.Write {
			for t := a.tier + 1; t < p.keys[a.slot].home; t++ {
				addTo(a.slot, t)
			}
		}
	}
	p.overflow = make([]bool, len(fp))
	for pi, f := range fp {
		p.overflow[pi] = pi < len(p.budget) && p.budget[pi] > 0 && f > p.budget[pi]
	}
}

// computeUntil is the modeled compute from the next access to begin up to
// the start of the access at global index g (g at or after it).
func (p *Planner) computeUntil(g int64) time.Duration {
	n := int64(len(p.trace))
	cur := p.stepBase + int64(p.pos)
	if n == 0 || g <= cur {
		return 0
	}
	// Accesses cur..g-1, cyclic over the trace.
	full := (g - cur) / n
	d := time.Duration(full) * p.cum[n]
	from, to := int64(p.pos)%n, (int64(p.pos)+(g-cur)%n)%n
	if to >= from {
		d += p.cum[to] - p.cum[from]
	} else {
		d += p.cum[n] - p.cum[from] + p.cum[to]
	}
	return d
}
