/* run_eval.c — the evaluations of a grid on a run's newest checkpoint: MQAR recall by number of pairs, needle accuracy
 * by length and depth, held-out loss by position, as metrics of the run. Spec: docs/EXPERIMENTS.md "Evaluations". */
#include "exp/exp.h"

#include "base/json.h"
#include "model/model.h"
#include "train/checkpoint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int k3c_ablate_eval_check(const k3c_ablate_eval_spec *s, const char *file, k3c_err *err) {
    for (int i = 0; i < s->n_pairs; i++)
        if (s->pairs[i] < 1 || s->pairs[i] > 26)
            return k3c_errf(err, K3C_ECONFIG, "%s: evals.mqar.pairs[%d]: %d, must be 1..26", file, i, s->pairs[i]);
    for (int i = 0; i < s->n_lengths; i++)
        if (s->lengths[i] < 8)
            return k3c_errf(err, K3C_ECONFIG, "%s: evals.needle.lengths[%d]: %lld, must be >= 8", file, i,
                            (long long)s->lengths[i]);
    for (int i = 0; i < s->n_depths; i++)
        if (!(s->depths[i] >= 0 && s->depths[i] <= 1))
            return k3c_errf(err, K3C_ECONFIG, "%s: evals.needle.depths[%d]: %g, must be in [0, 1]", file, i,
                            s->depths[i]);
    for (int i = 0; i < s->n_factors; i++)
        if (s->factors[i] < 1 || (i && s->factors[i] <= s->factors[i - 1]))
            return k3c_errf(err, K3C_ECONFIG, "%s: evals.position.factors[%d]: %lld, must be ascending and >= 1", file,
                            i, (long long)s->factors[i]);
    if (s->mqar_docs < 0 || s->needle_docs < 0 || s->position_docs < 0)
        return k3c_errf(err, K3C_ECONFIG, "%s: evals: docs must be >= 0", file);
    return K3C_OK;
}

double k3c_ablate_first_loss(const char *metrics_jsonl) {
    char *text;
    size_t n;
    if (k3c_read_file(metrics_jsonl, &text, &n, NULL)) return NAN;
    double first = NAN;
    for (char *line = strtok(text, "\n"); line && isnan(first); line = strtok(NULL, "\n")) {
        k3c_json *o;
        if (k3c_json_parse(line, strlen(line), metrics_jsonl, &o, NULL)) continue;
        const k3c_json *v = k3c_json_get(o, "loss");
        if (!k3c_json_get(o, "event") && v && v->type == K3C_JSON_NUMBER) first = v->number;
        k3c_json_free(o);
    }
    free(text);
    return first;
}

static void free_docs(k3c_task_doc *d, int64_t n) {
    for (int64_t i = 0; d && i < n; i++) k3c_task_doc_free(&d[i]);
    free(d);
}

/* kind 0: MQAR (a = pairs), 1: needle (a = length, depth), 2: filler (a = length); n test documents. */
static int make_docs(int kind, int64_t a, double depth, uint64_t seed, int64_t n, k3c_task_doc **out, k3c_err *err) {
    k3c_task_doc *d = calloc((size_t)(n > 0 ? n : 1), sizeof *d);
    if (!d) return k3c_errf(err, K3C_ENOMEM, "eval: out of memory");
    int e = K3C_OK;
    for (int64_t i = 0; !e && i < n; i++)
        e = kind == 0   ? k3c_task_mqar((int)a, a / 2 > 0 ? (int)(a / 2) : 1, seed, K3C_SPLIT_TEST, i, &d[i], err)
            : kind == 1 ? k3c_task_needle(a, depth, seed, K3C_SPLIT_TEST, i, &d[i], err)
                        : k3c_task_filler(a, seed, K3C_SPLIT_TEST, i, &d[i], err);
    if (e) free_docs(d, n);
    *out = e ? NULL : d;
    return e;
}

static int recall_of(k3c_model *m, const k3c_ablate_eval_spec *s, int kind, int64_t a, double depth, int64_t n,
                     int64_t *correct, int64_t *total, k3c_err *err) {
    k3c_task_doc *d;
    int e = make_docs(kind, a, depth, s->seed, n, &d, err);
    if (e) return e;
    e = k3c_eval_tasks(m, d, n, s->max_tokens, correct, total, err);
    free_docs(d, n);
    return e;
}

static int evaluate(k3c_model *m, const k3c_ablate_eval_spec *s, k3c_metric_set *out, k3c_err *err) {
    char name[40];
    int64_t all_c = 0, all_t = 0, c, t;
    for (int i = 0; s->mqar_docs > 0 && i < s->n_pairs; i++) {
        int e = recall_of(m, s, 0, s->pairs[i], 0, s->mqar_docs, &c, &t, err);
        if (e) return e;
        snprintf(name, sizeof name, "mqar_recall_p%d", s->pairs[i]);
        k3c_metric_set_value(out, name, t ? (double)c / (double)t : NAN);
        all_c += c, all_t += t;
    }
    if (all_t) k3c_metric_set_value(out, "mqar_recall", (double)all_c / (double)all_t);
    all_c = all_t = 0;
    for (int i = 0; s->needle_docs > 0 && i < s->n_lengths; i++) {
        int64_t len_c = 0, len_t = 0;
        for (int j = 0; j < s->n_depths; j++) {
            int e = recall_of(m, s, 1, s->lengths[i], s->depths[j], s->needle_docs, &c, &t, err);
            if (e) return e;
            len_c += c, len_t += t;
        }
        snprintf(name, sizeof name, "needle_acc_%lld", (long long)s->lengths[i]);
        k3c_metric_set_value(out, name, len_t ? (double)len_c / (double)len_t : NAN);
        all_c += len_c, all_t += len_t;
    }
    if (all_t) k3c_metric_set_value(out, "needle_acc", (double)all_c / (double)all_t);
    if (s->position_docs <= 0 || s->n_factors == 0) return K3C_OK;
    int64_t edge[K3C_ABLATE_MAX_LIST + 1] = {0};
    double loss[K3C_ABLATE_MAX_LIST];
    for (int i = 0; i < s->n_factors; i++) edge[i + 1] = s->factors[i] * s->train_len;
    k3c_task_doc *d;
    int e = make_docs(2, edge[s->n_factors] + 1, 0, s->seed, s->position_docs, &d, err);
    if (!e) e = k3c_eval_position_loss(m, d, s->position_docs, edge, s->n_factors, s->max_tokens, loss, err);
    free_docs(d, s->position_docs);
    for (int i = 0; !e && i < s->n_factors; i++) {
        snprintf(name, sizeof name, "pos_loss_%lldL", (long long)s->factors[i]);
        k3c_metric_set_value(out, name, loss[i]);
    }
    return e;
}

int k3c_ablate_evaluate(const k3c_ablate_eval_spec *s, const char *run_dir, int kda_chunk, const void *backend,
                        k3c_metric_set *out, k3c_err *err) {
    if (s->mqar_docs + s->needle_docs + s->position_docs == 0) return K3C_OK;
    char ck[4200];
    int e = k3c_train_ckpt_latest(run_dir, ck, sizeof ck, err);
    if (e) return e;
    k3c_model m;
    if ((e = k3c_model_open_f32(ck, 0, &m, err))) return e;
    m.kda_chunk = kda_chunk;
    e = k3c_model_use_backend_f32(&m, backend, err);
    if (!e) e = evaluate(&m, s, out, err);
    k3c_model_free_f32(&m);
    return e ? k3c_err_wrap(err, "evaluating %s", ck) : K3C_OK;
}
