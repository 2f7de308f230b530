/* bench_kda_cpu.c — timings of the CPU KDA core in float32: token recurrence vs chunked WY form (chunk 64, factored
 * tiles under the lower-bound gate and pairwise diagonal tiles), forward and forward+backward (docs/MODEL.md §3.2).
 * Usage: bench_kda_cpu [reps [filter]]   (prints a table: ms per call and tokens/s; filter: run only the
 * implementations whose name contains it) */
#include "base/base.h"
#include "ops/kda.h"

#include <stdlib.h>
#include <string.h>

static float *fill(size_t n, uint64_t seed, double lo, double hi) {
    float *x = k3c_aligned_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * k3c_uniform_at(seed, i));
    return x;
}

typedef struct {
    k3c_kda_dims d;
    float *q, *k, *v, *g, *beta, *o, *ht, *dout, *dq, *dk, *dv, *dg, *dbeta, *dh0;
    void *ws;
} bench;

/* impl: 0 recurrent, 1 chunk; bwd: also run the backward. Returns seconds of one call (best of reps). */
static double time_it(bench *b, int impl, int bwd, int reps) {
    double best = 1e30;
    k3c_err e = {0};
    for (int r = 0; r < reps; r++) {
        double t0 = k3c_now();
        int rc = (impl ? k3c_kda_chunk_fwd_f32 : k3c_kda_recurrent_fwd_f32)(&b->d, NULL, b->q, b->k, b->v, b->g,
                                                                            b->beta, NULL, b->o, b->ht, b->ws, &e);
        if (!rc && bwd)
            rc = (impl ? k3c_kda_chunk_bwd_f32 : k3c_kda_recurrent_bwd_f32)(&b->d, NULL, b->q, b->k, b->v, b->g,
                                                                            b->beta, NULL, b->dout, NULL, b->dq, b->dk,
                                                                            b->dv, b->dg, b->dbeta, b->dh0, b->ws, &e);
        if (rc) {
            fprintf(stderr, "bench_kda_cpu: %s\n", e.msg);
            exit(1);
        }
        double dt = k3c_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    const char *filter = argc > 2 ? argv[2] : "";
    if (reps < 1) reps = 1;
    const int64_t shapes[][3] = {{4096, 4, 64}, {1024, 8, 128}};
    printf("KDA CPU float32, %d threads, best of %d\n", k3c_num_threads(), reps);
    printf("%-18s %-22s %10s %12s %10s %12s\n", "shape (T,H,d)", "implementation", "fwd ms", "fwd tok/s", "f+b ms",
           "f+b tok/s");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int64_t T = shapes[s][0], H = shapes[s][1], D = shapes[s][2], NK = T * H * D;
        bench b;
        memset(&b, 0, sizeof b);
        b.d = (k3c_kda_dims){.T = T, .H = H, .dk = D, .dv = D, .n_docs = 1, .chunk = 64};
        b.q = fill(NK, 1, -0.2, 0.2), b.k = fill(NK, 2, -0.2, 0.2), b.v = fill(NK, 3, -1, 1);
        b.g = fill(NK, 4, -5, -0.01), b.beta = fill(T * H, 5, 0.1, 0.9);
        b.dout = fill(NK, 6, -1, 1);
        float **outs[] = {&b.o, &b.dq, &b.dk, &b.dv, &b.dg};
        for (int i = 0; i < 5; i++) *outs[i] = k3c_aligned_alloc(NK * sizeof(float));
        b.dbeta = k3c_aligned_alloc(T * H * sizeof(float));
        b.ht = k3c_aligned_alloc(H * D * D * sizeof(float)), b.dh0 = k3c_aligned_alloc(H * D * D * sizeof(float));
        size_t ws = k3c_kda_recurrent_bwd_workspace_f32(&b.d);
        for (int c = 16; c <= 64; c *= 4) { /* the chunk workspaces depend on the chunk size */
            b.d.chunk = c;
            size_t w2 = k3c_kda_chunk_bwd_workspace_f32(&b.d);
            ws = w2 > ws ? w2 : ws;
        }
        b.ws = k3c_aligned_alloc(ws);
        struct {
            const char *name;
            int impl;
            double bound;
        } im[] = {
            {"recurrent", 0, 0}, {"chunk64 factored", 1, -5}, {"chunk64 pairwise", 1, 0}, {"chunk16 factored", 1, -5}};
        char shape[32];
        snprintf(shape, sizeof shape, "(%lld,%lld,%lld)", (long long)T, (long long)H, (long long)D);
        for (size_t i = 0; i < sizeof im / sizeof *im; i++) {
            if (!strstr(im[i].name, filter)) continue;
            b.d.gate_lower_bound = im[i].bound;
            b.d.chunk = strstr(im[i].name, "16") ? 16 : 64;
            double f = time_it(&b, im[i].impl, 0, reps), fb = time_it(&b, im[i].impl, 1, reps);
            printf("%-18s %-22s %10.2f %12.0f %10.2f %12.0f\n", shape, im[i].name, 1e3 * f, T / f, 1e3 * fb, T / fb);
        }
        float *ptrs[] = {b.q, b.k, b.v, b.g, b.beta, b.o, b.ht, b.dout, b.dq, b.dk, b.dv, b.dg, b.dbeta, b.dh0};
        for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) k3c_aligned_free(ptrs[i]);
        k3c_aligned_free(b.ws);
    }
    return 0;
}
