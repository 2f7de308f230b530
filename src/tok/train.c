/* train.c — learns a byte-level BPE vocabulary in the tiktoken format from a corpus (docs/FORMATS.md §8.3: "train a
 * byte-level BPE in C and write it in the same .tiktoken format; reserve special ids above the merge ranks").
 *
 * Classic incremental BPE: count the distinct pre-token pieces once, then repeatedly merge the most frequent adjacent
 * pair. Pair counts are kept up to date from the words a merge touches (each pair remembers which words hold it), and a
 * max-heap with lazily refreshed entries picks the next pair, so a merge costs time in proportion to the words it
 * changes rather than to the corpus. */
#include "tok/tok_impl.h"

#include <stdlib.h>

/* ---------------------------------------------------------------- growable int32 list */
typedef struct {
    int32_t *v;
    int32_t n, cap;
} ilist;

static int ilist_push(ilist *l, int32_t x) {
    if (l->n == l->cap) {
        int32_t cap = l->cap ? l->cap * 2 : 4;
        int32_t *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return K3C_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return K3C_OK;
}

/* ---------------------------------------------------------------- distinct pieces with counts */
typedef struct {
    unsigned char *blob; /* piece bytes back to back */
    size_t blob_len, blob_cap;
    size_t *off;
    uint32_t *len;
    int64_t *count;
    int32_t n, cap;
    int32_t *slots; /* piece index + 1 */
    size_t n_slots;
} piece_set;

static int pieces_grow(piece_set *ps) {
    size_t ns = ps->n_slots ? ps->n_slots * 2 : 1 << 16;
    int32_t *s = calloc(ns, sizeof *s);
    if (!s) return K3C_ENOMEM;
    for (int32_t k = 0; k < ps->n; k++) {
        size_t i = tok_hash(ps->blob + ps->off[k], ps->len[k]) & (ns - 1);
        while (s[i]) i = (i + 1) & (ns - 1);
        s[i] = k + 1;
    }
    free(ps->slots);
    ps->slots = s;
    ps->n_slots = ns;
    return K3C_OK;
}

static int pieces_add(piece_set *ps, const unsigned char *p, size_t n) {
    if ((size_t)ps->n * 2 >= ps->n_slots && pieces_grow(ps) != K3C_OK) return K3C_ENOMEM;
    size_t mask = ps->n_slots - 1, i = tok_hash(p, n) & mask;
    for (; ps->slots[i]; i = (i + 1) & mask) {
        int32_t k = ps->slots[i] - 1;
        if (ps->len[k] == n && memcmp(ps->blob + ps->off[k], p, n) == 0) {
            ps->count[k]++;
            return K3C_OK;
        }
    }
    if (ps->n == ps->cap) {
        int32_t cap = ps->cap ? ps->cap * 2 : 4096;
        size_t *off = realloc(ps->off, (size_t)cap * sizeof *off);
        if (off) ps->off = off;
        uint32_t *len = realloc(ps->len, (size_t)cap * sizeof *len);
        if (len) ps->len = len;
        int64_t *count = realloc(ps->count, (size_t)cap * sizeof *count);
        if (count) ps->count = count;
        if (!off || !len || !count) return K3C_ENOMEM;
        ps->cap = cap;
    }
    if (ps->blob_len + n > ps->blob_cap) {
        size_t cap = ps->blob_cap ? ps->blob_cap * 2 : 1 << 20;
        while (cap < ps->blob_len + n) cap *= 2;
        unsigned char *b = realloc(ps->blob, cap);
        if (!b) return K3C_ENOMEM;
        ps->blob = b;
        ps->blob_cap = cap;
    }
    memcpy(ps->blob + ps->blob_len, p, n);
    ps->off[ps->n] = ps->blob_len;
    ps->len[ps->n] = (uint32_t)n;
    ps->count[ps->n] = 1;
    ps->blob_len += n;
    ps->slots[i] = ++ps->n;
    return K3C_OK;
}

static void pieces_free(piece_set *ps) {
    free(ps->blob);
    free(ps->off);
    free(ps->len);
    free(ps->count);
    free(ps->slots);
}

/* Length of the special spelling at s[i], or 0. first[c] says whether some spelling starts with byte c. */
static size_t special_at(const k3c_tok_train_opts *o, const unsigned char *first, const unsigned char *s, size_t n,
                         size_t i) {
    if (!first[s[i]]) return 0;
    for (int k = 0; k < o->n_specials; k++) {
        size_t l = strlen(o->specials[k]);
        if (l && l <= n - i && memcmp(s + i, o->specials[k], l) == 0) return l;
    }
    return 0;
}

/* Counts the pre-token pieces of one text; special spellings are cut out (they never take part in merges). */
static int count_pieces(piece_set *ps, const k3c_tok_train_opts *o, const unsigned char *first, const unsigned char *s,
                        size_t n) {
    size_t start = 0, i = 0;
    for (;;) {
        size_t sl = i < n ? special_at(o, first, s, n, i) : 0;
        if (i < n && sl == 0) {
            i++;
            continue;
        }
        for (size_t p = start; p < i;) { /* the ordinary run [start, i) */
            size_t e = k3c_tok_pretok_next(o->pattern, s + start, i - start, p - start) + start;
            if (pieces_add(ps, s + p, e - p) != K3C_OK) return K3C_ENOMEM;
            p = e;
        }
        if (i == n) return K3C_OK;
        i += sl;
        start = i;
    }
}

/* ---------------------------------------------------------------- pairs */
typedef struct {
    uint64_t key;  /* left << 32 | right */
    int64_t count; /* occurrences weighted by piece counts */
    ilist where;   /* words that held the pair at some point (may hold stale entries and repeats) */
} pair;

typedef struct {
    pair *p;
    int32_t n, cap;
    int32_t *slots; /* pair index + 1 */
    size_t n_slots;
} pair_map;

static inline uint64_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return k;
}

static int pairs_grow(pair_map *m) {
    size_t ns = m->n_slots ? m->n_slots * 2 : 1 << 16;
    int32_t *s = calloc(ns, sizeof *s);
    if (!s) return K3C_ENOMEM;
    for (int32_t k = 0; k < m->n; k++) {
        size_t i = pair_hash(m->p[k].key) & (ns - 1);
        while (s[i]) i = (i + 1) & (ns - 1);
        s[i] = k + 1;
    }
    free(m->slots);
    m->slots = s;
    m->n_slots = ns;
    return K3C_OK;
}

/* The index of pair key, created with count 0 when absent; -1 when out of memory. */
static int32_t pair_get(pair_map *m, uint64_t key) {
    if ((size_t)m->n * 2 >= m->n_slots && pairs_grow(m) != K3C_OK) return -1;
    size_t mask = m->n_slots - 1, i = pair_hash(key) & mask;
    for (; m->slots[i]; i = (i + 1) & mask)
        if (m->p[m->slots[i] - 1].key == key) return m->slots[i] - 1;
    if (m->n == m->cap) {
        int32_t cap = m->cap ? m->cap * 2 : 1 << 14;
        pair *p = realloc(m->p, (size_t)cap * sizeof *p);
        if (!p) return -1;
        m->p = p;
        m->cap = cap;
    }
    m->p[m->n] = (pair){.key = key};
    m->slots[i] = ++m->n;
    return m->n - 1;
}

/* Max-heap of (count, pair): larger count first, then the smaller key (left id, then right id) for determinism. */
typedef struct {
    int64_t count;
    uint64_t key;
    int32_t pair;
} hentry;

typedef struct {
    hentry *a;
    size_t n, cap;
} maxheap;

static inline int hbefore(hentry x, hentry y) { return x.count > y.count || (x.count == y.count && x.key < y.key); }

static int hpush(maxheap *h, hentry e) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 1 << 14;
        hentry *a = realloc(h->a, cap * sizeof *a);
        if (!a) return K3C_ENOMEM;
        h->a = a;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && hbefore(e, h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = e;
    return K3C_OK;
}

static hentry hpop(maxheap *h) {
    hentry top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hbefore(h->a[c + 1], h->a[c])) c++;
        if (!hbefore(h->a[c], last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* ---------------------------------------------------------------- the training state */
typedef struct {
    piece_set ps;
    int32_t *sym; /* each word's current symbols, at woff[w], wlen[w] of them */
    size_t *woff;
    uint32_t *wlen;
    int32_t *stamp; /* last merge that visited the word */
    pair_map pm;
    maxheap heap;
    ilist grown; /* pairs whose count rose during the current merge */
    k3c_tok *tok;
} trainer;

/* Adds delta occurrences of (a, b) in word w. */
static int bump(trainer *tr, int32_t a, int32_t b, int64_t delta, int32_t w) {
    int32_t k = pair_get(&tr->pm, (uint64_t)(uint32_t)a << 32 | (uint32_t)b);
    if (k < 0) return K3C_ENOMEM;
    pair *p = &tr->pm.p[k];
    p->count += delta;
    if (delta > 0) {
        if ((p->where.n == 0 || p->where.v[p->where.n - 1] != w) && ilist_push(&p->where, w) != K3C_OK)
            return K3C_ENOMEM;
        if (ilist_push(&tr->grown, k) != K3C_OK) return K3C_ENOMEM;
    }
    return K3C_OK;
}

static int init_words(trainer *tr) {
    piece_set *ps = &tr->ps;
    tr->sym = malloc((ps->blob_len + 1) * sizeof *tr->sym);
    tr->woff = malloc(((size_t)ps->n + 1) * sizeof *tr->woff);
    tr->wlen = malloc(((size_t)ps->n + 1) * sizeof *tr->wlen);
    tr->stamp = malloc(((size_t)ps->n + 1) * sizeof *tr->stamp);
    if (!tr->sym || !tr->woff || !tr->wlen || !tr->stamp) return K3C_ENOMEM;
    for (int32_t w = 0; w < ps->n; w++) {
        tr->woff[w] = ps->off[w];
        tr->wlen[w] = ps->len[w];
        tr->stamp[w] = -1;
        for (uint32_t i = 0; i < ps->len[w]; i++) tr->sym[ps->off[w] + i] = ps->blob[ps->off[w] + i];
        for (uint32_t i = 0; i + 1 < ps->len[w]; i++) {
            int32_t *s = tr->sym + ps->off[w];
            if (bump(tr, s[i], s[i + 1], ps->count[w], w) != K3C_OK) return K3C_ENOMEM;
        }
    }
    tr->grown.n = 0;
    for (int32_t k = 0; k < tr->pm.n; k++)
        if (hpush(&tr->heap, (hentry){tr->pm.p[k].count, tr->pm.p[k].key, k}) != K3C_OK) return K3C_ENOMEM;
    return K3C_OK;
}

/* Rewrites every (a, b) in word w as z, left to right, keeping the pair counts exact. */
static int merge_word(trainer *tr, int32_t w, int32_t a, int32_t b, int32_t z) {
    int32_t *s = tr->sym + tr->woff[w];
    uint32_t n = tr->wlen[w], o = 0;
    int64_t c = tr->ps.count[w];
    for (uint32_t i = 0; i < n; i++) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            /* s[o-1] is the already rewritten left neighbour, s[i+2] the untouched right one */
            if (o > 0 && (bump(tr, s[o - 1], a, -c, w) != K3C_OK || bump(tr, s[o - 1], z, c, w) != K3C_OK))
                return K3C_ENOMEM;
            if (i + 2 < n && (bump(tr, b, s[i + 2], -c, w) != K3C_OK || bump(tr, z, s[i + 2], c, w) != K3C_OK))
                return K3C_ENOMEM;
            s[o++] = z;
            i++;
        } else {
            s[o++] = s[i];
        }
    }
    tr->wlen[w] = o;
    return K3C_OK;
}

/* The id for the bytes of a + b: an existing token with those bytes, else a new rank. */
static int32_t merged_id(trainer *tr, int32_t a, int32_t b, unsigned char *buf) {
    k3c_tok *t = tr->tok;
    size_t la = t->span[a].len, lb = t->span[b].len;
    memcpy(buf, t->blob + t->span[a].off, la);
    memcpy(buf + la, t->blob + t->span[b].off, lb);
    int32_t existing = -1, z = t->n_ranks;
    int rc = tok_add_rank(t, buf, la + lb, z, &existing);
    if (rc == 1) return existing;
    return rc == K3C_OK ? z : -1;
}

static int do_merge(trainer *tr, int32_t k, int32_t iter, unsigned char *buf) {
    pair *p = &tr->pm.p[k];
    int32_t a = (int32_t)(p->key >> 32), b = (int32_t)(uint32_t)p->key;
    int32_t z = merged_id(tr, a, b, buf);
    if (z < 0) return K3C_ENOMEM;
    tr->grown.n = 0;
    /* p may move when the pair table grows: iterate over a detached copy of its word list */
    ilist where = p->where;
    p->where = (ilist){0};
    int rc = K3C_OK;
    for (int32_t i = 0; i < where.n && rc == K3C_OK; i++) {
        int32_t w = where.v[i];
        if (tr->stamp[w] == iter) continue;
        tr->stamp[w] = iter;
        rc = merge_word(tr, w, a, b, z);
    }
    free(where.v);
    tr->pm.p[k].count = 0;
    for (int32_t i = 0; i < tr->grown.n && rc == K3C_OK; i++) {
        pair *q = &tr->pm.p[tr->grown.v[i]];
        if (q->count > 0) rc = hpush(&tr->heap, (hentry){q->count, q->key, tr->grown.v[i]});
    }
    return rc;
}

static int learn(trainer *tr, const k3c_tok_train_opts *o) {
    int32_t total = o->vocab_size - 256, iter = 0;
    unsigned char *buf = malloc(2 * (tr->ps.blob_len + 2));
    if (!buf) return K3C_ENOMEM;
    int rc = K3C_OK;
    while (rc == K3C_OK && tr->tok->n_ranks < o->vocab_size && tr->heap.n) {
        hentry e = hpop(&tr->heap);
        pair *p = &tr->pm.p[e.pair];
        if (p->count != e.count) { /* stale: refresh it, unless the pair is gone */
            if (p->count > 0) rc = hpush(&tr->heap, (hentry){p->count, p->key, e.pair});
            continue;
        }
        if (e.count < 2) break; /* a pair seen once teaches nothing */
        rc = do_merge(tr, e.pair, iter++, buf);
        if (o->progress && (iter & 63) == 0) o->progress(o->progress_ctx, tr->tok->n_ranks - 256, total);
    }
    if (rc == K3C_OK && o->progress) o->progress(o->progress_ctx, tr->tok->n_ranks - 256, total);
    free(buf);
    return rc;
}

static void trainer_free(trainer *tr) {
    pieces_free(&tr->ps);
    free(tr->sym);
    free(tr->woff);
    free(tr->wlen);
    free(tr->stamp);
    for (int32_t k = 0; k < tr->pm.n; k++) free(tr->pm.p[k].where.v);
    free(tr->pm.p);
    free(tr->pm.slots);
    free(tr->heap.a);
    free(tr->grown.v);
}

int k3c_tok_train(const char *const *texts, const size_t *lens, int ntexts, const k3c_tok_train_opts *o, k3c_tok **out,
                  k3c_err *err) {
    *out = NULL;
    if (o->vocab_size < 256 || o->vocab_size > (1 << 24))
        return k3c_errf(err, K3C_EINVAL, "tokenizer train: vocab size %d outside [256, 2^24]", o->vocab_size);
    trainer tr = {0};
    int rc = tok_new(o->pattern, &tr.tok, err);
    if (rc != K3C_OK) return rc;
    for (int b = 0; b < 256 && rc == K3C_OK; b++) {
        unsigned char c = (unsigned char)b;
        rc = tok_add_rank(tr.tok, &c, 1, b, NULL);
    }
    unsigned char first[256] = {0};
    for (int k = 0; k < o->n_specials; k++) first[(unsigned char)o->specials[k][0]] = 1;
    for (int i = 0; i < ntexts && rc == K3C_OK; i++)
        rc = count_pieces(&tr.ps, o, first, (const unsigned char *)texts[i], lens[i]);
    if (rc == K3C_OK) rc = init_words(&tr);
    if (rc == K3C_OK) rc = learn(&tr, o);
    if (rc != K3C_OK) rc = k3c_errf(err, rc, "tokenizer train: out of memory");
    if (rc == K3C_OK) rc = tok_finish_ranks(tr.tok, "trained vocabulary", err);
    for (int k = 0; k < o->n_specials && rc == K3C_OK; k++)
        rc = k3c_tok_add_special(tr.tok, o->specials[k], strlen(o->specials[k]), tr.tok->n_ranks + k, err);
    k3c_tok *t = tr.tok;
    tr.tok = NULL;
    trainer_free(&tr);
    if (rc != K3C_OK) {
        k3c_tok_free(t);
        return rc;
    }
    *out = t;
    return K3C_OK;
}
