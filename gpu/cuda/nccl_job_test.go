package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dist"
	"github.com/strata-ai/strata/internal/mpitest"
)

// TestNCCLJobBootstrap: in a job of 2 processes of 2 ranks (mpirun; no
// GPU: NCCL is a recording stand-in of ncclAPI's functions), process 0
// alone calls ncclGetUniqueId, every process's ncclCommInitRank calls get
// its 128 bytes, the job's rank count 4 and the global ranks p·2+l, between
// one ncclGroupStart and one ncclGroupEnd. The functions' C calling
// convention is TestNCCLCallingConvention's.
func TestNCCLJobBootstrap(t *testing.T) {
	if mpitest.Child() {
		t.Skip("the parent's test")
	}
	mpitest.Run(t, 2, "TestNCCLJobBootstrapChild")
}

func TestNCCLJobBootstrapChild(t *testing.T) {
	if !mpitest.Child() {
		t.Skip("runs under mpirun (TestNCCLJobBootstrap)")
	}
	m, err := dist.OpenMPI()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var log []string
	want := ncclUniqueID{}
	for i := range want.Internal {
		want.Internal[i] = byte(i*7 + 3)
	}
	api := &ncclAPI{
		ncclGetUniqueId: func(id *ncclUniqueID) ncclResult {
			log = append(log, "id")
			*id = want
			return 0
		},
		ncclGroupStart: func() ncclResult { log = append(log, "start"); return 0 },
		ncclGroupEnd:   func() ncclResult { log = append(log, "end"); return 0 },
		ncclCommInitRank: func(comm *uintptr, n int32, id ncclUniqueID, rank int32) ncclResult {
			if id != want {
				t.Errorf("ncclCommInitRank rank %d: the unique id is not process 0's", rank)
			}
			log = append(log, fmt.Sprintf("init %d/%d", rank, n))
			*comm = uintptr(1000 + rank)
			return 0
		},
	}
	on := func(r int, f func() error) error { return f() }
	comms, err := initNCCL(api, m, 2, on)
	if err != nil {
		t.Fatal(err)
	}
	p := m.Proc()
	wantLog := []string{"start", fmt.Sprintf("init %d/4", 2*p), fmt.Sprintf("init %d/4", 2*p+1), "end"}
	if p == 0 {
		wantLog = append([]string{"id"}, wantLog...)
	}
	if strings.Join(log, ", ") != strings.Join(wantLog, ", ") {
		t.Errorf("process %d called %v, want %v", p, log, wantLog)
	}
	if comms[0] != uintptr(1000+2*p) || comms[1] != uintptr(1001+2*p) {
		t.Errorf("handles %v", comms)
	}
	// One process alone: ranks 0..n-1 of n, its own id.
	log = nil
	if _, err := initNCCL(api, nil, 2, on); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(log, ", "); got != "id, start, init 0/2, init 1/2, end" {
		t.Errorf("one process called %s", got)
	}
	fmt.Printf("nccl child ok: process %d\n", p)
}
