package shard

import (
	"fmt"
	"slices"
	"testing"
)

// TestMove: Evict and Alloc are instant and use no link; transfers name
// their link, and String says what the move does.
func TestMove(t *testing.T) {
	k := Key{Chunk: 2, Rank: 1, State: Master}
	for _, c := range []struct {
		m       Move
		instant bool
		link    Link
		str     string
	}{
		{Move{Key: k, From: NVMe, To: Host, SizeBytes: 4096, Reason: Demand}, false, NVMeToHost, "demand chunk 2 rank 1 master nvme->host (4096 B)"},
		{Move{Key: k, From: Host, To: NVMe, SizeBytes: 4096, Reason: Prefetch, WriteBehind: true}, false, HostToNVMe, "writebehind chunk 2 rank 1 master host->nvme (4096 B)"},
		{Move{Key: k, From: HBM, To: Host, Reason: WriteBack}, false, HBMToHost, "writeback chunk 2 rank 1 master hbm->host"},
		{Move{Key: k, From: Host, To: NVMe, Reason: Evict}, true, 0, "evict chunk 2 rank 1 master from host"},
		{Move{Key: k, To: Host, SizeBytes: 8, Reason: Alloc}, true, 0, "alloc chunk 2 rank 1 master in host (8 B)"},
	} {
		if c.m.Instant() != c.instant {
			t.Errorf("%s: instant %v, want %v", c.m, c.m.Instant(), c.instant)
		}
		l, ok := c.m.Link()
		if ok == c.instant || (ok && l != c.link) {
			t.Errorf("%s: link %s %v, want %s %v", c.m, l, ok, c.link, !c.instant)
		}
		if got := c.m.String(); got != c.str {
			t.Errorf("String: %q, want %q", got, c.str)
		}
	}
}

// TestAccessSameSlot: phase, size and compute do not make another slot.
func TestAccessSameSlot(t *testing.T) {
	a := Access{Key: Key{Chunk: 1}, Phase: Forward, Tier: HBM, Kind: Read, SizeBytes: 10}
	b := a
	b.Phase, b.SizeBytes, b.Compute = Backward, 20, 5
	if !a.SameSlot(b) {
		t.Error("same shard, tier and kind: not the same slot")
	}
	for _, c := range []Access{{Key: Key{Chunk: 2}, Tier: HBM, Kind: Read}, {Key: a.Key, Tier: Host, Kind: Read}, {Key: a.Key, Tier: HBM, Kind: Update}} {
		if a.SameSlot(c) {
			t.Errorf("%s and %s: the same slot", a, c)
		}
	}
}

// TestNames pins the names stringer generates from the constants' line
// comments (shard_string.go, move_string.go, access_string.go): traces,
// JSON output and statistics print them.
func TestNames(t *testing.T) {
	want := map[string][]string{
		"State":  {"param", "grad", "master", "adam_m", "adam_v", "activation"},
		"Tier":   {"hbm", "host", "nvme"},
		"Link":   {"nvme->host", "host->hbm", "hbm->host", "host->nvme"},
		"Reason": {"prefetch", "demand", "evict", "writeback", "alloc"},
		"Phase":  {"fwd", "bwd", "opt"},
		"Kind":   {"read", "update", "write"},
	}
	got := map[string][]string{}
	for i := range StateCount + 1 {
		got["State"] = append(got["State"], State(i).String())
	}
	for i := range TierCount + 1 {
		got["Tier"] = append(got["Tier"], Tier(i).String())
	}
	for i := range LinkCount + 1 {
		got["Link"] = append(got["Link"], Link(i).String())
	}
	for i := range ReasonCount + 1 {
		got["Reason"] = append(got["Reason"], Reason(i).String())
	}
	for i := range 4 {
		got["Phase"] = append(got["Phase"], Phase(i).String())
		got["Kind"] = append(got["Kind"], Kind(i).String())
	}
	for typ, names := range want {
		names = append(names, fmt.Sprintf("%s(%d)", typ, len(names))) // one past the last
		if !slices.Equal(got[typ], names) {
			t.Errorf("%s: %q, want %q", typ, got[typ], names)
		}
	}
}
