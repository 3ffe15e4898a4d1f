// Package dist is a job of several processes and the bytes moved between them.
//
// It says where this process stands in the job (FromEnv: the variables of
// torchrun, DeepSpeed's launcher, Open MPI's mpirun and Slurm, or the flags
// --nnodes, --node-rank, --master) and holds the engine that moves bytes
// between the processes: Open MPI, loaded at run time with purego
// (OpenMPI), not a protocol of Strata's own.
//
// # Open MPI from Go
//
// libmpi.so.40 (or STRATA_MPI_LIB) is opened once per process and bound by
// name; Open MPI's handles (MPI_COMM_WORLD, MPI_BYTE, MPI_SUM, ...) are the
// addresses of its predefined objects (ompi_mpi_comm_world, ...), so MPICH
// and its derivatives, whose handles are integers, are refused with their
// missing symbols named. Before MPI_Init_thread, OMPI_MCA_opal_signal is set
// empty (Open MPI's handlers for SIGSEGV and SIGBUS would take Go's), and
// errors are returned as codes (MPI_ERRORS_RETURN), each wrapped with the
// call's name and MPI_Error_string's text.
//
// Every call on a communicator runs on that communicator's own locked OS
// thread, in the order the methods are called; MPI_THREAD_MULTIPLE lets
// two communicators' threads call at once. A job has two streams of
// collectives that no order relates: the devices' rounds (gpu/cpu's Net)
// and the host's exchanges (engine.Procs, cmd's training loop). Each gets
// its own communicator (Dup): on one, a process could enter a call of one
// stream while its peer entered the other's.
//
// Counts are MPI's int: a buffer of more than 2 GiB − 1 per process in one
// call is an error saying so. Close is MPI_Comm_free of a duplicate and
// MPI_Finalize of the world: MPI cannot be initialized again in the
// process.
package dist
