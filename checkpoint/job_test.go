package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dist"
	"github.com/strata-ai/strata/internal/mpitest"
)

// TestSaveJob: two processes of a job, each writing two of four ranks'
// files (SaveJob, under mpirun), make the checkpoint SaveWith makes of the
// same state: the same rank files byte for byte, the same manifest but
// its time; it loads. A process whose shards fail fails the save in every
// process, naming it, and leaves latest as it was and no temporary
// directory.
func TestSaveJob(t *testing.T) {
	if mpitest.Child() {
		t.Skip("the parent's test")
	}
	dir := t.TempDir()
	mpitest.Run(t, 2, "TestSaveJobChild", "STRATA_TEST_DIR="+dir)
}

func TestSaveJobChild(t *testing.T) {
	if !mpitest.Child() {
		t.Skip("runs under mpirun (TestSaveJob)")
	}
	m, err := dist.OpenMPI()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	base := os.Getenv("STRATA_TEST_DIR")
	st := filledState(t, 4, 64, 3) // the same in both processes
	lo, hi := 2*m.Proc(), 2*m.Proc()+2
	fill := func(fail bool) ChunkFunc {
		return func(c, k int, part []byte) error {
			per := len(part) / 2
			if fail && m.Proc() == 1 && c == 1 {
				return errors.New("a device failed")
			}
			for r := lo; r < hi; r++ {
				copy(part[(r-lo)*per:(r-lo+1)*per], st.Data[r][c][k])
			}
			return nil
		}
	}
	job, one := filepath.Join(base, "job"), filepath.Join(base, "one")
	if err := SaveJob(job, st.Meta(), lo, hi, fill(false), m, Options{}); err != nil {
		t.Fatal(err)
	}
	if m.Proc() == 0 {
		if err := SaveWith(one, st, Options{}); err != nil {
			t.Fatal(err)
		}
		mj, fj := readCheckpointFiles(t, job)
		mo, fo := readCheckpointFiles(t, one)
		mj.Created = mo.Created
		if a, b := fmt.Sprintf("%+v", *mj), fmt.Sprintf("%+v", *mo); a != b || len(fj) != 4 {
			t.Errorf("manifest %s, one process's %s", a, b)
		}
		for r := range fo {
			if !bytes.Equal(fj[r], fo[r]) {
				t.Errorf("rank %d's file differs from one process's", r)
			}
		}
		got, err := Load(job)
		if err != nil {
			t.Fatal(err)
		}
		sameState(t, got, st)
	}
	if err := m.Barrier(); err != nil {
		t.Fatal(err)
	}
	// Process 1 fails: both processes fail, latest unchanged, no leftovers.
	st.Step = 101
	err = SaveJob(job, st.Meta(), lo, hi, fill(true), m, Options{})
	if err == nil || !strings.Contains(err.Error(), "a device failed") || (m.Proc() == 0 && !strings.Contains(err.Error(), "process 1")) {
		t.Errorf("process %d: a failed save gave %v", m.Proc(), err)
	}
	if err := m.Barrier(); err != nil {
		t.Fatal(err)
	}
	if man, _, err := ReadManifest(job); err != nil || man.Step != 100 {
		t.Errorf("latest after a failed save: %v, step %d; want step 100", err, man.Step)
	}
	ents, _ := os.ReadDir(job)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			t.Errorf("a failed save left %s", e.Name())
		}
	}
	fmt.Printf("savejob child ok: process %d\n", m.Proc())
}
