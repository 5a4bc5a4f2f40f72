/* allreduce.c: every rank contributes rank+1; the sum must be n(n+1)/2. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/time.h>
int main(int argc, char **argv) {
    struct timeval tv; gettimeofday(&tv, NULL);
    MPI_Init(&argc, &argv);
    int rank, size; char host[256];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long want = (long)size * (size + 1) / 2;
    printf("rank %d/%d on %s: allreduce sum %ld (expected %ld) %s start %ld.%06ld\n", rank, size,
           host, sum, want, sum == want ? "OK" : "WRONG", (long)tv.tv_sec, (long)tv.tv_usec);
    MPI_Finalize();
    return sum == want ? 0 : 1;
}
