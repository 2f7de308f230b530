/* golden.c — compares a model's gradients with a golden file written by other code: maps the golden's tensor names
 * (checkpoint names, or transformers' internal Kimi-Linear names: fused conv1d, forget_gate.*, experts.gate_up_proj, ...)
 * onto k3c's parameters. Spec: shared/golden/README.md (the mapping), docs/FORMATS.md §5. */
#include "base/real.h"
#include "model/golden.h"
#include "ops/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const real *slice(const k3c_model *m, const char *name, int64_t *n) {
    int e, i = k3c_params_lookup(&m->table, name, &e);
    if (i < 0) return NULL;
    const k3c_param *p = &m->table.p[i];
    *n = k3c_param_slice_numel(p);
    return (const real *)m->g + p->offset + (size_t)(e > 0 ? e : 0) * (size_t)*n;
}

static int replace(const char *s, const char *from, const char *to, char *out, size_t n) {
    const char *at = strstr(s, from);
    if (!at) return 0;
    snprintf(out, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    return 1;
}

/* Fills buf (n values, the golden's layout) with our gradient for golden tensor `name`; 0 if unknown. */
static int gather(const k3c_model *m, const char *name, double *buf, int64_t n) {
    char a[512], b[512];
    int64_t k;
    const real *src = slice(m, name, &k);
    if (src && k == n) {
        for (int64_t i = 0; i < n; i++) buf[i] = (double)src[i];
        return 1;
    }
    if (replace(name, "forget_gate.", "", a, sizeof a)) return gather(m, a, buf, n);
    if (replace(name, "self_attn.conv1d.weight", "self_attn.q_conv1d.weight", a, sizeof a)) {
        static const char *qkv[3] = {"q", "k", "v"};
        int64_t off = 0;
        for (int j = 0; j < 3; j++) {
            char leaf[64];
            snprintf(leaf, sizeof leaf, "self_attn.%s_conv1d.weight", qkv[j]);
            replace(name, "self_attn.conv1d.weight", leaf, b, sizeof b);
            const real *s = slice(m, b, &k);
            if (!s || off + k > n) return 0;
            for (int64_t i = 0; i < k; i++) buf[off + i] = (double)s[i];
            off += k;
        }
        return off == n;
    }
    int gu = replace(name, "mlp.experts.gate_up_proj", "block_sparse_moe.experts.%d.w1.weight", a, sizeof a);
    int dn = !gu && replace(name, "mlp.experts.down_proj", "block_sparse_moe.experts.%d.w2.weight", a, sizeof a);
    if (gu || dn) {
        int64_t off = 0;
        for (int e = 0; off < n; e++) {
            for (int part = 0; part < (gu ? 2 : 1); part++) {
                char pat[512], nm[512];
                snprintf(pat, sizeof pat, "%s", a);
                if (part) replace(a, ".w1.", ".w3.", pat, sizeof pat);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
                snprintf(nm, sizeof nm, pat, e);
#pragma GCC diagnostic pop
                const real *s = slice(m, nm, &k);
                if (!s || off + k > n) return 0;
                for (int64_t i = 0; i < k; i++) buf[off + i] = (double)s[i];
                off += k;
            }
        }
        return 1;
    }
    if (replace(name, ".mlp.", ".block_sparse_moe.", a, sizeof a)) return gather(m, a, buf, n);
    return 0;
}

/* Compares through a view of the model whose gradients are a host copy: the backend's memory may not be
 * host-addressable. */
static int compare(const k3c_model *m, const k3c_safetensors *golden, k3c_golden_row *rows, int max_rows, int *n_rows,
                   k3c_err *err);

int k3c_golden_grads(const k3c_model *m, const k3c_safetensors *golden, k3c_golden_row *rows, int max_rows, int *n_rows,
                     k3c_err *err) {
    const size_t bytes = m->table.total * sizeof(real);
    k3c_model host = *m;
    host.g = malloc(bytes + 1);
    if (!host.g) return k3c_errf(err, K3C_ENOMEM, "golden: out of memory");
    int rc = m->g ? k3c_model_backend(m)->download(host.g, m->g, bytes, err)
                  : k3c_errf(err, K3C_EINVAL, "golden: the model has no gradients");
    if (!rc) rc = compare(&host, golden, rows, max_rows, n_rows, err);
    free(host.g);
    return rc;
}

static int compare(const k3c_model *m, const k3c_safetensors *golden, k3c_golden_row *rows, int max_rows, int *n_rows,
                   k3c_err *err) {
    int nr = 0;
    for (int i = 0; i < k3c_st_count(golden); i++) {
        const k3c_st_tensor *t = k3c_st_at(golden, i);
        if (strncmp(t->name, "grad.", 5) != 0) continue;
        if (strstr(t->name, "e_score_correction_bias")) continue; /* selection only: no gradient */
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1)),
               *ours = malloc(sizeof(double) * (size_t)(n ? n : 1));
        if (!ref || !ours) {
            free(ref);
            free(ours);
            return k3c_errf(err, K3C_ENOMEM, "golden: out of memory");
        }
        int rc = k3c_st_read_f64(t, ref, (size_t)n, err);
        if (!rc && !gather(m, t->name + 5, ours, n))
            rc = k3c_errf(err, K3C_ENOTFOUND, "%s: no k3c parameter matches golden tensor %s", t->file, t->name);
        if (!rc && nr == max_rows) rc = k3c_errf(err, K3C_EINVAL, "golden: more than %d gradient tensors", max_rows);
        if (!rc) {
            double num = 0, den = 0, amax = 0;
            for (int64_t j = 0; j < n; j++) {
                double d = ours[j] - ref[j];
                num += d * d;
                den += ref[j] * ref[j];
                if (fabs(d) > amax) amax = fabs(d);
            }
            k3c_golden_row *r = &rows[nr++];
            snprintf(r->name, sizeof r->name, "%s", t->name);
            r->ref_norm = sqrt(den);
            r->rel_err = den > 0 ? sqrt(num / den) : 0;
            r->abs_err = amax;
        }
        free(ref);
        free(ours);
        if (rc) return rc;
    }
    *n_rows = nr;
    return K3C_OK;
}

static double rel_err(const real *x, const k3c_st_tensor *ref, double *work, size_t n) {
    if (k3c_st_read_f64(ref, work, n, NULL)) return INFINITY; /* wrong size or dtype: report as a failure */
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - work[i];
        num += d * d;
        den += work[i] * work[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The logits and loss against the golden's "logits" and "loss" (each only when present). */
static int compare_outputs(const k3c_model *m, const k3c_safetensors *gs, const real *logits, double loss, size_t n,
                           k3c_golden_report *r, k3c_err *err) {
    const k3c_st_tensor *gl = k3c_st_find(gs, "logits"), *gloss = k3c_st_find(gs, "loss");
    double *work = malloc(sizeof(double) * (n ? n : 1));
    if (!work) return k3c_errf(err, K3C_ENOMEM, "golden: out of memory");
    real *host = gl ? malloc(sizeof(real) * (n ? n : 1)) : NULL;
    if (gl && !host) {
        free(work);
        return k3c_errf(err, K3C_ENOMEM, "golden: out of memory");
    }
    int rc = gl ? k3c_model_download(m, host, logits, sizeof(real) * n, err) : 0;
    if (rc) {
        free(work);
        free(host);
        return rc;
    }
    if ((r->has_logits = gl != NULL)) r->logits_rel = rel_err(host, gl, work, n);
    free(host);
    if ((r->has_loss = gloss != NULL)) {
        r->loss = loss;
        r->loss_rel = k3c_st_read_f64(gloss, work, 1, NULL) ? INFINITY : fabs(loss - work[0]) / fabs(work[0]);
        r->loss_ref = work[0];
    }
    free(work);
    return 0;
}

/* Forward + backward of the golden's input_ids (rows = documents), then outputs and gradients against it. */
static int check_run(k3c_model *m, const k3c_safetensors *gs, const int32_t *ids, const int32_t *cu,
                     k3c_golden_report *r, k3c_err *err) {
    k3c_arena arena = {0};
    int64_t B = r->B, T = r->T;
    int rc = k3c_model_arena_init(m, k3c_model_plan_bytes(m, B * T, (int)B), &arena, err);
    k3c_model_batch b = {B * T, (int)B, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_acts *acts;
    real *logits = NULL;
    double loss = 0;
    if (!rc) rc = k3c_model_forward(m, &b, &arena, &acts, &loss, &logits, err);
    if (!rc) rc = k3c_model_backward(m, acts, 1.0, err);
    if (!rc) rc = compare_outputs(m, gs, logits, loss, (size_t)(B * T * m->cfg.vocab_size), r, err);
    if (!rc) rc = k3c_golden_grads(m, gs, r->rows, r->max_rows, &r->n_rows, err);
    k3c_model_arena_free(m, &arena);
    return rc;
}

int k3c_golden_check(k3c_model *m, const char *golden_path, k3c_golden_report *r, k3c_err *err) {
    r->has_logits = r->has_loss = 0;
    r->n_rows = 0;
    if (!r->rows || r->max_rows < 1) return k3c_errf(err, K3C_EINVAL, "golden: no rows to fill");
    k3c_safetensors *gs = NULL;
    int32_t *ids = NULL, *cu = NULL;
    int rc = k3c_st_open(golden_path, &gs, err);
    if (!rc) rc = k3c_st_read_ids(golden_path, "input_ids", &ids, &r->B, &r->T, err);
    if (!rc && !(cu = malloc(sizeof(int32_t) * (size_t)(r->B + 1))))
        rc = k3c_errf(err, K3C_ENOMEM, "golden: out of memory");
    for (int64_t b = 0; !rc && b <= r->B; b++) cu[b] = (int32_t)(b * r->T);
    if (!rc) rc = check_run(m, gs, ids, cu, r, err);
    free(ids);
    free(cu);
    k3c_st_close(gs);
    return rc;
}
