/* bench_prefill_cpu.c — prefill throughput of the inference engine on KDA layers from 1K to 64K prompt tokens: the
 * engine's chunked prefill (k3c_kda_chunk_fwd per prompt chunk, from and into the sequence's state) should cost the
 * same per token at any length, and the decode state of a KDA sequence does not grow with it.
 * A k3_tiny model (configs/k3_tiny.json) with every mixer turned into KDA (8 KDA layers, MoE FFNs), random weights,
 * one sequence, 1 thread. Usage: bench_prefill_cpu [MAX_K (default 64)] [REPS (default 2)]. Prints a table; not a
 * test. */
#include "bench_mem.h"
#include "model/model.h"
#include "serve/engine.h"

#include <stdio.h>
#include <stdlib.h>

#define CHUNK 1024 /* the engine's prefill_chunk: prompt tokens per step */

/* Seconds (wall, CPU) from submitting a T-token prompt to its first sampled token (the prefill). */
static int prefill_once(const k3c_model *m, int64_t T, double *wall, double *cpu, size_t *state, size_t *kda_state,
                        k3c_err *err) {
    k3c_engine_opts o = {.max_seqs = 1, .max_ctx = T + 2, .prefill_chunk = CHUNK, .threads = 1};
    k3c_engine *e;
    int rc = k3c_engine_open(m, &o, &e, err);
    if (rc) return rc;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t i = 0; i < T; i++) ids[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab_size);
    k3c_request req = {.sampler = {.temperature = 0, .top_p = 1}, .max_new = 1};
    int64_t seq;
    double t0 = k3c_now(), c0 = bench_cpu_now();
    rc = k3c_engine_submit(e, ids, T, &req, &seq, err);
    while (!rc && k3c_engine_pending(e) > 0) {
        k3c_engine_event ev[2];
        int n_ev;
        rc = k3c_engine_step(e, ev, 2, &n_ev, err);
    }
    *wall = k3c_now() - t0, *cpu = bench_cpu_now() - c0;
    k3c_engine_stats st;
    k3c_engine_get_stats(e, &st);
    *state = st.state_bytes, *kda_state = st.kda_state_bytes;
    free(ids);
    k3c_engine_close(e);
    return rc;
}

int main(int argc, char **argv) {
    const int max_k = argc > 1 ? atoi(argv[1]) : 64, reps = argc > 2 ? atoi(argv[2]) : 2;
    if (max_k < 1 || max_k > 1024 || reps < 1 || reps > 16) {
        fprintf(stderr, "usage: bench_prefill_cpu [MAX_K 1..1024] [REPS 1..16]\n");
        return 2;
    }
    k3c_config c;
    k3c_err err = {0};
    if (k3c_config_load("configs/k3_tiny.json", &c, &err)) {
        fprintf(stderr, "bench_prefill_cpu: %s\n", err.msg);
        return 1;
    }
    for (int64_t l = 0; l < c.num_layers; l++) c.mixer[l] = K3C_MIXER_KDA;
    c.max_positions = (int64_t)max_k * 1024 + 2;
    k3c_model m;
    if (k3c_model_create_f32(&c, 0, &m, &err)) {
        fprintf(stderr, "bench_prefill_cpu: %s\n", err.msg);
        return 1;
    }
    k3c_model_init_f32(&m, 7, 0.02);
    printf("engine prefill, k3_tiny dims with all %lld layers KDA (d = %lld, %lld heads x %lld, MoE %lld experts "
           "top-%lld), prefill_chunk %d, 1 thread, best of %d\n\n",
           (long long)c.num_layers, (long long)c.hidden_size, (long long)c.kda_heads, (long long)c.kda_head_dim,
           (long long)c.num_experts, (long long)c.top_k, CHUNK, reps);
    printf(
        "| prompt tokens | wall s | tokens/s (wall) | CPU s | tokens per CPU-s | vs best | decode state per sequence "
        "(KDA state + conv tails) |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    double rate[16], best = 0, worst = 1e30, wall[16], cpu[16];
    size_t state[16], kda[16];
    int nk = 0;
    for (int64_t k = 1; k <= max_k; k *= 2, nk++) {
        wall[nk] = cpu[nk] = 1e30;
        for (int r = 0; r < reps; r++) {
            double w, cs;
            if (prefill_once(&m, k * 1024, &w, &cs, &state[nk], &kda[nk], &err)) {
                fprintf(stderr, "bench_prefill_cpu: %s\n", err.msg);
                return 1;
            }
            wall[nk] = w < wall[nk] ? w : wall[nk], cpu[nk] = cs < cpu[nk] ? cs : cpu[nk];
        }
        rate[nk] = (double)k * 1024 / cpu[nk];
        best = rate[nk] > best ? rate[nk] : best, worst = rate[nk] < worst ? rate[nk] : worst;
    }
    for (int i = 0; i < nk; i++)
        printf("| %lld | %.3f | %.0f | %.3f | %.0f | %.2f | %zu B (%zu B) |\n", (1LL << i) * 1024, wall[i],
               (double)(1LL << i) * 1024 / wall[i], cpu[i], rate[i], rate[i] / best, state[i], kda[i]);
    printf("\ntokens per CPU-second, fastest / slowest length: %.2fx (goal <= 1.3x)\n", best / worst);
    k3c_model_free_f32(&m);
    return 0;
}
