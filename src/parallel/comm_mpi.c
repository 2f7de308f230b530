/* comm_mpi.c — the MPI backend of the communicator (host memory; OpenMPI from Debian): every operation is the MPI-3
 * non-blocking collective or point-to-point call, so a started operation progresses while the caller computes.
 * Built with MPI when the Makefile finds it (K3C_MPI, flags from `mpicc --showme`); otherwise the entry points say so.
 * Spec: docs/PARALLEL.md "Communicator". */
#include "parallel/comm.h"

#ifdef K3C_MPI
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

int k3c_comm_mpi_available(void) { return 1; }

typedef struct {
    const k3c_comm_ops *ops; /* first: k3c_comm_wait finds the backend here */
    MPI_Request r;
    int *counts; /* int count / displacement arrays MPI reads until completion (v-collectives) */
} mpi_req;

static const k3c_comm_ops mpi_ops;

static MPI_Comm comm_of(const k3c_comm *c) { return *(const MPI_Comm *)c->impl; }

static int mpi_fail(k3c_err *err, const char *op, int code) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", code);
    return k3c_errf(err, K3C_EDEVICE, "MPI %s: %s", op, msg);
}

static MPI_Datatype mpi_type(k3c_dtype t) {
    switch (t) {
    case K3C_F64: return MPI_DOUBLE;
    case K3C_F32: return MPI_FLOAT;
    case K3C_I64: return MPI_INT64_T;
    case K3C_I32: return MPI_INT32_T;
    case K3C_BF16:
    case K3C_F16: return MPI_UINT16_T; /* moved, never reduced */
    default: return MPI_UINT8_T;
    }
}

static MPI_Op mpi_op(k3c_comm_op op) { return op == K3C_COMM_MAX ? MPI_MAX : op == K3C_COMM_MIN ? MPI_MIN : MPI_SUM; }

static int to_int(const char *op, int64_t v, int *out, k3c_err *err) {
    if (v > INT_MAX)
        return k3c_errf(err, K3C_EUNSUPPORTED, "MPI %s: %lld elements exceed MPI's int count (split the buffer)", op,
                        (long long)v);
    *out = (int)v;
    return K3C_OK;
}

/* A request with room for n ints of counts (n = 0: none). */
static mpi_req *req_new(int n) {
    mpi_req *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->ops = &mpi_ops;
    q->r = MPI_REQUEST_NULL;
    if (n && !(q->counts = malloc(sizeof(int) * (size_t)n))) {
        free(q);
        return NULL;
    }
    return q;
}

static void req_free(mpi_req *q) {
    if (!q) return;
    free(q->counts);
    free(q);
}

/* Finishes a started call: hands the request out (req != NULL) or waits for it here (blocking call). */
static int finish(const char *op, int code, mpi_req *q, k3c_comm_req **req, k3c_err *err) {
    if (code != MPI_SUCCESS) {
        req_free(q);
        return mpi_fail(err, op, code);
    }
    if (req) {
        *req = (k3c_comm_req *)q;
        return K3C_OK;
    }
    code = MPI_Wait(&q->r, MPI_STATUS_IGNORE);
    req_free(q);
    return code == MPI_SUCCESS ? K3C_OK : mpi_fail(err, op, code);
}

static int nomem(k3c_err *err, const char *op) { return k3c_errf(err, K3C_ENOMEM, "MPI %s: out of memory", op); }

static int m_allreduce(k3c_comm *c, const void *send, void *recv, int64_t n, k3c_dtype t, k3c_comm_op op,
                       k3c_comm_req **req, k3c_err *err) {
    int cn = 0;
    int e = to_int("allreduce", n, &cn, err);
    if (e) return e;
    mpi_req *q = req_new(0);
    if (!q) return nomem(err, "allreduce");
    int code = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, cn, mpi_type(t), mpi_op(op), comm_of(c), &q->r);
    return finish("allreduce", code, q, req, err);
}

/* counts (and displs) as ints in q->counts[0..size) (and [size..2 size)). */
static int fill_counts(const char *op, const k3c_comm *c, const int64_t *counts, const int64_t *displs, int *out,
                       k3c_err *err) {
    for (int r = 0; r < c->size; r++) {
        int e = to_int(op, counts[r], &out[r], err);
        if (!e && displs) e = to_int(op, displs[r], &out[c->size + r], err);
        if (e) return e;
    }
    return K3C_OK;
}

static int m_reduce_scatter(k3c_comm *c, const void *send, void *recv, const int64_t *counts, k3c_dtype t,
                            k3c_comm_op op, k3c_comm_req **req, k3c_err *err) {
    mpi_req *q = req_new(c->size);
    if (!q) return nomem(err, "reduce_scatter");
    int e = fill_counts("reduce_scatter", c, counts, NULL, q->counts, err);
    if (e) {
        req_free(q);
        return e;
    }
    /* in place: MPI_IN_PLACE takes the whole input from recv, the result lands at its start */
    int code = MPI_Ireduce_scatter(send == recv ? MPI_IN_PLACE : send, recv, q->counts, mpi_type(t), mpi_op(op),
                                   comm_of(c), &q->r);
    return finish("reduce_scatter", code, q, req, err);
}

static int m_allgather(k3c_comm *c, const void *send, void *recv, const int64_t *counts, const int64_t *displs,
                       k3c_dtype t, k3c_comm_req **req, k3c_err *err) {
    mpi_req *q = req_new(2 * c->size);
    if (!q) return nomem(err, "allgather");
    int e = fill_counts("allgather", c, counts, displs, q->counts, err);
    if (e) {
        req_free(q);
        return e;
    }
    int code = MPI_Iallgatherv(send ? send : MPI_IN_PLACE, send ? q->counts[c->rank] : 0, mpi_type(t), recv, q->counts,
                               q->counts + c->size, mpi_type(t), comm_of(c), &q->r);
    return finish("allgather", code, q, req, err);
}

static int m_alltoall(k3c_comm *c, const void *send, const int64_t *scounts, const int64_t *sdispls, void *recv,
                      const int64_t *rcounts, const int64_t *rdispls, k3c_dtype t, k3c_comm_req **req, k3c_err *err) {
    mpi_req *q = req_new(4 * c->size);
    if (!q) return nomem(err, "alltoall");
    int e = fill_counts("alltoall", c, scounts, sdispls, q->counts, err);
    if (!e) e = fill_counts("alltoall", c, rcounts, rdispls, q->counts + 2 * c->size, err);
    if (e) {
        req_free(q);
        return e;
    }
    int *sc = q->counts, *sd = q->counts + c->size, *rc = q->counts + 2 * c->size, *rd = q->counts + 3 * c->size;
    int code = MPI_Ialltoallv(send, sc, sd, mpi_type(t), recv, rc, rd, mpi_type(t), comm_of(c), &q->r);
    return finish("alltoall", code, q, req, err);
}

static int m_send(k3c_comm *c, const void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req,
                  k3c_err *err) {
    int cn = 0;
    int e = to_int("send", n, &cn, err);
    if (e) return e;
    mpi_req *q = req_new(0);
    if (!q) return nomem(err, "send");
    int code = MPI_Isend(buf, cn, mpi_type(t), peer, tag, comm_of(c), &q->r);
    return finish("send", code, q, req, err);
}

static int m_recv(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req, k3c_err *err) {
    int cn = 0;
    int e = to_int("recv", n, &cn, err);
    if (e) return e;
    mpi_req *q = req_new(0);
    if (!q) return nomem(err, "recv");
    int code = MPI_Irecv(buf, cn, mpi_type(t), peer, tag, comm_of(c), &q->r);
    return finish("recv", code, q, req, err);
}

static int m_bcast(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int root, k3c_comm_req **req, k3c_err *err) {
    int cn = 0;
    int e = to_int("bcast", n, &cn, err);
    if (e) return e;
    mpi_req *q = req_new(0);
    if (!q) return nomem(err, "bcast");
    int code = MPI_Ibcast(buf, cn, mpi_type(t), root, comm_of(c), &q->r);
    return finish("bcast", code, q, req, err);
}

static int m_barrier(k3c_comm *c, k3c_err *err) {
    int code = MPI_Barrier(comm_of(c));
    return code == MPI_SUCCESS ? K3C_OK : mpi_fail(err, "barrier", code);
}

static int wrap(MPI_Comm mc, k3c_comm **out, k3c_err *err) {
    k3c_comm *c = calloc(1, sizeof *c);
    MPI_Comm *h = malloc(sizeof *h);
    if (!c || !h) {
        free(c);
        free(h);
        return k3c_errf(err, K3C_ENOMEM, "MPI: out of memory");
    }
    *h = mc;
    *c = (k3c_comm){&mpi_ops, h, 0, 1};
    MPI_Comm_rank(mc, &c->rank);
    MPI_Comm_size(mc, &c->size);
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN); /* errors come back as codes, not aborts */
    *out = c;
    return K3C_OK;
}

static int m_split(k3c_comm *c, int color, int key, k3c_comm **out, k3c_err *err) {
    MPI_Comm mc;
    int code = MPI_Comm_split(comm_of(c), color, key, &mc);
    if (code != MPI_SUCCESS) return mpi_fail(err, "split", code);
    int e = wrap(mc, out, err);
    if (e) MPI_Comm_free(&mc);
    return e;
}

static int m_wait(k3c_comm_req *req, k3c_err *err) {
    mpi_req *q = (mpi_req *)req;
    int code = MPI_Wait(&q->r, MPI_STATUS_IGNORE);
    req_free(q);
    return code == MPI_SUCCESS ? K3C_OK : mpi_fail(err, "wait", code);
}

static void m_free(k3c_comm *c) {
    MPI_Comm *h = c->impl;
    if (*h != MPI_COMM_WORLD) MPI_Comm_free(h);
    free(h);
    free(c);
}

static const k3c_comm_ops mpi_ops = {"mpi",  m_allreduce, m_reduce_scatter, m_allgather, m_alltoall, m_send,
                                     m_recv, m_bcast,     m_barrier,        m_split,     m_wait,     m_free};

int k3c_comm_mpi_world(k3c_comm **out, k3c_err *err) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        int code = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (code != MPI_SUCCESS) return mpi_fail(err, "init", code);
    }
    return wrap(MPI_COMM_WORLD, out, err);
}

void k3c_comm_mpi_finalize(void) {
    int done = 0;
    MPI_Finalized(&done);
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited && !done) MPI_Finalize();
}

void k3c_comm_mpi_abort(int code) {
    int inited = 0, done = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&done);
    if (inited && !done) MPI_Abort(MPI_COMM_WORLD, code);
}

#else /* built without MPI */

void k3c_comm_mpi_abort(int code) {}

int k3c_comm_mpi_available(void) { return 0; }

int k3c_comm_mpi_world(k3c_comm **out, k3c_err *err) {
    *out = NULL;
    return k3c_errf(err, K3C_EUNSUPPORTED, "this k3c was built without MPI (install libopenmpi-dev and rebuild)");
}

void k3c_comm_mpi_finalize(void) {}

#endif
