package dist

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EnvMPILib names the MPI library to load instead of the search below.
const EnvMPILib = "STRATA_MPI_LIB"

// mpiLibs are the names tried in turn: Open MPI's soname (Debian's
// openmpi-bin and libopenmpi3), then the development link.
var mpiLibs = []string{"libmpi.so.40", "libmpi.so"}

// Open MPI's constants (mpi.h): handles are the addresses of the
// library's predefined objects, found by name.
const (
	mpiSuccess        = 0
	mpiThreadMultiple = 3
	mpiMaxErrorString = 256
)

type mpiAPI struct {
	path          string
	initThread    func(argc, argv unsafe.Pointer, required int32, provided *int32) int32
	initialized   func(flag *int32) int32
	finalize      func() int32
	abort         func(comm uintptr, code int32) int32
	commRank      func(comm uintptr, rank *int32) int32
	commSize      func(comm uintptr, size *int32) int32
	commDup       func(comm uintptr, out *uintptr) int32
	commFree      func(comm *uintptr) int32
	setErrhandler func(comm, handler uintptr) int32
	errorString   func(code int32, s *byte, n *int32) int32
	barrier       func(comm uintptr) int32
	bcast         func(buf unsafe.Pointer, count int32, dt uintptr, root int32, comm uintptr) int32
	allgather     func(send unsafe.Pointer, scount int32, stype uintptr, recv unsafe.Pointer, rcount int32, rtype uintptr, comm uintptr) int32
	allgatherv    func(send unsafe.Pointer, scount int32, stype uintptr, recv unsafe.Pointer, rcounts, displs *int32, rtype uintptr, comm uintptr) int32
	alltoallv     func(send unsafe.Pointer, scounts, sdispls *int32, stype uintptr, recv unsafe.Pointer, rcounts, rdispls *int32, rtype uintptr, comm uintptr) int32
	allreduce     func(send, recv unsafe.Pointer, count int32, dt, op, comm uintptr) int32
	procName      func(name *byte, n *int32) int32

	world, byteT, floatT, sum, errorsReturn uintptr
}

func loadMPI() (*mpiAPI, error) {
	names := mpiLibs
	if p := os.Getenv(EnvMPILib); p != "" {
		names = []string{p}
	}
	var h uintptr
	var errs []error
	a := &mpiAPI{}
	for _, n := range names {
		var err error
		if h, err = purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			a.path = n
			break
		}
		errs = append(errs, err)
	}
	if h == 0 {
		return nil, fmt.Errorf("%w: cannot load an MPI library (tried %v; install Open MPI: apt-get install openmpi-bin libopenmpi-dev, or set %s): %v", ErrNoMPI, names, EnvMPILib, errors.Join(errs...))
	}
	var missing []string
	fn := func(p any, name string) {
		if s, err := purego.Dlsym(h, name); err == nil && s != 0 {
			purego.RegisterFunc(p, s)
			return
		}
		missing = append(missing, name)
	}
	obj := func(p *uintptr, name string) {
		if s, err := purego.Dlsym(h, name); err == nil && s != 0 {
			*p = s
			return
		}
		missing = append(missing, name)
	}
	fn(&a.initThread, "MPI_Init_thread")
	fn(&a.initialized, "MPI_Initialized")
	fn(&a.finalize, "MPI_Finalize")
	fn(&a.abort, "MPI_Abort")
	fn(&a.commRank, "MPI_Comm_rank")
	fn(&a.commSize, "MPI_Comm_size")
	fn(&a.commDup, "MPI_Comm_dup")
	fn(&a.commFree, "MPI_Comm_free")
	fn(&a.setErrhandler, "MPI_Comm_set_errhandler")
	fn(&a.errorString, "MPI_Error_string")
	fn(&a.barrier, "MPI_Barrier")
	fn(&a.bcast, "MPI_Bcast")
	fn(&a.allgather, "MPI_Allgather")
	fn(&a.allgatherv, "MPI_Allgatherv")
	fn(&a.alltoallv, "MPI_Alltoallv")
	fn(&a.allreduce, "MPI_Allreduce")
	fn(&a.procName, "MPI_Get_processor_name")
	// Open MPI's handles (MPI_COMM_WORLD is &ompi_mpi_comm_world, ...);
	// MPICH's are integers, which this binding does not read.
	obj(&a.world, "ompi_mpi_comm_world")
	obj(&a.byteT, "ompi_mpi_byte")
	obj(&a.floatT, "ompi_mpi_float")
	obj(&a.sum, "ompi_mpi_op_sum")
	obj(&a.errorsReturn, "ompi_mpi_errors_return")
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s lacks %v: Strata binds Open MPI's ABI (MPICH and its derivatives are not read)", ErrNoMPI, a.path, missing)
	}
	return a, nil
}

// MPI is this process's membership of an MPI job: Open MPI, loaded at run
// time, initialized once per process (MPI cannot be initialized again
// after MPI_Finalize), on a communicator: MPI_COMM_WORLD, or a duplicate
// of it (Dup). Every call on a communicator runs on that communicator's
// own locked OS thread, in the order the methods are called: the methods
// are safe for concurrent use, but each communicator's collectives must be
// called in the same order by every process. Two streams of collectives
// that no order relates (a backend's rounds, the host's exchanges) each
// need their own communicator, and so their own thread
// (MPI_THREAD_MULTIPLE): on one, a process could be waiting in one stream's
// call while another waits in the other's.
type MPI struct {
	api        *mpiAPI
	comm       uintptr
	world      bool // MPI_COMM_WORLD: Close finalizes MPI
	rank, size int
	host       string
	calls      chan func()
	done       chan struct{}
	closeOnce  sync.Once
	closeErr   error
}

var (
	mpiOnce sync.Once
	mpiProc *MPI
	mpiErr  error
)

// OpenMPI initializes MPI (once per process; later calls return the same
// *MPI or the same error). Before MPI_Init it tells Open MPI to leave the
// fatal signals to Go (OMPI_MCA_opal_signal: Open MPI's handlers for
// SIGSEGV and SIGBUS would take Go's nil-pointer panics), and it makes
// errors return codes instead of aborting the job.
func OpenMPI() (*MPI, error) {
	mpiOnce.Do(func() { mpiProc, mpiErr = openMPI() })
	return mpiProc, mpiErr
}

func openMPI() (*MPI, error) {
	api, err := loadMPI()
	if err != nil {
		return nil, err
	}
	if _, set := os.LookupEnv("OMPI_MCA_opal_signal"); !set {
		os.Setenv("OMPI_MCA_opal_signal", "") // no signal of Open MPI's own
	}
	m := &MPI{api: api, comm: api.world, world: true, calls: make(chan func()), done: make(chan struct{})}
	ready := make(chan error)
	go m.serve(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return m, nil
}

// serve is the MPI thread: it initializes MPI, then runs the calls.
func (m *MPI) serve(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
	defer close(m.done)
	a := m.api
	var provided, r, n int32
	if rc := a.initThread(nil, nil, mpiThreadMultiple, &provided); rc != mpiSuccess {
		ready <- fmt.Errorf("dist: MPI_Init_thread: %s", m.errString(rc))
		return
	}
	if provided < mpiThreadMultiple {
		a.finalize()
		ready <- fmt.Errorf("dist: MPI_Init_thread gave thread level %d, Strata needs MPI_THREAD_MULTIPLE (3): an Open MPI built with thread support (Debian's is)", provided)
		return
	}
	a.setErrhandler(a.world, a.errorsReturn) // duplicates inherit it
	a.commRank(a.world, &r)
	a.commSize(a.world, &n)
	m.rank, m.size = int(r), int(n)
	name := make([]byte, 256) // MPI_MAX_PROCESSOR_NAME
	var l int32
	if a.procName(&name[0], &l) == mpiSuccess && l > 0 && int(l) <= len(name) {
		m.host = string(name[:l])
	}
	ready <- nil
	for f := range m.calls {
		f()
	}
}

// Proc is this process's rank in MPI_COMM_WORLD.
func (m *MPI) Proc() int { return m.rank }

// Procs is MPI_COMM_WORLD's size.
func (m *MPI) Procs() int { return m.size }

// Host is this process's node (MPI_Get_processor_name).
func (m *MPI) Host() string { return m.host }

// do runs f on the MPI thread and returns its error.
func (m *MPI) do(what string, f func() int32) error {
	rc := make(chan int32, 1)
	select {
	case m.calls <- func() { rc <- f() }:
	case <-m.done:
		return fmt.Errorf("dist: %s after MPI_Finalize", what)
	}
	if c := <-rc; c != mpiSuccess {
		return fmt.Errorf("dist: %s: %s", what, m.errString(c))
	}
	return nil
}

func (m *MPI) errString(code int32) string {
	b := make([]byte, mpiMaxErrorString)
	var n int32
	if m.api.errorString(code, &b[0], &n) != mpiSuccess || n <= 0 || int(n) > len(b) {
		return fmt.Sprintf("MPI error %d", code)
	}
	return fmt.Sprintf("%s (MPI error %d)", b[:n], code)
}

// count32 checks that a count fits MPI's int.
func count32(what string, n int) (int32, error) {
	if n < 0 || n > 1<<31-1 {
		return 0, fmt.Errorf("dist: %s of %d bytes: MPI counts are 32-bit; at most 2 GiB - 1 per process", what, n)
	}
	return int32(n), nil
}

func ptr(b []byte) unsafe.Pointer {
	if cap(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

func counts32(what string, c []int) ([]int32, []int32, error) {
	out, displ := make([]int32, len(c)), make([]int32, len(c))
	off := 0
	for i, v := range c {
		var err error
		if out[i], err = count32(what, v); err != nil {
			return nil, nil, err
		}
		if displ[i], err = count32(what+" (displacement)", off); err != nil {
			return nil, nil, err
		}
		off += v
	}
	return out, displ, nil
}

// Barrier is MPI_Barrier over every process.
func (m *MPI) Barrier() error {
	return m.do("MPI_Barrier", func() int32 { return m.api.barrier(m.comm) })
}

// Bcast is MPI_Bcast of buf's bytes from process root.
func (m *MPI) Bcast(buf []byte, root int) error {
	n, err := count32("MPI_Bcast", len(buf))
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(buf)
	return m.do("MPI_Bcast", func() int32 { return m.api.bcast(ptr(buf), n, m.api.byteT, int32(root), m.comm) })
}

// Allgather is MPI_Allgather of bytes: recv (Procs × len(send)) holds
// every process's send in process order.
func (m *MPI) Allgather(send, recv []byte) error {
	if len(recv) != m.size*len(send) {
		panic(fmt.Sprintf("dist: Allgather of %d bytes into %d, want %d", len(send), len(recv), m.size*len(send)))
	}
	n, err := count32("MPI_Allgather", len(send))
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(send)
	defer runtime.KeepAlive(recv)
	return m.do("MPI_Allgather", func() int32 {
		return m.api.allgather(ptr(send), n, m.api.byteT, ptr(recv), n, m.api.byteT, m.comm)
	})
}

// Allgatherv is MPI_Allgatherv of bytes: process q sends counts[q] bytes
// (this one send, len(send) == counts[Proc]), and recv holds them all in
// process order, back to back.
func (m *MPI) Allgatherv(send, recv []byte, counts []int) error {
	total := 0
	for _, c := range counts {
		total += c
	}
	if len(counts) != m.size || counts[m.rank] != len(send) || len(recv) != total {
		panic(fmt.Sprintf("dist: Allgatherv of %d bytes into %d with counts %v", len(send), len(recv), counts))
	}
	rc, displ, err := counts32("MPI_Allgatherv", counts)
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(send)
	defer runtime.KeepAlive(recv)
	return m.do("MPI_Allgatherv", func() int32 {
		return m.api.allgatherv(ptr(send), rc[m.rank], m.api.byteT, ptr(recv), &rc[0], &displ[0], m.api.byteT, m.comm)
	})
}

// Alltoallv is MPI_Alltoallv of bytes: send holds, back to back in
// process order, sendCounts[q] bytes for process q; recv receives
// recvCounts[q] bytes from each process q, back to back in process order.
func (m *MPI) Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	sc, sd, err := counts32("MPI_Alltoallv", sendCounts)
	if err != nil {
		return err
	}
	rc, rd, err := counts32("MPI_Alltoallv", recvCounts)
	if err != nil {
		return err
	}
	if len(sc) != m.size || len(rc) != m.size || int(sd[m.size-1]+sc[m.size-1]) > len(send) || int(rd[m.size-1]+rc[m.size-1]) > len(recv) {
		panic(fmt.Sprintf("dist: Alltoallv of %d bytes (counts %v) into %d (counts %v)", len(send), sendCounts, len(recv), recvCounts))
	}
	defer runtime.KeepAlive(send)
	defer runtime.KeepAlive(recv)
	return m.do("MPI_Alltoallv", func() int32 {
		return m.api.alltoallv(ptr(send), &sc[0], &sd[0], m.api.byteT, ptr(recv), &rc[0], &rd[0], m.api.byteT, m.comm)
	})
}

// AllreduceSumF32 is MPI_Allreduce(MPI_FLOAT, MPI_SUM) — MPI's own
// reduction, in its own order: the anchor `strata bench comm` measures the
// rank-order collectives against, not what the engine runs.
func (m *MPI) AllreduceSumF32(send, recv []float32) error {
	if len(send) != len(recv) {
		panic("dist: AllreduceSumF32 of unequal lengths")
	}
	n, err := count32("MPI_Allreduce", len(send))
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(send)
	defer runtime.KeepAlive(recv)
	return m.do("MPI_Allreduce", func() int32 {
		return m.api.allreduce(unsafe.Pointer(unsafe.SliceData(send)), unsafe.Pointer(unsafe.SliceData(recv)), n, m.api.floatT, m.api.sum, m.comm)
	})
}

// Dup is MPI_Comm_dup: a communicator of the same processes, on its own
// thread, whose collectives no order relates to m's (a collective: every
// process calls it, in the same order). Close it before m.
func (m *MPI) Dup() (*MPI, error) {
	var c uintptr
	if err := m.do("MPI_Comm_dup", func() int32 { return m.api.commDup(m.comm, &c) }); err != nil {
		return nil, err
	}
	d := &MPI{api: m.api, comm: c, rank: m.rank, size: m.size, host: m.host, calls: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		defer close(d.done)
		for f := range d.calls {
			f()
		}
	}()
	return d, nil
}

// Abort is MPI_Abort on MPI_COMM_WORLD with status code: Open MPI ends
// every process of the job (mpirun kills the others and exits with code),
// this one included; Abort does not return. It is called on the caller's
// thread, not the communicator's (MPI_THREAD_MULTIPLE allows it), since
// that thread may be waiting in a collective that will never complete: a
// process that fails while its peers wait for it ends the job this way
// instead of leaving them waiting (MPI_Finalize would wait for them too).
func (m *MPI) Abort(code int) {
	m.api.abort(m.api.world, int32(code))
	os.Exit(code) // MPI_Abort returned (it should not): end this process at least
}

// Close is MPI_Comm_free of a duplicate, MPI_Finalize of MPI_COMM_WORLD
// (collectives: every process calls them). After the world's, the process
// cannot use MPI again.
func (m *MPI) Close() error {
	m.closeOnce.Do(func() {
		if m.world {
			m.closeErr = m.do("MPI_Finalize", m.api.finalize)
		} else {
			m.closeErr = m.do("MPI_Comm_free", func() int32 { return m.api.commFree(&m.comm) })
		}
		close(m.calls)
		<-m.done
	})
	return m.closeErr
}
