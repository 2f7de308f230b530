/* bench_qmat.c — GB/s of the weight-view products (ops/qmat.h) on the cpu_bench shapes (bf16 trunk, MXFP4 experts,
 * the lm_head), with 1 and 2 threads, against this machine's streaming read bandwidth measured in the same run.
 * Prints a table (best and median of the repetitions); not part of `make test`. */
#include "bench_mem.h"
#include "ops/qmat.h"

#include <cblas.h>
#include <stdio.h>
#include <string.h>

#define POOL_BYTES ((size_t)160 << 20) /* cycle through this much weight so every pass comes from DRAM */
#define REPS 5

typedef struct {
    const char *what;
    int type;
    int64_t rows, cols, n;
    int ref; /* 1: k3c_qmat_mul_ref, 2: cblas_sgemv */
} bench_case;

static size_t weight_bytes(const k3c_qmat *W) {
    size_t e = (size_t)(W->rows * W->cols);
    return W->type == K3C_QMAT_F32 ? 4 * e : W->type == K3C_QMAT_BF16 ? 2 * e : e / 2 + e / 32;
}

static void run(const bench_case *bc, int threads) {
    k3c_qmat W0 = {bc->type, bc->rows, bc->cols, NULL, NULL};
    const size_t one = weight_bytes(&W0);
    const int pool = (int)(POOL_BYTES / one + 1);
    uint8_t *mem = malloc(one * (size_t)pool);
    float *x = malloc(sizeof(float) * (size_t)(bc->cols * bc->n)),
          *y = malloc(sizeof(float) * (size_t)(bc->rows * bc->n));
    if (!mem || !x || !y) {
        printf("| %s | out of memory |\n", bc->what);
        return;
    }
    /* random bytes, then valid exponents where the scales live (bf16 / f32: small finite values) */
    for (size_t i = 0; i < one * (size_t)pool; i++) mem[i] = (uint8_t)((i * 2654435761u) >> 13);
    if (bc->type == K3C_QMAT_BF16)
        for (size_t i = 0; i < one * (size_t)pool / 2; i++) ((uint16_t *)mem)[i] = (uint16_t)(0x3c00 | (i & 0x3ff));
    if (bc->type == K3C_QMAT_F32)
        for (size_t i = 0; i < one * (size_t)pool / 4; i++) ((float *)mem)[i] = (float)(i % 97) * 1e-2f;
    const size_t packed = (size_t)(bc->rows * bc->cols / 2);
    for (int k = 0; bc->type == K3C_QMAT_MXFP4 && k < pool; k++) memset(mem + k * one + packed, 120, one - packed);
    for (int64_t i = 0; i < bc->cols * bc->n; i++) x[i] = (float)(i % 13) * 0.1f;
    omp_set_num_threads(threads);
    double gbs[REPS], best_cpu = 0;
    for (int r = 0; r < REPS; r++) {
        double t0 = k3c_now(), c0 = bench_cpu_now();
        for (int k = 0; k < pool; k++) {
            k3c_qmat W = W0;
            W.w = mem + k * one;
            W.scale = bc->type == K3C_QMAT_MXFP4 ? mem + k * one + packed : NULL;
            if (bc->ref == 2)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)bc->rows, (int)bc->cols, 1.0f, W.w, (int)bc->cols, x, 1,
                            0.0f, y, 1);
            else
                (bc->ref ? k3c_qmat_mul_ref : k3c_qmat_mul)(&W, x, bc->n, y, 0);
        }
        gbs[r] = (double)one * pool / (k3c_now() - t0) / 1e9;
        double cpu = (double)one * pool / ((bench_cpu_now() - c0) / threads) / 1e9;
        best_cpu = cpu > best_cpu ? cpu : best_cpu;
    }
    double best = 0;
    for (int r = 0; r < REPS; r++) best = gbs[r] > best ? gbs[r] : best;
    double med = bench_sorted_median(gbs, REPS);
    printf("| %s | [%lld, %lld] | %lld | %d | %.1f | %.2f | %.2f | %.2f | %.1f |\n", bc->what, (long long)bc->rows,
           (long long)bc->cols, (long long)bc->n, threads, (double)one / 1e6, best, med, best_cpu,
           1e6 * (double)one / (best * 1e9));
    free(mem);
    free(x);
    free(y);
}

/* Usage: bench_qmat [SUBSTRING [MAX_THREADS]] — only the cases whose name contains SUBSTRING ("" for all). */
int main(int argc, char **argv) {
    double bw[3][3];
    const int tmax = argc > 2 ? atoi(argv[2]) : 2;
    for (int t = 1; t <= 2; t++) bench_read_bandwidth((size_t)1 << 30, t, 7, &bw[t][0], &bw[t][1], &bw[t][2]);
    printf("read bandwidth (1 GiB streaming sum): 1 thread %.2f GB/s best, %.2f median, %.2f per CPU-s; 2 threads %.2f "
           "best, %.2f median, %.2f per CPU-s\n\n",
           bw[1][0], bw[1][1], bw[1][2], bw[2][0], bw[2][1], bw[2][2]);
    static const bench_case cases[] = {
        {"bf16 trunk (q/k/v/o/g, shared experts)", K3C_QMAT_BF16, 1024, 1024, 1, 0},
        {"bf16 lm_head", K3C_QMAT_BF16, 32768, 1024, 1, 0},
        {"bf16 dense MLP up", K3C_QMAT_BF16, 4096, 1024, 1, 0},
        {"bf16 latent down", K3C_QMAT_BF16, 512, 1024, 1, 0},
        {"MXFP4 expert w1/w2/w3", K3C_QMAT_MXFP4, 512, 512, 1, 0},
        {"MXFP4 expert, reference", K3C_QMAT_MXFP4, 512, 512, 1, 1},
        {"bf16 trunk, reference", K3C_QMAT_BF16, 1024, 1024, 1, 1},
        {"f32 trunk (BLAS sgemm, n = 1)", K3C_QMAT_F32, 1024, 1024, 1, 0},
        {"f32 trunk, cblas_sgemv", K3C_QMAT_F32, 1024, 1024, 1, 2},
        {"bf16 trunk, 8 inputs", K3C_QMAT_BF16, 1024, 1024, 8, 0},
        {"MXFP4 expert, 8 inputs", K3C_QMAT_MXFP4, 512, 512, 8, 0},
        {"bf16 trunk, 64 inputs", K3C_QMAT_BF16, 1024, 1024, 64, 0},
    };
    printf("| product | shape | n | threads | MB | GB/s best | GB/s median | GB/s per CPU-s | µs best "
           "|\n|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int t = 1; t <= tmax && t <= 2; t++)
            if (argc < 2 || strstr(cases[i].what, argv[1])) run(&cases[i], t);
    return 0;
}
