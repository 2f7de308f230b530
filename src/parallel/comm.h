/* comm.h — the communicator every parallel piece of k3c talks through: all-reduce, reduce-scatter, all-gather(v),
 * all-to-all(v), send / recv, broadcast and barrier on a group of ranks and on sub-groups split from it, each
 * blocking or started asynchronously and finished with k3c_comm_wait, so communication can overlap compute.
 * Backends: "self" (one rank, comm.c), MPI (host memory, comm_mpi.c) and NCCL (device memory, comm_nccl.cu).
 * Spec: docs/PARALLEL.md "Communicator".
 *
 * Buffers hold `n` elements of a k3c_dtype (F64, F32, BF16, F16, I64, I32, U8; reductions take F64, F32, I64, I32).
 * A collective's send and recv may be the same pointer (in place). Counts and displacements are in elements. A request
 * (k3c_comm_req) keeps pointers to the caller's buffers and count arrays: they must stay valid, and the buffers
 * untouched, until k3c_comm_wait returns. Every rank of a group calls a collective in the same order. */
#ifndef K3C_DIST_COMM_H
#define K3C_DIST_COMM_H

#include "base/base.h"
#include "k3c/train.h"

typedef enum { K3C_COMM_SUM = 0, K3C_COMM_MAX = 1, K3C_COMM_MIN = 2 } k3c_comm_op;

typedef struct k3c_comm_req k3c_comm_req;

/* A backend's entries. req == NULL asks for a blocking call; otherwise *req gets a handle for k3c_comm_wait (or NULL
 * when the operation has already completed). Arguments are checked by the k3c_comm_* wrappers before they get here. */
typedef struct {
    const char *name;
    int (*allreduce)(k3c_comm *c, const void *send, void *recv, int64_t n, k3c_dtype t, k3c_comm_op op,
                     k3c_comm_req **req, k3c_err *err);
    int (*reduce_scatter)(k3c_comm *c, const void *send, void *recv, const int64_t *counts, k3c_dtype t, k3c_comm_op op,
                          k3c_comm_req **req, k3c_err *err);
    int (*allgather)(k3c_comm *c, const void *send, void *recv, const int64_t *counts, const int64_t *displs,
                     k3c_dtype t, k3c_comm_req **req, k3c_err *err);
    int (*alltoall)(k3c_comm *c, const void *send, const int64_t *scounts, const int64_t *sdispls, void *recv,
                    const int64_t *rcounts, const int64_t *rdispls, k3c_dtype t, k3c_comm_req **req, k3c_err *err);
    int (*send)(k3c_comm *c, const void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req,
                k3c_err *err);
    int (*recv)(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req, k3c_err *err);
    int (*bcast)(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int root, k3c_comm_req **req, k3c_err *err);
    int (*barrier)(k3c_comm *c, k3c_err *err);
    int (*split)(k3c_comm *c, int color, int key, k3c_comm **out, k3c_err *err);
    int (*wait)(k3c_comm_req *req, k3c_err *err); /* frees req */
    void (*free)(k3c_comm *c);
} k3c_comm_ops;

struct k3c_comm {
    const k3c_comm_ops *ops;
    void *impl;
    int rank, size;
};

/* ---------------------------------------------------------------- making communicators (more: k3c/train.h) */
/* The one-rank communicator: every collective is a copy, send / recv to rank 0 match by tag. */
int k3c_comm_self(k3c_comm **out, k3c_err *err);
/* MPI_COMM_WORLD (initialising MPI on first use, MPI_THREAD_FUNNELED: only the calling thread communicates). */
int k3c_comm_mpi_world(k3c_comm **out, k3c_err *err);
/* K3C_EUNSUPPORTED naming `what` (the parallel piece) when c cannot reach the memory of the backend named `backend`:
 * a device backend needs the NCCL communicator (self and MPI move host memory); NCCL takes host buffers too (staged
 * through device memory), so the CPU backend runs over any communicator. */
int k3c_comm_check_memory(const k3c_comm *c, const char *backend, const char *what, k3c_err *err);

/* ---------------------------------------------------------------- operations (checked wrappers over the ops) */
int k3c_comm_allreduce(k3c_comm *c, const void *send, void *recv, int64_t n, k3c_dtype t, k3c_comm_op op,
                       k3c_comm_req **req, k3c_err *err);
/* send: sum(counts) elements, rank r's block at the prefix sum of counts[0..r); recv: counts[rank] elements. */
int k3c_comm_reduce_scatter(k3c_comm *c, const void *send, void *recv, const int64_t *counts, k3c_dtype t,
                            k3c_comm_op op, k3c_comm_req **req, k3c_err *err);
/* recv + displs[r] ← rank r's counts[r] elements from its send; send == NULL: in place (each rank's block is already
 * at recv + displs[rank]). */
int k3c_comm_allgather(k3c_comm *c, const void *send, void *recv, const int64_t *counts, const int64_t *displs,
                       k3c_dtype t, k3c_comm_req **req, k3c_err *err);
/* Rank r sends scounts[p] elements from send + sdispls[p] to each rank p and receives rcounts[p] from p at
 * recv + rdispls[p] (rcounts on p must equal scounts on the sender). */
int k3c_comm_alltoall(k3c_comm *c, const void *send, const int64_t *scounts, const int64_t *sdispls, void *recv,
                      const int64_t *rcounts, const int64_t *rdispls, k3c_dtype t, k3c_comm_req **req, k3c_err *err);
int k3c_comm_send(k3c_comm *c, const void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req,
                  k3c_err *err);
int k3c_comm_recv(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req, k3c_err *err);
int k3c_comm_bcast(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int root, k3c_comm_req **req, k3c_err *err);
int k3c_comm_barrier(k3c_comm *c, k3c_err *err);
/* Sub-groups: ranks with the same color form one communicator, ordered by (key, rank). */
int k3c_comm_split(k3c_comm *c, int color, int key, k3c_comm **out, k3c_err *err);
/* Completes a started operation (req may be NULL: already complete) and frees the handle. */
int k3c_comm_wait(k3c_comm_req *req, k3c_err *err);

/* Element size of t for communication, 0 for an unknown dtype. */
size_t k3c_comm_dtype_size(k3c_dtype t);

#endif
