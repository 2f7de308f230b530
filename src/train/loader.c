/* loader.c — the packed loader: exactly T tokens per step from whole documents or pieces of at most S tokens, with
 * cu_seqlens and next-token targets (-1 at piece ends), shuffled per epoch, mixed over sources by weight, a small
 * plain state for bit-exact resume, and a fixed-order validation iterator. Spec: docs/TRAINING.md §2, §1.4 (stages). */
#include "base/json.h"
#include "train/data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[64];
    k3c_shard_set *train, *val;
    uint64_t name_hash;
    int64_t *perm;      /* train document order of epoch perm_epoch */
    int64_t perm_epoch; /* -1 = not computed */
} lsrc;

struct k3c_loader {
    int n;
    lsrc src[K3C_LOADER_MAX_SOURCES];
    double weight[K3C_LOADER_MAX_SOURCES]; /* normalised to sum 1 */
    int64_t vocab;
    k3c_loader_state st;
};


/* The streams: one for the mixture draws, one per (source, epoch) for the permutation. Keyed by the source's name,
 * so a source keeps its document order when other sources are added or reordered. */
static uint64_t mix_seed(uint64_t seed) { return k3c_mix64(seed ^ 0x6d6978747572ull /* "mixture" */); }
static uint64_t perm_seed(uint64_t seed, uint64_t name_hash, int64_t epoch) {
    return k3c_mix64(k3c_mix64(seed ^ name_hash) + (uint64_t)epoch);
}

static uint64_t sources_hash(const k3c_loader *ld) {
    uint64_t h = K3C_FNV1A64_INIT;
    for (int i = 0; i < ld->n; i++) h = k3c_fnv1a64(ld->src[i].name, strlen(ld->src[i].name) + 1, h);
    return h;
}

/* ---------------------------------------------------------------- batches */

int k3c_batch_alloc(k3c_batch *b, int64_t T, k3c_err *err) {
    memset(b, 0, sizeof *b);
    if (T < 1 || T >= INT32_MAX)
        return k3c_errf(err, K3C_EINVAL, "batch: %lld tokens per step (1 .. 2^31 - 2)", (long long)T);
    b->T = T;
    b->ids = malloc((size_t)T * sizeof *b->ids);
    b->targets = malloc((size_t)T * sizeof *b->targets);
    b->cu_seqlens = malloc((size_t)(T + 1) * sizeof *b->cu_seqlens);
    b->piece_source = malloc((size_t)T * sizeof *b->piece_source);
    if (!b->ids || !b->targets || !b->cu_seqlens || !b->piece_source) {
        k3c_batch_free(b);
        return k3c_errf(err, K3C_ENOMEM, "batch: cannot allocate %lld tokens", (long long)T);
    }
    return K3C_OK;
}

void k3c_batch_free(k3c_batch *b) {
    free(b->ids);
    free(b->targets);
    free(b->cu_seqlens);
    free(b->piece_source);
    memset(b, 0, sizeof *b);
}

/* Appends tokens [from, from + n) of document d as one piece. */
static void emit(k3c_batch *b, const k3c_shard_set *set, int64_t d, int64_t from, int64_t n, int source) {
    const k3c_shard *sh;
    int64_t local;
    k3c_shard_set_locate(set, d, &sh, &local);
    const int32_t at = b->cu_seqlens[b->n_docs];
    int32_t *ids = b->ids + at, *tg = b->targets + at;
    k3c_shard_copy(sh, local, from, n, ids);
    for (int64_t i = 0; i + 1 < n; i++) tg[i] = ids[i + 1];
    tg[n - 1] = -1;
    b->piece_source[b->n_docs] = source;
    b->cu_seqlens[++b->n_docs] = at + (int32_t)n;
}

static int check_step(const k3c_batch *b, int64_t S, k3c_err *err) {
    if (!b || !b->ids || b->T < 1) return k3c_errf(err, K3C_EINVAL, "loader: batch not allocated (k3c_batch_alloc)");
    if (S < 1) return k3c_errf(err, K3C_EINVAL, "loader: maximum piece length %lld must be >= 1", (long long)S);
    return K3C_OK;
}

/* ---------------------------------------------------------------- open / weights */

static int open_source(k3c_loader *ld, int i, const k3c_data_source *s, k3c_err *err) {
    lsrc *L = &ld->src[i];
    L->perm_epoch = -1;
    int rc = k3c_shard_set_open(s->dir, "train", &L->train, err);
    if (!rc) rc = k3c_shard_set_open(s->dir, "val", &L->val, err);
    if (rc) return rc;
    snprintf(L->name, sizeof L->name, "%s", s->name && *s->name ? s->name : L->train->source);
    if (!L->name[0])
        return k3c_errf(err, K3C_EINVAL, "%s: the source has no name (manifest \"source\" is empty)", s->dir);
    for (int j = 0; j < i; j++)
        if (strcmp(ld->src[j].name, L->name) == 0)
            return k3c_errf(err, K3C_EINVAL, "%s: source name \"%s\" used twice", s->dir, L->name);
    if (i == 0) ld->vocab = L->train->vocab_size;
    if (L->train->vocab_size != ld->vocab)
        return k3c_errf(err, K3C_EFORMAT, "%s: vocab size %lld, but source %s has %lld (different tokenizers)", s->dir,
                        (long long)L->train->vocab_size, ld->src[0].name, (long long)ld->vocab);
    L->name_hash = k3c_fnv1a64(L->name, strlen(L->name), K3C_FNV1A64_INIT);
    L->perm = malloc((size_t)(L->train->n_docs + 1) * sizeof *L->perm);
    return L->perm ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", s->dir);
}

int k3c_loader_open(const k3c_data_source *src, int n, const double *weights, uint64_t seed, k3c_loader **out,
                    k3c_err *err) {
    *out = NULL;
    if (n < 1 || n > K3C_LOADER_MAX_SOURCES)
        return k3c_errf(err, K3C_EINVAL, "loader: %d sources (1 .. %d)", n, K3C_LOADER_MAX_SOURCES);
    k3c_loader *ld = calloc(1, sizeof *ld);
    if (!ld) return k3c_errf(err, K3C_ENOMEM, "loader: out of memory");
    int rc = K3C_OK;
    for (int i = 0; i < n && !rc; i++) {
        ld->n = i + 1; /* so that close releases a partly opened source too */
        rc = open_source(ld, i, &src[i], err);
    }
    if (!rc) rc = k3c_loader_set_weights(ld, weights, err);
    if (rc) {
        k3c_loader_close(ld);
        return rc;
    }
    ld->st = (k3c_loader_state){.magic = K3C_LOADER_STATE_MAGIC,
                                .version = K3C_LOADER_STATE_VERSION,
                                .n_sources = n,
                                .seed = seed,
                                .sources_hash = sources_hash(ld),
                                .cur_source = -1};
    *out = ld;
    return K3C_OK;
}

void k3c_loader_close(k3c_loader *ld) {
    if (!ld) return;
    for (int i = 0; i < ld->n; i++) {
        k3c_shard_set_close(ld->src[i].train);
        k3c_shard_set_close(ld->src[i].val);
        free(ld->src[i].perm);
    }
    free(ld);
}

int k3c_loader_set_weights(k3c_loader *ld, const double *w, k3c_err *err) {
    double sum = 0, nw[K3C_LOADER_MAX_SOURCES];
    for (int i = 0; i < ld->n; i++) {
        nw[i] = w ? w[i] : 0;
        if (!isfinite(nw[i]) || nw[i] < 0)
            return k3c_errf(err, K3C_EINVAL, "loader: source %s: weight %g (must be finite and >= 0)", ld->src[i].name,
                            nw[i]);
        sum += nw[i];
    }
    if (sum == 0) /* all zero = uniform over the sources that have training data */
        for (int i = 0; i < ld->n; i++) sum += nw[i] = ld->src[i].train->n_tokens > 0;
    for (int i = 0; i < ld->n; i++)
        if (nw[i] > 0 && ld->src[i].train->n_tokens == 0)
            return k3c_errf(err, K3C_EINVAL, "loader: source %s (%s) has weight %g but no training tokens",
                            ld->src[i].name, ld->src[i].train->dir, nw[i]);
    if (sum == 0) { /* name every source's directory: the empty batches would come from there */
        char dirs[1024] = "";
        for (int i = 0, at = 0; i < ld->n && at < (int)sizeof dirs; i++)
            at += snprintf(dirs + at, sizeof dirs - (size_t)at, "%s%s (%s)", i ? ", " : "", ld->src[i].name,
                           ld->src[i].train->dir);
        return k3c_errf(err, K3C_EINVAL, "loader: no source has training tokens: %s", dirs);
    }
    for (int i = 0; i < ld->n; i++) ld->weight[i] = nw[i] / sum;
    return K3C_OK;
}

int k3c_loader_n_sources(const k3c_loader *ld) { return ld->n; }
const char *k3c_loader_source_name(const k3c_loader *ld, int i) { return ld->src[i].name; }
int64_t k3c_loader_vocab_size(const k3c_loader *ld) { return ld->vocab; }
const k3c_shard_set *k3c_loader_split(const k3c_loader *ld, int source, int val) {
    return val ? ld->src[source].val : ld->src[source].train;
}

/* ---------------------------------------------------------------- training batches */

/* Fisher–Yates from the end with the counter-based stream of (seed, source, epoch): recomputable after a restore. */
static void ensure_perm(k3c_loader *ld, int s, int64_t epoch) {
    lsrc *L = &ld->src[s];
    if (L->perm_epoch == epoch) return;
    const int64_t n = L->train->n_docs;
    const uint64_t seed = perm_seed(ld->st.seed, L->name_hash, epoch);
    for (int64_t i = 0; i < n; i++) L->perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(k3c_uniform_at(seed, (uint64_t)(n - 1 - i)) * (double)(i + 1));
        if (j > i) j = i;
        int64_t t = L->perm[i];
        L->perm[i] = L->perm[j], L->perm[j] = t;
    }
    L->perm_epoch = epoch;
}

static int draw_source(k3c_loader *ld) {
    double u = k3c_uniform_at(mix_seed(ld->st.seed), ld->st.counter++), acc = 0;
    int last = -1;
    for (int i = 0; i < ld->n; i++) {
        if (ld->weight[i] <= 0) continue;
        last = i;
        acc += ld->weight[i];
        if (u < acc) return i;
    }
    return last; /* rounding: the cumulative sum may end just below 1 */
}

int k3c_loader_next(k3c_loader *ld, int64_t S, k3c_batch *b, k3c_err *err) {
    int rc = check_step(b, S, err);
    if (rc) return rc;
    k3c_loader_state *st = &ld->st;
    b->n_docs = 0;
    b->cu_seqlens[0] = 0;
    for (int64_t fill = 0; fill < b->T;) {
        if (st->cur_source < 0) st->cur_source = draw_source(ld);
        const int s = st->cur_source;
        k3c_loader_cursor *c = &st->cursor[s];
        const k3c_shard_set *set = ld->src[s].train;
        ensure_perm(ld, s, c->epoch);
        const int64_t d = ld->src[s].perm[c->pos], len = k3c_shard_set_doc_len(set, d);
        int64_t take = len - c->offset;
        if (take > S) take = S;
        if (take > b->T - fill) take = b->T - fill;
        if (take > 0) emit(b, set, d, c->offset, take, s);
        c->offset += take;
        fill += take;
        if (c->offset < len) continue; /* only when the step is full: the rest opens the next step */
        c->offset = 0;
        st->cur_source = -1;
        if (++c->pos == set->n_docs) c->pos = 0, c->epoch++;
    }
    st->steps++;
    st->tokens += b->T;
    return K3C_OK;
}

/* ---------------------------------------------------------------- state */

void k3c_loader_get_state(const k3c_loader *ld, k3c_loader_state *st) { *st = ld->st; }

static int check_cursor(k3c_loader *ld, const k3c_loader_state *st, int i, k3c_err *err) {
    const k3c_loader_cursor *c = &st->cursor[i];
    const lsrc *L = &ld->src[i];
    const int64_t n = L->train->n_docs;
    if (c->epoch < 0 || c->pos < 0 || c->offset < 0 || (n > 0 && c->pos >= n) || (n == 0 && (c->pos || c->offset)))
        return k3c_errf(err, K3C_EINVAL,
                        "loader state: source %s: cursor (epoch %lld, pos %lld) outside its %lld documents", L->name,
                        (long long)c->epoch, (long long)c->pos, (long long)n);
    if (c->offset == 0) return K3C_OK;
    if (st->cur_source != i)
        return k3c_errf(err, K3C_EINVAL, "loader state: source %s is inside a document but is not the current source",
                        L->name);
    ensure_perm(ld, i, c->epoch);
    const int64_t len = k3c_shard_set_doc_len(L->train, L->perm[c->pos]);
    if (c->offset >= len)
        return k3c_errf(err, K3C_EINVAL, "loader state: source %s: offset %lld past its document's %lld tokens",
                        L->name, (long long)c->offset, (long long)len);
    return K3C_OK;
}

int k3c_loader_set_state(k3c_loader *ld, const k3c_loader_state *st, k3c_err *err) {
    if (st->magic != K3C_LOADER_STATE_MAGIC || st->version != K3C_LOADER_STATE_VERSION)
        return k3c_errf(err, K3C_EFORMAT, "loader state: not a version-%u loader state", K3C_LOADER_STATE_VERSION);
    if (st->n_sources != ld->n || st->sources_hash != sources_hash(ld))
        return k3c_errf(err, K3C_EINVAL, "loader state: saved for other data sources (%d sources; this loader has %d)",
                        st->n_sources, ld->n);
    if (st->cur_source < -1 || st->cur_source >= ld->n || st->steps < 0 || st->tokens < 0)
        return k3c_errf(err, K3C_EINVAL, "loader state: corrupt (current source %d, steps %lld)", st->cur_source,
                        (long long)st->steps);
    if (st->cur_source >= 0 && ld->src[st->cur_source].train->n_docs == 0)
        return k3c_errf(err, K3C_EINVAL, "loader state: current source %s has no documents",
                        ld->src[st->cur_source].name);
    const k3c_loader_state old = ld->st;
    ld->st.seed = st->seed; /* the permutations the cursors index are those of the state's seed */
    for (int i = 0; i < ld->n; i++) ld->src[i].perm_epoch = -1;
    for (int i = 0; i < ld->n; i++) {
        int rc = check_cursor(ld, st, i, err);
        if (rc) {
            ld->st = old;
            for (int j = 0; j < ld->n; j++) ld->src[j].perm_epoch = -1;
            return rc;
        }
    }
    ld->st = *st;
    return K3C_OK;
}

int k3c_loader_state_to_json(const k3c_loader *ld, char **json, k3c_err *err) {
    const k3c_loader_state *st = &ld->st;
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    /* the seed is a string: JSON numbers are doubles and a 64-bit seed does not fit in 53 bits */
    k3c_sbuf_printf(
        &s, "{\"version\": %u, \"seed\": \"%llu\", \"counter\": %llu, \"steps\": %lld, \"tokens\": %lld, \"current\": ",
        st->version, (unsigned long long)st->seed, (unsigned long long)st->counter, (long long)st->steps,
        (long long)st->tokens);
    if (st->cur_source >= 0)
        k3c_sbuf_json_string(&s, ld->src[st->cur_source].name, strlen(ld->src[st->cur_source].name));
    else
        k3c_sbuf_printf(&s, "null");
    k3c_sbuf_printf(&s, ", \"sources\": [");
    for (int i = 0; i < ld->n; i++) {
        k3c_sbuf_printf(&s, "%s{\"name\": ", i ? ", " : "");
        k3c_sbuf_json_string(&s, ld->src[i].name, strlen(ld->src[i].name));
        k3c_sbuf_printf(&s, ", \"epoch\": %lld, \"pos\": %lld, \"offset\": %lld}", (long long)st->cursor[i].epoch,
                        (long long)st->cursor[i].pos, (long long)st->cursor[i].offset);
    }
    k3c_sbuf_printf(&s, "]}");
    if (!s.ok) {
        k3c_sbuf_free(&s);
        return k3c_errf(err, K3C_ENOMEM, "loader state: out of memory");
    }
    *json = s.buf;
    return K3C_OK;
}

static int jint(const k3c_json *o, const char *key, int64_t *v) {
    const k3c_json *x = k3c_json_get(o, key);
    if (!x || x->type != K3C_JSON_NUMBER || !x->is_integer || x->integer < 0) return 0;
    *v = x->integer;
    return 1;
}

static int find_source(const k3c_loader *ld, const char *name) {
    for (int i = 0; i < ld->n; i++)
        if (strcmp(ld->src[i].name, name) == 0) return i;
    return -1;
}

static int state_from(const k3c_loader *ld, const k3c_json *r, k3c_loader_state *st, k3c_err *err) {
    const k3c_json *seed = k3c_json_get(r, "seed"), *cur = k3c_json_get(r, "current"),
                   *srcs = k3c_json_get(r, "sources");
    int64_t ver = 0, counter = 0;
    char *end = NULL;
    if (!jint(r, "version", &ver) || ver != K3C_LOADER_STATE_VERSION)
        return k3c_errf(err, K3C_EFORMAT, "loader state: \"version\" must be %u", K3C_LOADER_STATE_VERSION);
    if (!seed || seed->type != K3C_JSON_STRING || !seed->len || (st->seed = strtoull(seed->string, &end, 10), *end))
        return k3c_errf(err, K3C_EFORMAT, "loader state: \"seed\" must be a decimal string");
    if (!jint(r, "counter", &counter) || !jint(r, "steps", &st->steps) || !jint(r, "tokens", &st->tokens))
        return k3c_errf(err, K3C_EFORMAT, "loader state: \"counter\", \"steps\", \"tokens\" must be integers >= 0");
    st->counter = (uint64_t)counter;
    if (!srcs || srcs->type != K3C_JSON_ARRAY || srcs->n != (size_t)ld->n)
        return k3c_errf(err, K3C_EINVAL, "loader state: \"sources\" must list this loader's %d sources", ld->n);
    for (size_t k = 0; k < srcs->n; k++) {
        const k3c_json *e = &srcs->items[k], *nm = k3c_json_get(e, "name");
        int i = nm && nm->type == K3C_JSON_STRING ? find_source(ld, nm->string) : -1;
        if (i < 0) return k3c_errf(err, K3C_EINVAL, "loader state: sources[%zu]: not a source of this loader", k);
        k3c_loader_cursor *c = &st->cursor[i];
        if (!jint(e, "epoch", &c->epoch) || !jint(e, "pos", &c->pos) || !jint(e, "offset", &c->offset))
            return k3c_errf(err, K3C_EFORMAT, "loader state: source %s: needs integers epoch, pos, offset >= 0",
                            ld->src[i].name);
    }
    st->cur_source = -1;
    if (cur && cur->type == K3C_JSON_STRING && (st->cur_source = find_source(ld, cur->string)) < 0)
        return k3c_errf(err, K3C_EINVAL, "loader state: current source \"%s\" is not a source of this loader",
                        cur->string);
    if (!cur || (cur->type != K3C_JSON_STRING && cur->type != K3C_JSON_NULL))
        return k3c_errf(err, K3C_EFORMAT, "loader state: \"current\" must be a source name or null");
    return K3C_OK;
}

int k3c_loader_state_from_json(k3c_loader *ld, const char *json, size_t n, k3c_err *err) {
    k3c_json *r = NULL;
    int rc = k3c_json_parse(json, n, "loader state", &r, err);
    if (rc) return rc;
    k3c_loader_state st = {.magic = K3C_LOADER_STATE_MAGIC,
                           .version = K3C_LOADER_STATE_VERSION,
                           .n_sources = ld->n,
                           .sources_hash = sources_hash(ld)};
    for (int i = 0; i < ld->n; i++) st.cursor[i].epoch = -1; /* marks sources the JSON did not name */
    rc = r->type == K3C_JSON_OBJECT ? state_from(ld, r, &st, err)
                                    : k3c_errf(err, K3C_EFORMAT, "loader state: expected a JSON object");
    k3c_json_free(r);
    for (int i = 0; !rc && i < ld->n; i++)
        if (st.cursor[i].epoch < 0) rc = k3c_errf(err, K3C_EINVAL, "loader state: source %s missing", ld->src[i].name);
    return rc ? rc : k3c_loader_set_state(ld, &st, err);
}

/* ---------------------------------------------------------------- validation */

void k3c_loader_val_begin(const k3c_loader *ld, int source, k3c_val_iter *it) {
    (void)ld;
    *it = (k3c_val_iter){.source = source, .cur = source < 0 ? 0 : source};
}

int64_t k3c_loader_val_tokens(const k3c_loader *ld, int source) {
    int64_t n = 0;
    for (int i = 0; i < ld->n; i++)
        if (source < 0 || source == i) n += ld->src[i].val->n_tokens;
    return n;
}

int k3c_loader_val_next(const k3c_loader *ld, k3c_val_iter *it, int64_t S, k3c_batch *b, k3c_err *err) {
    int rc = check_step(b, S, err);
    if (rc) return rc;
    if (it->source >= ld->n || it->cur < 0 || it->cur >= ld->n)
        return k3c_errf(err, K3C_EINVAL, "loader: validation source %d out of range", it->source);
    if (k3c_loader_val_tokens(ld, it->source) == 0)
        return k3c_errf(err, K3C_ENOTFOUND, "loader: %s%s has no validation tokens (prepare with --val-fraction > 0)",
                        it->source < 0 ? "every source" : "source ", it->source < 0 ? "" : ld->src[it->source].name);
    b->n_docs = 0;
    b->cu_seqlens[0] = 0;
    for (int64_t fill = 0; fill < b->T;) {
        const k3c_shard_set *set = ld->src[it->cur].val;
        if (it->doc >= set->n_docs) { /* next source (or the first again): the pass restarts */
            if (it->source < 0) it->cur = (it->cur + 1) % ld->n;
            it->doc = it->offset = 0;
            continue;
        }
        const int64_t len = k3c_shard_set_doc_len(set, it->doc);
        int64_t take = len - it->offset;
        if (take > S) take = S;
        if (take > b->T - fill) take = b->T - fill;
        if (take > 0) emit(b, set, it->doc, it->offset, take, it->cur);
        it->offset += take;
        fill += take;
        if (it->offset >= len) it->doc++, it->offset = 0;
    }
    return K3C_OK;
}
