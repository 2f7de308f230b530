/* run_config.c — the strict reader of a training run config (JSON): model, tokenizer, data sources, staged context
 * lengths with their schedules and mixtures, optimizer, balancing, logging and checkpoint cadence. Spec: docs/TRAINING.md §1. */
#include "base/json.h"
#include "ops/optim.h"
#include "ops/qk_clip.h"
#include "train/schedule.h"
#include "ops/quantile_balance.h"
#include "train/guard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef k3c_json_ctx ctx; /* the file name for messages and the error */

static int keys_known(ctx *c, const k3c_json *o, const char *where, const char *const *allowed) {
    for (size_t i = 0; i < o->n; i++) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(o->keys[i], *a) == 0;
        if (!ok) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: unknown key", c->file, where, o->keys[i]);
    }
    return 0;
}

/* Optional fields (absent or null) take `def`; the typed reading and its messages are base/json's. */
static int get_num(ctx *c, const k3c_json *o, const char *where, const char *key, double def, int required,
                   double *out) {
    int present;
    int e =
        k3c_json_get_num(c, required ? K3C_JSON_REQ : K3C_JSON_OPT, K3C_SPOT(o, where, key), K3C_NOSPOT, out, &present);
    if (!e && !present) *out = def;
    return e;
}

static int get_int(ctx *c, const k3c_json *o, const char *where, const char *key, int64_t def, int required,
                   int64_t *out) {
    int present;
    int e =
        k3c_json_get_int(c, required ? K3C_JSON_REQ : K3C_JSON_OPT, K3C_SPOT(o, where, key), K3C_NOSPOT, out, &present);
    if (!e && !present) *out = def;
    return e;
}

/* A path relative to the config file's directory (absolute paths unchanged). */
static int get_path(ctx *c, const k3c_json *o, const char *where, const char *key, int required, char *out, size_t n) {
    const char *v;
    int e = k3c_json_get_str(c, required ? K3C_JSON_REQ : K3C_JSON_OPT, K3C_SPOT(o, where, key), &v);
    if (e) return e;
    out[0] = 0;
    if (!v) return 0;
    if (!v[0]) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: expected a non-empty string", c->file, where, key);
    const char *slash = strrchr(c->file, '/');
    int len = v[0] == '/' || !slash ? snprintf(out, n, "%s", v)
                                    : snprintf(out, n, "%.*s/%s", (int)(slash - c->file), c->file, v);
    if (len < 0 || (size_t)len >= n) /* a truncated path could name another directory */
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: path longer than %zu bytes", c->file, where, key, n - 1);
    return 0;
}

static int get_str(ctx *c, const k3c_json *o, const char *where, const char *key, const char *def, char *out,
                   size_t n) {
    const char *v;
    int e = k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(o, where, key), &v);
    if (e) return e;
    if (!v) v = def;
    if (strlen(v) >= n)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: expected a string (< %zu bytes)", c->file, where, key, n);
    snprintf(out, n, "%s", v);
    return 0;
}

/* "parallel": {"dp", "ep", "tp", "pp", "cp"}, each ≥ 1 (absent keys 1), "micro_batches" (≥ 1, absent: pp) and
 * "force" (a boolean, absent: false); checked against the world and the model when the run starts (parallel/layout.c).
 * No block leaves every degree 0. */
static int parse_parallel(ctx *c, const k3c_json *p, k3c_parallel *out, int *force) {
    static const char *const keys[] = {"dp", "ep", "tp", "pp", "cp", "micro_batches", "force", NULL};
    int64_t *deg[] = {&out->dp, &out->ep, &out->tp, &out->pp, &out->cp, &out->micro_batches};
    memset(out, 0, sizeof *out);
    *force = 0;
    if (!p) return 0;
    if (p->type != K3C_JSON_OBJECT) return k3c_errf(c->err, K3C_ECONFIG, "%s: parallel: expected an object", c->file);
    int e = keys_known(c, p, "parallel.", keys);
    for (int i = 0; !e && i < 6; i++) {
        e = get_int(c, p, "parallel.", keys[i], i < 5 ? 1 : 0, 0, deg[i]);
        if (!e && k3c_json_get(p, keys[i]) && (*deg[i] < 1 || *deg[i] > 65536)) /* absent: the defaults */
            e = k3c_errf(c->err, K3C_ECONFIG, "%s: parallel.%s: %lld, must be 1..65536", c->file, keys[i],
                         (long long)*deg[i]);
    }
    int present;
    if (!e) e = k3c_json_get_bool(c, K3C_JSON_OPT, K3C_SPOT(p, "parallel.", "force"), K3C_NOSPOT, force, &present);
    return e;
}

static int parse_stage(ctx *c, const k3c_json *s, int i, const k3c_run_config *rc, int64_t default_tps, k3c_stage *st) {
    char where[64];
    snprintf(where, sizeof where, "stages[%d].", i);
    if (s->type != K3C_JSON_OBJECT)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: stages[%d]: expected an object", c->file, i);
    static const char *const keys[] = {"name",         "seq_len", "tokens_per_step", "steps",   "lr",
                                       "min_lr_ratio", "warmup",  "schedule",        "mixture", NULL};
    int rc_ = keys_known(c, s, where, keys);
    char sched[16];
    if (!rc_) rc_ = get_str(c, s, where, "name", "", st->name, sizeof st->name);
    if (!rc_) rc_ = get_int(c, s, where, "seq_len", 0, 1, &st->seq_len);
    if (!rc_) rc_ = get_int(c, s, where, "tokens_per_step", default_tps, default_tps <= 0, &st->tokens_per_step);
    if (!rc_) rc_ = get_int(c, s, where, "steps", 0, 1, &st->steps);
    if (!rc_) rc_ = get_num(c, s, where, "lr", 0, 1, &st->lr);
    if (!rc_) rc_ = get_num(c, s, where, "min_lr_ratio", 0.1, 0, &st->min_lr_ratio);
    if (!rc_) rc_ = get_int(c, s, where, "warmup", 0, 0, &st->warmup);
    if (!rc_) rc_ = get_str(c, s, where, "schedule", "cosine", sched, sizeof sched);
    if (!rc_ && k3c_schedule_parse(sched, &st->schedule, NULL))
        rc_ = k3c_errf(c->err, K3C_ECONFIG, "%s: %sschedule: '%s' is not cosine, linear or constant", c->file, where,
                       sched);
    if (rc_) return rc_;
    if (!st->name[0]) snprintf(st->name, sizeof st->name, "stage%d", i);
    if (st->seq_len <= 0)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %sseq_len: %lld, must be positive", c->file, where,
                        (long long)st->seq_len);
    if (st->tokens_per_step <= 0)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %stokens_per_step: %lld, must be positive", c->file, where,
                        (long long)st->tokens_per_step);
    if (st->steps <= 0)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %ssteps: %lld, must be positive", c->file, where,
                        (long long)st->steps);
    if (st->seq_len > st->tokens_per_step)
        return k3c_errf(c->err, K3C_ECONFIG,
                        "%s: %sseq_len %lld exceeds tokens_per_step %lld (a step holds whole pieces)", c->file, where,
                        (long long)st->seq_len, (long long)st->tokens_per_step);
    if (!(st->lr > 0)) return k3c_errf(c->err, K3C_ECONFIG, "%s: %slr: %g, must be > 0", c->file, where, st->lr);
    if (st->min_lr_ratio < 0 || st->min_lr_ratio > 1)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %smin_lr_ratio: %g, must be in [0, 1]", c->file, where,
                        st->min_lr_ratio);
    if (st->warmup < 0 || st->warmup > st->steps)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %swarmup: %lld, must be in [0, steps = %lld]", c->file, where,
                        (long long)st->warmup, (long long)st->steps);
    const k3c_json *mix = k3c_json_get(s, "mixture");
    if (mix) {
        if (mix->type != K3C_JSON_OBJECT)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %smixture: expected an object", c->file, where);
        double total = 0;
        for (size_t j = 0; j < mix->n; j++) {
            int k = -1;
            for (int q = 0; q < rc->n_sources; q++)
                if (strcmp(rc->source_name[q], mix->keys[j]) == 0) k = q;
            if (k < 0)
                return k3c_errf(c->err, K3C_ECONFIG, "%s: %smixture.%s: no data source of that name", c->file, where,
                                mix->keys[j]);
            if (mix->items[j].type != K3C_JSON_NUMBER || !(mix->items[j].number >= 0))
                return k3c_errf(c->err, K3C_ECONFIG, "%s: %smixture.%s: weight must be a number ≥ 0", c->file, where,
                                mix->keys[j]);
            st->mixture[k] = mix->items[j].number;
            total += st->mixture[k];
        }
        if (!(total > 0)) return k3c_errf(c->err, K3C_ECONFIG, "%s: %smixture: weights sum to 0", c->file, where);
    }
    return 0;
}

/* "guard": {"spike_factor": 5, "window": 32, "max_skips": 3, "lr_factor": 0.5} (all optional; these are the defaults) */
static int parse_guard(ctx *c, const k3c_json *g, k3c_run_config *rc) {
    static const char *const keys[] = {"spike_factor", "window", "max_skips", "lr_factor", NULL};
    static const k3c_json empty = {.type = K3C_JSON_OBJECT};
    if (g && g->type != K3C_JSON_OBJECT) return k3c_errf(c->err, K3C_ECONFIG, "%s: guard: expected an object", c->file);
    const k3c_json *o = g ? g : &empty;
    int e = keys_known(c, o, "guard.", keys);
    if (!e) e = get_num(c, o, "guard.", "spike_factor", 5.0, 0, &rc->guard_spike_factor);
    if (!e) e = get_int(c, o, "guard.", "window", 32, 0, &rc->guard_window);
    if (!e) e = get_int(c, o, "guard.", "max_skips", 3, 0, &rc->guard_max_skips);
    if (!e) e = get_num(c, o, "guard.", "lr_factor", 0.5, 0, &rc->guard_lr_factor);
    if (e) return e;
    if (!(rc->guard_spike_factor == 0 || rc->guard_spike_factor > 1))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: guard.spike_factor: %g, must be 0 (off) or > 1", c->file,
                        rc->guard_spike_factor);
    if (rc->guard_window < 1 || rc->guard_window > K3C_GUARD_MAX_WINDOW)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: guard.window: %lld, must be in 1..%d", c->file,
                        (long long)rc->guard_window, K3C_GUARD_MAX_WINDOW);
    if (rc->guard_max_skips < 0)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: guard.max_skips: %lld, must be >= 0 (0: never roll back)", c->file,
                        (long long)rc->guard_max_skips);
    if (!(rc->guard_lr_factor > 0 && rc->guard_lr_factor <= 1))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: guard.lr_factor: %g, must be in (0, 1]", c->file,
                        rc->guard_lr_factor);
    return 0;
}

/* "balancing" (quantile balancing by default) and the coefficient of the method that has one: "bias_gamma" only with
 * "bias", "aux_alpha" only with "aux" (a coefficient the method would ignore is an error, not a silent no-op). */
static int parse_balancing(ctx *c, const k3c_json *r, k3c_run_config *rc) {
    static const struct {
        const char *name;
        int method, qb_mode;
    } methods[] = {{"exact", K3C_BALANCE_QUANTILE, K3C_QB_EXACT},
                   {"quantile", K3C_BALANCE_QUANTILE, K3C_QB_EXACT},
                   {"histogram", K3C_BALANCE_QUANTILE, K3C_QB_HISTOGRAM},
                   {"bias", K3C_BALANCE_BIAS, -1},
                   {"aux", K3C_BALANCE_AUX, -1},
                   {"none", K3C_BALANCE_NONE, -1},
                   {"off", K3C_BALANCE_NONE, -1}};
    char bal[16];
    int e = get_str(c, r, "", "balancing", "exact", bal, sizeof bal), found = 0;
    if (e) return e;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0] && !found; i++)
        if (strcmp(bal, methods[i].name) == 0)
            rc->balancing = methods[i].method, rc->qb_mode = methods[i].qb_mode, found = 1;
    if (!found)
        return k3c_errf(c->err, K3C_ECONFIG,
                        "%s: balancing: '%s' is not exact (= quantile), histogram, bias, aux or none (= off)", c->file,
                        bal);
    static const struct {
        const char *key;
        int method;
        double def;
    } coef[2] = {{"bias_gamma", K3C_BALANCE_BIAS, 0.001}, {"aux_alpha", K3C_BALANCE_AUX, 0.01}};
    double *out[2] = {&rc->bias_gamma, &rc->aux_alpha};
    for (int i = 0; i < 2; i++) {
        if (k3c_json_get(r, coef[i].key) && rc->balancing != coef[i].method)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s: only with balancing \"%s\" (this run balances by '%s')",
                            c->file, coef[i].key, coef[i].method == K3C_BALANCE_BIAS ? "bias" : "aux", bal);
        if ((e = get_num(c, r, "", coef[i].key, coef[i].def, 0, out[i]))) return e;
        if (!(*out[i] > 0) || !isfinite(*out[i]))
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s: %g, must be > 0", c->file, coef[i].key, *out[i]);
        if (rc->balancing != coef[i].method) *out[i] = 0; /* unused by this run */
    }
    return 0;
}

static int parse_root(ctx *c, const k3c_json *r, k3c_run_config *rc) {
    if (r->type != K3C_JSON_OBJECT) return k3c_errf(c->err, K3C_ECONFIG, "%s: expected a JSON object", c->file);
    static const char *const keys[] = {"model",
                                       "tokenizer",
                                       "pattern",
                                       "out_dir",
                                       "data",
                                       "stages",
                                       "seed",
                                       "init_std",
                                       "kda_chunk",
                                       "threads",
                                       "optimizer",
                                       "balancing",
                                       "bias_gamma",
                                       "aux_alpha",
                                       "tokens_per_step",
                                       "log_every",
                                       "eval_every",
                                       "eval_batches",
                                       "checkpoint_every",
                                       "keep_checkpoints",
                                       "recompute",
                                       "recompute_slice",
                                       "head_chunk",
                                       "parallel",
                                       "guard",
                                       NULL};
    int e = keys_known(c, r, "", keys);
    int64_t v;
    if (!e) e = get_path(c, r, "", "model", 1, rc->model_config, sizeof rc->model_config);
    if (!e) e = get_path(c, r, "", "tokenizer", 1, rc->vocab, sizeof rc->vocab);
    if (!e) e = get_str(c, r, "", "pattern", "cl100k", rc->pattern, sizeof rc->pattern);
    if (!e) e = get_path(c, r, "", "out_dir", 1, rc->out_dir, sizeof rc->out_dir);
    if (!e) e = get_int(c, r, "", "seed", 1234, 0, &v), rc->seed = (uint64_t)v;
    if (!e) e = get_num(c, r, "", "init_std", 0.02, 0, &rc->init_std);
    if (!e) e = get_int(c, r, "", "kda_chunk", 64, 0, &v), rc->kda_chunk = (int)v;
    if (!e && rc->kda_chunk != 0 && rc->kda_chunk != 16 && rc->kda_chunk != 64)
        e = k3c_errf(c->err, K3C_ECONFIG, "%s: kda_chunk: %d, must be 16, 64 or 0 (token recurrence)", c->file,
                     rc->kda_chunk);
    if (!e) e = get_int(c, r, "", "threads", 0, 0, &v), rc->threads = (int)v;
    if (!e) e = get_int(c, r, "", "log_every", 1, 0, &rc->log_every);
    if (!e) e = get_int(c, r, "", "eval_every", 100, 0, &rc->eval_every);
    if (!e) e = get_int(c, r, "", "eval_batches", 4, 0, &rc->eval_batches);
    if (!e) e = get_int(c, r, "", "checkpoint_every", 0, 0, &rc->checkpoint_every);
    if (!e) e = get_int(c, r, "", "keep_checkpoints", 2, 0, &rc->keep_checkpoints);
    if (e) return e;
    if (rc->log_every <= 0 || rc->eval_every < 0 || rc->eval_batches < 0 || rc->checkpoint_every < 0 ||
        rc->keep_checkpoints < 1)
        return k3c_errf(c->err, K3C_ECONFIG,
                        "%s: log_every > 0; eval_every, eval_batches, checkpoint_every ≥ 0; keep_checkpoints ≥ 1",
                        c->file);
    const k3c_json *data = k3c_json_get(r, "data");
    if (!data || data->type != K3C_JSON_OBJECT || data->n == 0 || data->n > K3C_RUN_MAX_SOURCES)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: data: expected an object of 1..%d sources {name: shard dir}", c->file,
                        K3C_RUN_MAX_SOURCES);
    rc->n_sources = (int)data->n;
    for (size_t i = 0; i < data->n; i++) {
        if (strlen(data->keys[i]) >= sizeof rc->source_name[0])
            return k3c_errf(c->err, K3C_ECONFIG, "%s: data.%s: name too long", c->file, data->keys[i]);
        snprintf(rc->source_name[i], sizeof rc->source_name[i], "%s", data->keys[i]);
        if ((e = get_path(c, data, "data.", data->keys[i], 1, rc->source_dir[i], sizeof rc->source_dir[i]))) return e;
    }
    const k3c_json *opt = k3c_json_get(r, "optimizer");
    if (opt) {
        static const char *const okeys[] = {"matrix", "muon_precision", "weight_decay", "beta1", "beta2",
                                            "eps",    "grad_clip",      "qk_clip_tau",  NULL};
        if (opt->type != K3C_JSON_OBJECT)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: optimizer: expected an object", c->file);
        if ((e = keys_known(c, opt, "optimizer.", okeys))) return e;
    }
    static const k3c_json empty = {.type = K3C_JSON_OBJECT};
    const k3c_json *o = opt ? opt : &empty;
    int m;
    if (!e) e = get_str(c, o, "optimizer.", "matrix", "muon", rc->matrix_optimizer, sizeof rc->matrix_optimizer);
    if (!e && k3c_optim_parse_matrix(rc->matrix_optimizer, &m, NULL))
        e = k3c_errf(c->err, K3C_ECONFIG, "%s: optimizer.matrix: '%s' is not muon or adamw", c->file,
                     rc->matrix_optimizer);
    if (!e) e = get_str(c, o, "optimizer.", "muon_precision", "auto", rc->muon_precision, sizeof rc->muon_precision);
    if (!e && k3c_optim_parse_muon_precision(rc->muon_precision, &m, NULL))
        e = k3c_errf(c->err, K3C_ECONFIG, "%s: optimizer.muon_precision: '%s' is not auto, fp32 or bf16", c->file,
                     rc->muon_precision);
    if (!e) e = get_num(c, o, "optimizer.", "weight_decay", 0.1, 0, &rc->weight_decay);
    if (!e) e = get_num(c, o, "optimizer.", "beta1", 0.9, 0, &rc->beta1);
    if (!e) e = get_num(c, o, "optimizer.", "beta2", 0.95, 0, &rc->beta2);
    if (!e) e = get_num(c, o, "optimizer.", "eps", 1e-8, 0, &rc->eps);
    if (!e) e = get_num(c, o, "optimizer.", "grad_clip", 1.0, 0, &rc->grad_clip);
    if (!e) e = get_num(c, o, "optimizer.", "qk_clip_tau", K3C_QK_CLIP_TAU, 0, &rc->qk_clip_tau);
    if (e) return e;
    if (!(rc->qk_clip_tau >= 0))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: optimizer.qk_clip_tau: %g, must be > 0, or 0 (QK-Clip off)", c->file,
                        rc->qk_clip_tau);
    char bal[16];
    if ((e = get_str(c, r, "", "recompute", "none", bal, sizeof bal))) return e;
    if (strcmp(bal, "none") && strcmp(bal, "all"))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: recompute: '%s' is not none or all", c->file, bal);
    rc->recompute = strcmp(bal, "all") == 0;
    if ((e = get_int(c, r, "", "recompute_slice", 0, 0, &rc->recompute_slice))) return e;
    if (rc->recompute_slice < 0 || (rc->recompute_slice > 0 && !rc->recompute))
        return k3c_errf(c->err, K3C_ECONFIG, "%s: recompute_slice: %lld, %s", c->file, (long long)rc->recompute_slice,
                        rc->recompute_slice < 0 ? "must be ≥ 0 (tokens a slice; 0 = off)"
                                                : "only with recompute \"all\" (the layers that run in slices)");
    if ((e = get_int(c, r, "", "head_chunk", 0, 0, &rc->head_chunk))) return e;
    if (rc->head_chunk < 0)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: head_chunk: %lld, must be ≥ 0 (tokens a chunk of the head; 0 = off)",
                        c->file, (long long)rc->head_chunk);
    if ((e = parse_balancing(c, r, rc))) return e;
    if ((e = parse_parallel(c, k3c_json_get(r, "parallel"), &rc->parallel, &rc->parallel_force))) return e;
    if ((e = parse_guard(c, k3c_json_get(r, "guard"), rc))) return e;
    int64_t tps;
    if ((e = get_int(c, r, "", "tokens_per_step", 0, 0, &tps))) return e;
    const k3c_json *stages = k3c_json_get(r, "stages");
    if (!stages || stages->type != K3C_JSON_ARRAY || stages->n == 0 || stages->n > K3C_RUN_MAX_STAGES)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: stages: expected an array of 1..%d stages", c->file,
                        K3C_RUN_MAX_STAGES);
    rc->n_stages = (int)stages->n;
    for (int i = 0; i < rc->n_stages; i++)
        if ((e = parse_stage(c, &stages->items[i], i, rc, tps, &rc->stage[i]))) return e;
    return 0;
}

int k3c_run_config_load(const char *path, k3c_run_config *rc, k3c_err *err) {
    memset(rc, 0, sizeof *rc);
    snprintf(rc->path, sizeof rc->path, "%s", path);
    char *text;
    size_t n;
    int e = k3c_read_file(path, &text, &n, err);
    if (e) return e;
    k3c_json *root = NULL;
    e = k3c_json_parse(text, n, path, &root, err);
    free(text);
    if (e) return e;
    ctx c = {path, err};
    e = parse_root(&c, root, rc);
    k3c_json_free(root);
    return e;
}
