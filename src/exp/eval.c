/* eval.c — evaluations of a model on task documents: the fraction of recall queries answered and the held-out
 * next-token loss by position, over documents packed into batches on the model's backend. Spec: docs/EXPERIMENTS.md
 * "Evaluations". */
#include "k3c/exp.h"

#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef int (*batch_fn)(void *ctx, const k3c_task_doc *d, const float *logits, int64_t V);

/* Runs documents [i0, i1) as one packed batch and hands each its rows of the logits. */
static int run_batch(k3c_model *m, const k3c_task_doc *docs, int64_t i0, int64_t i1, batch_fn f, void *ctx,
                     k3c_err *err) {
    int64_t T = 0;
    for (int64_t i = i0; i < i1; i++) T += docs[i].n;
    const int n_docs = (int)(i1 - i0);
    const int64_t V = m->cfg.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T), *cu = malloc(sizeof(int32_t) * (size_t)(n_docs + 1));
    float *host = malloc(sizeof(float) * (size_t)(T * V));
    k3c_arena arena = {0};
    int e = ids && cu && host ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "eval: out of memory for %lld tokens", (long long)T);
    if (!e) cu[0] = 0;
    for (int64_t i = i0, t = 0; !e && i < i1; i++) {
        for (int64_t j = 0; j < docs[i].n; j++) {
            if (docs[i].ids[j] < 0 || docs[i].ids[j] >= V)
                e = k3c_errf(err, K3C_EINVAL, "eval: token %d of document %lld outside the model's vocabulary of %lld",
                             docs[i].ids[j], (long long)i, (long long)V);
            ids[t++] = docs[i].ids[j];
        }
        cu[i - i0 + 1] = (int32_t)t;
    }
    if (!e) e = k3c_model_arena_init_f32(m, k3c_model_plan_bytes_f32(m, T, n_docs), &arena, err);
    k3c_model_batch b = {T, n_docs, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_acts *acts;
    double loss;
    float *logits = NULL;
    if (!e) e = k3c_model_forward_f32(m, &b, &arena, &acts, &loss, &logits, err);
    if (!e) e = k3c_model_download_f32(m, host, logits, sizeof(float) * (size_t)(T * V), err);
    for (int64_t i = i0, t = 0; !e && i < i1; t += docs[i].n, i++) e = f(ctx, &docs[i], host + t * V, V);
    if (arena.base) k3c_model_arena_free_f32(m, &arena);
    free(ids);
    free(cu);
    free(host);
    return e;
}

static int each_batch(k3c_model *m, const k3c_task_doc *docs, int64_t n_docs, int64_t max_tokens, batch_fn f, void *ctx,
                      k3c_err *err) {
    if (max_tokens <= 0) max_tokens = 8192;
    for (int64_t i = 0; i < n_docs;) {
        int64_t j = i, T = 0;
        while (j < n_docs && (j == i || T + docs[j].n <= max_tokens)) T += docs[j++].n;
        int e = run_batch(m, docs, i, j, f, ctx, err);
        if (e) return e;
        i = j;
    }
    return K3C_OK;
}

typedef struct {
    int64_t correct, total;
} recall;

static int add_recall(void *ctx, const k3c_task_doc *d, const float *logits, int64_t V) {
    recall *r = ctx;
    r->correct += k3c_task_score(d, logits, V);
    r->total += d->n_q;
    return K3C_OK;
}

int k3c_eval_tasks(k3c_model *m, const k3c_task_doc *docs, int64_t n_docs, int64_t max_tokens, int64_t *correct,
                   int64_t *total, k3c_err *err) {
    recall r = {0, 0};
    int e = each_batch(m, docs, n_docs, max_tokens, add_recall, &r, err);
    *correct = r.correct;
    *total = r.total;
    return e;
}

typedef struct {
    const int64_t *edge;
    int n;
    double *sum;
    int64_t *count;
} by_position;

static int add_losses(void *ctx, const k3c_task_doc *d, const float *logits, int64_t V) {
    by_position *p = ctx;
    for (int64_t t = 0; t + 1 < d->n; t++) {
        int b = 0;
        while (b < p->n && t >= p->edge[b + 1]) b++;
        if (b == p->n) break;
        const float *row = logits + t * V;
        double mx = row[0], z = 0;
        for (int64_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int64_t v = 0; v < V; v++) z += exp((double)row[v] - mx);
        p->sum[b] += log(z) + mx - (double)row[d->ids[t + 1]];
        p->count[b]++;
    }
    return K3C_OK;
}

int k3c_eval_position_loss(k3c_model *m, const k3c_task_doc *docs, int64_t n_docs, const int64_t *edge, int n_buckets,
                           int64_t max_tokens, double *loss, k3c_err *err) {
    if (n_buckets < 1 || edge[0] != 0)
        return k3c_errf(err, K3C_EINVAL, "eval: position buckets need edges 0 = e0 < e1 < ... (%d buckets)", n_buckets);
    for (int b = 0; b < n_buckets; b++)
        if (edge[b + 1] <= edge[b])
            return k3c_errf(err, K3C_EINVAL, "eval: bucket edges not ascending at %d (%lld, %lld)", b + 1,
                            (long long)edge[b], (long long)edge[b + 1]);
    double *sum = calloc((size_t)n_buckets, sizeof *sum);
    int64_t *count = calloc((size_t)n_buckets, sizeof *count);
    int e = sum && count ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "eval: out of memory");
    by_position p = {edge, n_buckets, sum, count};
    if (!e) e = each_batch(m, docs, n_docs, max_tokens, add_losses, &p, err);
    for (int b = 0; !e && b < n_buckets; b++) loss[b] = count[b] ? sum[b] / (double)count[b] : NAN;
    free(sum);
    free(count);
    return e;
}
