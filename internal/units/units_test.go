package units

import "testing"

func TestParseBytes(t *testing.T) {
	good := map[string]int64{"4096": 4096, "128K": 128 << 10, "128KiB": 128 << 10, "64KB": 64 << 10,
		"1M": 1 << 20, "1.5G": 3 << 29, "2GiB": 2 << 30, "1t": 1 << 40, " 8m ": 8 << 20}
	for in, want := range good {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "K", "12Q", "-1", "0.3", "1e30G"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) succeeded", bad)
		}
	}
}

func TestFormat(t *testing.T) {
	if s := FormatSize(1 << 20); s != "1M" {
		t.Error(s)
	}
	if s := FormatSize(128 << 10); s != "128K" {
		t.Error(s)
	}
	if s := FormatBytes(1536); s != "1.5 KiB" {
		t.Error(s)
	}
	if AlignUp(4097, 4096) != 8192 || AlignUp(0, 512) != 0 {
		t.Error("AlignUp")
	}
}
