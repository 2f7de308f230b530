/* comm_nccl.cu — the NCCL backend of the communicator (device memory, one GPU per rank): every operation is enqueued
 * on the communicator's own CUDA stream, so it overlaps the compute stream; a started operation's handle is a CUDA
 * event recorded after it, and k3c_comm_wait makes the calling thread's stream wait for that event (blocking calls
 * synchronise the communication stream). Host buffers are accepted too (the parallel step's counts, scalars and
 * host-side rows): each is staged through device memory on the communication stream, and an operation that writes a
 * host buffer completes before it returns. Bootstrapped by broadcasting the NCCL unique id over another communicator
 * (MPI) or through a rendezvous file. Built by `make nccl` where NCCL's headers exist (not part of `make cuda`).
 * Spec: docs/PARALLEL.md "Communicator". */
extern "C" {
#include "parallel/comm.h"
}

#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

namespace {

struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream; /* communication stream, separate from the compute stream */
};

struct nccl_req {
    const k3c_comm_ops *ops; /* first: k3c_comm_wait finds the backend here */
    cudaEvent_t done;
};

extern const k3c_comm_ops nccl_ops;

nccl_state *st(const k3c_comm *c) { return static_cast<nccl_state *>(c->impl); }

int nccl_fail(k3c_err *err, const char *op, ncclResult_t r) {
    return k3c_errf(err, K3C_EDEVICE, "NCCL %s: %s", op, ncclGetErrorString(r));
}

int cuda_fail(k3c_err *err, const char *op, cudaError_t r) {
    return k3c_errf(err, K3C_EDEVICE, "NCCL %s: CUDA %s", op, cudaGetErrorString(r));
}

ncclDataType_t nccl_type(k3c_dtype t) {
    switch (t) {
    case K3C_F64: return ncclFloat64;
    case K3C_F32: return ncclFloat32;
    case K3C_I64: return ncclInt64;
    case K3C_I32: return ncclInt32;
    case K3C_BF16: return ncclBfloat16;
    case K3C_F16: return ncclFloat16;
    default: return ncclUint8;
    }
}

ncclRedOp_t nccl_op(k3c_comm_op op) { return op == K3C_COMM_MAX ? ncclMax : op == K3C_COMM_MIN ? ncclMin : ncclSum; }

/* After the enqueued operation: a handle (req) or a synchronised stream (blocking). */
int finish(k3c_comm *c, const char *op, ncclResult_t r, k3c_comm_req **req, k3c_err *err) {
    if (r != ncclSuccess) return nccl_fail(err, op, r);
    if (!req) {
        cudaError_t e = cudaStreamSynchronize(st(c)->stream);
        return e == cudaSuccess ? K3C_OK : cuda_fail(err, op, e);
    }
    nccl_req *q = static_cast<nccl_req *>(calloc(1, sizeof(nccl_req)));
    if (!q) return k3c_errf(err, K3C_ENOMEM, "NCCL %s: out of memory", op);
    q->ops = &nccl_ops;
    cudaError_t e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(q->done, st(c)->stream);
    if (e != cudaSuccess) {
        free(q);
        return cuda_fail(err, op, e);
    }
    *req = reinterpret_cast<k3c_comm_req *>(q);
    return K3C_OK;
}

/* ---------------------------------------------------------------- host buffers
 * NCCL moves device memory only. A host pointer (pageable or registered: cudaPointerGetAttributes says "unregistered"
 * or "host") is replaced by a device copy on the communication stream, its contents uploaded first (in-place and
 * partly written outputs keep what the operation does not write) and, for an output, downloaded after the operation;
 * the copies are freed in stream order. An operation with a staged output is blocking (its handle is NULL), so the
 * host buffer holds the result when the call returns. */
struct staged {
    void *host, *dev;
    size_t bytes;
    bool out;
};

struct staging {
    staged s[2];
    int n;
    cudaError_t e;
};

bool on_host(const void *p) {
    if (!p) return false;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* older runtimes fail on plain host memory: clear the error it left */
        return true;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

/* The device pointer to use for p (bytes long; out: the operation writes it). */
void *stage(k3c_comm *c, staging *g, const void *p, size_t bytes, bool out) {
    void *hp = const_cast<void *>(p);
    for (int i = 0; i < g->n; i++)
        if (g->s[i].host == hp) { /* in place: one copy serves both */
            g->s[i].out = g->s[i].out || out;
            return g->s[i].dev;
        }
    if (!on_host(p) || !bytes || g->e != cudaSuccess || g->n == 2) return hp;
    staged *s = &g->s[g->n];
    *s = {hp, nullptr, bytes, out};
    g->e = cudaMallocAsync(&s->dev, bytes, st(c)->stream);
    if (g->e == cudaSuccess) g->e = cudaMemcpyAsync(s->dev, p, bytes, cudaMemcpyHostToDevice, st(c)->stream);
    if (g->e != cudaSuccess) return hp;
    g->n++;
    return s->dev;
}

bool has_output(const staging *g) {
    for (int i = 0; i < g->n; i++)
        if (g->s[i].out) return true;
    return false;
}

/* After the operation is enqueued: outputs copied back, the copies freed (stream-ordered). */
int unstage(k3c_comm *c, staging *g, const char *op, k3c_err *err) {
    cudaError_t e = g->e;
    for (int i = 0; i < g->n; i++) {
        if (e == cudaSuccess && g->s[i].out)
            e = cudaMemcpyAsync(g->s[i].host, g->s[i].dev, g->s[i].bytes, cudaMemcpyDeviceToHost, st(c)->stream);
        cudaFreeAsync(g->s[i].dev, st(c)->stream);
    }
    return e == cudaSuccess ? K3C_OK : cuda_fail(err, op, e);
}

/* The end of an operation with staged buffers: copies back, then finish (blocking when a host buffer is written). */
int finish_staged(k3c_comm *c, staging *g, const char *op, ncclResult_t r, k3c_comm_req **req, k3c_err *err) {
    if (int e = unstage(c, g, op, err)) {
        cudaStreamSynchronize(st(c)->stream);
        return e;
    }
    return finish(c, op, r, has_output(g) ? nullptr : req, err);
}

/* Elements spanned by blocks at displs (or consecutive when displs is NULL) of the given counts. */
size_t extent(const k3c_comm *c, const int64_t *counts, const int64_t *displs) {
    int64_t end = 0, off = 0;
    for (int p = 0; p < c->size; p++) {
        int64_t d = displs ? displs[p] : off;
        if (counts[p] && d + counts[p] > end) end = d + counts[p];
        off += counts[p];
    }
    return (size_t)end;
}

/* The communication stream first waits for the work the caller's (legacy default / per-thread) stream enqueued, so
 * an operation never reads a buffer before the compute that writes it. */
int after_compute(k3c_comm *c, const char *op, k3c_err *err) {
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(st(c)->stream, ev, 0);
    cudaEventDestroy(ev);
    return e == cudaSuccess ? K3C_OK : cuda_fail(err, op, e);
}

int n_allreduce(k3c_comm *c, const void *send, void *recv, int64_t n, k3c_dtype t, k3c_comm_op op, k3c_comm_req **req,
                k3c_err *err) {
    if (int e = after_compute(c, "allreduce", err)) return e;
    staging g = {};
    const size_t bytes = (size_t)n * k3c_dtype_size(t);
    const void *s = stage(c, &g, send, bytes, false);
    void *d = stage(c, &g, recv, bytes, true);
    ncclResult_t r = g.e == cudaSuccess
                         ? ncclAllReduce(s, d, (size_t)n, nccl_type(t), nccl_op(op), st(c)->comm, st(c)->stream)
                         : ncclSuccess;
    return finish_staged(c, &g, "allreduce", r, req, err);
}

/* Uneven blocks: one reduce per block to its owner, grouped (NCCL's reduce-scatter needs equal counts). In place, the
 * result lands at the start of recv as the interface says, so a block is reduced to a scratch-free spot only when it
 * does not overlap: rank r's own block is reduced onto itself and then moved. */
int n_reduce_scatter(k3c_comm *c, const void *send, void *recv, const int64_t *counts, k3c_dtype t, k3c_comm_op op,
                     k3c_comm_req **req, k3c_err *err) {
    if (int e = after_compute(c, "reduce_scatter", err)) return e;
    size_t es = k3c_dtype_size(t), off = 0, mine = 0;
    staging g = {};
    const bool in_place = send == recv;
    const char *s = static_cast<const char *>(stage(c, &g, send, extent(c, counts, nullptr) * es, in_place));
    if (!in_place)
        recv = stage(c, &g, recv, (size_t)counts[c->rank] * es, true);
    else
        recv = const_cast<char *>(s);
    send = s;
    if (g.e != cudaSuccess) return finish_staged(c, &g, "reduce_scatter", ncclSuccess, req, err);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < c->size; p++) {
        if (p == c->rank) mine = off;
        void *dst = p == c->rank ? (send == recv ? (void *)(s + off * es) : recv) : nullptr;
        r = ncclReduce(s + off * es, dst, (size_t)counts[p], nccl_type(t), nccl_op(op), p, st(c)->comm, st(c)->stream);
        off += (size_t)counts[p];
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r == ncclSuccess && send == recv && mine && counts[c->rank]) {
        cudaError_t e =
            cudaMemcpyAsync(recv, s + mine * es, (size_t)counts[c->rank] * es, cudaMemcpyDeviceToDevice, st(c)->stream);
        if (e != cudaSuccess) g.e = e;
    }
    return finish_staged(c, &g, "reduce_scatter", r, req, err);
}

/* All-gather with uneven blocks: every rank broadcasts its block, grouped. */
int n_allgather(k3c_comm *c, const void *send, void *recv, const int64_t *counts, const int64_t *displs, k3c_dtype t,
                k3c_comm_req **req, k3c_err *err) {
    if (int e = after_compute(c, "allgather", err)) return e;
    size_t es = k3c_dtype_size(t);
    staging g = {};
    send = stage(c, &g, send, (size_t)counts[c->rank] * es, false);
    char *rv = static_cast<char *>(stage(c, &g, recv, extent(c, counts, displs) * es, true));
    if (g.e != cudaSuccess) return finish_staged(c, &g, "allgather", ncclSuccess, req, err);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < c->size; p++) {
        const void *src = p == c->rank ? (send ? send : rv + (size_t)displs[p] * es) : nullptr;
        r = ncclBroadcast(src, rv + (size_t)displs[p] * es, (size_t)counts[p], nccl_type(t), p, st(c)->comm,
                          st(c)->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    return finish_staged(c, &g, "allgather", r == ncclSuccess ? r2 : r, req, err);
}

/* All-to-all(v): paired sends and receives in one group. */
int n_alltoall(k3c_comm *c, const void *send, const int64_t *scounts, const int64_t *sdispls, void *recv,
               const int64_t *rcounts, const int64_t *rdispls, k3c_dtype t, k3c_comm_req **req, k3c_err *err) {
    if (int e = after_compute(c, "alltoall", err)) return e;
    size_t es = k3c_dtype_size(t);
    staging g = {};
    const char *s = static_cast<const char *>(stage(c, &g, send, extent(c, scounts, sdispls) * es, false));
    char *rv = static_cast<char *>(stage(c, &g, recv, extent(c, rcounts, rdispls) * es, true));
    if (g.e != cudaSuccess) return finish_staged(c, &g, "alltoall", ncclSuccess, req, err);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < c->size; p++) {
        if (scounts[p])
            r = ncclSend(s + (size_t)sdispls[p] * es, (size_t)scounts[p], nccl_type(t), p, st(c)->comm, st(c)->stream);
        if (r == ncclSuccess && rcounts[p])
            r = ncclRecv(rv + (size_t)rdispls[p] * es, (size_t)rcounts[p], nccl_type(t), p, st(c)->comm, st(c)->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    return finish_staged(c, &g, "alltoall", r == ncclSuccess ? r2 : r, req, err);
}

/* NCCL matches point-to-point calls by order between a pair of ranks, not by tag: tags are accepted and ignored, so
 * callers must post sends and receives between two ranks in the same order. */
int n_send(k3c_comm *c, const void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req, k3c_err *err) {
    if (int e = after_compute(c, "send", err)) return e;
    staging g = {};
    const void *b = stage(c, &g, buf, (size_t)n * k3c_dtype_size(t), false);
    ncclResult_t r =
        g.e == cudaSuccess ? ncclSend(b, (size_t)n, nccl_type(t), peer, st(c)->comm, st(c)->stream) : ncclSuccess;
    return finish_staged(c, &g, "send", r, req, err);
}

int n_recv(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req, k3c_err *err) {
    if (int e = after_compute(c, "recv", err)) return e;
    staging g = {};
    void *b = stage(c, &g, buf, (size_t)n * k3c_dtype_size(t), true);
    ncclResult_t r =
        g.e == cudaSuccess ? ncclRecv(b, (size_t)n, nccl_type(t), peer, st(c)->comm, st(c)->stream) : ncclSuccess;
    return finish_staged(c, &g, "recv", r, req, err);
}

int n_bcast(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int root, k3c_comm_req **req, k3c_err *err) {
    if (int e = after_compute(c, "bcast", err)) return e;
    staging g = {};
    void *b = stage(c, &g, buf, (size_t)n * k3c_dtype_size(t), true);
    ncclResult_t r = g.e == cudaSuccess ? ncclBroadcast(b, b, (size_t)n, nccl_type(t), root, st(c)->comm, st(c)->stream)
                                        : ncclSuccess;
    return finish_staged(c, &g, "bcast", r, req, err);
}

/* A one-element all-reduce, synchronised: every rank has reached it when it returns. */
int n_barrier(k3c_comm *c, k3c_err *err) {
    int32_t *d = nullptr;
    cudaError_t e = cudaMallocAsync(reinterpret_cast<void **>(&d), sizeof(int32_t), st(c)->stream);
    if (e != cudaSuccess) return cuda_fail(err, "barrier", e);
    ncclResult_t r = ncclAllReduce(d, d, 1, ncclInt32, ncclSum, st(c)->comm, st(c)->stream);
    cudaFreeAsync(d, st(c)->stream);
    return finish(c, "barrier", r, nullptr, err);
}

int wrap(ncclComm_t comm, k3c_comm **out, k3c_err *err) {
    k3c_comm *c = static_cast<k3c_comm *>(calloc(1, sizeof(k3c_comm)));
    nccl_state *s = static_cast<nccl_state *>(calloc(1, sizeof(nccl_state)));
    cudaError_t e = cudaErrorMemoryAllocation;
    if (!c || !s || (e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        free(s);
        ncclCommDestroy(comm);
        return cuda_fail(err, "communicator", e);
    }
    s->comm = comm;
    c->ops = &nccl_ops;
    c->impl = s;
    ncclCommUserRank(comm, &c->rank);
    ncclCommCount(comm, &c->size);
    *out = c;
    return K3C_OK;
}

int n_split(k3c_comm *c, int color, int key, k3c_comm **out, k3c_err *err) {
    ncclComm_t sub;
    ncclResult_t r = ncclCommSplit(st(c)->comm, color, key, &sub, nullptr);
    if (r != ncclSuccess) return nccl_fail(err, "split", r);
    return wrap(sub, out, err);
}

/* The caller's stream waits for the operation (the host does not): later compute on it sees the result. */
int n_wait(k3c_comm_req *req, k3c_err *err) {
    nccl_req *q = reinterpret_cast<nccl_req *>(req);
    cudaError_t e = cudaStreamWaitEvent(cudaStreamPerThread, q->done, 0);
    cudaEventDestroy(q->done);
    free(q);
    return e == cudaSuccess ? K3C_OK : cuda_fail(err, "wait", e);
}

void n_free(k3c_comm *c) {
    nccl_state *s = st(c);
    cudaStreamSynchronize(s->stream);
    ncclCommDestroy(s->comm);
    cudaStreamDestroy(s->stream);
    free(s);
    free(c);
}

const k3c_comm_ops nccl_ops = {"nccl", n_allreduce, n_reduce_scatter, n_allgather, n_alltoall, n_send,
                               n_recv, n_bcast,     n_barrier,        n_split,     n_wait,     n_free};

/* Rank 0 writes the id to path (temporary file + rename: readers never see half of it); the others wait for it. */
int file_rendezvous(const char *path, int rank, ncclUniqueId *id, k3c_err *err) {
    if (rank == 0) {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0)
            return k3c_errf(err, K3C_EIO, "NCCL rendezvous %s: cannot write: %s", path, strerror(errno));
        return K3C_OK;
    }
    for (int tries = 0; tries < 6000; tries++) { /* 10 minutes */
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return K3C_OK;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, nullptr);
    }
    return k3c_errf(err, K3C_EIO, "NCCL rendezvous %s: rank 0 never wrote the id", path);
}

} // namespace

extern "C" int k3c_comm_nccl(k3c_comm *boot, const char *rendezvous, int rank, int size, int device, k3c_comm **out,
                             k3c_err *err) {
    *out = nullptr;
    if (boot) rank = boot->rank, size = boot->size;
    if (rank < 0 || rank >= size) return k3c_errf(err, K3C_EINVAL, "NCCL: rank %d outside a group of %d", rank, size);
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) return cuda_fail(err, "device", ce);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (r != ncclSuccess) return nccl_fail(err, "unique id", r);
    int e =
        boot ? k3c_comm_bcast(boot, &id, (int64_t)sizeof id, K3C_U8, 0, nullptr, err)
        : rendezvous
            ? file_rendezvous(rendezvous, rank, &id, err)
            : (size == 1 ? K3C_OK : k3c_errf(err, K3C_EINVAL, "NCCL: %d ranks need MPI or a rendezvous file", size));
    if (e) return e;
    ncclComm_t comm;
    if ((r = ncclCommInitRank(&comm, size, id, rank)) != ncclSuccess) return nccl_fail(err, "init", r);
    return wrap(comm, out, err);
}
