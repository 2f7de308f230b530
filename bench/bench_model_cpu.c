/* bench_model_cpu.c — forward and forward+backward tokens/s of whole models on the CPU (float32), for the two golden
 * tiny models and the make-run demo config. Prints a table; not part of `make test`. Run from the repo root. */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench(const char *label, k3c_model *m, int64_t T, int64_t seq, int reps) {
    int nd = (int)((T + seq - 1) / seq);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T), *cu = malloc(sizeof(int32_t) * (size_t)(nd + 1));
    for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)((t * 7919) % m->cfg.vocab_size);
    for (int d = 0; d <= nd; d++) cu[d] = (int32_t)(d * seq < T ? d * seq : T);
    k3c_err err = {0};
    k3c_arena ar;
    if (k3c_arena_init(&ar, k3c_model_plan_bytes_f32(m, T, nd), &err)) {
        printf("%s\n", err.msg);
        return;
    }
    k3c_model_batch b = {T, nd, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    double tf[16], tb[16];
    for (int r = 0; r < reps + 1; r++) {
        k3c_acts *a;
        double loss;
        k3c_arena_reset(&ar, 0);
        double t0 = k3c_now();
        if (k3c_model_forward_f32(m, &b, &ar, &a, &loss, NULL, &err)) {
            printf("%s\n", err.msg);
            return;
        }
        double t1 = k3c_now();
        if (k3c_model_backward_f32(m, a, 1.0, &err)) {
            printf("%s\n", err.msg);
            return;
        }
        double t2 = k3c_now();
        if (r) {
            tf[r - 1] = t1 - t0;
            tb[r - 1] = t2 - t0;
        } /* first run is warm-up */
    }
    qsort(tf, (size_t)reps, sizeof *tf, cmp);
    qsort(tb, (size_t)reps, sizeof *tb, cmp);
    printf("| %-22s | %6lld | %5lld | %8.1f | %9.0f | %8.1f | %9.0f |\n", label, (long long)T, (long long)seq,
           1e3 * tf[reps / 2], (double)T / tf[reps / 2], 1e3 * tb[reps / 2], (double)T / tb[reps / 2]);
    k3c_arena_free(&ar);
    free(ids);
    free(cu);
}

int main(int argc, char **argv) {
    const char *shared = argc > 1 ? argv[1] : "../shared";
    char p[1024];
    k3c_err err = {0};
    printf("threads: %d\n\n| model | tokens | seq | fwd ms | fwd tok/s | fwd+bwd ms | fwd+bwd tok/s |\n",
           k3c_num_threads());
    printf("|---|---|---|---|---|---|---|\n");
    static const char *dirs[2] = {"golden/kimi_linear_tiny_a", "golden/k3_tiny_a"};
    for (int i = 0; i < 2; i++) {
        k3c_model m;
        snprintf(p, sizeof p, "%s/%s", shared, dirs[i]);
        if (k3c_model_open_f32(p, 1, &m, &err)) {
            printf("%s: %s\n", p, err.msg);
            continue;
        }
        bench(dirs[i] + 7, &m, 2048, 512, 5);
        k3c_model_free_f32(&m);
    }
    k3c_config cfg;
    if (!k3c_config_load("configs/k3_tiny.json", &cfg, &err)) {
        k3c_model m;
        if (!k3c_model_create_f32(&cfg, 1, &m, &err)) {
            k3c_model_init_f32(&m, 1, 0.02);
            bench("configs/k3_tiny.json", &m, 8192, 256, 3);
            bench("configs/k3_tiny.json", &m, 8192, 1024, 3);
            bench("configs/k3_tiny.json", &m, 8192, 4096, 3);
            k3c_model_free_f32(&m);
        }
    } else {
        printf("%s\n", err.msg);
    }
    return 0;
}
