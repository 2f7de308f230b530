/* bench_decode_cpu.c — CPU decode of a release checkpoint served as stored (k3c_weights_open: mmap'd bf16 trunk, MXFP4
 * experts) through the inference engine: load time, greedy tokens/s with 1 and 2 threads, peak resident memory, the
 * weight bytes a token reads, and this machine's read bandwidth in the same run → % of the bandwidth roofline.
 * Usage: bench_decode_cpu [DIR (default /work/cpu_bench)] [REPS (default 3)] [MAX_THREADS (1 or
 * 2, default 2)]. Not a test. */
#include "bench_mem.h"
#include "serve/weights.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROMPT 16
#define NEW 32

static double qbytes(const k3c_qmat *q) {
    if (!q->w) return 0;
    double e = (double)q->rows * (double)q->cols;
    return q->type == K3C_QMAT_F32 ? 4 * e : q->type == K3C_QMAT_BF16 ? 2 * e : e / 2 + e / 32;
}

/* Weight bytes one decode token reads: every trunk matrix the step multiplies (the absorbed MLA pair, not kv_b), the
 * top-k routed experts of each MoE layer, the lm_head and one embedding row (vectors: < 0.1%, left out). */
static double bytes_per_token(const k3c_weights *w) {
    const k3c_config *c = &w->cfg;
    double b = qbytes(&w->lm_head) + qbytes(&w->embed) / (double)c->vocab_size;
    for (int l = 0; l < c->num_layers; l++) {
        const k3c_weights_layer *L = &w->layer[l];
        const k3c_qmat *m[] = {&L->q_proj,      &L->k_proj,   &L->v_proj,      &L->f_a,       &L->f_b,
                               &L->b_proj,      &L->g_proj,   &L->g_a,         &L->g_b,       &L->q_a,
                               &L->q_b,         &L->kv_a,     &L->o_proj,      &L->mlp_gate,  &L->mlp_up,
                               &L->mlp_down,    &L->router,   &L->shared_gate, &L->shared_up, &L->shared_down,
                               &L->latent_down, &L->latent_up};
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) b += qbytes(m[i]);
        for (int64_t h = 0; L->uk_t && h < c->mla_heads; h++) b += qbytes(&L->uk_t[h]) + qbytes(&L->uv[h]);
        if (L->w1) b += (double)c->top_k * (qbytes(&L->w1[0]) + qbytes(&L->w2[0]) + qbytes(&L->w3[0]));
    }
    return b;
}

static double dir_safetensors_bytes(const char *dir) {
    DIR *d = opendir(dir);
    double total = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        char path[4400];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors") && !stat(path, &sb)) total += (double)sb.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* The bandwidth in a child process, so its 1 GiB buffer stays out of this process's peak resident memory. */
static void bandwidth_in_child(double bw[3][3]) {
    int fd[2];
    const size_t sz = sizeof(double) * 9;
    memset(bw, 0, sz);
    if (pipe(fd)) return;
    pid_t pid = fork();
    if (pid == 0) {
        double r[3][3] = {{0}};
        for (int t = 1; t <= 2; t++) bench_read_bandwidth((size_t)1 << 30, t, 7, &r[t][0], &r[t][1], &r[t][2]);
        ssize_t wr = write(fd[1], r, sizeof r);
        _exit(wr == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    if (pid > 0 && read(fd[0], bw, sz) != (ssize_t)sz) memset(bw, 0, sz);
    close(fd[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
}

typedef struct {
    double prefill_s, decode_tps, decode_tps_cpu; /* tokens per wall second, per CPU-second of each thread */
    int32_t ids[NEW];
    int n;
} run_result;

/* Prompt of PROMPT ids, NEW greedy ids; decode tokens/s over the NEW − 1 steps after the first sampled token. */
static int decode_once(const k3c_weights *w, int threads, run_result *r, k3c_err *err) {
    k3c_engine_opts o = {.max_seqs = 1, .max_ctx = PROMPT + NEW + 1, .prefill_chunk = PROMPT, .threads = threads};
    k3c_engine *e;
    int rc = k3c_engine_open_weights(w, &o, &e, err);
    if (rc) return rc;
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 7919 + 13) % w->cfg.vocab_size);
    k3c_request req = {.sampler = {.temperature = 0, .top_p = 1}, .max_new = NEW};
    int64_t seq;
    double t0 = k3c_now(), t1 = t0, c1 = bench_cpu_now();
    rc = k3c_engine_submit(e, prompt, PROMPT, &req, &seq, err);
    r->n = 0;
    while (!rc && k3c_engine_pending(e) > 0) {
        k3c_engine_event ev[2];
        int n_ev;
        rc = k3c_engine_step(e, ev, 2, &n_ev, err);
        for (int i = 0; !rc && i < n_ev && r->n < NEW; i++) {
            if (r->n == 0) t1 = k3c_now(), c1 = bench_cpu_now();
            r->ids[r->n++] = ev[i].token.id;
        }
    }
    double t2 = k3c_now(), c2 = bench_cpu_now();
    r->prefill_s = t1 - t0;
    r->decode_tps = r->n > 1 ? (r->n - 1) / (t2 - t1) : 0;
    r->decode_tps_cpu = r->n > 1 ? (r->n - 1) / ((c2 - c1) / threads) : 0;
    k3c_engine_close(e);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/work/cpu_bench";
    const int reps = argc > 2 ? atoi(argv[2]) : 3, tmax = argc > 3 ? atoi(argv[3]) : 2;
    if (reps < 1 || reps > 16 || tmax < 1 || tmax > 2) {
        fprintf(stderr, "usage: bench_decode_cpu [DIR] [REPS 1..16] [MAX_THREADS 1..2]\n");
        return 2;
    }
    double bw[3][3];
    bandwidth_in_child(bw);
    k3c_err err = {0};
    k3c_weights w;
    double t0 = k3c_now(), c0 = bench_cpu_now();
    if (k3c_weights_open(dir, &w, &err)) {
        fprintf(stderr, "bench_decode_cpu: %s\n", err.msg);
        return 1;
    }
    const double load_s = k3c_now() - t0, load_cpu = bench_cpu_now() - c0, file = dir_safetensors_bytes(dir),
                 bpt = bytes_per_token(&w);
    printf("checkpoint %s: %.1f MB of safetensors; loaded (mmap'd, as stored) in %.3f s wall, %.3f s CPU\n", dir,
           file / 1e6, load_s, load_cpu);
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("OMP_WAIT_POLICY=%s (passive: a thread waiting at a join sleeps instead of spinning, which on a shared "
           "machine keeps the CPU for the thread it waits for)\n",
           wait ? wait : "(unset: libgomp spins first)");
    printf("weight bytes read per decode token: %.1f MB (trunk + top-%lld experts x %d MoE layers + lm_head)\n",
           bpt / 1e6, (long long)w.cfg.top_k, k3c_config_num_moe(&w.cfg));
    printf("read bandwidth (1 GiB streaming sum, same run), GB/s best / median / best per CPU-second: 1 thread %.2f / "
           "%.2f / %.2f; 2 threads %.2f / %.2f / %.2f\n\n",
           bw[1][0], bw[1][1], bw[1][2], bw[2][0], bw[2][1], bw[2][2]);
    printf(
        "| threads | tok/s best | tok/s median | roofline tok/s | %% of roofline | tok/s per CPU-s (best / median) | "
        "roofline per CPU-s | %% (best / median) | prefill s (best) |\n|---|---|---|---|---|---|---|---|---|\n");
    int32_t first_ids[NEW];
    int same_ids = 1, have = 0;
    for (int t = 1; t <= tmax; t++) {
        double tps[16], tps_cpu[16], best_pre = 1e30, best_cpu = 0;
        for (int r = 0; r < reps; r++) {
            run_result res;
            if (decode_once(&w, t, &res, &err)) {
                fprintf(stderr, "bench_decode_cpu: %s\n", err.msg);
                k3c_weights_free(&w);
                return 1;
            }
            tps[r] = res.decode_tps, tps_cpu[r] = res.decode_tps_cpu;
            best_cpu = res.decode_tps_cpu > best_cpu ? res.decode_tps_cpu : best_cpu;
            best_pre = res.prefill_s < best_pre ? res.prefill_s : best_pre;
            if (!have) memcpy(first_ids, res.ids, sizeof first_ids), have = 1;
            same_ids &= res.n == NEW && !memcmp(first_ids, res.ids, sizeof first_ids);
        }
        double best = 0;
        for (int r = 0; r < reps; r++) best = tps[r] > best ? tps[r] : best;
        double med = bench_sorted_median(tps, reps), med_cpu = bench_sorted_median(tps_cpu, reps),
               roof = bw[t][0] * 1e9 / bpt, roof_cpu = bw[t][2] * 1e9 / bpt;
        printf("| %d | %.2f | %.2f | %.1f | %.0f%% | %.2f / %.2f | %.1f | %.0f%% / %.0f%% | %.3f |\n", t, best, med,
               roof, roof > 0 ? 100 * best / roof : 0, best_cpu, med_cpu, roof_cpu,
               roof_cpu > 0 ? 100 * best_cpu / roof_cpu : 0, roof_cpu > 0 ? 100 * med_cpu / roof_cpu : 0, best_pre);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("\npeak resident memory: %.1f MiB = %.2fx the checkpoint files\n", ru.ru_maxrss / 1024.0,
           ru.ru_maxrss * 1024.0 / file);
    printf("greedy ids (first 12 of %d): ", NEW);
    for (int i = 0; i < 12; i++) printf("%d ", first_ids[i]);
    printf("\nsame %d greedy ids in every run and thread count: %s\n", NEW, same_ids ? "yes" : "NO");
    k3c_weights_free(&w);
    return 0;
}
