package checkpoint

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killState is the state saved as step s by the kill test's child: seeded
// by s, so each step's bits differ.
func killState(t testing.TB, s int64) *State {
	st := filledState(t, 2, 2048, uint64(s))
	st.Step = s
	return st
}

// TestKillHelper is the child of TestKillAtEveryPoint (it does nothing
// otherwise): it saves steps 1-3 into $KILL_DIR with the default Keep (2),
// then saves step 4 with a hook that, at the point $KILL_POINT, prints
// "AT POINT" and blocks until the parent kills it.
func TestKillHelper(t *testing.T) {
	dir, point := os.Getenv("KILL_DIR"), os.Getenv("KILL_POINT")
	if dir == "" {
		return
	}
	run := Options{RunID: "r1"}
	for s := int64(1); s <= 3; s++ {
		if err := SaveWith(dir, killState(t, s), run); err != nil {
			t.Fatal(err)
		}
	}
	run.Hook = func(p string) error {
		if p == point {
			fmt.Printf("AT %s\n", p)
			for {
				time.Sleep(time.Hour) // until SIGKILL
			}
		}
		return nil
	}
	if err := SaveWith(dir, killState(t, 4), run); err != nil {
		t.Fatal(err)
	}
	fmt.Println("NOT REACHED")
}

// TestKillAtEveryPoint kills a real process (this test binary, re-run as
// TestKillHelper) with SIGKILL at every named point of a save and of its
// pruning: each time the directory's latest loads with the bits of step 3
// or 4 (4 once latest was replaced), no incomplete checkpoint is left to
// trip a later resume, and the next save (step 5) succeeds, prunes, and
// loads bit for bit.
func TestKillAtEveryPoint(t *testing.T) {
	points := []string{"write rank-00000.safetensors", "write rank-00001.safetensors", "manifest", "rename", "latest",
		"prune step-00000002", "remove .tmp-prune-step-00000002"}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run", "^TestKillHelper$", "-test.count", "1")
			cmd.Env = append(os.Environ(), "KILL_DIR="+dir, "KILL_POINT="+point)
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(out).ReadString('\n')
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			if strings.TrimSpace(line) != "AT "+point {
				t.Fatalf("child printed %q, want it blocked at %q", line, point)
			}
			want := int64(3)
			if strings.HasPrefix(point, "prune") || strings.HasPrefix(point, "remove") {
				want = 4 // latest was replaced before the pruning
			}
			got, err := Load(dir)
			if err != nil {
				t.Fatalf("killed at %q: load latest: %v", point, err)
			}
			sameState(t, got, killState(t, want))
			ls, err := List(dir)
			if err != nil || len(ls.Incomplete) > 0 {
				t.Fatalf("killed at %q: list: %v, incomplete %v", point, err, ls.Incomplete)
			}
			// Every complete checkpoint left loads bit for bit.
			for _, c := range ls.Complete {
				st, err := Load(filepath.Join(dir, c.Name))
				if err != nil {
					t.Fatalf("killed at %q: %s: %v", point, c.Name, err)
				}
				sameState(t, st, killState(t, c.Step))
			}
			if err := SaveWith(dir, killState(t, 5), Options{RunID: "r1"}); err != nil {
				t.Fatalf("killed at %q: next save: %v", point, err)
			}
			got, err = Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			sameState(t, got, killState(t, 5))
			ents, _ := os.ReadDir(dir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			kept := want // the one before 5 that Keep 2 keeps
			if point == "latest" {
				kept = 4 // complete, though latest did not name it yet
			}
			if w := fmt.Sprintf("latest step-%08d step-%08d", kept, 5); strings.Join(names, " ") != w {
				t.Errorf("killed at %q: after the next save the directory holds %v, want %s", point, names, w)
			}
		})
	}
}
