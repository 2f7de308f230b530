/* golden_kda.c — k3c_kda_golden_check: the CPU Kimi Delta Attention (token recurrence and chunked WY form, pairwise and
 * factored tiles) forward and backward in float64 against a golden file (docs/MODEL.md §3, §12); behind `check-kda`. */
#include "model/golden.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const in_names[] = {"q", "k", "v", "g", "beta", "h0", "do", "dht"};
const char *const k3c_kda_check_tensor[K3C_KDA_CHECK_TENSORS] = {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
enum { NIN = 8, NOUT = K3C_KDA_CHECK_TENSORS };

/* The file's inputs and references in float64 (absent optional inputs and references stay NULL). */
typedef struct {
    k3c_kda_dims d;
    int32_t *cu;
    double *in[NIN], *ref[NOUT];
    size_t n_in[NIN], n_out[NOUT];
} kfile;

static size_t sizes_of(const kfile *f, int which_in, int i) {
    const k3c_kda_dims *d = &f->d;
    const size_t K = (size_t)(d->T * d->H * d->dk), V = (size_t)(d->T * d->H * d->dv), B = (size_t)(d->T * d->H),
                 S = (size_t)(d->n_docs * d->H * d->dk * d->dv);
    const size_t in[NIN] = {K, K, V, K, B, S, V, S}, out[NOUT] = {V, S, K, K, V, K, B, S};
    return which_in ? in[i] : out[i];
}

static int load_tensors(const char *path, const k3c_safetensors *st, kfile *f, k3c_err *err) {
    int rc = 0;
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (int i = 0; i < (pass ? NOUT : NIN) && !rc; i++) {
            const char *name = pass ? k3c_kda_check_tensor[i] : in_names[i];
            const k3c_st_tensor *t = k3c_st_find(st, name);
            double **dst = pass ? &f->ref[i] : &f->in[i];
            size_t n = sizes_of(f, !pass, i);
            if (!t) {
                if (pass == 0 && i < 5) rc = k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s' missing", path, name);
                continue; /* h0, dht optional (zero); missing references are skipped */
            }
            *dst = calloc(n ? n : 1, sizeof **dst);
            rc = *dst ? k3c_st_read_f64(t, *dst, n, err) : k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
            if (rc) k3c_err_wrap(err, "%s: tensor '%s'", path, name);
            if (pass)
                f->n_out[i] = n;
            else
                f->n_in[i] = n;
        }
    return rc;
}

static int load(const char *path, kfile *f, k3c_err *err) {
    k3c_safetensors *st = NULL;
    int rc = k3c_st_open(path, &st, err);
    if (rc) return rc;
    const k3c_st_tensor *q = k3c_st_find(st, "q"), *v = k3c_st_find(st, "v");
    if (!q || !v || q->ndim != 4 || v->ndim != 4) {
        k3c_st_close(st);
        return k3c_errf(err, K3C_EFORMAT, "%s: q and v must exist with shape [B, T, H, d]", path);
    }
    const int64_t B = q->shape[0], T = q->shape[1];
    f->d = (k3c_kda_dims){.T = B * T, .H = q->shape[2], .dk = q->shape[3], .dv = v->shape[3], .n_docs = (int)B};
    f->cu = malloc((size_t)(B + 1) * sizeof *f->cu);
    if (!f->cu) rc = k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path);
    for (int64_t i = 0; !rc && i <= B; i++) f->cu[i] = (int32_t)(i * T);
    if (!rc) rc = load_tensors(path, st, f, err);
    k3c_st_close(st);
    return rc;
}

static void rel_errs(const kfile *f, double *const out[NOUT], double errs[NOUT]) {
    for (int i = 0; i < NOUT; i++) {
        errs[i] = -1;
        if (!f->ref[i]) continue;
        double num = 0, den = 0;
        for (size_t j = 0; j < f->n_out[i]; j++) {
            double e = out[i][j] - f->ref[i][j];
            num += e * e, den += f->ref[i][j] * f->ref[i][j];
        }
        errs[i] = den > 0 ? sqrt(num / den) : sqrt(num);
    }
}

/* One implementation, forward and backward; errs[] = relative errors against the references (−1 = no reference). */
static int run(const kfile *f, int chunk, double bound, double errs[NOUT], k3c_err *err) {
    k3c_kda_dims d = f->d;
    d.chunk = chunk;
    d.gate_lower_bound = bound;
    double *out[NOUT];
    for (int i = 0; i < NOUT; i++) out[i] = calloc(sizes_of(f, 0, i) ? sizes_of(f, 0, i) : 1, sizeof(double));
    double *const *x = f->in;
    size_t wf = chunk ? k3c_kda_chunk_fwd_workspace_f64(&d) : k3c_kda_recurrent_fwd_workspace_f64(&d);
    size_t wb = chunk ? k3c_kda_chunk_bwd_workspace_f64(&d) : k3c_kda_recurrent_bwd_workspace_f64(&d);
    void *ws = k3c_aligned_alloc(wf > wb ? wf : wb);
    int rc = ws ? 0 : k3c_errf(err, K3C_ENOMEM, "check-kda: workspace of %zu bytes", wf > wb ? wf : wb);
    for (int i = 0; i < NOUT && !rc; i++)
        if (!out[i]) rc = k3c_errf(err, K3C_ENOMEM, "check-kda: out of memory");
    if (!rc)
        rc = (chunk ? k3c_kda_chunk_fwd_f64 : k3c_kda_recurrent_fwd_f64)(&d, f->cu, x[0], x[1], x[2], x[3], x[4], x[5],
                                                                         out[0], out[1], ws, err);
    if (!rc)
        rc = (chunk ? k3c_kda_chunk_bwd_f64 : k3c_kda_recurrent_bwd_f64)(&d, f->cu, x[0], x[1], x[2], x[3], x[4], x[5],
                                                                         x[6], x[7], out[2], out[3], out[4], out[5],
                                                                         out[6], out[7], ws, err);
    if (!rc) rel_errs(f, out, errs);
    for (int i = 0; i < NOUT; i++) free(out[i]);
    k3c_aligned_free(ws);
    return rc;
}

static void kfile_free(kfile *f) {
    for (int i = 0; i < NIN; i++) free(f->in[i]);
    for (int i = 0; i < NOUT; i++) free(f->ref[i]);
    free(f->cu);
}

int k3c_kda_golden_check(const char *path, int only, k3c_kda_check *out, k3c_err *err) {
    static const k3c_kda_check_run runs[K3C_KDA_CHECK_RUNS] = {{.name = "recurrent", .chunk = 0, .bound = 0},
                                                               {.name = "c16 pair", .chunk = 16, .bound = 0},
                                                               {.name = "c64 pair", .chunk = 64, .bound = 0},
                                                               {.name = "c16 fact", .chunk = 16, .bound = -5},
                                                               {.name = "c64 fact", .chunk = 64, .bound = -5}};
    memset(out, 0, sizeof *out);
    if (only != -1 && only != 0 && only != 16 && only != 64)
        return k3c_errf(err, K3C_EINVAL, "check-kda: chunk must be 0, 16 or 64 (got %d)", only);
    kfile f;
    memset(&f, 0, sizeof f);
    int rc = load(path, &f, err);
    for (size_t i = 0; !rc && i < f.n_in[3]; i++) out->g_min = f.in[3][i] < out->g_min ? f.in[3][i] : out->g_min;
    out->dims.T = f.d.T, out->dims.H = f.d.H, out->dims.dk = f.d.dk, out->dims.dv = f.d.dv;
    out->dims.n_docs = f.d.n_docs;
    for (int r = 0; !rc && r < K3C_KDA_CHECK_RUNS; r++) {
        k3c_kda_check_run *x = &out->run[r];
        *x = runs[r];
        for (int i = 0; i < NOUT; i++) x->rel[i] = -1;
        /* the factored tiles need every gate above their bound */
        x->ran = (only < 0 || only == x->chunk) && (x->bound == 0 || out->g_min >= x->bound);
        if (x->ran) x->status = run(&f, x->chunk, x->bound, x->rel, &x->why);
    }
    kfile_free(&f);
    return rc;
}
