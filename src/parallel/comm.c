/* comm.c — the communicator's checked entry points (argument checks shared by every backend) and the one-rank "self"
 * backend. Spec: docs/PARALLEL.md "Communicator". */
#include "parallel/comm.h"

#include "base/check.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

size_t k3c_comm_dtype_size(k3c_dtype t) { return t >= 0 && t < K3C_DTYPE_COUNT ? k3c_dtype_size(t) : 0; }

static int check_type(const char *op, k3c_dtype t, int reduce, k3c_err *err) {
    if (!k3c_comm_dtype_size(t)) return k3c_errf(err, K3C_EINVAL, "comm %s: unknown element type %d", op, (int)t);
    if (reduce && t != K3C_F64 && t != K3C_F32 && t != K3C_I64 && t != K3C_I32)
        return k3c_errf(err, K3C_EINVAL, "comm %s: cannot reduce %s elements", op, k3c_dtype_name(t));
    return K3C_OK;
}

static int check_counts(const char *op, const k3c_comm *c, const int64_t *counts, const int64_t *displs, k3c_err *err) {
    if (!counts) return k3c_errf(err, K3C_EINVAL, "comm %s: no counts", op);
    for (int r = 0; r < c->size; r++)
        if (counts[r] < 0 || (displs && displs[r] < 0))
            return k3c_errf(err, K3C_EINVAL, "comm %s: negative count or displacement for rank %d", op, r);
    return K3C_OK;
}

static int check_peer(const char *op, const k3c_comm *c, int peer, k3c_err *err) {
    if (peer < 0 || peer >= c->size)
        return k3c_errf(err, K3C_EINVAL, "comm %s: rank %d outside a group of %d", op, peer, c->size);
    return K3C_OK;
}

int k3c_comm_allreduce(k3c_comm *c, const void *send, void *recv, int64_t n, k3c_dtype t, k3c_comm_op op,
                       k3c_comm_req **req, k3c_err *err) {
    if (req) *req = NULL;
    CHECK_RC(check_type("allreduce", t, 1, err));
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "comm allreduce: negative count");
    return c->ops->allreduce(c, send, recv, n, t, op, req, err);
}

int k3c_comm_reduce_scatter(k3c_comm *c, const void *send, void *recv, const int64_t *counts, k3c_dtype t,
                            k3c_comm_op op, k3c_comm_req **req, k3c_err *err) {
    if (req) *req = NULL;
    CHECK_RC(check_type("reduce_scatter", t, 1, err));
    CHECK_RC(check_counts("reduce_scatter", c, counts, NULL, err));
    return c->ops->reduce_scatter(c, send, recv, counts, t, op, req, err);
}

int k3c_comm_allgather(k3c_comm *c, const void *send, void *recv, const int64_t *counts, const int64_t *displs,
                       k3c_dtype t, k3c_comm_req **req, k3c_err *err) {
    if (req) *req = NULL;
    CHECK_RC(check_type("allgather", t, 0, err));
    CHECK_RC(check_counts("allgather", c, counts, displs, err));
    if (!displs) return k3c_errf(err, K3C_EINVAL, "comm allgather: no displacements");
    return c->ops->allgather(c, send, recv, counts, displs, t, req, err);
}

int k3c_comm_alltoall(k3c_comm *c, const void *send, const int64_t *scounts, const int64_t *sdispls, void *recv,
                      const int64_t *rcounts, const int64_t *rdispls, k3c_dtype t, k3c_comm_req **req, k3c_err *err) {
    if (req) *req = NULL;
    CHECK_RC(check_type("alltoall", t, 0, err));
    CHECK_RC(check_counts("alltoall", c, scounts, sdispls, err));
    CHECK_RC(check_counts("alltoall", c, rcounts, rdispls, err));
    if (!sdispls || !rdispls) return k3c_errf(err, K3C_EINVAL, "comm alltoall: no displacements");
    return c->ops->alltoall(c, send, scounts, sdispls, recv, rcounts, rdispls, t, req, err);
}

int k3c_comm_send(k3c_comm *c, const void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req,
                  k3c_err *err) {
    if (req) *req = NULL;
    CHECK_RC(check_type("send", t, 0, err));
    CHECK_RC(check_peer("send", c, peer, err));
    if (n < 0 || tag < 0) return k3c_errf(err, K3C_EINVAL, "comm send: negative count or tag");
    return c->ops->send(c, buf, n, t, peer, tag, req, err);
}

int k3c_comm_recv(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req, k3c_err *err) {
    if (req) *req = NULL;
    CHECK_RC(check_type("recv", t, 0, err));
    CHECK_RC(check_peer("recv", c, peer, err));
    if (n < 0 || tag < 0) return k3c_errf(err, K3C_EINVAL, "comm recv: negative count or tag");
    return c->ops->recv(c, buf, n, t, peer, tag, req, err);
}

int k3c_comm_bcast(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int root, k3c_comm_req **req, k3c_err *err) {
    if (req) *req = NULL;
    CHECK_RC(check_type("bcast", t, 0, err));
    CHECK_RC(check_peer("bcast", c, root, err));
    if (n < 0) return k3c_errf(err, K3C_EINVAL, "comm bcast: negative count");
    return c->ops->bcast(c, buf, n, t, root, req, err);
}

int k3c_comm_barrier(k3c_comm *c, k3c_err *err) { return c->ops->barrier(c, err); }

int k3c_comm_split(k3c_comm *c, int color, int key, k3c_comm **out, k3c_err *err) {
    *out = NULL;
    if (color < 0) return k3c_errf(err, K3C_EINVAL, "comm split: negative color %d", color);
    return c->ops->split(c, color, key, out, err);
}

int k3c_comm_wait(k3c_comm_req *req, k3c_err *err) {
    if (!req) return K3C_OK;
    const k3c_comm_ops *ops = *(const k3c_comm_ops **)req; /* every backend's request starts with its ops */
    return ops->wait(req, err);
}

int k3c_comm_rank(const k3c_comm *c) { return c->rank; }

int k3c_comm_size(const k3c_comm *c) { return c->size; }

void k3c_comm_free(k3c_comm *c) {
    if (c) c->ops->free(c);
}

/* Builds without NCCL (the CPU library, `make cuda`): the definition of comm_nccl.cu, linked by `make nccl`, replaces
 * this one. */
__attribute__((weak)) int k3c_comm_nccl(k3c_comm *boot, const char *rendezvous, int rank, int size, int device,
                                        k3c_comm **out, k3c_err *err) {
    *out = NULL;
    return k3c_errf(
        err, K3C_EUNSUPPORTED,
        "NCCL: this build has no NCCL communicator (the GPU's parallel step: build/nccl/k3c of `make nccl`)");
}

int k3c_comm_check_memory(const k3c_comm *comm, const char *backend, const char *what, k3c_err *err) {
    if (strcmp(backend, "cpu") && strcmp(comm->ops->name, "nccl"))
        return k3c_errf(err, K3C_EUNSUPPORTED,
                        "%s on the %s backend needs a device communicator (NCCL: build/nccl/k3c of `make nccl`); the "
                        "%s communicator moves host memory",
                        what, backend, comm->ops->name);
    return K3C_OK;
}

int k3c_comm_world(k3c_comm **out, k3c_err *err) {
    if (k3c_comm_mpi_launched() && k3c_comm_mpi_available()) return k3c_comm_mpi_world(out, err);
    return k3c_comm_self(out, err);
}

int k3c_comm_mpi_launched(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    if (!s) s = getenv("PMIX_SIZE");
    return s != NULL && atoi(s) >= 1;
}

/* ================================================================ the one-rank communicator
 * Collectives copy send to recv. A send to oneself is kept (copied) until the matching receive (same tag, in order);
 * a receive started before its send is completed by that send; waiting on a receive nobody sent is an error (with one
 * rank it could never complete). */
typedef struct self_msg {
    struct self_msg *next;
    int tag;
    size_t bytes;
    unsigned char data[];
} self_msg;

typedef struct self_req {
    const k3c_comm_ops *ops; /* first: k3c_comm_wait finds the backend here */
    struct self_req *next;   /* pending receives */
    k3c_comm *c;
    void *buf;
    size_t bytes;
    int tag, done;
} self_req;

typedef struct {
    self_msg *msgs;    /* sends waiting for their receive, oldest first */
    self_req *pending; /* receives waiting for their send, oldest first */
} self_state;

static const k3c_comm_ops self_ops;

static void copy_if(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
}

static int self_allreduce(k3c_comm *c, const void *send, void *recv, int64_t n, k3c_dtype t, k3c_comm_op op,
                          k3c_comm_req **req, k3c_err *err) {
    copy_if(recv, send, (size_t)n * k3c_dtype_size(t));
    return K3C_OK;
}

static int self_reduce_scatter(k3c_comm *c, const void *send, void *recv, const int64_t *counts, k3c_dtype t,
                               k3c_comm_op op, k3c_comm_req **req, k3c_err *err) {
    copy_if(recv, send, (size_t)counts[0] * k3c_dtype_size(t));
    return K3C_OK;
}

static int self_allgather(k3c_comm *c, const void *send, void *recv, const int64_t *counts, const int64_t *displs,
                          k3c_dtype t, k3c_comm_req **req, k3c_err *err) {
    size_t es = k3c_dtype_size(t);
    if (send) copy_if((char *)recv + (size_t)displs[0] * es, send, (size_t)counts[0] * es);
    return K3C_OK;
}

static int self_alltoall(k3c_comm *c, const void *send, const int64_t *scounts, const int64_t *sdispls, void *recv,
                         const int64_t *rcounts, const int64_t *rdispls, k3c_dtype t, k3c_comm_req **req,
                         k3c_err *err) {
    if (scounts[0] != rcounts[0])
        return k3c_errf(err, K3C_EINVAL, "comm alltoall: sends %lld elements to itself but receives %lld",
                        (long long)scounts[0], (long long)rcounts[0]);
    size_t es = k3c_dtype_size(t);
    copy_if((char *)recv + (size_t)rdispls[0] * es, (const char *)send + (size_t)sdispls[0] * es,
            (size_t)scounts[0] * es);
    return K3C_OK;
}

static int size_mismatch(k3c_err *err, int tag, size_t sent, size_t want) {
    return k3c_errf(err, K3C_EINVAL, "comm recv (tag %d): message of %zu bytes, receive of %zu", tag, sent, want);
}

static int self_send(k3c_comm *c, const void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req,
                     k3c_err *err) {
    self_state *s = c->impl;
    size_t bytes = (size_t)n * k3c_dtype_size(t);
    for (self_req **p = &s->pending; *p; p = &(*p)->next)
        if ((*p)->tag == tag) { /* a receive is already waiting */
            self_req *r = *p;
            if (r->bytes != bytes) return size_mismatch(err, tag, bytes, r->bytes);
            copy_if(r->buf, buf, bytes);
            r->done = 1;
            *p = r->next;
            return K3C_OK;
        }
    self_msg *m = malloc(sizeof *m + bytes);
    if (!m) return k3c_errf(err, K3C_ENOMEM, "comm send: out of memory");
    m->next = NULL;
    m->tag = tag;
    m->bytes = bytes;
    if (bytes) memcpy(m->data, buf, bytes);
    self_msg **tail = &s->msgs;
    while (*tail) tail = &(*tail)->next;
    *tail = m;
    return K3C_OK;
}

/* Takes the oldest kept message with this tag into buf: 1 if there was one, 0 if not, < 0 on a size mismatch. */
static int self_take(self_state *s, void *buf, size_t bytes, int tag, k3c_err *err) {
    for (self_msg **p = &s->msgs; *p; p = &(*p)->next)
        if ((*p)->tag == tag) {
            self_msg *m = *p;
            if (m->bytes != bytes) return size_mismatch(err, tag, m->bytes, bytes);
            if (bytes) memcpy(buf, m->data, bytes);
            *p = m->next;
            free(m);
            return 1;
        }
    return 0;
}

static int self_recv(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int peer, int tag, k3c_comm_req **req,
                     k3c_err *err) {
    self_state *s = c->impl;
    size_t bytes = (size_t)n * k3c_dtype_size(t);
    int got = self_take(s, buf, bytes, tag, err);
    if (got < 0) return got;
    if (got) return K3C_OK;
    if (!req)
        return k3c_errf(err, K3C_EINVAL, "comm recv (tag %d): nothing was sent (one rank: it never could be)", tag);
    self_req *r = calloc(1, sizeof *r);
    if (!r) return k3c_errf(err, K3C_ENOMEM, "comm recv: out of memory");
    *r = (self_req){&self_ops, NULL, c, buf, bytes, tag, 0};
    self_req **tail = &s->pending;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    *req = (k3c_comm_req *)r;
    return K3C_OK;
}

static int self_wait(k3c_comm_req *req, k3c_err *err) {
    self_req *r = (self_req *)req;
    int done = r->done, tag = r->tag;
    if (!done) { /* never matched: unlink it */
        self_state *s = r->c->impl;
        for (self_req **p = &s->pending; *p; p = &(*p)->next)
            if (*p == r) {
                *p = r->next;
                break;
            }
    }
    free(r);
    return done ? K3C_OK : k3c_errf(err, K3C_EINVAL, "comm wait: receive (tag %d) without a matching send", tag);
}

static int self_bcast(k3c_comm *c, void *buf, int64_t n, k3c_dtype t, int root, k3c_comm_req **req, k3c_err *err) {
    return K3C_OK;
}

static int self_barrier(k3c_comm *c, k3c_err *err) { return K3C_OK; }

static int self_split(k3c_comm *c, int color, int key, k3c_comm **out, k3c_err *err) { return k3c_comm_self(out, err); }

static void self_free(k3c_comm *c) {
    self_state *s = c->impl;
    while (s->msgs) {
        self_msg *m = s->msgs;
        s->msgs = m->next;
        free(m);
    }
    free(s);
    free(c);
}

static const k3c_comm_ops self_ops = {"self",        self_allreduce, self_reduce_scatter, self_allgather,
                                      self_alltoall, self_send,      self_recv,           self_bcast,
                                      self_barrier,  self_split,     self_wait,           self_free};

int k3c_comm_self(k3c_comm **out, k3c_err *err) {
    k3c_comm *c = calloc(1, sizeof *c);
    self_state *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c);
        free(s);
        return k3c_errf(err, K3C_ENOMEM, "comm: out of memory");
    }
    *c = (k3c_comm){&self_ops, s, 0, 1};
    *out = c;
    return K3C_OK;
}
