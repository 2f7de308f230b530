/* cmd_check_kda.c — `k3c check-kda FILE`: runs the CPU KDA (recurrent and chunked) forward and backward in float64 on a
 * file laid out like shared/golden/kda_fp64_small.safetensors and prints relative errors (ARCHITECTURE.md §3, §12). */
#include "cli.h"

#include "ops/kda.h"

#include <stdlib.h>
#include <string.h>

static const char *const in_names[] = {"q", "k", "v", "g", "beta", "h0", "do", "dht"};
static const char *const out_names[] = {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
enum { NIN = 8, NOUT = 8, MAXRUN = 5 };

typedef struct {
    k3c_kda_dims d;
    int32_t *cu;
    double *in[NIN], *ref[NOUT];
    size_t n_in[NIN], n_out[NOUT];
} kfile;

static void usage(FILE *f) {
    fprintf(f, "usage: k3c check-kda FILE [--chunk 16|64|0] [--tol X]\n\n"
               "Runs Kimi Delta Attention on the CPU in float64 (token recurrence and the chunked WY form, pairwise\n"
               "and, when every g >= -5, factored intra-chunk tiles), forward and backward, on FILE: a safetensors\n"
               "file laid out like shared/golden/kda_fp64_small.safetensors (q k v g beta [h0] do [dht] with shapes\n"
               "[B,T,H,d], [B,T,H], [B,H,dk,dv]; references o ht dq dk dv dg dbeta dh0). Prints the relative error\n"
               "||x - ref|| / ||ref|| per tensor and implementation.\n\n"
               "  --chunk N   only one implementation: 0 = recurrent, 16 or 64 = chunked (default: all)\n"
               "  --tol X     failure threshold (default 1e-5)\n\n"
               "Exit status: 0 if every error <= tol, 1 otherwise or on a read error, 2 on a usage error.\n");
}

static size_t sizes_of(const kfile *f, int which_in, int i) {
    const k3c_kda_dims *d = &f->d;
    const size_t K = (size_t)(d->T * d->H * d->dk), V = (size_t)(d->T * d->H * d->dv), B = (size_t)(d->T * d->H),
                 S = (size_t)(d->n_docs * d->H * d->dk * d->dv);
    const size_t in[NIN] = {K, K, V, K, B, S, V, S}, out[NOUT] = {V, S, K, K, V, K, B, S};
    return which_in ? in[i] : out[i];
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
    for (int64_t i = 0; i <= B; i++) f->cu[i] = (int32_t)(i * T);
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (int i = 0; i < (pass ? NOUT : NIN) && !rc; i++) {
            const char *name = pass ? out_names[i] : in_names[i];
            const k3c_st_tensor *t = k3c_st_find(st, name);
            double **dst = pass ? &f->ref[i] : &f->in[i];
            size_t n = sizes_of(f, !pass, i);
            if (!t) {
                if (pass == 0 && i < 5) rc = k3c_errf(err, K3C_EFORMAT, "%s: tensor '%s' missing", path, name);
                continue; /* h0, dht optional (zero); missing references are skipped */
            }
            *dst = calloc(n ? n : 1, sizeof **dst);
            rc = k3c_st_read_f64(t, *dst, n, err);
            if (rc) k3c_err_wrap(err, "%s: tensor '%s'", path, name);
            if (pass)
                f->n_out[i] = n;
            else
                f->n_in[i] = n;
        }
    k3c_st_close(st);
    return rc;
}

/* One implementation, forward and backward; errs[] = relative errors against the references (−1 = no reference). */
static int run(kfile *f, int chunk, double bound, double errs[NOUT], k3c_err *err) {
    k3c_kda_dims d = f->d;
    d.chunk = chunk;
    d.gate_lower_bound = bound;
    double *out[NOUT];
    for (int i = 0; i < NOUT; i++) out[i] = calloc(sizes_of(f, 0, i) ? sizes_of(f, 0, i) : 1, sizeof(double));
    double **x = f->in;
    size_t wf = chunk ? k3c_kda_chunk_fwd_workspace_f64(&d) : k3c_kda_recurrent_fwd_workspace_f64(&d);
    size_t wb = chunk ? k3c_kda_chunk_bwd_workspace_f64(&d) : k3c_kda_recurrent_bwd_workspace_f64(&d);
    void *ws = k3c_aligned_alloc(wf > wb ? wf : wb);
    int rc = ws ? 0 : k3c_errf(err, K3C_ENOMEM, "check-kda: workspace of %zu bytes", wf > wb ? wf : wb);
    if (!rc)
        rc = (chunk ? k3c_kda_chunk_fwd_f64 : k3c_kda_recurrent_fwd_f64)(&d, f->cu, x[0], x[1], x[2], x[3], x[4], x[5],
                                                                         out[0], out[1], ws, err);
    if (!rc)
        rc = (chunk ? k3c_kda_chunk_bwd_f64 : k3c_kda_recurrent_bwd_f64)(&d, f->cu, x[0], x[1], x[2], x[3], x[4], x[5],
                                                                         x[6], x[7], out[2], out[3], out[4], out[5],
                                                                         out[6], out[7], ws, err);
    for (int i = 0; i < NOUT; i++) {
        errs[i] = -1;
        if (!rc && f->ref[i]) {
            double num = 0, den = 0;
            for (size_t j = 0; j < f->n_out[i]; j++) {
                double e = out[i][j] - f->ref[i][j];
                num += e * e, den += f->ref[i][j] * f->ref[i][j];
            }
            errs[i] = den > 0 ? sqrt(num / den) : sqrt(num);
        }
        free(out[i]);
    }
    k3c_aligned_free(ws);
    return rc;
}

static void kfile_free(kfile *f) {
    for (int i = 0; i < NIN; i++) free(f->in[i]);
    for (int i = 0; i < NOUT; i++) free(f->ref[i]);
    free(f->cu);
}

int cmd_check_kda(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    static const char *const value_opts[] = {"--chunk", "--tol", NULL};
    const char *path = cli_positional(argc, argv, 0, value_opts);
    long long only;
    double tol;
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (!cli_opt_int(argc, argv, "--chunk", -1, &only) || !cli_opt_double(argc, argv, "--tol", 1e-5, &tol)) return 2;
    if (only != -1 && only != 0 && only != 16 && only != 64)
        return cli_usage_error("check-kda", "--chunk must be 0, 16 or 64 (got %lld)", only);
    kfile f;
    memset(&f, 0, sizeof f);
    k3c_err err = {0};
    if (load(path, &f, &err)) {
        kfile_free(&f);
        return cli_fail("check-kda", &err);
    }
    double gmin = 0;
    for (size_t i = 0; i < f.n_in[3]; i++) gmin = f.in[3][i] < gmin ? f.in[3][i] : gmin;
    struct {
        const char *name;
        int chunk;
        double bound;
    } runs[MAXRUN] = {
        {"recurrent", 0, 0}, {"c16 pair", 16, 0}, {"c64 pair", 64, 0}, {"c16 fact", 16, -5}, {"c64 fact", 64, -5}};
    double errs[MAXRUN][NOUT];
    int use[MAXRUN], fail = 0;
    printf("check-kda %s: B=%d T=%lld H=%lld dk=%lld dv=%lld, min g = %.4g, tol %.1e\n", path, f.d.n_docs,
           (long long)(f.d.T / f.d.n_docs), (long long)f.d.H, (long long)f.d.dk, (long long)f.d.dv, gmin, tol);
    for (int r = 0; r < MAXRUN; r++) {
        use[r] = (only < 0 || only == runs[r].chunk) && (runs[r].bound == 0 || gmin >= runs[r].bound);
        if (use[r] && run(&f, runs[r].chunk, runs[r].bound, errs[r], &err)) {
            fail = cli_fail("check-kda", &err);
            use[r] = 0;
        }
    }
    printf("%-7s", "tensor");
    for (int r = 0; r < MAXRUN; r++)
        if (use[r]) printf(" %11s", runs[r].name);
    printf("\n");
    for (int i = 0; i < NOUT; i++) {
        printf("%-7s", out_names[i]);
        for (int r = 0; r < MAXRUN; r++) {
            if (!use[r]) continue;
            if (errs[r][i] < 0)
                printf(" %11s", "(no ref)");
            else
                printf(" %11.3e%s", errs[r][i], errs[r][i] > tol ? "!" : "");
            if (errs[r][i] > tol || errs[r][i] != errs[r][i]) fail = 1;
        }
        printf("\n");
    }
    printf("%s\n", fail ? "FAIL" : "OK");
    kfile_free(&f);
    return fail ? 1 : 0;
}
