/* constrain_mask.c — the token mask of constrained decoding: the vocabulary's trie walked with the automaton (a subtree
 * whose prefix is refused is skipped whole), per-state tables for free text (inside a JSON string or the think
 * channel) reused while the text runs on, and the k3c_constraint the engine calls. docs/SERVING.md "Constrained
 * decoding". */
#include "serve/constrain_impl.h"

#include "tok/tok.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the vocabulary trie */

/* The ids a free-text frame keeps inside it (fc: the frame's cost after the id, FC_OUT when the id is refused or
 * leaves the frame) and the trie nodes where the frame closes (a JSON string's quote), from which the rest of a token
 * continues in the frames below. */
#define FC_OUT 255
typedef struct {
    frame key;
    unsigned char *fc;
    int32_t *exits;
    int nexits, cap;
    uint64_t used;
} ltable;
#define N_SHARED 4 /* tables built with the trie: a JSON string's and the think text's, after '<' or not */

/* Nodes in preorder: node i holds byte[i] at depth[i] (1 = a first byte), its subtree ends before skip[i], and the
 * tokens whose bytes end there are ids[off[i] .. off[i] + cnt[i]). */
struct k3c_vtrie {
    int64_t nn, V;
    unsigned char *byte;
    uint16_t *depth, *cnt;
    int32_t *skip, *off, *ids;
    int max_depth;
    ltable shared[N_SHARED]; /* read-only once built */
};

typedef struct {
    const unsigned char *b;
    size_t len;
    int32_t id;
} vtok;

static void copy_state(cstate *to, const cstate *from) {
    to->n = from->n;
    memcpy(to->f, from->f, sizeof(frame) * (size_t)from->n);
}

/* Every string (every text) frame steps alike, and the range of a continuation byte matters only while one is due. */
static frame local_key(const k3c_cgrammar *g, const frame *f) {
    frame k = *f;
    k.node = (int16_t)g->nodes[f->node].kind;
    if (!k.a) k.i = k.pos = 0;
    return k;
}

static int table_build(const k3c_cgrammar *g, const k3c_vtrie *t, cstate *walk, ltable *lt, const frame *f);
static int shared_tables(k3c_vtrie *t);

static int cmp_vtok(const void *x, const void *y) {
    const vtok *a = x, *b = y;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->b, b->b, n);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

void k3c_vtrie_free(k3c_vtrie *t) {
    if (!t) return;
    for (int k = 0; k < N_SHARED; k++) free(t->shared[k].fc), free(t->shared[k].exits);
    free(t->byte), free(t->depth), free(t->cnt), free(t->skip), free(t->off), free(t->ids), free(t);
}

#define TRIE_MAX_LEN 1024 /* longer tokens are left out of the trie (the mask refuses them) */

int k3c_vtrie_new(const k3c_tok *tok, int64_t n_vocab, k3c_vtrie **out, k3c_err *err) {
    *out = NULL;
    int64_t V = n_vocab < k3c_tok_n_vocab(tok) ? n_vocab : k3c_tok_n_vocab(tok);
    vtok *v = malloc(sizeof *v * (size_t)(V > 0 ? V : 1));
    k3c_vtrie *t = calloc(1, sizeof *t);
    if (!v || !t) {
        free(v), free(t);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    int64_t n = 0, total = 0;
    for (int32_t id = 0; id < V; id++) {
        const unsigned char *b;
        size_t len;
        if (id >= k3c_tok_n_ranks(tok) || k3c_tok_token_bytes(tok, id, &b, &len, NULL) || len == 0 ||
            len > TRIE_MAX_LEN)
            continue;
        v[n++] = (vtok){b, len, id};
        total += (int64_t)len;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_vtok);
    t->V = V;
    size_t cap = (size_t)total + 1;
    t->byte = malloc(cap), t->depth = malloc(cap * 2), t->cnt = calloc(cap, 2), t->skip = malloc(cap * 4);
    t->off = malloc(cap * 4), t->ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!t->byte || !t->depth || !t->cnt || !t->skip || !t->off || !t->ids) {
        free(v), k3c_vtrie_free(t);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    int32_t path[TRIE_MAX_LEN + 1];
    size_t plen = 0; /* the previous token's nodes, path[0 .. plen) */
    for (int64_t k = 0; k < n; k++) {
        size_t lcp = 0;
        if (k > 0)
            while (lcp < plen && lcp < v[k].len && v[k - 1].b[lcp] == v[k].b[lcp]) lcp++;
        for (size_t d = lcp; d < plen; d++) t->skip[path[d]] = (int32_t)t->nn;
        for (size_t d = lcp; d < v[k].len; d++) {
            int32_t i = (int32_t)t->nn++;
            t->byte[i] = v[k].b[d], t->depth[i] = (uint16_t)(d + 1), t->off[i] = (int32_t)k, path[d] = i;
        }
        plen = v[k].len;
        if ((int)plen > t->max_depth) t->max_depth = (int)plen;
        int32_t end = path[plen - 1];
        if (!t->cnt[end]) t->off[end] = (int32_t)k;
        t->cnt[end]++;
        t->ids[k] = v[k].id;
    }
    for (size_t d = 0; d < plen; d++) t->skip[path[d]] = (int32_t)t->nn;
    free(v);
    if (shared_tables(t)) {
        k3c_vtrie_free(t);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    *out = t;
    return K3C_OK;
}

int k3c_vtrie_prefixes(const k3c_vtrie *t, const int32_t *b, int n, int *lens, int max) {
    int64_t i = 0, end = t->nn;
    int got = 0;
    for (int d = 0; d < n && b[d] < SYM_MARK && i < end; d++) {
        while (i < end && t->byte[i] != b[d]) i = t->skip[i]; /* the siblings at depth d + 1 */
        if (i >= end) break;
        if (t->cnt[i] && got < max) lens[got++] = d + 1;
        end = t->skip[i], i++;
    }
    return got;
}

/* ---------------------------------------------------------------- the constraint */

#define N_LOCAL 16 /* free-text tables kept per sequence */


typedef struct {
    int32_t id;
    float logit;
} kept;

typedef struct {
    k3c_constraint iface;
    const k3c_cgrammar *g;
    k3c_cgrammar *owned;
    cstate st;
    cstate *walk; /* a state per trie depth */
    kept *keep;   /* ids allowed outside a table, with their logits */
    int64_t nkeep, capkeep;
    ltable local[N_LOCAL];
    uint64_t clock;
} cimpl;

int k3c_cmarker_of(const k3c_cgrammar *g, int32_t id) {
    for (int k = 0; k < N_MARKS; k++)
        if (g->mark_id[k] == id) return SYM_MARK + k;
    return -1;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int k3c_cis_special(const k3c_cgrammar *g, int32_t id) {
    return bsearch(&id, g->special, (size_t)g->nspecial, sizeof id, cmp_i32) != NULL;
}

/* The state after token id, or 0 when the automaton refuses it. */
static int advance(const k3c_cgrammar *g, const cstate *from, int32_t id, cstate *to) {
    const unsigned char *b;
    size_t len;
    if (k3c_cis_special(g, id)) {
        int m = k3c_cmarker_of(g, id);
        if (m < 0) return 0;
        copy_state(to, from);
        return k3c_cstep(g, to, m);
    }
    if (k3c_tok_token_bytes(g->tok, id, &b, &len, NULL) || len == 0) return 0;
    copy_state(to, from);
    for (size_t i = 0; i < len; i++)
        if (!k3c_cstep(g, to, b[i])) return 0;
    return 1;
}

int k3c_constraint_mask_exact(k3c_constraint *k, float *logits, int64_t V, int64_t left) {
    cimpl *c = k->ctx;
    cstate t;
    int64_t n_ok = 0;
    for (int64_t id = 0; id < V; id++) {
        if (logits[id] == -INFINITY) continue;
        int ok = advance(c->g, &c->st, (int32_t)id, &t) && k3c_cstate_cost(c->g, &t) <= left - 1;
        if (!ok) logits[id] = -INFINITY;
        n_ok += ok;
    }
    return n_ok ? K3C_OK : K3C_ENUMERIC;
}

static int keep_id(cimpl *c, const float *logits, int32_t id) {
    if (logits[id] == -INFINITY) return K3C_OK;
    if (c->nkeep == c->capkeep) {
        int64_t cap = c->capkeep ? 2 * c->capkeep : 1024;
        kept *p = realloc(c->keep, sizeof *p * (size_t)cap);
        if (!p) return K3C_ENOMEM;
        c->keep = p, c->capkeep = cap;
    }
    c->keep[c->nkeep++] = (kept){id, logits[id]};
    return K3C_OK;
}

/* Walks trie nodes [i0, i1) whose parent state at depth d0 is c->walk[d0], keeping every id whose state fits. */
static int walk_range(cimpl *c, const float *logits, int64_t i0, int64_t i1, int64_t left) {
    const k3c_vtrie *t = c->g->trie;
    for (int64_t i = i0; i < i1;) {
        cstate *s = &c->walk[t->depth[i]];
        copy_state(s, &c->walk[t->depth[i] - 1]);
        if (!k3c_cstep(c->g, s, t->byte[i])) {
            i = t->skip[i];
            continue;
        }
        if (t->cnt[i] && k3c_cstate_cost(c->g, s) <= left - 1)
            for (int k = 0; k < t->cnt[i]; k++)
                if (keep_id(c, logits, t->ids[t->off[i] + k])) return K3C_ENOMEM;
        i++;
    }
    return K3C_OK;
}

static int keep_specials(cimpl *c, const float *logits, int64_t V, int64_t left) {
    cstate *s = &c->walk[0];
    for (int i = 0; i < c->g->nspecial; i++) {
        int32_t id = c->g->special[i];
        int m = k3c_cmarker_of(c->g, id);
        if (id >= V || m < 0) continue;
        copy_state(s, &c->st);
        if (k3c_cstep(c->g, s, m) && k3c_cstate_cost(c->g, s) <= left - 1 && keep_id(c, logits, id))
            return K3C_ENOMEM;
    }
    return K3C_OK;
}

static int is_free_text(const k3c_cgrammar *g, const cstate *s) {
    if (s->n == 0) return 0;
    const frame *f = &s->f[s->n - 1];
    int kind = g->nodes[f->node].kind;
    return kind == N_TEXT || (kind == N_STR && f->phase > 0);
}


/* Builds the table of a free-text frame: the trie walked with that frame alone (walk: max_depth + 1 states). */
static int table_build(const k3c_cgrammar *g, const k3c_vtrie *t, cstate *walk, ltable *lt, const frame *f) {
    if (!lt->fc && !(lt->fc = malloc((size_t)t->V))) return K3C_ENOMEM;
    memset(lt->fc, FC_OUT, (size_t)t->V);
    lt->nexits = 0;
    walk[0].n = 1;
    walk[0].f[0] = *f;
    for (int64_t i = 0; i < t->nn;) {
        cstate *s = &walk[t->depth[i]];
        copy_state(s, &walk[t->depth[i] - 1]);
        if (!k3c_cstep(g, s, t->byte[i])) {
            i = t->skip[i];
            continue;
        }
        if (s->n == 0) { /* the frame closed: the rest continues below it */
            if (lt->nexits == lt->cap) {
                int cap = lt->cap ? 2 * lt->cap : 256;
                int32_t *p = realloc(lt->exits, sizeof *p * (size_t)cap);
                if (!p) return K3C_ENOMEM;
                lt->exits = p, lt->cap = cap;
            }
            lt->exits[lt->nexits++] = (int32_t)i;
            i = t->skip[i];
            continue;
        }
        int64_t fc = k3c_cframe_cost(g, &s->f[0]);
        for (int k = 0; k < t->cnt[i]; k++)
            lt->fc[t->ids[t->off[i] + k]] = (unsigned char)(fc < FC_OUT ? fc : FC_OUT - 1);
        i++;
    }
    lt->key = local_key(g, f);
    lt->used = 1;
    return K3C_OK;
}

/* The tables every answer meets, built once with the trie over a grammar of one string and one text node. */
static int shared_tables(k3c_vtrie *t) {
    cnode nodes[2] = {{.kind = N_STR}, {.kind = N_TEXT}};
    k3c_cgrammar g = {.nodes = nodes, .nn = 2};
    cstate *walk = malloc(sizeof(cstate) * (size_t)(t->max_depth + 1));
    if (!walk) return K3C_ENOMEM;
    int rc = K3C_OK;
    for (int k = 0; !rc && k < N_SHARED; k++) {
        frame f = {(int16_t)(k / 2), (int16_t)(k < 2), 0, 0, 0, (uint64_t)(k % 2)};
        rc = table_build(&g, t, walk, &t->shared[k], &f);
    }
    free(walk);
    return rc;
}

static const ltable *local_table(cimpl *c, const frame *f, int *rc) {
    frame key = local_key(c->g, f);
    ltable *lru = &c->local[0];
    *rc = K3C_OK;
    for (int k = 0; k < N_SHARED; k++)
        if (!memcmp(&c->g->trie->shared[k].key, &key, sizeof key)) return &c->g->trie->shared[k];
    for (int k = 0; k < N_LOCAL; k++) {
        ltable *lt = &c->local[k];
        if (lt->used && !memcmp(&lt->key, &key, sizeof key)) return lt->used = ++c->clock, lt;
        if (lt->used < lru->used) lru = lt;
    }
    lru->used = 0;
    if ((*rc = table_build(c->g, c->g->trie, c->walk, lru, f))) return NULL;
    lru->used = ++c->clock;
    return lru;
}

/* Free text: the frame's table for the ids that stay inside it, the exits walked from the frames below. */
static int mask_local(cimpl *c, float *logits, int64_t V, int64_t left, int64_t *n_ok) {
    const k3c_cgrammar *g = c->g;
    const frame *top = &c->st.f[c->st.n - 1];
    int rc;
    const ltable *lt = local_table(c, top, &rc);
    if (!lt) return rc;
    const k3c_vtrie *t = g->trie;
    cstate *below = &c->walk[0];
    copy_state(below, &c->st);
    below->n--;
    int64_t rest = k3c_cstate_cost(g, below), thr = left - 1 - rest;
    /* the state after the frame closes is the same whatever text came before in it */
    below->n++;
    k3c_cstate_close(g, below);
    for (int e = 0; e < lt->nexits; e++) {
        int32_t i = lt->exits[e];
        copy_state(&c->walk[t->depth[i]], below);
        if (t->cnt[i] && k3c_cstate_cost(g, below) <= left - 1)
            for (int k = 0; k < t->cnt[i]; k++)
                if (keep_id(c, logits, t->ids[t->off[i] + k])) return K3C_ENOMEM;
        if ((rc = walk_range(c, logits, i + 1, t->skip[i], left))) return rc;
    }
    int64_t nt = t->V < V ? t->V : V, ok = 0;
    const unsigned char *fc = lt->fc;
    for (int64_t id = 0; id < nt; id++) {
        int in = fc[id] != FC_OUT && fc[id] <= thr && logits[id] != -INFINITY;
        ok += in;
        if (!in) logits[id] = -INFINITY;
    }
    for (int64_t id = nt; id < V; id++) logits[id] = -INFINITY;
    *n_ok = ok;
    return K3C_OK;
}

static int c_mask(void *ctx, float *logits, int64_t V, int64_t left) {
    cimpl *c = ctx;
    if (!c->g->trie) return k3c_constraint_mask_exact(&c->iface, logits, V, left);
    c->nkeep = 0;
    int64_t n_ok = 0;
    int rc = keep_specials(c, logits, V, left);
    if (!rc && is_free_text(c->g, &c->st)) {
        rc = mask_local(c, logits, V, left, &n_ok);
    } else if (!rc) {
        copy_state(&c->walk[0], &c->st);
        rc = walk_range(c, logits, 0, c->g->trie->nn, left);
        for (int64_t id = 0; !rc && id < V; id++) logits[id] = -INFINITY;
    }
    if (rc) return rc;
    for (int64_t k = 0; k < c->nkeep; k++) logits[c->keep[k].id] = c->keep[k].logit; /* specials, exits: refused above */
    n_ok += c->nkeep;
    return n_ok ? K3C_OK : K3C_ENUMERIC;
}

static int c_accept(void *ctx, int32_t id) {
    cimpl *c = ctx;
    cstate *t = &c->walk[0];
    if (!advance(c->g, &c->st, id, t)) return K3C_EINVAL;
    copy_state(&c->st, t);
    return K3C_OK;
}

static void c_release(void *ctx) {
    cimpl *c = ctx;
    for (int k = 0; k < N_LOCAL; k++) free(c->local[k].fc), free(c->local[k].exits);
    free(c->walk), free(c->keep);
    k3c_cgrammar_free(c->owned);
    free(c);
}

int k3c_constraint_new(const k3c_cgrammar *g, int own, k3c_constraint **out, k3c_err *err) {
    cimpl *c = calloc(1, sizeof *c);
    int depth = g->trie ? g->trie->max_depth : 0;
    if (c) c->walk = malloc(sizeof(cstate) * (size_t)(depth + 1));
    if (!c || !c->walk) {
        free(c);
        if (own) k3c_cgrammar_free((k3c_cgrammar *)g);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    c->g = g;
    c->owned = own ? (k3c_cgrammar *)g : NULL;
    c->iface = (k3c_constraint){c, c_mask, c_accept, c_release};
    k3c_cstate_init(g, &c->st);
    *out = &c->iface;
    return K3C_OK;
}

int k3c_constraint_feed(k3c_constraint *k, const char *s, size_t n) {
    cimpl *c = k->ctx;
    cstate *t = &c->walk[0];
    copy_state(t, &c->st);
    for (size_t i = 0; i < n; i++)
        if (!k3c_cstep(c->g, t, (unsigned char)s[i])) return 0;
    copy_state(&c->st, t);
    return 1;
}

int64_t k3c_constraint_cost(const k3c_constraint *k) {
    const cimpl *c = k->ctx;
    return k3c_cstate_cost(c->g, &c->st);
}

int k3c_constraint_done(const k3c_constraint *k) { return ((const cimpl *)k->ctx)->st.n == 0; }
