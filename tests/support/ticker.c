/* ticker.c SECONDS: a job whose ranks run for a while, as a training job's do. Every rank
 * joins an allreduce every 0.2 s until SECONDS have passed on rank 0's clock (rank 0
 * decides and the allreduce tells the others, so every rank ends at the same round);
 * a rank that stops answering stalls every other one in its next allreduce. Each rank
 * prints its rounds at the end. tests/bench/chaos.py and tests/bench/loaded.py run it. */
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
    double seconds = argc > 1 ? atof(argv[1]) : 1.0, t0 = MPI_Wtime();
    long rounds = 0;
    int stop = 0;
    while (!stop) {
        int mine = rank == 0 && MPI_Wtime() - t0 >= seconds;
        MPI_Allreduce(&mine, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        rounds++;
        if (!stop) usleep(200000);
    }
    printf("rank %d/%d on %s: %ld rounds in %.1f s\n", rank, size, host, rounds, MPI_Wtime() - t0);
    MPI_Finalize();
    return 0;
}
