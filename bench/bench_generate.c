/* bench_generate.c — generation is linear in the new tokens: k3c_generate (the inference engine) times 64 and 512 new
 * tokens on a tiny model and prints the ratio (goal ≤ 12×; the prefix-recomputing loop took 32.9×), plus the decode
 * state one sequence holds, for the tiny model and the K3 release dims. Prints a table; not part of `make test`. */
#include "model/model.h"
#include "serve/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of k3c_generate producing n greedy ids after a 16-id prompt. */
static double time_generate(k3c_model *m, int64_t n, int reps) {
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(16 + n));
    double t[8];
    k3c_err err = {0};
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < 16; i++) seq[i] = (int32_t)((i * 7919 + 11) % m->cfg.vocab_size);
        k3c_gen_opts o = {.sampler = {.top_p = 1}, .max_new = n, .stop_id = -1};
        int64_t len;
        double t0 = k3c_now();
        if (k3c_generate(m, seq, 16, &o, &len, &err) || len != 16 + n) {
            printf("generate: %s (length %lld)\n", err.msg, (long long)len);
            exit(1);
        }
        t[r] = k3c_now() - t0;
    }
    free(seq);
    qsort(t, (size_t)reps, sizeof *t, cmp);
    return t[reps / 2];
}

static void state_row(const char *label, const char *config) {
    k3c_config c;
    k3c_err err = {0};
    if (k3c_config_load(config, &c, &err)) {
        printf("%s: %s\n", label, err.msg);
        return;
    }
    k3c_eng_dims d;
    k3c_eng_dims_of(&c, &d);
    size_t kda = k3c_eng_state_bytes(&d, 0), tok = k3c_eng_state_bytes(&d, 1) - kda;
    printf("| %-22s | %3d KDA, %2d MLA | %12.3f MiB | %8zu B (%lld values/layer) | %10.1f MiB |\n", label, d.n_kda,
           d.n_mla, (double)kda / (1 << 20), tok, (long long)d.lat_w, (double)(kda + 8192 * tok) / (1 << 20));
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "../shared/golden/k3_tiny_a";
    k3c_model m;
    k3c_err err = {0};
    if (k3c_model_open_f32(dir, 0, &m, &err)) {
        printf("%s\n", err.msg);
        return 1;
    }
    k3c_set_num_threads(1);
    double t64 = time_generate(&m, 64, 3), t512 = time_generate(&m, 512, 3);
    printf("k3c_generate on %s (16-id prompt, greedy, 1 thread, median of 3)\n\n", dir);
    printf("| new tokens | seconds | tokens/s |\n|---:|---:|---:|\n");
    printf("| 64 | %.4f | %.1f |\n| 512 | %.4f | %.1f |\n\n", t64, 64 / t64, t512, 512 / t512);
    printf("512 / 64 time ratio: %.2f× (linear: 8×; goal ≤ 12×; the prefix-recomputing loop: 32.9×)\n\n", t512 / t64);
    printf("Decode state per sequence (float32)\n\n");
    printf("| model | layers | KDA state + conv tails | latent cache per token | at 8K tokens |\n");
    printf("|---|---|---:|---:|---:|\n");
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    state_row("this model", cfg);
    state_row("K3 release dims", "../shared/golden/kimi_k3_config.json");
    k3c_model_free_f32(&m);
    return 0;
}
