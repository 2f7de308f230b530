/* bpe.c — byte-pair merging of one pre-token with tiktoken's rule (docs/FORMATS.md §8.1): repeatedly merge the
 * adjacent pair whose concatenation has the lowest rank, leftmost on ties; linear rescans for short pieces, a heap for long. */
#include "tok/tok_impl.h"

#include <stdlib.h>

#define NO_RANK UINT32_MAX
/* Pieces up to this many bytes use tiktoken's linear rescans (O(n²) compares, but no allocation and tiny constants). */
#define LINEAR_MAX 256

int k3c_tok_ids_push(k3c_tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return K3C_ENOMEM;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return K3C_OK;
}

void k3c_tok_ids_free(k3c_tok_ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

static uint32_t rank_of(const k3c_tok *t, const unsigned char *p, size_t n) {
    int32_t r = tok_lookup(t, p, n);
    return r < 0 ? NO_RANK : (uint32_t)r;
}

/* tiktoken's _byte_pair_merge: parts[i] starts at start[i]; rank[i] is the rank of merging parts i and i + 1. */
static int merge_linear(const k3c_tok *t, const unsigned char *s, size_t n, k3c_tok_ids *out) {
    size_t start[LINEAR_MAX + 1];
    uint32_t rank[LINEAR_MAX + 1];
    size_t m = n + 1; /* parts, counting the end sentinel */
    for (size_t i = 0; i < n; i++) {
        start[i] = i;
        rank[i] = i + 1 < n ? rank_of(t, s + i, 2) : NO_RANK;
    }
    start[n] = n;
    rank[n] = NO_RANK;
    for (;;) {
        uint32_t best = NO_RANK;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (best == NO_RANK) break;
        /* parts bi and bi+1 merge: drop start[bi+1], then re-rank the pairs that now end or start at bi */
        memmove(start + bi + 1, start + bi + 2, (m - bi - 2) * sizeof *start);
        memmove(rank + bi + 1, rank + bi + 2, (m - bi - 2) * sizeof *rank);
        m--;
        rank[bi] = bi + 2 < m ? rank_of(t, s + start[bi], start[bi + 2] - start[bi]) : NO_RANK;
        if (bi > 0) rank[bi - 1] = rank_of(t, s + start[bi - 1], start[bi + 1] - start[bi - 1]);
    }
    for (size_t i = 0; i + 1 < m; i++)
        if (k3c_tok_ids_push(out, (int32_t)rank_of(t, s + start[i], start[i + 1] - start[i])) != K3C_OK)
            return K3C_ENOMEM;
    return K3C_OK;
}

/* A binary min-heap of (rank << 32 | part) keys: the smallest rank wins, then the leftmost part (lowest start). */
typedef struct {
    uint64_t *a;
    size_t n;
} heap;

static void heap_push(heap *h, uint64_t k) {
    size_t i = h->n++;
    while (i > 0 && h->a[(i - 1) / 2] > k) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = k;
}

static uint64_t heap_pop(heap *h) {
    uint64_t top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->a[c + 1] < h->a[c]) c++;
        if (h->a[c] >= last) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* The same merges in O(n log n): parts are a linked list over byte positions (a part is named by its start byte, which
 * never changes while it lives); stale heap keys are skipped by comparing with the part's current pair rank. */
static int merge_heap(const k3c_tok *t, const unsigned char *s, size_t n, k3c_tok_ids *out) {
    uint32_t *nxt = malloc(n * sizeof *nxt), *prv = malloc(n * sizeof *prv), *cur = malloc(n * sizeof *cur);
    heap h = {malloc(3 * n * sizeof *h.a), 0};
    int rc = nxt && prv && cur && h.a ? K3C_OK : K3C_ENOMEM;
    if (rc == K3C_OK) {
        for (size_t i = 0; i < n; i++) {
            nxt[i] = (uint32_t)(i + 1);
            prv[i] = (uint32_t)i - 1; /* wraps for part 0: never read */
            cur[i] = i + 1 < n ? rank_of(t, s + i, 2) : NO_RANK;
            if (cur[i] != NO_RANK) heap_push(&h, (uint64_t)cur[i] << 32 | i);
        }
        while (h.n) {
            uint64_t k = heap_pop(&h);
            uint32_t i = (uint32_t)k, r = (uint32_t)(k >> 32);
            if (cur[i] != r) continue; /* stale: the part died or its pair changed */
            uint32_t j = nxt[i];
            nxt[i] = nxt[j];
            if (nxt[j] < n) prv[nxt[j]] = i;
            cur[j] = NO_RANK;
            cur[i] = nxt[i] < n ? rank_of(t, s + i, nxt[nxt[i]] - i) : NO_RANK; /* a part ends where the next starts */
            if (cur[i] != NO_RANK) heap_push(&h, (uint64_t)cur[i] << 32 | i);
            if (i > 0) {
                uint32_t p = prv[i];
                cur[p] = rank_of(t, s + p, nxt[i] - p);
                if (cur[p] != NO_RANK) heap_push(&h, (uint64_t)cur[p] << 32 | p);
            }
        }
        for (uint32_t i = 0; i < n && rc == K3C_OK; i = nxt[i])
            rc = k3c_tok_ids_push(out, (int32_t)rank_of(t, s + i, nxt[i] - i));
    }
    free(nxt);
    free(prv);
    free(cur);
    free(h.a);
    return rc;
}

int tok_bpe_merge(const k3c_tok *t, const unsigned char *s, size_t n, k3c_tok_ids *out) {
    if (n == 0) return K3C_OK;
    if (n == 1) return k3c_tok_ids_push(out, t->byte_rank[s[0]]);
    return n <= LINEAR_MAX ? merge_linear(t, s, n, out) : merge_heap(t, s, n, out);
}

int tok_bpe_piece(const k3c_tok *t, const unsigned char *s, size_t n, int algo, k3c_tok_ids *out) {
    if (n == 0) return K3C_OK;
    if (n == 1) return k3c_tok_ids_push(out, t->byte_rank[s[0]]);
    int32_t whole = tok_lookup(t, s, n); /* tiktoken emits a piece that is itself a token directly */
    if (whole >= 0) return k3c_tok_ids_push(out, whole);
    if (algo == 1 || (algo == 0 && n <= LINEAR_MAX)) {
        if (n > LINEAR_MAX) return K3C_EINVAL;
        return merge_linear(t, s, n, out);
    }
    return merge_heap(t, s, n, out);
}

int k3c_tok_encode_piece(const k3c_tok *t, const void *piece, size_t len, int algo, k3c_tok_ids *out, k3c_err *err) {
    int rc = tok_bpe_piece(t, piece, len, algo, out);
    if (rc == K3C_EINVAL) return k3c_errf(err, rc, "encode_piece: linear merging takes at most %d bytes", LINEAR_MAX);
    if (rc != K3C_OK) return k3c_errf(err, rc, "encode_piece: out of memory");
    return K3C_OK;
}
