/* cmd_check_kda.c — `k3c check-kda FILE`: prints the relative errors of the CPU KDA (recurrent and chunked) forward and
 * backward in float64 against a golden file, as k3c_kda_golden_check (model/golden_kda.c) measures them. */
#include "cli.h"

#include "k3c/check.h"

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

/* The error table: one row per tensor, one column per implementation that ran; returns 1 if any error > tol. */
static int print_table(const k3c_kda_check *c, double tol) {
    int fail = 0;
    printf("%-7s", "tensor");
    for (int r = 0; r < K3C_KDA_CHECK_RUNS; r++)
        if (c->run[r].ran && !c->run[r].status) printf(" %11s", c->run[r].name);
    printf("\n");
    for (int i = 0; i < K3C_KDA_CHECK_TENSORS; i++) {
        printf("%-7s", k3c_kda_check_tensor[i]);
        for (int r = 0; r < K3C_KDA_CHECK_RUNS; r++) {
            const k3c_kda_check_run *x = &c->run[r];
            if (!x->ran || x->status) continue;
            if (x->rel[i] < 0)
                printf(" %11s", "(no ref)");
            else
                printf(" %11.3e%s", x->rel[i], x->rel[i] > tol ? "!" : "");
            if (x->rel[i] > tol || x->rel[i] != x->rel[i]) fail = 1;
        }
        printf("\n");
    }
    return fail;
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
    k3c_err err = {0};
    k3c_kda_check c;
    if (k3c_kda_golden_check(path, (int)only, &c, &err)) return cli_fail("check-kda", &err);
    const k3c_kda_check_dims *d = &c.dims;
    printf("check-kda %s: B=%d T=%lld H=%lld dk=%lld dv=%lld, min g = %.4g, tol %.1e\n", path, d->n_docs,
           (long long)(d->T / d->n_docs), (long long)d->H, (long long)d->dk, (long long)d->dv, c.g_min, tol);
    int fail = 0;
    for (int r = 0; r < K3C_KDA_CHECK_RUNS; r++)
        if (c.run[r].ran && c.run[r].status) fail = cli_fail("check-kda", &c.run[r].why);
    fail |= print_table(&c, tol);
    printf("%s\n", fail ? "FAIL" : "OK");
    return fail ? 1 : 0;
}
