package backend

import (
	"testing"
)

func TestOpenCPU(t *testing.T) {
	for _, name := range []string{"", "cpu"} {
		d, err := Open(name, 2, 1<<20, true)
		if err != nil {
			t.Fatal(err)
		}
		if d.Backend != "cpu" || len(d.Devs) != 2 || len(d.Comms) != 2 || d.Describe != "2 cpu device(s)" || d.Collectives != "rank-order" || d.Registrar == nil {
			t.Errorf("Open(%q): %+v", name, d)
		}
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	}
}

func TestOpenUnknown(t *testing.T) {
	_, err := Open("tpu", 1, 0, true)
	if err == nil || err.Error() != `backend: unknown backend "tpu" (one of [cpu cuda])` {
		t.Errorf("got %v", err)
	}
}
