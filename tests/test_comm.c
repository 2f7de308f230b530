/* test_comm.c — every operation of the communicator (src/parallel/comm.h) against hand-computed results: on the one-rank
 * self communicator here, and on 2 and 4 MPI ranks (the program relaunches itself under mpirun, tests/mpi_launch.h),
 * blocking and started/waited, in place, on the world and on split sub-groups, plus the argument errors. */
#include "test.h"

#include "mpi_launch.h"

#define N 37

/* rank r, element i: a value every rank can predict for every other */
static double val(int r, int i) { return r * 10.0 + i; }

static void t_allreduce(k3c_comm *c, int async) {
    int R = c->size, me = c->rank;
    double S = R * (R - 1) / 2.0;
    k3c_err err = {0};
    float xf[N], yf[N];
    double xd[N];
    int64_t xl[N];
    int32_t xi[N], yi[N];
    for (int i = 0; i < N; i++)
        xf[i] = (float)val(me, i), xd[i] = val(me, i), xl[i] = (int64_t)val(me, i), xi[i] = (int32_t)val(me, i);
    k3c_comm_req *q[4] = {0};
    CHECK_OK(k3c_comm_allreduce(c, xf, yf, N, K3C_F32, K3C_COMM_SUM, async ? &q[0] : NULL, &err), &err);
    CHECK_OK(k3c_comm_allreduce(c, xd, xd, N, K3C_F64, K3C_COMM_MAX, async ? &q[1] : NULL, &err), &err); /* in place */
    CHECK_OK(k3c_comm_allreduce(c, xl, xl, N, K3C_I64, K3C_COMM_MIN, async ? &q[2] : NULL, &err), &err);
    CHECK_OK(k3c_comm_allreduce(c, xi, yi, N, K3C_I32, K3C_COMM_SUM, async ? &q[3] : NULL, &err), &err);
    for (int k = 0; k < 4; k++) CHECK_OK(k3c_comm_wait(q[k], &err), &err);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bad += yf[i] != (float)(10 * S + R * i);
        bad += xd[i] != val(R - 1, i);
        bad += xl[i] != i;
        bad += yi[i] != (int32_t)(10 * S + R * i);
    }
    CHECK(bad == 0, "allreduce (async %d): %d wrong elements", async, bad);
}

static void t_reduce_scatter(k3c_comm *c, int async) {
    int R = c->size, me = c->rank;
    int64_t counts[8] = {0}, total = 0, off = 0;
    for (int r = 0; r < R; r++) counts[r] = r + 1, total += r + 1;
    for (int r = 0; r < me; r++) off += counts[r];
    double *x = malloc(sizeof(double) * (size_t)total), y[8];
    for (int64_t j = 0; j < total; j++) x[j] = me + (double)j;
    k3c_err err = {0};
    k3c_comm_req *q = NULL;
    CHECK_OK(k3c_comm_reduce_scatter(c, x, y, counts, K3C_F64, K3C_COMM_SUM, async ? &q : NULL, &err), &err);
    CHECK_OK(k3c_comm_wait(q, &err), &err);
    int bad = 0;
    for (int i = 0; i < counts[me]; i++) bad += y[i] != R * (R - 1) / 2.0 + R * (double)(off + i);
    CHECK(bad == 0, "reduce_scatter (async %d): %d wrong elements", async, bad);
    /* in place: the result lands at the start of the buffer */
    CHECK_OK(k3c_comm_reduce_scatter(c, x, x, counts, K3C_F64, K3C_COMM_MAX, NULL, &err), &err);
    bad = 0;
    for (int i = 0; i < counts[me]; i++) bad += x[i] != (R - 1) + (double)(off + i);
    CHECK(bad == 0, "reduce_scatter in place: %d wrong elements", bad);
    free(x);
}

static void t_allgather(k3c_comm *c, int async) {
    int R = c->size, me = c->rank;
    int64_t counts[8] = {0}, displs[8] = {0}, total = 0;
    for (int r = 0; r < R; r++) counts[r] = 2 * r + 1, displs[r] = total + 3, total += counts[r] + 3; /* gaps */
    float *y = malloc(sizeof(float) * (size_t)total), *z = malloc(sizeof(float) * (size_t)total), x[16];
    for (int i = 0; i < counts[me]; i++) x[i] = (float)(me * 100 + i);
    for (int64_t j = 0; j < total; j++) y[j] = -1, z[j] = -1;
    for (int i = 0; i < counts[me]; i++) z[displs[me] + i] = x[i];
    k3c_err err = {0};
    k3c_comm_req *q[2] = {0};
    CHECK_OK(k3c_comm_allgather(c, x, y, counts, displs, K3C_F32, async ? &q[0] : NULL, &err), &err);
    CHECK_OK(k3c_comm_allgather(c, NULL, z, counts, displs, K3C_F32, async ? &q[1] : NULL, &err), &err); /* in place */
    for (int k = 0; k < 2; k++) CHECK_OK(k3c_comm_wait(q[k], &err), &err);
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int64_t j = displs[r] - 3; j < displs[r] + counts[r]; j++) {
            float want = j < displs[r] ? -1.0f : (float)(r * 100 + (j - displs[r]));
            bad += y[j] != want;
            bad += z[j] != want;
        }
    CHECK(bad == 0, "allgather (async %d): %d wrong elements", async, bad);
    free(y);
    free(z);
}

static void t_alltoall(k3c_comm *c, int async) {
    int R = c->size, me = c->rank;
    int64_t sc[8] = {0}, sd[8] = {0}, rc[8] = {0}, rd[8] = {0}, st = 0, rt = 0;
    for (int p = 0; p < R; p++) {
        sc[p] = me + p + 1, sd[p] = st, st += sc[p];
        rc[p] = p + me + 1, rd[p] = rt, rt += rc[p];
    }
    int32_t *s = malloc(sizeof(int32_t) * (size_t)st), *r = malloc(sizeof(int32_t) * (size_t)rt);
    for (int p = 0; p < R; p++)
        for (int i = 0; i < sc[p]; i++) s[sd[p] + i] = me * 1000 + p * 10 + i;
    k3c_err err = {0};
    k3c_comm_req *q = NULL;
    CHECK_OK(k3c_comm_alltoall(c, s, sc, sd, r, rc, rd, K3C_I32, async ? &q : NULL, &err), &err);
    CHECK_OK(k3c_comm_wait(q, &err), &err);
    int bad = 0;
    for (int p = 0; p < R; p++)
        for (int i = 0; i < rc[p]; i++) bad += r[rd[p] + i] != p * 1000 + me * 10 + i;
    CHECK(bad == 0, "alltoall (async %d): %d wrong elements", async, bad);
    free(s);
    free(r);
}

/* A ring: every rank receives from the left and sends to the right, both started before either is waited for (a
 * blocking send first would deadlock on large messages). */
static void t_sendrecv(k3c_comm *c) {
    int R = c->size, me = c->rank, right = (me + 1) % R, left = (me + R - 1) % R;
    double out[N], in[N];
    for (int i = 0; i < N; i++) out[i] = val(me, i), in[i] = -1;
    k3c_err err = {0};
    k3c_comm_req *qr = NULL, *qs = NULL;
    CHECK_OK(k3c_comm_recv(c, in, N, K3C_F64, left, 7, &qr, &err), &err);
    CHECK_OK(k3c_comm_send(c, out, N, K3C_F64, right, 7, &qs, &err), &err);
    CHECK_OK(k3c_comm_wait(qs, &err), &err);
    CHECK_OK(k3c_comm_wait(qr, &err), &err);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += in[i] != val(left, i);
    CHECK(bad == 0, "send/recv ring: %d wrong elements", bad);
    /* blocking pair with tags out of order: tag 2 then tag 1 sent, received 1 then 2 */
    double a = me, b = -me, ra = 0, rb = 0;
    k3c_comm_req *q2 = NULL, *q1 = NULL;
    CHECK_OK(k3c_comm_send(c, &a, 1, K3C_F64, right, 2, &q2, &err), &err);
    CHECK_OK(k3c_comm_send(c, &b, 1, K3C_F64, right, 1, &q1, &err), &err);
    CHECK_OK(k3c_comm_recv(c, &rb, 1, K3C_F64, left, 1, NULL, &err), &err);
    CHECK_OK(k3c_comm_recv(c, &ra, 1, K3C_F64, left, 2, NULL, &err), &err);
    CHECK_OK(k3c_comm_wait(q2, &err), &err);
    CHECK_OK(k3c_comm_wait(q1, &err), &err);
    CHECK(ra == left && rb == -left, "tagged send/recv: got %g, %g from rank %d", ra, rb, left);
}

static void t_bcast(k3c_comm *c, int async) {
    int R = c->size, me = c->rank;
    uint16_t x[N]; /* bf16 bits: moved, never reduced */
    for (int i = 0; i < N; i++) x[i] = (uint16_t)(me == R - 1 ? 0x3f80 + i : 0);
    k3c_err err = {0};
    k3c_comm_req *q = NULL;
    CHECK_OK(k3c_comm_bcast(c, x, N, K3C_BF16, R - 1, async ? &q : NULL, &err), &err);
    CHECK_OK(k3c_comm_wait(q, &err), &err);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += x[i] != 0x3f80 + i;
    CHECK(bad == 0, "bcast (async %d): %d wrong elements", async, bad);
}

/* Sub-groups: the even and the odd ranks, each ordered by descending world rank (key −rank). */
static void t_split(k3c_comm *c) {
    int R = c->size, me = c->rank;
    k3c_err err = {0};
    k3c_comm *sub = NULL;
    CHECK_OK(k3c_comm_split(c, me % 2, -me, &sub, &err), &err);
    if (!sub) return;
    int n = 0, higher = 0;
    int64_t sum = 0;
    for (int r = me % 2; r < R; r += 2) n++, sum += r, higher += r > me;
    CHECK(sub->size == n && sub->rank == higher, "split: rank %d of %d, expected %d of %d", sub->rank, sub->size,
          higher, n);
    int64_t x = me;
    CHECK_OK(k3c_comm_allreduce(sub, &x, &x, 1, K3C_I64, K3C_COMM_SUM, NULL, &err), &err);
    CHECK(x == sum, "allreduce on the sub-group: %lld, expected %lld", (long long)x, (long long)sum);
    t_allgather(sub, 1);
    t_alltoall(sub, 0);
    k3c_comm_free(sub);
    CHECK_OK(k3c_comm_barrier(c, &err), &err);
}

static void t_errors(k3c_comm *c) {
    k3c_err err = {0};
    double x = 0;
    CHECK(k3c_comm_send(c, &x, 1, K3C_F64, c->size, 0, NULL, &err) == K3C_EINVAL && strstr(err.msg, "outside"),
          "send to a rank outside the group: %s", err.msg);
    CHECK(k3c_comm_allreduce(c, &x, &x, 1, K3C_BF16, K3C_COMM_SUM, NULL, &err) == K3C_EINVAL &&
              strstr(err.msg, "cannot reduce"),
          "bf16 reduction: %s", err.msg);
    int64_t neg[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    CHECK(k3c_comm_reduce_scatter(c, &x, &x, neg, K3C_F64, K3C_COMM_SUM, NULL, &err) == K3C_EINVAL,
          "negative counts: %s", err.msg);
    if (c->size == 1) { /* a receive that nothing can ever match */
        CHECK(k3c_comm_recv(c, &x, 1, K3C_F64, 0, 3, NULL, &err) == K3C_EINVAL && strstr(err.msg, "nothing was sent"),
              "self recv without send: %s", err.msg);
        k3c_comm_req *q = NULL;
        CHECK_OK(k3c_comm_recv(c, &x, 1, K3C_F64, 0, 3, &q, &err), &err);
        CHECK(k3c_comm_wait(q, &err) == K3C_EINVAL, "waiting on an unmatched self receive: %s", err.msg);
    }
}

static void run_all(k3c_comm *c) {
    if (c->size == 1)
        CHECK(c->rank == 0 && !strcmp(c->ops->name, "self"), "a one-rank world is the self communicator: %s",
              c->ops->name);
    for (int async = 0; async < 2; async++) {
        t_allreduce(c, async);
        t_reduce_scatter(c, async);
        t_allgather(c, async);
        t_alltoall(c, async);
        t_bcast(c, async);
    }
    t_sendrecv(c);
    t_split(c);
    t_errors(c);
}

int main(int argc, char **argv) {
    return test_mpi_main(argv[0], run_all);
}
