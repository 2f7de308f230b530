/* bench_mem.h — the read bandwidth of this machine, measured the way a decode reads weights: every thread streams its
 * share of a buffer far larger than the caches (AVX2 loads summed). Shared by the CPU benchmarks; not a library part. */
#ifndef K3C_BENCH_MEM_H
#define K3C_BENCH_MEM_H

#include "base/base.h"

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <time.h>

/* CPU seconds of this process, all threads: on a shared machine a rate per CPU-second shows what the code does when
 * it runs, wall time what it got. */
static inline double bench_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline double bench_sorted_median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Best and median GB/s over `reps` streaming sums of a `bytes` buffer with `threads` threads (0 if out of memory);
 * best_cpu: the best GB/s per CPU-second of each thread (bytes / (CPU seconds / threads)). */
static inline void bench_read_bandwidth(size_t bytes, int threads, int reps, double *best, double *median,
                                        double *best_cpu) {
    size_t n = bytes / sizeof(float) / 32 * 32;
    float *buf = aligned_alloc(64, n * sizeof(float));
    double gbs[32];
    *best = *median = *best_cpu = 0;
    if (!buf || reps > 32) {
        free(buf);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f;
    volatile float sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = k3c_now(), c0 = bench_cpu_now(), total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
        for (size_t b = 0; b < n / 4096; b++) {
            const float *p = buf + b * 4096;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < 4096; i += 32) {
                a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
                a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
                a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
                a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
            }
            float o[8];
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            total += o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
        }
        double dt = k3c_now() - t0, dc = (bench_cpu_now() - c0) / threads, gb = (double)(n / 4096 * 4096) * 4 / 1e9;
        sink += (float)total;
        gbs[r] = gb / dt;
        if (gb / dc > *best_cpu) *best_cpu = gb / dc;
    }
    (void)sink;
    free(buf);
    *best = 0;
    for (int r = 0; r < reps; r++) *best = gbs[r] > *best ? gbs[r] : *best;
    *median = bench_sorted_median(gbs, reps);
}

#endif
