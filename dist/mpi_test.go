package dist

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/mpitest"
)

// TestMPI runs TestMPIChild in three processes of one mpirun job.
func TestMPI(t *testing.T) {
	if mpitest.Child() {
		t.Skip("the parent's test")
	}
	mpitest.Run(t, 3, "TestMPIChild")
}

// TestMPIChild checks every collective against what each process can
// compute alone, and that a nil dereference is still Go's panic after
// MPI_Init: a guard, not a test of OMPI_MCA_opal_signal (Open MPI 4.1
// leaves a signal's handler alone when one is installed, so this passes
// without the setting too); it would catch a version that took Go's.
func TestMPIChild(t *testing.T) {
	if !mpitest.Child() {
		t.Skip("runs under mpirun (TestMPI)")
	}
	m, err := OpenMPI()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	}()
	n, r := m.Procs(), m.Proc()
	if n != 3 {
		t.Fatalf("%d processes, want 3", n)
	}
	// A process's bytes: b(q, i) = q*31 + i.
	fill := func(q, k, off int) []byte {
		b := make([]byte, k)
		for i := range b {
			b[i] = byte(q*31 + off + i)
		}
		return b
	}
	recv := make([]byte, 3*5)
	if err := m.Allgather(fill(r, 5, 0), recv); err != nil {
		t.Fatal(err)
	}
	if want := append(append(fill(0, 5, 0), fill(1, 5, 0)...), fill(2, 5, 0)...); !bytes.Equal(recv, want) {
		t.Errorf("Allgather %v, want %v", recv, want)
	}
	counts := []int{1, 0, 4}
	recv = make([]byte, 5)
	if err := m.Allgatherv(fill(r, counts[r], 0), recv, counts); err != nil {
		t.Fatal(err)
	}
	if want := append(fill(0, 1, 0), fill(2, 4, 0)...); !bytes.Equal(recv, want) {
		t.Errorf("Allgatherv %v, want %v", recv, want)
	}
	// Alltoallv: process q sends q+p+1 bytes to p, starting at value 100·p.
	var send []byte
	sc, rc := make([]int, 3), make([]int, 3)
	for p := range 3 {
		sc[p], rc[p] = r+p+1, p+r+1
		send = append(send, fill(r, sc[p], 100*p)...)
	}
	recv = make([]byte, rc[0]+rc[1]+rc[2])
	if err := m.Alltoallv(send, sc, recv, rc); err != nil {
		t.Fatal(err)
	}
	var want []byte
	for q := range 3 {
		want = append(want, fill(q, q+r+1, 100*r)...)
	}
	if !bytes.Equal(recv, want) {
		t.Errorf("Alltoallv %v, want %v", recv, want)
	}
	buf := fill(r, 7, 0)
	if err := m.Bcast(buf, 2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, fill(2, 7, 0)) {
		t.Errorf("Bcast %v", buf)
	}
	x, y := []float32{float32(r), 1}, make([]float32, 2)
	if err := m.AllreduceSumF32(x, y); err != nil {
		t.Fatal(err)
	}
	if y[0] != 3 || y[1] != 3 {
		t.Errorf("Allreduce %v, want [3 3]", y)
	}
	if err := m.Barrier(); err != nil {
		t.Fatal(err)
	}
	// Two communicators whose collectives no order relates: each process
	// enters them in another order, from two goroutines. On one thread
	// process 0 would wait in a's while process 1 waits in b's.
	b, err := m.Dup()
	if err != nil {
		t.Fatal(err)
	}
	// Of different sizes: calls crossed on one communicator would not match.
	gather := func(c *MPI, k int) func() error {
		return func() error {
			send, recv := bytes.Repeat([]byte{byte(r)}, k), make([]byte, k*n)
			if err := c.Allgather(send, recv); err != nil {
				return err
			}
			for q := range n {
				if !bytes.Equal(recv[q*k:(q+1)*k], bytes.Repeat([]byte{byte(q)}, k)) {
					return fmt.Errorf("Allgather of %d bytes received %v", k, recv)
				}
			}
			return nil
		}
	}
	opA, opB := gather(m, 1), gather(b, 2)
	first, second := opA, opB
	if r == 1 {
		first, second = opB, opA
	}
	done := make(chan error, 2)
	go func() { done <- first() }()
	time.Sleep(50 * time.Millisecond)
	go func() { done <- second() }()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			// The MPI thread is stuck: a deferred Close would wait on it.
			fmt.Println("two communicators entered in different orders: no progress in 30 s")
			os.Exit(3)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := nilPanics(); err == nil {
		t.Error("a nil dereference did not panic")
	}
	fmt.Printf("mpi child ok: process %d of %d on %s\n", r, n, m.Host())
}

func nilPanics() (err error) {
	defer func() {
		if e := recover(); e != nil {
			err = fmt.Errorf("%v", e)
		}
	}()
	var p *int
	_ = *p
	return nil
}
