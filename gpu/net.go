package gpu

// Net is the processes of a job, for a backend whose collectives cross
// processes (package dist implements it on MPI). Process q of Procs drives
// the same number of devices L, and its devices are the global ranks
// q·L .. q·L+L-1. Each method is a collective of every process, called
// in the same order by all of them; buffers are plain bytes.
type Net interface {
	Procs() int
	Proc() int
	// Allgather: recv (Procs × len(send)) holds every process's send in
	// process order.
	Allgather(send, recv []byte) error
	// Allgatherv: process q sends counts[q] bytes; recv holds them back to
	// back in process order.
	Allgatherv(send, recv []byte, counts []int) error
	// Alltoallv: send holds sendCounts[q] bytes for each process q, back
	// to back; recv gets recvCounts[q] bytes from each, back to back.
	Alltoallv(send []byte, sendCounts []int, recv []byte, recvCounts []int) error
	// Bcast: buf takes process root's bytes.
	Bcast(buf []byte, root int) error
}
