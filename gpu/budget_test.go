package gpu

import (
	"errors"
	"testing"
)

func TestBudget(t *testing.T) {
	b := NewBudget(3, 1000)
	w := Tag{Kind: Workspace, Purpose: "gathered chunk"}
	m := Tag{Kind: ModelState, Purpose: "param shard"}
	if err := b.Reserve(600, m); err != nil {
		t.Fatal(err)
	}
	if err := b.Reserve(300, w); err != nil {
		t.Fatal(err)
	}
	err := b.Reserve(200, w)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("past the budget: %v, want *OutOfMemoryError", err)
	}
	if oom.Device != 3 || oom.RequestedBytes != 200 || oom.Tag != w || oom.Stats.InUseBytes != 900 || oom.Stats.InUseByPurpose["param shard"] != 600 {
		t.Errorf("the error says %+v", oom)
	}
	b.Release(300, w)
	st := b.Stats()
	if st.InUseBytes != 600 || st.PeakBytes != 900 || st.InUseByKind[Workspace] != 0 || st.PeakByKind[Workspace] != 300 || st.BudgetBytes != 1000 {
		t.Errorf("after release: %+v", st)
	}
	if _, ok := st.InUseByPurpose["gathered chunk"]; ok {
		t.Errorf("a purpose with nothing in use is still listed: %v", st.InUseByPurpose)
	}
	st.InUseByPurpose["param shard"] = 0 // Stats returns a copy
	b.ResetPeak()
	st = b.Stats()
	if st.PeakBytes != 600 || st.PeakByKind[Workspace] != 0 || st.PeakByKind[ModelState] != 600 || st.InUseByPurpose["param shard"] != 600 {
		t.Errorf("after ResetPeak: %+v", st)
	}
	if err := b.Reserve(400, w); err != nil {
		t.Errorf("exactly the budget: %v", err)
	}
	if err := b.OutOfMemory(1, m); !errors.As(err, &oom) || oom.Stats.InUseBytes != 1000 {
		t.Errorf("OutOfMemory: %v", err)
	}
}
