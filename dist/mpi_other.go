//go:build !linux

package dist

import "errors"

// MPI is Linux only.
type MPI struct{}

// OpenMPI says that MPI is bound on Linux only.
func OpenMPI() (*MPI, error) { return nil, errors.New("dist: MPI is bound on Linux only") }

func (m *MPI) Proc() int                                        { return 0 }
func (m *MPI) Procs() int                                       { return 1 }
func (m *MPI) Host() string                                     { return "" }
func (m *MPI) Barrier() error                                   { return ErrNoMPI }
func (m *MPI) Bcast(buf []byte, root int) error                 { return ErrNoMPI }
func (m *MPI) Allgather(send, recv []byte) error                { return ErrNoMPI }
func (m *MPI) Allgatherv(send, recv []byte, counts []int) error { return ErrNoMPI }
func (m *MPI) AllreduceSumF32(send, recv []float32) error       { return ErrNoMPI }
func (m *MPI) Close() error                                     { return nil }
func (m *MPI) Abort(code int)                                   {}
func (m *MPI) Dup() (*MPI, error)                               { return nil, ErrNoMPI }
func (m *MPI) Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	return ErrNoMPI
}
