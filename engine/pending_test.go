package engine

import (
	"strings"
	"testing"
)

// TestPendingStates walks the pending update's state machine through
// Step and settle: exact's update is pending (leasing or leased) after
// Step and finished by Params; dpu's past its warm-up is delayed and left
// computed by Params, its upload owed to the next pass.
func TestPendingStates(t *testing.T) {
	s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
	for _, c := range []struct {
		name    string
		js      string
		settled runState // after Params; runFinished: taken off the rank
	}{
		{"exact", s.configJSON(), runFinished},
		{"dpu", dpuJSON(s, 0), runComputed},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngineJSON(t, c.js, s.n)
			for range 2 {
				if _, err := e.Step(); err != nil {
					t.Fatal(err)
				}
				for _, r := range e.ranks {
					if r.run == nil || (r.run.state != runLeasing && r.run.state != runLeased) {
						t.Fatalf("rank %d after Step: %v, want an update leasing or leased", r.idx, r.run)
					}
				}
			}
			if _, err := e.Params(); err != nil {
				t.Fatal(err)
			}
			for _, r := range e.ranks {
				switch {
				case c.settled == runFinished && r.run != nil:
					t.Errorf("rank %d after Params: update %s, want none", r.idx, r.run.state)
				case c.settled != runFinished && (r.run == nil || r.run.state != c.settled):
					t.Errorf("rank %d after Params: %v, want an update %s", r.idx, r.run, c.settled)
				}
			}
			if _, err := e.Step(); err != nil { // dpu: the owed upload, then the next update
				t.Fatal(err)
			}
		})
	}
}

// TestPendingIllegalMove: a move the state machine does not have panics,
// naming the step and both states.
func TestPendingIllegalMove(t *testing.T) {
	u := newPending(7, exactSchedule{}, runFinished, 0)
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, "optimizer step 7") || !strings.Contains(msg, "from finished to leasing") {
			t.Errorf("panic %q, want one naming step 7 and the move finished -> leasing", msg)
		}
	}()
	u.to(runLeasing)
}
