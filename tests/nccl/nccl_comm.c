/* nccl_comm.c — the NCCL communicator (src/parallel/comm_nccl.cu) against hand-computed results on device buffers:
 * all-reduce (sum, max), uneven reduce-scatter and all-gather (also in place), all-to-all(v), send/recv, broadcast,
 * barrier, split, started and waited. Not a test_*.c (`make test` has no GPU): `make nccl` builds it as
 * build/nccl/test_comm_nccl, to run on a GPU machine. Alone it is a one-rank communicator; under `mpirun -np N` (one
 * GPU per rank, device = rank % GPUs) the id travels over MPI. */
#include "test.h"

#include "parallel/comm.h"

#include <cuda_runtime_api.h>

#define N 37

static double *dev(const double *h, size_t n) {
    double *d = NULL;
    cudaMalloc((void **)&d, n * sizeof(double));
    if (h) cudaMemcpy(d, h, n * sizeof(double), cudaMemcpyHostToDevice);
    return d;
}

static void host(double *h, const double *d, size_t n) {
    cudaDeviceSynchronize();
    cudaMemcpy(h, d, n * sizeof(double), cudaMemcpyDeviceToHost);
}

static void run_all(k3c_comm *c) {
    int R = c->size, me = c->rank;
    k3c_err err = {0};
    double x[64 * 8], y[64 * 8];
    for (int i = 0; i < N; i++) x[i] = me * 10.0 + i;
    double *dx = dev(x, N), *dy = dev(NULL, N);
    k3c_comm_req *q = NULL;
    CHECK_OK(k3c_comm_allreduce(c, dx, dy, N, K3C_F64, K3C_COMM_SUM, &q, &err), &err);
    CHECK_OK(k3c_comm_wait(q, &err), &err);
    host(y, dy, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += y[i] != 10.0 * R * (R - 1) / 2 + (double)R * i;
    CHECK(bad == 0, "allreduce sum: %d wrong", bad);
    CHECK_OK(k3c_comm_allreduce(c, dx, dx, N, K3C_F64, K3C_COMM_MAX, NULL, &err), &err);
    host(y, dx, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += y[i] != (R - 1) * 10.0 + i;
    CHECK(bad == 0, "allreduce max in place: %d wrong", bad);
    /* uneven blocks: rank r has r + 1 elements */
    int64_t cnt[8], dsp[8], tot = 0, off = 0;
    for (int r = 0; r < R; r++) cnt[r] = r + 1, dsp[r] = tot, tot += r + 1;
    off = dsp[me];
    for (int64_t j = 0; j < tot; j++) x[j] = me + (double)j;
    double *ds = dev(x, (size_t)tot), *dr = dev(NULL, (size_t)tot);
    CHECK_OK(k3c_comm_reduce_scatter(c, ds, dr, cnt, K3C_F64, K3C_COMM_SUM, NULL, &err), &err);
    host(y, dr, (size_t)cnt[me]);
    bad = 0;
    for (int i = 0; i < cnt[me]; i++) bad += y[i] != R * (R - 1) / 2.0 + R * (double)(off + i);
    CHECK(bad == 0, "reduce_scatter: %d wrong", bad);
    for (int i = 0; i < cnt[me]; i++) x[i] = me * 100.0 + i;
    double *dmine = dev(x, (size_t)cnt[me]);
    CHECK_OK(k3c_comm_allgather(c, dmine, dr, cnt, dsp, K3C_F64, NULL, &err), &err);
    host(y, dr, (size_t)tot);
    bad = 0;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < cnt[r]; i++) bad += y[dsp[r] + i] != r * 100.0 + i;
    CHECK(bad == 0, "allgather: %d wrong", bad);
    CHECK_OK(k3c_comm_allgather(c, NULL, dr, cnt, dsp, K3C_F64, NULL, &err), &err); /* in place: unchanged */
    host(x, dr, (size_t)tot);
    CHECK(memcmp(x, y, sizeof(double) * (size_t)tot) == 0, "allgather in place changed the data");
    /* all-to-all: rank r sends p + r + 1 elements to p */
    int64_t sc[8], sd[8], rc[8], rd[8], st = 0, rt = 0;
    for (int p = 0; p < R; p++)
        sc[p] = me + p + 1, sd[p] = st, st += sc[p], rc[p] = p + me + 1, rd[p] = rt, rt += rc[p];
    for (int p = 0; p < R; p++)
        for (int i = 0; i < sc[p]; i++) x[sd[p] + i] = me * 1000.0 + p * 10.0 + i;
    double *da = dev(x, (size_t)st), *db = dev(NULL, (size_t)rt);
    CHECK_OK(k3c_comm_alltoall(c, da, sc, sd, db, rc, rd, K3C_F64, &q, &err), &err);
    CHECK_OK(k3c_comm_wait(q, &err), &err);
    host(y, db, (size_t)rt);
    bad = 0;
    for (int p = 0; p < R; p++)
        for (int i = 0; i < rc[p]; i++) bad += y[rd[p] + i] != p * 1000.0 + me * 10.0 + i;
    CHECK(bad == 0, "alltoall: %d wrong", bad);
    /* broadcast from the last rank, barrier, a split into even and odd ranks */
    for (int i = 0; i < N; i++) x[i] = me == R - 1 ? 7.0 + i : 0.0;
    cudaMemcpy(dx, x, N * sizeof(double), cudaMemcpyHostToDevice);
    CHECK_OK(k3c_comm_bcast(c, dx, N, K3C_F64, R - 1, NULL, &err), &err);
    host(y, dx, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += y[i] != 7.0 + i;
    CHECK(bad == 0, "bcast: %d wrong", bad);
    CHECK_OK(k3c_comm_barrier(c, &err), &err);
    k3c_comm *sub = NULL;
    CHECK_OK(k3c_comm_split(c, me % 2, me, &sub, &err), &err);
    if (sub) {
        x[0] = me;
        cudaMemcpy(dx, x, sizeof(double), cudaMemcpyHostToDevice);
        CHECK_OK(k3c_comm_allreduce(sub, dx, dx, 1, K3C_F64, K3C_COMM_SUM, NULL, &err), &err);
        host(y, dx, 1);
        double want = 0;
        for (int r = me % 2; r < R; r += 2) want += r;
        CHECK(y[0] == want, "split allreduce: %g, expected %g", y[0], want);
        k3c_comm_free(sub);
    }
    double *bufs[] = {dx, dy, ds, dr, dmine, da, db};
    for (int i = 0; i < 7; i++) cudaFree(bufs[i]);
}

int main(void) {
    k3c_err err = {0};
    k3c_comm *boot = NULL, *c = NULL;
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
        printf("FAIL: no GPU\n0 passed, 1 failed\n");
        return 1;
    }
    if (k3c_comm_mpi_launched()) CHECK_OK(k3c_comm_mpi_world(&boot, &err), &err);
    int rank = boot ? boot->rank : 0;
    CHECK_OK(k3c_comm_nccl(boot, NULL, rank, boot ? boot->size : 1, rank % gpus, &c, &err), &err);
    if (c) {
        run_all(c);
        k3c_comm_free(c);
    }
    if (boot) {
        printf("rank %d: ", rank);
        k3c_comm_free(boot);
        k3c_comm_mpi_finalize();
    }
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ ? 1 : 0;
}
