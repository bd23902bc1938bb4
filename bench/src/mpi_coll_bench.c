/*
 * mpi_coll_bench: time MPI collectives on float32 with sum, nccl-tests
 * style: warm-up, a timed loop, the time per call as the maximum over
 * ranks, and algbw/busbw computed from the largest per-rank buffer.
 *
 *   mpi_coll_bench allreduce|allgather|reduce_scatter SIZE ITERS WARMUP
 *
 * SIZE is in bytes: the buffer of allreduce, the receive buffer of
 * allgather, the send buffer of reduce_scatter (as nccl-tests). Prints
 * one line: coll size count time_us algbw_GBps busbw_GBps
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 5) {
    if (rank == 0) fprintf(stderr, "usage: %s allreduce|allgather|reduce_scatter SIZE ITERS WARMUP\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char *coll = argv[1];
  long size = atol(argv[2]);
  int iters = atoi(argv[3]), warmup = atoi(argv[4]);
  long count = size / 4; /* elements in the big buffer */
  /* elements per rank for allgather / reduce_scatter, in 16-byte units
     as nccl-tests counts them */
  long part = (count / n) & ~3L;
  if (part < 1) part = 1;
  float *a = aligned_alloc(4096, ((count > part * n ? count : part * n) * 4 + 4095) / 4096 * 4096);
  float *b = aligned_alloc(4096, ((count > part * n ? count : part * n) * 4 + 4095) / 4096 * 4096);
  for (long i = 0; i < (count > part * n ? count : part * n); i++) a[i] = (float)(rank + i % 7), b[i] = 0;
  double factor;
  long param;
  int which;
  if (!strcmp(coll, "allreduce")) which = 0, param = count, factor = 2.0 * (n - 1) / n;
  else if (!strcmp(coll, "allgather")) which = 1, param = part, factor = (double)(n - 1) / n;
  else if (!strcmp(coll, "reduce_scatter")) which = 2, param = part, factor = (double)(n - 1) / n;
  else MPI_Abort(MPI_COMM_WORLD, 2);
  for (int it = -warmup; it < iters; it++) {
    if (it == 0) MPI_Barrier(MPI_COMM_WORLD);
    static double t0;
    if (it == 0) t0 = MPI_Wtime();
    switch (which) {
    case 0: MPI_Allreduce(a, b, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case 1: MPI_Allgather(a, (int)part, MPI_FLOAT, b, (int)part, MPI_FLOAT, MPI_COMM_WORLD); break;
    case 2: MPI_Reduce_scatter_block(a, b, (int)part, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    }
    if (it == iters - 1) {
      double t = (MPI_Wtime() - t0) / iters, tmax;
      MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double bytes = which == 0 ? (double)count * 4 : (double)part * 4 * n;
      double algbw = bytes / 1e9 / tmax;
      if (rank == 0) printf("%s %ld %ld %.3f %.4f %.4f\n", coll, (long)bytes, param, tmax * 1e6, algbw, algbw * factor);
    }
  }
  free(a);
  free(b);
  MPI_Finalize();
  return 0;
}
