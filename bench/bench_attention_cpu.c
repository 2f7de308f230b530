/* bench_attention_cpu.c — ms of causal MLA attention on the CPU (float32), flash vs materialised reference, forward and
 * forward+backward, H = 4, dqk = 24, dv = 16, T = 1024 and 4096. Spec: docs/MODEL.md §4.2. Not part of make test. */

/* Usage: bench_attention_cpu [reps]  (best of reps, default 3; one document of length T; threads: OMP_NUM_THREADS) */
#include "base/base.h"
#include "ops/attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    k3c_attention_sizes s;
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    void *ws;
} bench;

static float *randf(size_t n, uint64_t seed) {
    float *x = k3c_aligned_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)k3c_normal_at(seed, i);
    return x;
}

/* One timed pass; returns milliseconds, or a negative number on an op error (message in err). */
static double run(bench *b, int naive, int backward, k3c_err *err) {
    const k3c_attention_sizes *s = &b->s;
    double t0 = k3c_now();
    int rc = naive ? k3c_attention_naive_fwd_f32(s, NULL, b->q, b->k, b->v, b->o, b->lse, b->ws, err)
                   : k3c_attention_fwd_f32(s, NULL, b->q, b->k, b->v, b->o, b->lse, NULL, err);
    if (!rc && backward)
        rc = naive ? k3c_attention_naive_bwd_f32(s, NULL, b->q, b->k, b->v, b->o, b->lse, b->dout, b->dq, b->dk, b->dv,
                                                 b->ws, err)
                   : k3c_attention_bwd_f32(s, NULL, b->q, b->k, b->v, b->o, b->lse, b->dout, b->dq, b->dk, b->dv, b->ws,
                                           err);
    return rc ? -1 : 1e3 * (k3c_now() - t0);
}

static double best(bench *b, int naive, int backward, int reps, k3c_err *err) {
    double m = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = run(b, naive, backward, err);
        if (t < 0) return t;
        m = t < m ? t : m;
    }
    return m;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    if (reps < 1) reps = 1;
    const int64_t H = 4, dqk = 24, dv = 16, Ts[2] = {1024, 4096};
    k3c_err err = {0};
    printf("causal attention, float32, H=%lld dqk=%lld dv=%lld, %d threads, best of %d (ms)\n", (long long)H,
           (long long)dqk, (long long)dv, k3c_num_threads(), reps);
    printf("%6s | %10s %12s | %10s %12s | %8s %8s\n", "T", "flash fwd", "flash fwd+bwd", "naive fwd", "naive fwd+bwd",
           "fwd x", "f+b x");
    for (int ti = 0; ti < 2; ti++) {
        const int64_t T = Ts[ti];
        bench b;
        memset(&b, 0, sizeof b);
        b.s = (k3c_attention_sizes){T, H, dqk, dv, 0, 0.2041241452 /* 24^-1/2 */, 0, 0, 0};
        size_t nq = (size_t)(T * H * dqk), nv = (size_t)(T * H * dv);
        b.q = randf(nq, 1), b.k = randf(nq, 2), b.v = randf(nv, 3), b.dout = randf(nv, 4);
        b.o = randf(nv, 5), b.lse = randf((size_t)(T * H), 6);
        b.dq = randf(nq, 7), b.dk = randf(nq, 8), b.dv = randf(nv, 9);
        size_t wsb = k3c_attention_naive_workspace_f32(&b.s);
        if (k3c_attention_workspace_f32(&b.s) > wsb) wsb = k3c_attention_workspace_f32(&b.s);
        b.ws = k3c_aligned_alloc(wsb);
        double ff = best(&b, 0, 0, reps, &err), fb = best(&b, 0, 1, reps, &err);
        double nf = best(&b, 1, 0, reps, &err), nb = best(&b, 1, 1, reps, &err);
        if (ff < 0 || fb < 0 || nf < 0 || nb < 0) {
            fprintf(stderr, "bench_attention_cpu: %s\n", err.msg);
            return 1;
        }
        printf("%6lld | %10.2f %12.2f | %10.2f %12.2f | %8.2f %8.2f\n", (long long)T, ff, fb, nf, nb, nf / ff, nb / fb);
        k3c_aligned_free(b.q), k3c_aligned_free(b.k), k3c_aligned_free(b.v), k3c_aligned_free(b.dout);
        k3c_aligned_free(b.o), k3c_aligned_free(b.lse), k3c_aligned_free(b.dq), k3c_aligned_free(b.dk);
        k3c_aligned_free(b.dv), k3c_aligned_free(b.ws);
    }
    return 0;
}
