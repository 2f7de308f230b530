/* adamw.c — AdamW and the combined optimizer k3c_optim that sends each parameter entry to Muon or AdamW and lays out
 * their state. Spec: docs/MODEL.md §10.1 (which tensors each optimizer covers), docs/TRAINING.md §1.3 (defaults). */
#include "ops/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void k3c_adamw_update(const k3c_adamw_hp *hp, float *w, const float *g, float *m, float *v, int64_t n, double lr,
                      double wd, int64_t step) {
    /* 1 − β in double: in float, 1 − 0.999f loses five digits (0.00099998713). */
    const float b1 = (float)hp->beta1, b2 = (float)hp->beta2, eps = (float)hp->eps;
    const float omb1 = (float)(1.0 - hp->beta1), omb2 = (float)(1.0 - hp->beta2);
    /* Bias corrections folded into two scalars so the loop is one pass: w -= lr/bc1 · m / (sqrt(v)/sqrt(bc2) + eps). */
    const double bc1 = 1.0 - pow(hp->beta1, (double)step), bc2 = 1.0 - pow(hp->beta2, (double)step);
    const float step_size = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float decay = (float)(1.0 - lr * wd);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] = w[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
}

void k3c_optim_defaults(k3c_optim *o) {
    memset(o, 0, sizeof *o);
    o->lr = 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->decay_vectors = 0;
    o->muon_momentum = 0.95;
    o->nesterov = 1;
    o->ns_steps = 5;
    o->muon_scale = 0.2;
    o->per_head = 1;
    o->matrix_optimizer = K3C_MATRIX_MUON;
}

int k3c_optim_parse_matrix(const char *name, int *out, k3c_err *err) {
    if (name && strcmp(name, "muon") == 0) {
        *out = K3C_MATRIX_MUON;
        return K3C_OK;
    }
    if (name && strcmp(name, "adamw") == 0) {
        *out = K3C_MATRIX_ADAMW;
        return K3C_OK;
    }
    return k3c_errf(err, K3C_EINVAL, "optimizer: matrix optimizer '%s' is not one of muon, adamw",
                    name ? name : "(null)");
}

int k3c_optim_parse_muon_precision(const char *name, int *out, k3c_err *err) {
    static const char *const names[] = {"auto", "fp32", "bf16"};
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = i; /* K3C_MUON_AUTO, _FP32, _BF16 */
            return K3C_OK;
        }
    return k3c_errf(err, K3C_EINVAL, "optimizer: muon precision '%s' is not one of auto, fp32, bf16",
                    name ? name : "(null)");
}

int k3c_optim_check_cpu(const k3c_optim *o, k3c_err *err) {
    if (o->muon_precision == K3C_MUON_BF16 && o->matrix_optimizer == K3C_MATRIX_MUON)
        return k3c_errf(err, K3C_EUNSUPPORTED,
                        "optimizer: muon precision bf16 runs on the GPU only; the CPU's Newton-Schulz is fp32 (ask "
                        "for fp32 or auto)");
    return K3C_OK;
}

static int uses_muon(const k3c_optim *o, const k3c_param *p) {
    return p->kind == K3C_PK_MATRIX && o->matrix_optimizer == K3C_MATRIX_MUON;
}

static size_t entry_state(const k3c_optim *o, const k3c_param *p) {
    if (p->kind == K3C_PK_ROUTER_BIAS) return 0;
    return (size_t)p->numel * (uses_muon(o, p) ? 1 : 2);
}

size_t k3c_optim_state_numel(const k3c_optim *o, const k3c_param_table *t) {
    size_t n = 0;
    for (int i = 0; i < t->n; i++) n += entry_state(o, &t->p[i]);
    return n;
}

static int check_hp(const k3c_optim *o, k3c_err *err) {
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) || !(o->eps > 0))
        return k3c_errf(err, K3C_EINVAL, "optimizer: need 0 <= beta1, beta2 < 1 and eps > 0 (got %g, %g, %g)", o->beta1,
                        o->beta2, o->eps);
    if (!(o->weight_decay >= 0) || !(o->muon_momentum >= 0 && o->muon_momentum < 1) || o->ns_steps < 0 ||
        !(o->muon_scale > 0))
        return k3c_errf(err, K3C_EINVAL, "optimizer: bad weight_decay %g, muon momentum %g, ns_steps %d or scale %g",
                        o->weight_decay, o->muon_momentum, o->ns_steps, o->muon_scale);
    if (o->matrix_optimizer != K3C_MATRIX_MUON && o->matrix_optimizer != K3C_MATRIX_ADAMW)
        return k3c_errf(err, K3C_EINVAL, "optimizer: unknown matrix optimizer %d", o->matrix_optimizer);
    if (o->muon_precision < K3C_MUON_AUTO || o->muon_precision > K3C_MUON_BF16)
        return k3c_errf(err, K3C_EINVAL, "optimizer: unknown muon precision %d", o->muon_precision);
    return K3C_OK;
}

static int64_t block_rows(const k3c_optim *o, const k3c_param *p) { return o->per_head ? p->head_rows : 0; }

int k3c_optim_init(k3c_optim *o, const k3c_param_table *t, k3c_err *err) {
    int rc = check_hp(o, err);
    if (rc) return rc;
    o->state_off = NULL;
    o->ws = NULL;
    size_t off = 0, ws = 0;
    for (int i = 0; i < t->n; i++) {
        const k3c_param *p = &t->p[i];
        if (!uses_muon(o, p)) continue;
        if (p->ndim != 2 || p->shape[0] < 1 || p->shape[1] < 1)
            return k3c_errf(err, K3C_EINVAL, "optimizer: %s: Muon needs a 2-D matrix (ndim %d)", p->name, p->ndim);
        int64_t hr = block_rows(o, p);
        if (hr < 0 || (hr > 0 && p->shape[0] % hr != 0))
            return k3c_errf(err, K3C_EINVAL, "optimizer: %s: head_rows %lld does not divide %lld rows", p->name,
                            (long long)hr, (long long)p->shape[0]);
        size_t need = k3c_muon_workspace(p->shape[0], p->shape[1], hr);
        if (need > ws) ws = need;
    }
    o->state_off = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *o->state_off);
    o->ws = ws ? k3c_aligned_alloc(ws * sizeof(float)) : NULL;
    if (!o->state_off || (ws && !o->ws)) {
        k3c_optim_free(o);
        return k3c_errf(err, K3C_ENOMEM, "optimizer: out of memory (%zu workspace floats)", ws);
    }
    for (int i = 0; i < t->n; i++) {
        o->state_off[i] = off;
        off += entry_state(o, &t->p[i]);
    }
    o->n_entries = t->n;
    o->state_numel = off;
    o->ws_numel = ws;
    return K3C_OK;
}

int k3c_optim_layout(k3c_optim *o, const k3c_param_table *t, k3c_err *err) {
    int rc = check_hp(o, err);
    if (rc) return rc;
    o->ws = NULL;
    o->ws_numel = 0;
    o->state_off = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *o->state_off);
    if (!o->state_off) return k3c_errf(err, K3C_ENOMEM, "optimizer: out of memory");
    size_t off = 0;
    for (int i = 0; i < t->n; i++) {
        o->state_off[i] = off;
        off += entry_state(o, &t->p[i]);
    }
    o->n_entries = t->n;
    o->state_numel = off;
    return K3C_OK;
}

void k3c_optim_free(k3c_optim *o) {
    free(o->state_off);
    k3c_aligned_free(o->ws);
    o->state_off = NULL;
    o->ws = NULL;
    o->n_entries = 0;
    o->state_numel = o->ws_numel = 0;
}

static int step_muon(k3c_optim *o, const k3c_param *p, float *w, const float *g, float *mom, double lr, k3c_err *err) {
    const k3c_muon_hp hp = {o->muon_momentum, o->nesterov, o->ns_steps, o->muon_scale};
    const int64_t rows = p->shape[0], cols = p->shape[1], slice = rows * cols;
    const int64_t slices = p->stack ? p->stack : 1;
    for (int64_t e = 0; e < slices; e++) {
        int rc = k3c_muon_update(&hp, w + e * slice, g + e * slice, mom + e * slice, rows, cols, block_rows(o, p), lr,
                                 o->weight_decay, o->ws, err);
        if (rc) return err ? k3c_err_wrap(err, "optimizer: %s slice %lld", p->name, (long long)e) : rc;
    }
    return K3C_OK;
}

int k3c_optim_check_step(const k3c_optim *o, const k3c_param_table *t, int first, int last, double lr, int64_t step,
                         k3c_err *err) {
    if (!o->state_off || o->n_entries != t->n)
        return k3c_errf(err, K3C_EINVAL, "optimizer: not initialised for this parameter table (%d vs %d entries)",
                        o->n_entries, t->n);
    if (first < 0 || last > t->n || first > last || step < 1 || !isfinite(lr))
        return k3c_errf(err, K3C_EINVAL, "optimizer: bad entry range [%d, %d) of %d, step %lld or lr %g", first, last,
                        t->n, (long long)step, lr);
    return K3C_OK;
}

int k3c_optim_step_entries(k3c_optim *o, const k3c_param_table *t, int first, int last, float *w, const float *g,
                           float *state, double lr, int64_t step, k3c_err *err) {
    int rc = k3c_optim_check_step(o, t, first, last, lr, step, err);
    if (!rc) rc = k3c_optim_check_cpu(o, err);
    if (rc) return rc;
    const k3c_adamw_hp hp = {o->beta1, o->beta2, o->eps};
    for (int i = first; i < last; i++) {
        const k3c_param *p = &t->p[i];
        float *pw = w + p->offset, *st = state + o->state_off[i];
        const float *pg = g + p->offset;
        if (p->kind == K3C_PK_ROUTER_BIAS) continue;
        if (uses_muon(o, p)) {
            int rc = step_muon(o, p, pw, pg, st, lr, err);
            if (rc) return rc;
            continue;
        }
        double wd = (p->kind == K3C_PK_VECTOR && !o->decay_vectors) ? 0.0 : o->weight_decay;
        k3c_adamw_update(&hp, pw, pg, st, st + p->numel, p->used, lr, wd, step);
    }
    return K3C_OK;
}

int k3c_optim_step(k3c_optim *o, const k3c_param_table *t, float *w, const float *g, float *state, double lr,
                   int64_t step, k3c_err *err) {
    return k3c_optim_step_entries(o, t, 0, t->n, w, g, state, lr, step, err);
}
