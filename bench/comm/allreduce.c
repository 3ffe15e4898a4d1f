/* The anchor of bench/comm.sh: MPI_Allreduce (MPI_FLOAT, MPI_SUM) of a
 * buffer across the processes of an mpirun job, as a C program would call
 * it. Usage: allreduce BYTES ROUNDS. Rank 0 prints one line:
 * "allreduce BYTES PROCS median_s" after one warm-up call, the median of
 * ROUNDS timed calls (each after a barrier). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, procs;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &procs);
	if (argc != 3) {
		if (rank == 0) fprintf(stderr, "usage: allreduce BYTES ROUNDS\n");
		MPI_Finalize();
		return 2;
	}
	long bytes = atol(argv[1]);
	int rounds = atoi(argv[2]);
	long n = bytes / 4;
	float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
	double *t = malloc(rounds * sizeof *t);
	for (long i = 0; i < n; i++) in[i] = (float)((i * 7 + rank * 13) % 1024) / 64;
	MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	for (int r = 0; r < rounds; r++) {
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		t[r] = MPI_Wtime() - t0;
	}
	qsort(t, rounds, sizeof *t, cmp);
	double med = rounds % 2 ? t[rounds / 2] : (t[rounds / 2 - 1] + t[rounds / 2]) / 2;
	if (rank == 0) printf("allreduce %ld %d %.6f\n", bytes, procs, med);
	free(in); free(out); free(t);
	MPI_Finalize();
	return 0;
}
