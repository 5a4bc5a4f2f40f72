/* distgraph.c: MPI_Dist_graph_create as mpi4py's topology test does it (an empty graph,
   then each rank's edges to its ring neighbours and itself, unweighted then weighted),
   then a neighbour exchange. Prints one line per rank; exit 0 when every rank agrees. */
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, ok = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int round = 0; round < 20; round++) {
        MPI_Comm topo;
        MPI_Dist_graph_create(MPI_COMM_WORLD, 0, NULL, NULL, NULL, MPI_UNWEIGHTED,
                              MPI_INFO_NULL, 0, &topo);
        MPI_Comm_free(&topo);
        int sources[1] = {rank}, degrees[1] = {3};
        int dest[3] = {(rank + size - 1) % size, rank, (rank + 1) % size};
        int weights[3] = {1, 2, 3};
        MPI_Dist_graph_create(MPI_COMM_WORLD, 1, sources, degrees, dest, MPI_UNWEIGHTED,
                              MPI_INFO_NULL, 0, &topo);
        int in, out, w;
        MPI_Dist_graph_neighbors_count(topo, &in, &out, &w);
        ok = ok && in == 3 && out == 3 && !w;
        int got[3] = {-1, -1, -1};
        MPI_Neighbor_allgather(&rank, 1, MPI_INT, got, 1, MPI_INT, topo);
        MPI_Comm_free(&topo);
        MPI_Dist_graph_create(MPI_COMM_WORLD, 1, sources, degrees, dest, weights,
                              MPI_INFO_NULL, 0, &topo);
        MPI_Dist_graph_neighbors_count(topo, &in, &out, &w);
        ok = ok && in == 3 && out == 3 && w;
        MPI_Comm_free(&topo);
    }
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    printf("distgraph rank %d/%d: %s\n", rank, size, all ? "OK" : "WRONG");
    MPI_Finalize();
    return all ? 0 : 1;
}
