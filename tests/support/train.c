/* train.c: a training loop's shape. Every rank runs STEPS (argv[1], default 100) steps of
 * an allreduce every PERIOD_MS (argv[2], default 200), printing each step it finished as
 * `step S rank R/N on HOST`: a lost peer stops every rank inside a collective. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size; char host[256];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    long steps = argc > 1 ? atol(argv[1]) : 100, period = argc > 2 ? atol(argv[2]) : 200;
    for (long s = 1; s <= steps; s++) {
        long mine = rank + 1, sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (sum != (long)size * (size + 1) / 2) { fprintf(stderr, "wrong sum\n"); return 1; }
        printf("step %ld rank %d/%d on %s\n", s, rank, size, host);
        fflush(stdout);
        usleep(period * 1000);
    }
    MPI_Finalize();
    return 0;
}
