/* ablate.c — `k3c ablate`: reads a grid (a base run config, axes of arms as JSON merge patches, seeds, evaluations),
 * writes each run's model and run config, trains (or resumes, or skips) every arm × seed one after another, measures
 * each run (its metrics.jsonl, the evaluations on its last checkpoint) and writes the report. Spec:
 * docs/EXPERIMENTS.md "Grids", "Runs". */
#include "exp/exp.h"

#include "base/json.h"
#include "k3c/train.h"
#include "train/checkpoint.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- JSON merge patch (RFC 7386) */

static void write_merged(k3c_sbuf *s, const k3c_json *base, const k3c_json *patch) {
    if (!patch || patch->type != K3C_JSON_OBJECT) {
        k3c_sbuf_json_value(s, patch ? patch : base, K3C_JSON_W_LEXEMES);
        return;
    }
    const int obj = base && base->type == K3C_JSON_OBJECT;
    int first = 1;
    k3c_sbuf_printf(s, "{");
    for (size_t i = 0; obj && i < base->n; i++) {
        const k3c_json *p = k3c_json_get(patch, base->keys[i]);
        if (p && p->type == K3C_JSON_NULL) continue; /* null removes the member */
        k3c_sbuf_printf(s, "%s", first ? "" : ",");
        first = 0;
        k3c_sbuf_json_string(s, base->keys[i], strlen(base->keys[i]));
        k3c_sbuf_printf(s, ":");
        write_merged(s, &base->items[i], p);
    }
    for (size_t i = 0; i < patch->n; i++) {
        if (patch->items[i].type == K3C_JSON_NULL || (obj && k3c_json_get(base, patch->keys[i]))) continue;
        k3c_sbuf_printf(s, "%s", first ? "" : ",");
        first = 0;
        k3c_sbuf_json_string(s, patch->keys[i], strlen(patch->keys[i]));
        k3c_sbuf_printf(s, ":");
        write_merged(s, NULL, &patch->items[i]);
    }
    k3c_sbuf_printf(s, "}");
}

/* base ⊕ patch as a new tree (*out), named `name` in messages. */
static int merge(const k3c_json *base, const k3c_json *patch, const char *name, k3c_json **out, k3c_err *err) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    write_merged(&s, base, patch);
    int e = s.ok ? k3c_json_parse(s.buf, s.len, name, out, err) : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", name);
    k3c_sbuf_free(&s);
    return e;
}

static int write_json(const char *path, const k3c_json *v, k3c_err *err) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_json_value(&s, v, K3C_JSON_W_LEXEMES | K3C_JSON_W_SPACED);
    k3c_sbuf_printf(&s, "\n");
    int e =
        s.ok ? k3c_write_file_atomic(path, s.buf, s.len, err) : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    k3c_sbuf_free(&s);
    return e;
}

/* ---------------------------------------------------------------- the grid */

int k3c_exp_mkdirs(const char *path, k3c_err *err) {
    char p[1100];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) return k3c_errf(err, K3C_EIO, "%s: cannot create", p);
            *c = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return k3c_errf(err, K3C_EIO, "%s: cannot create", p);
    return K3C_OK;
}

/* path taken relative to the directory of `file` (absolute paths unchanged). */
static int resolve(const char *file, const char *path, char *out, size_t n, k3c_err *err) {
    const char *slash = strrchr(file, '/');
    int len = path[0] == '/' || !slash ? snprintf(out, n, "%s", path)
                                       : snprintf(out, n, "%.*s/%s", (int)(slash - file), file, path);
    if (len < 0 || (size_t)len >= n) return k3c_errf(err, K3C_ECONFIG, "%s: %s: path too long", file, path);
    return K3C_OK;
}

typedef struct {
    const k3c_json *run, *model; /* merge patches (NULL: none) */
    double lr_scale;
} arm_patch;

typedef struct {
    char path[PATH_MAX];      /* the grid file, absolute */
    char base_path[PATH_MAX]; /* the base run config, absolute */
    k3c_json *root, *base_run, *base_model;
    int base_nested; /* the model config keeps its fields under text_config */
    k3c_ablate_eval_spec ev;
    int64_t spike_window;
    double spike_factor;
    arm_patch *patch; /* per arm of the result */
} grid;

static int grid_num(k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, double def, double *out) {
    int present;
    int e = k3c_json_get_num(c, K3C_JSON_OPT, K3C_SPOT(o, where, key), K3C_NOSPOT, out, &present);
    if (!e && !present) *out = def;
    return e;
}

static int known(k3c_json_ctx *c, const k3c_json *o, const char *where, const char *const *keys) {
    if (o->type != K3C_JSON_OBJECT)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s: expected an object", c->file, where[0] ? where : "grid");
    for (size_t i = 0; i < o->n; i++) {
        int ok = 0;
        for (const char *const *k = keys; *k && !ok; k++) ok = strcmp(*k, o->keys[i]) == 0;
        if (!ok) return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: unknown key", c->file, where, o->keys[i]);
    }
    return K3C_OK;
}

/* A list of up to cap numbers ("where" for messages); *n its length (at least 1). */
static int num_list(k3c_json_ctx *c, const k3c_json *o, const char *where, const char *key, double *out, int cap,
                    int *n) {
    const k3c_json *a = k3c_json_get(o, key);
    if (!a || a->type != K3C_JSON_ARRAY || a->n < 1 || a->n > (size_t)cap)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s: expected an array of 1..%d numbers", c->file, where, key, cap);
    for (size_t i = 0; i < a->n; i++) {
        if (a->items[i].type != K3C_JSON_NUMBER)
            return k3c_errf(c->err, K3C_ECONFIG, "%s: %s%s[%zu]: expected a number", c->file, where, key, i);
        out[i] = a->items[i].number;
    }
    *n = (int)a->n;
    return K3C_OK;
}

static int parse_evals(k3c_json_ctx *c, const k3c_json *ev, k3c_ablate_eval_spec *s) {
    memset(s, 0, sizeof *s);
    if (!ev) return K3C_OK;
    static const char *const keys[] = {"seed", "max_tokens", "mqar", "needle", "position", NULL};
    int e = known(c, ev, "evals.", keys);
    double v;
    if (!e) e = grid_num(c, ev, "evals.", "seed", 7, &v), s->seed = (uint64_t)v;
    if (!e) e = grid_num(c, ev, "evals.", "max_tokens", 8192, &v), s->max_tokens = (int64_t)v;
    const k3c_json *mq = k3c_json_get(ev, "mqar"), *nd = k3c_json_get(ev, "needle"), *ps = k3c_json_get(ev, "position");
    static const char *const mkeys[] = {"pairs", "docs", NULL}, *const nkeys[] = {"lengths", "depths", "docs", NULL},
                             *const pkeys[] = {"train_len", "factors", "docs", NULL};
    double list[K3C_ABLATE_MAX_LIST];
    if (!e && mq && !(e = known(c, mq, "evals.mqar.", mkeys)) &&
        !(e = num_list(c, mq, "evals.mqar.", "pairs", list, K3C_ABLATE_MAX_LIST, &s->n_pairs))) {
        for (int i = 0; i < s->n_pairs; i++) s->pairs[i] = (int)list[i];
        e = grid_num(c, mq, "evals.mqar.", "docs", 64, &v), s->mqar_docs = (int64_t)v;
    }
    if (!e && nd && !(e = known(c, nd, "evals.needle.", nkeys)) &&
        !(e = num_list(c, nd, "evals.needle.", "lengths", list, K3C_ABLATE_MAX_LIST, &s->n_lengths)) &&
        !(e = num_list(c, nd, "evals.needle.", "depths", s->depths, K3C_ABLATE_MAX_LIST, &s->n_depths))) {
        for (int i = 0; i < s->n_lengths; i++) s->lengths[i] = (int64_t)list[i];
        e = grid_num(c, nd, "evals.needle.", "docs", 4, &v), s->needle_docs = (int64_t)v;
    }
    if (!e && ps && !(e = known(c, ps, "evals.position.", pkeys)) &&
        !(e = num_list(c, ps, "evals.position.", "factors", list, K3C_ABLATE_MAX_LIST, &s->n_factors))) {
        for (int i = 0; i < s->n_factors; i++) s->factors[i] = (int64_t)list[i];
        if (!(e = grid_num(c, ps, "evals.position.", "train_len", 0, &v))) s->train_len = (int64_t)v;
        if (!e) e = grid_num(c, ps, "evals.position.", "docs", 4, &v), s->position_docs = (int64_t)v;
        if (!e && s->train_len < 1)
            e = k3c_errf(c->err, K3C_ECONFIG, "%s: evals.position.train_len: required, >= 1", c->file);
    }
    return e ? e : k3c_ablate_eval_check(s, c->file, c->err);
}

static int add_arm(k3c_ablate_result *res, grid *g, const char *axis, const char *arm, const char *metric, arm_patch p,
                   k3c_err *err) {
    k3c_ablate_arm *a = realloc(res->arm, sizeof *a * (size_t)(res->n_arms + 1));
    arm_patch *q = realloc(g->patch, sizeof *q * (size_t)(res->n_arms + 1));
    if (a) res->arm = a;
    if (q) g->patch = q;
    if (!a || !q) return k3c_errf(err, K3C_ENOMEM, "ablate: out of memory");
    k3c_ablate_arm *x = &res->arm[res->n_arms];
    memset(x, 0, sizeof *x);
    if (strlen(axis) >= sizeof x->axis || strlen(arm) >= sizeof x->arm || strlen(metric) >= sizeof x->metric ||
        strpbrk(axis, "/ '\"\\$`") || strpbrk(arm, "/ '\"\\$`") || !axis[0] || !arm[0])
        return k3c_errf(err, K3C_ECONFIG, "%s: axis '%s' arm '%s': names are 1..63 bytes without / spaces or quotes",
                        g->path, axis, arm);
    snprintf(x->axis, sizeof x->axis, "%s", axis);
    snprintf(x->arm, sizeof x->arm, "%s", arm);
    snprintf(x->metric, sizeof x->metric, "%s", metric);
    g->patch[res->n_arms++] = p;
    return K3C_OK;
}

static int parse_axes(k3c_json_ctx *c, grid *g, k3c_ablate_result *res) {
    const k3c_json *axes = k3c_json_get(g->root, "axes");
    if (!axes || axes->type != K3C_JSON_ARRAY || axes->n == 0)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: axes: expected a non-empty array", c->file);
    for (size_t i = 0; i < axes->n; i++) {
        const k3c_json *ax = &axes->items[i];
        static const char *const keys[] = {"name", "metric", "arms", NULL}, *const akeys[] = {"run", "model",
                                                                                              "lr_scale", NULL};
        char where[96];
        snprintf(where, sizeof where, "axes[%zu].", i);
        int e = known(c, ax, where, keys);
        const char *name, *metric;
        if (!e) e = k3c_json_get_str(c, K3C_JSON_REQ, K3C_SPOT(ax, where, "name"), &name);
        if (!e) e = k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(ax, where, "metric"), &metric);
        const k3c_json *arms = k3c_json_get(ax, "arms");
        if (!e && (!arms || arms->type != K3C_JSON_OBJECT || arms->n == 0))
            e = k3c_errf(c->err, K3C_ECONFIG, "%s: %sarms: expected an object of arms", c->file, where);
        for (size_t j = 0; !e && j < arms->n; j++) {
            char aw[256];
            snprintf(aw, sizeof aw, "%sarms.%s.", where, arms->keys[j]);
            const k3c_json *a = &arms->items[j];
            arm_patch p = {k3c_json_get(a, "run"), k3c_json_get(a, "model"), 1};
            if (!(e = known(c, a, aw, akeys))) e = grid_num(c, a, aw, "lr_scale", 1, &p.lr_scale);
            if (!e && (!(p.lr_scale > 0) || !isfinite(p.lr_scale)))
                e = k3c_errf(c->err, K3C_ECONFIG, "%s: %slr_scale: %g, must be > 0", c->file, aw, p.lr_scale);
            if (!e && ((p.run && p.run->type != K3C_JSON_OBJECT) || (p.model && p.model->type != K3C_JSON_OBJECT)))
                e = k3c_errf(c->err, K3C_ECONFIG, "%s: %srun / model: expected objects (merge patches)", c->file, aw);
            static const char *const fixed[] = {"model", "out_dir", "seed"}; /* the runner sets these itself */
            for (int k = 0; !e && p.run && k < 3; k++)
                if (k3c_json_get(p.run, fixed[k]))
                    e = k3c_errf(c->err, K3C_ECONFIG,
                                 "%s: %srun.%s: set by the runner (the model patch, the run directory, \"seeds\")",
                                 c->file, aw, fixed[k]);
            for (int k = 0; !e && k < res->n_arms; k++)
                if (!strcmp(res->arm[k].axis, name) && !strcmp(res->arm[k].arm, arms->keys[j]))
                    e = k3c_errf(c->err, K3C_ECONFIG, "%s: %s: arm listed twice", c->file, aw);
            if (!e) e = add_arm(res, g, name, arms->keys[j], metric ? metric : "val_loss", p, c->err);
        }
        if (e) return e;
    }
    return K3C_OK;
}

static int load_grid(const char *path, grid *g, k3c_ablate_result *res, k3c_err *err) {
    memset(g, 0, sizeof *g);
    if (!realpath(path, g->path)) return k3c_errf(err, K3C_ENOTFOUND, "%s: %s", path, strerror(errno));
    int e = k3c_json_parse_file(g->path, &g->root, err);
    if (e) return e;
    k3c_json_ctx c = {g->path, err};
    static const char *const keys[] = {"base",         "out_dir", "seeds", "spike_window",
                                       "spike_factor", "evals",   "axes",  NULL};
    if ((e = known(&c, g->root, "", keys))) return e;
    const char *base, *out;
    if ((e = k3c_json_get_str(&c, K3C_JSON_REQ, K3C_SPOT(g->root, "", "base"), &base))) return e;
    if ((e = k3c_json_get_str(&c, K3C_JSON_REQ, K3C_SPOT(g->root, "", "out_dir"), &out))) return e;
    char tmp[PATH_MAX];
    if ((e = resolve(g->path, base, tmp, sizeof tmp, err))) return e;
    if (!realpath(tmp, g->base_path))
        return k3c_errf(err, K3C_ENOTFOUND, "%s: base: %s: %s", g->path, tmp, strerror(errno));
    if ((e = resolve(g->path, out, res->out_dir, sizeof res->out_dir, err))) return e;
    double seeds[K3C_ABLATE_MAX_SEEDS], v;
    if ((e = num_list(&c, g->root, "", "seeds", seeds, K3C_ABLATE_MAX_SEEDS, &res->n_seeds))) return e;
    for (int i = 0; i < res->n_seeds; i++) {
        if (!(seeds[i] >= 0) || seeds[i] != floor(seeds[i]))
            return k3c_errf(err, K3C_ECONFIG, "%s: seeds[%d]: %g, expected an integer >= 0", g->path, i, seeds[i]);
        res->seed[i] = (uint64_t)seeds[i];
    }
    if ((e = grid_num(&c, g->root, "", "spike_window", 16, &v))) return e;
    g->spike_window = (int64_t)v;
    if ((e = grid_num(&c, g->root, "", "spike_factor", 1.2, &g->spike_factor))) return e;
    if (g->spike_window < 1 || !(g->spike_factor > 1))
        return k3c_errf(err, K3C_ECONFIG, "%s: spike_window >= 1 and spike_factor > 1", g->path);
    if ((e = parse_evals(&c, k3c_json_get(g->root, "evals"), &g->ev))) return e;
    if ((e = k3c_json_parse_file(g->base_path, &g->base_run, err))) return e;
    const char *model;
    k3c_json_ctx bc = {g->base_path, err};
    if ((e = k3c_json_get_str(&bc, K3C_JSON_REQ, K3C_SPOT(g->base_run, "", "model"), &model))) return e;
    if ((e = resolve(g->base_path, model, tmp, sizeof tmp, err))) return e;
    if ((e = k3c_json_parse_file(tmp, &g->base_model, err))) return e;
    g->base_nested = k3c_json_get(g->base_model, "text_config") != NULL;
    if ((e = add_arm(res, g, "base", "base", "val_loss", (arm_patch){NULL, NULL, 1}, err))) return e;
    return parse_axes(&c, g, res);
}

static void grid_free(grid *g) {
    k3c_json_free(g->root);
    k3c_json_free(g->base_run);
    k3c_json_free(g->base_model);
    free(g->patch);
}

/* ---------------------------------------------------------------- one run */

/* The arm's model.json and run.json in dir: the base with the arm's patches, every path absolute, the seed and the
 * run's own out_dir. */
static int write_configs(const grid *g, const arm_patch *p, uint64_t seed, const char *dir, k3c_err *err) {
    k3c_json *run = NULL, *model = NULL, *fix = NULL, *out = NULL;
    char mpath[1200], rpath[1200], abs_[PATH_MAX];
    snprintf(mpath, sizeof mpath, "%s/model.json", dir);
    snprintf(rpath, sizeof rpath, "%s/run.json", dir);
    int e = merge(g->base_run, p->run, g->path, &run, err);
    if (!e && p->model) { /* the patch applies where the fields are: text_config of a nested config */
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        if (g->base_nested) k3c_sbuf_printf(&s, "{\"text_config\":");
        k3c_sbuf_json_value(&s, p->model, K3C_JSON_W_LEXEMES);
        if (g->base_nested) k3c_sbuf_printf(&s, "}");
        k3c_json *mp = NULL;
        e = s.ok ? k3c_json_parse(s.buf, s.len, g->path, &mp, err) : k3c_errf(err, K3C_ENOMEM, "out of memory");
        if (!e) e = merge(g->base_model, mp, g->path, &model, err);
        k3c_json_free(mp);
        k3c_sbuf_free(&s);
    }
    if (!e) e = write_json(mpath, model ? model : g->base_model, err);
    k3c_sbuf s; /* the fixed members: paths, seed, out_dir */
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "{\"model\":");
    k3c_sbuf_json_string(&s, mpath, strlen(mpath));
    k3c_sbuf_printf(&s, ",\"out_dir\":");
    k3c_sbuf_json_string(&s, dir, strlen(dir));
    k3c_sbuf_printf(&s, ",\"seed\":%llu", (unsigned long long)seed);
    const k3c_json *tok = run ? k3c_json_get(run, "tokenizer") : NULL, *data = run ? k3c_json_get(run, "data") : NULL;
    if (!e && tok && tok->type == K3C_JSON_STRING &&
        !(e = resolve(g->base_path, tok->string, abs_, sizeof abs_, err))) {
        k3c_sbuf_printf(&s, ",\"tokenizer\":");
        k3c_sbuf_json_string(&s, abs_, strlen(abs_));
    }
    if (!e && data && data->type == K3C_JSON_OBJECT) {
        k3c_sbuf_printf(&s, ",\"data\":{");
        for (size_t i = 0; !e && i < data->n; i++) {
            if (data->items[i].type != K3C_JSON_STRING) continue; /* the run config's reader names it */
            e = resolve(g->base_path, data->items[i].string, abs_, sizeof abs_, err);
            k3c_sbuf_printf(&s, "%s", i ? "," : "");
            k3c_sbuf_json_string(&s, data->keys[i], strlen(data->keys[i]));
            k3c_sbuf_printf(&s, ":");
            k3c_sbuf_json_string(&s, abs_, strlen(abs_));
        }
        k3c_sbuf_printf(&s, "}");
    }
    k3c_sbuf_printf(&s, "}");
    if (!e) e = s.ok ? k3c_json_parse(s.buf, s.len, g->path, &fix, err) : k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!e) e = merge(run, fix, g->path, &out, err);
    if (!e) e = write_json(rpath, out, err);
    k3c_sbuf_free(&s);
    k3c_json_free(run);
    k3c_json_free(model);
    k3c_json_free(fix);
    k3c_json_free(out);
    return e;
}

static int64_t total_tokens(const k3c_run_config *rc) {
    int64_t n = 0;
    for (int i = 0; i < rc->n_stages; i++) n += rc->stage[i].steps * rc->stage[i].tokens_per_step;
    return n;
}

/* result.json: {"status": "done" | "diverged", "error": "...", "metrics": {name: number | null}} */
static int write_result(const char *dir, int diverged, const char *why, const k3c_metric_set *m, k3c_err *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/result.json", dir);
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "{\n  \"status\": \"%s\",\n  \"error\": ", diverged ? "diverged" : "done");
    k3c_sbuf_json_string(&s, why, strlen(why));
    k3c_sbuf_printf(&s, ",\n  \"metrics\": {");
    for (int i = 0; i < m->n; i++) {
        k3c_sbuf_printf(&s, "%s\n    \"%s\": ", i ? "," : "", m->name[i]);
        if (isfinite(m->v[i]))
            k3c_sbuf_json_number(&s, m->v[i]);
        else
            k3c_sbuf_printf(&s, "null");
    }
    k3c_sbuf_printf(&s, "\n  }\n}\n");
    int e = s.ok ? k3c_write_file_atomic(path, s.buf, s.len, err) : k3c_errf(err, K3C_ENOMEM, "out of memory");
    k3c_sbuf_free(&s);
    return e;
}

/* A finished run's result.json back into m: 1 when there is one, 0 when the run has not finished, or an error. */
static int read_result(const char *dir, k3c_metric_set *m, k3c_err *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/result.json", dir);
    if (access(path, F_OK) != 0) return 0;
    k3c_json *r;
    int e = k3c_json_parse_file(path, &r, err);
    if (e) return -e;
    const k3c_json *ms = k3c_json_get(r, "metrics");
    for (size_t i = 0; ms && ms->type == K3C_JSON_OBJECT && i < ms->n; i++)
        k3c_metric_set_value(m, ms->keys[i], ms->items[i].type == K3C_JSON_NUMBER ? ms->items[i].number : NAN);
    k3c_json_free(r);
    if (!ms) return -k3c_errf(err, K3C_EFORMAT, "%s: no \"metrics\" object", path);
    return 1;
}

static int run_one(grid *g, const k3c_ablate_opts *o, const k3c_ablate_arm *arm, const arm_patch *p, uint64_t seed,
                   const char *dir, int64_t *tokens, k3c_metric_set *m, k3c_err *err) {
    int e = read_result(dir, m, err);
    if (e) {
        if (e > 0 && o->log)
            fprintf(o->log, "ablate: %s %s seed %llu: finished before, skipped\n", arm->axis, arm->arm,
                    (unsigned long long)seed);
        return e > 0 ? K3C_OK : -e;
    }
    if ((e = k3c_exp_mkdirs(dir, err)) || (e = write_configs(g, p, seed, dir, err))) return e;
    char path[1200], latest[1300];
    snprintf(path, sizeof path, "%s/run.json", dir);
    k3c_run_config rc;
    if ((e = k3c_run_config_load(path, &rc, err))) return e;
    for (int i = 0; i < rc.n_stages; i++) rc.stage[i].lr *= p->lr_scale;
    if (*tokens == 0) *tokens = total_tokens(&rc);
    if (total_tokens(&rc) != *tokens)
        return k3c_errf(err, K3C_ECONFIG, "%s: arm %s of axis %s trains %lld tokens, the base %lld (equal tokens)",
                        g->path, arm->arm, arm->axis, (long long)total_tokens(&rc), (long long)*tokens);
    const int resume = k3c_train_ckpt_latest(dir, latest, sizeof latest, NULL) == K3C_OK;
    if (o->log)
        fprintf(o->log, "ablate: %s %s seed %llu: %s\n", arm->axis, arm->arm, (unsigned long long)seed,
                resume ? "resuming" : "training");
    k3c_train_opts to = {resume, 0, NULL, NULL, o->backend, NULL};
    k3c_train_result tr;
    k3c_err terr = {0};
    e = k3c_train_run(&rc, &to, &tr, &terr);
    if (e && e != K3C_ENUMERIC) {
        *err = terr;
        return e;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if ((e = k3c_ablate_summarise(path, g->spike_window, g->spike_factor, rc.grad_clip, m, err))) return e;
    /* diverged: the trainer stopped on non-finite numbers, or the run ended above the loss it started at */
    const double first = k3c_ablate_first_loss(path), last = k3c_metric_get(m, "final_loss");
    const int diverged = terr.code != 0 || !isfinite(last) || !(last < first);
    k3c_metric_set_value(m, "diverged", diverged);
    if (!diverged && (e = k3c_ablate_evaluate(&g->ev, dir, rc.kda_chunk, o->backend, m, err))) return e;
    if (o->log)
        fprintf(o->log, "ablate: %s %s seed %llu: %s, validation loss %.4f, %.0f tokens/s\n", arm->axis, arm->arm,
                (unsigned long long)seed, diverged ? "diverged" : "done", k3c_metric_get(m, "val_loss"),
                k3c_metric_get(m, "tokens_per_s"));
    return write_result(dir, diverged, terr.code ? terr.msg : "", m, err);
}

int k3c_ablate_run(const char *grid_path, const k3c_ablate_opts *o, k3c_ablate_result *res, k3c_err *err) {
    memset(res, 0, sizeof *res);
    grid g;
    const double t0 = k3c_now();
    int e = load_grid(grid_path, &g, res, err);
    if (!e) e = k3c_exp_mkdirs(res->out_dir, err);
    int64_t tokens = 0;
    for (int a = 0; !e && a < res->n_arms; a++) {
        k3c_ablate_arm *arm = &res->arm[a];
        for (int s = 0; !e && s < res->n_seeds; s++) {
            char axis[sizeof arm->axis], name[sizeof arm->arm]; /* copies: gcc -O1 flags the struct's own fields as
                                                                  possible overlaps of the destination */
            memcpy(axis, arm->axis, sizeof axis);
            memcpy(name, arm->arm, sizeof name);
            int n = a == 0 ? snprintf(arm->dir[s], sizeof arm->dir[s], "%s/base/seed%llu", res->out_dir,
                                      (unsigned long long)res->seed[s])
                           : snprintf(arm->dir[s], sizeof arm->dir[s], "%s/%s-%s/seed%llu", res->out_dir, axis, name,
                                      (unsigned long long)res->seed[s]);
            if (n < 0 || n >= (int)sizeof arm->dir[s])
                e = k3c_errf(err, K3C_ECONFIG, "%s: out_dir too long for the run directories", g.path);
            if (!e) e = run_one(&g, o, arm, &g.patch[a], res->seed[s], arm->dir[s], &tokens, &arm->run[s], err);
            if (e) k3c_err_wrap(err, "ablate: %s %s seed %llu", arm->axis, arm->arm, (unsigned long long)res->seed[s]);
        }
    }
    res->wall_s = k3c_now() - t0;
    snprintf(res->report, sizeof res->report, "%s/report.md", res->out_dir);
    if (!e) e = k3c_ablate_report(res, g.path, &g.ev, err);
    grid_free(&g);
    return e;
}

void k3c_ablate_result_free(k3c_ablate_result *res) {
    free(res->arm);
    memset(res, 0, sizeof *res);
}
