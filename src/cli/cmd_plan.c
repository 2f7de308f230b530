/* cmd_plan.c — `k3c plan CONFIG`: parameters, FLOPs, per-GPU memory, communication and the best TP×CP×PP×EP×DP
 * layouts for training (or serving) a Kimi-K3-class model on N GPUs (src/plan, docs/PLAN.md). */
#include "base/json.h"
#include "cli.h"
#include "k3c/plan.h"
#include "k3c/train.h"

#include <stdlib.h>
#include <string.h>

#define MAX_TOP 64

static const char *const value_opts[] = {"--gpus",
                                         "--seq",
                                         "--tp",
                                         "--cp",
                                         "--pp",
                                         "--ep",
                                         "--dp",
                                         "--zero",
                                         "--recompute",
                                         "--recompute-slice",
                                         "--head-chunk",
                                         "--micro-batch",
                                         "--global-batch-tokens",
                                         "--optimizer",
                                         "--grad-dtype",
                                         "--experts",
                                         "--gpu-mem-gb",
                                         "--nvlink-gbs",
                                         "--ib-gbps",
                                         "--gpus-per-node",
                                         "--peak-tflops",
                                         "--compute-eff",
                                         "--hbm-gbs",
                                         "--step-time",
                                         "--context",
                                         "--batch",
                                         "--top",
                                         NULL};
static const char *const flag_opts[] = {"--serve", "--json", "--help", "-h", NULL};

static void help(void) {
    printf(
        "usage: k3c plan CONFIG [options]\n\n"
        "Sizes a kimi_linear / kimi_k3 model (CONFIG = config.json or its directory) on paper: exact parameters by\n"
        "component, FLOPs per token, per-GPU memory, communication, step time, and the best layouts for N GPUs.\n"
        "Ranks are ordered TP, EP, CP, DP, PP (innermost first); docs/PLAN.md explains every assumption.\n\n"
        "training layout (all four of --tp --pp --ep --dp evaluate one layout; with --gpus the rest is searched):\n"
        "  --gpus N                 GPUs to plan for: enumerate every valid layout, keep those that fit, rank by step\n"
        "  --seq T                  tokens per sequence (default 4096)\n"
        "  --tp N --cp N --pp N     tensor (inside a node unless given), context, pipeline parallel degrees\n"
        "  --ep N --dp N            expert parallel (divides the routed experts), data parallel degrees\n"
        "  --zero 0..3              shard optimizer state (1), + gradients (2), + weights (3) over the DP group\n"
        "  --recompute none|selective|full   activations kept for backward (default: searched, else selective)\n"
        "  --recompute-slice N      full recompute in slices of N tokens per GPU (TRAINING.md 1.4; default 0 = off)\n"
        "  --head-chunk N           the head's logits in chunks of N tokens per GPU (TRAINING.md 1.4; 0 = off)\n"
        "  --micro-batch B          sequences per micro-batch (default: searched, else 1)\n"
        "  --global-batch-tokens N  tokens per optimizer step (default 67108864 = 2^26)\n"
        "  --optimizer adamw|muon   AdamW: fp32 master + 2 moments; Muon: fp32 master + 1 momentum on matrices\n"
        "  --grad-dtype fp32|bf16   gradient accumulation buffers (default fp32)\n"
        "  --experts bf16|mxfp4     routed-expert weights on the GPU (training default bf16; serving: checkpoint)\n"
        "  --step-time S            a measured step time in seconds: report its MFU\n"
        "serving (--serve):\n"
        "  --serve                  plan inference instead: weights, MLA latent cache, KDA states, decode step\n"
        "  --context T              tokens of context per sequence (default: max_position_embeddings)\n"
        "  --batch B                concurrent sequences over the whole deployment (default 1)\n"
        "hardware (defaults: H200):\n"
        "  --gpu-mem-gb G           usable memory per GPU (default 141)\n"
        "  --nvlink-gbs G           NVLink GB/s per GPU inside a node (default 900)\n"
        "  --ib-gbps G              network Gb/s per GPU across nodes (default 400)\n"
        "  --gpus-per-node N        GPUs per node (default 8)\n"
        "  --peak-tflops F          dense BF16 peak per GPU (default 989)\n"
        "  --compute-eff F          fraction of peak the kernels reach, for step times (default 0.5)\n"
        "  --hbm-gbs G              memory bandwidth per GPU for decode estimates (default 4800)\n"
        "output:\n"
        "  --top K                  layouts to print from a search (default 5)\n"
        "  --json                   one JSON object instead of the text report\n");
}

/* ---------------------------------------------------------------- options */
typedef struct {
    const char *path;
    int64_t gpus, top, context, batch;
    int serve, json, explicit_layout;
    double step_time;
    k3c_plan_layout lay; /* constraints: 0 / −1 = free */
    k3c_plan_hw hw;
} plan_opts;

static int known(const char *a) {
    for (const char *const *o = value_opts; *o; o++)
        if (strcmp(a, *o) == 0 || (strncmp(a, *o, strlen(*o)) == 0 && a[strlen(*o)] == '=')) return 1;
    for (const char *const *o = flag_opts; *o; o++)
        if (strcmp(a, *o) == 0) return 1;
    return 0;
}

static int opt_i(int argc, char **argv, const char *name, long long def, int64_t *out) {
    long long v;
    if (!cli_opt_int(argc, argv, name, def, &v)) return 0;
    *out = (int64_t)v;
    return 1;
}

static int opt_choice(int argc, char **argv, const char *name, const char *const *names, int n, int def, int *out) {
    const char *v = cli_opt(argc, argv, name);
    *out = def;
    if (!v) return 1;
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = i;
            return 1;
        }
    fprintf(stderr, "k3c plan: %s: unknown value '%s'\n", name, v);
    return 0;
}

static int parse(int argc, char **argv, plan_opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-' || argv[i][1] == 0) continue;
        if (!known(argv[i])) return cli_usage_error("plan", "unknown option '%s'", argv[i]);
        for (const char *const *v = value_opts; *v; v++)
            if (strcmp(argv[i], *v) == 0) {
                i++;
                break;
            }
    }
    o->path = cli_positional(argc, argv, 0, value_opts);
    if (!o->path) return cli_usage_error("plan", "missing CONFIG (a config.json or a checkpoint directory)");
    k3c_plan_hw_default(&o->hw);
    k3c_plan_layout_default(&o->lay);
    k3c_plan_layout *L = &o->lay;
    static const char *const rc_names[] = {"none", "selective", "full"}, *const opt_names[] = {"adamw", "muon"};
    static const char *const grad_names[] = {"bf16", "fp32"}, *const ex_names[] = {"bf16", "mxfp4"};
    int64_t zero, gpn;
    int grad, ex;
    int ok = opt_i(argc, argv, "--gpus", 0, &o->gpus) && opt_i(argc, argv, "--seq", 4096, &L->seq) &&
             opt_i(argc, argv, "--tp", 0, &L->tp) && opt_i(argc, argv, "--cp", 0, &L->cp) &&
             opt_i(argc, argv, "--pp", 0, &L->pp) && opt_i(argc, argv, "--ep", 0, &L->ep) &&
             opt_i(argc, argv, "--dp", 0, &L->dp) && opt_i(argc, argv, "--zero", -1, &zero) &&
             opt_i(argc, argv, "--micro-batch", 0, &L->micro_batch) &&
             opt_i(argc, argv, "--recompute-slice", 0, &L->recompute_slice) &&
             opt_i(argc, argv, "--head-chunk", 0, &L->head_chunk) &&
             opt_i(argc, argv, "--global-batch-tokens", L->global_batch_tokens, &L->global_batch_tokens) &&
             opt_i(argc, argv, "--top", 5, &o->top) && opt_i(argc, argv, "--context", 0, &o->context) &&
             opt_i(argc, argv, "--batch", 1, &o->batch) && opt_i(argc, argv, "--gpus-per-node", 8, &gpn) &&
             opt_choice(argc, argv, "--recompute", rc_names, 3, -1, &L->recompute) &&
             opt_choice(argc, argv, "--optimizer", opt_names, 2, K3C_OPT_ADAMW, &L->optimizer) &&
             opt_choice(argc, argv, "--grad-dtype", grad_names, 2, 1, &grad) &&
             opt_choice(argc, argv, "--experts", ex_names, 2, -1, &ex) &&
             cli_opt_double(argc, argv, "--gpu-mem-gb", o->hw.gpu_mem_gb, &o->hw.gpu_mem_gb) &&
             cli_opt_double(argc, argv, "--nvlink-gbs", o->hw.nvlink_gbs, &o->hw.nvlink_gbs) &&
             cli_opt_double(argc, argv, "--ib-gbps", o->hw.ib_gbps, &o->hw.ib_gbps) &&
             cli_opt_double(argc, argv, "--peak-tflops", o->hw.peak_tflops, &o->hw.peak_tflops) &&
             cli_opt_double(argc, argv, "--compute-eff", o->hw.compute_eff, &o->hw.compute_eff) &&
             cli_opt_double(argc, argv, "--hbm-gbs", o->hw.hbm_gbs, &o->hw.hbm_gbs) &&
             cli_opt_double(argc, argv, "--step-time", 0, &o->step_time);
    if (!ok) return 2;
    L->zero = (int)zero, L->grad_bytes = grad ? 4 : 2, L->experts_mxfp4 = ex; /* −1: decided per mode */
    o->hw.gpus_per_node = gpn;
    o->serve = cli_flag(argc, argv, "--serve"), o->json = cli_flag(argc, argv, "--json");
    o->explicit_layout = L->tp > 0 && L->pp > 0 && L->ep > 0 && L->dp > 0;
    if (o->hw.gpu_mem_gb <= 0 || o->hw.nvlink_gbs <= 0 || o->hw.ib_gbps <= 0 || o->hw.peak_tflops <= 0 ||
        o->hw.compute_eff <= 0 || o->hw.compute_eff > 1 || o->hw.hbm_gbs <= 0 || gpn < 1)
        return cli_usage_error("plan", "hardware figures must be positive (and --compute-eff at most 1)");
    if (o->gpus < 0 || o->top < 1 || o->top > MAX_TOP || L->seq < 1 || o->batch < 1 || o->context < 0 ||
        o->step_time < 0 || L->zero < -1 || L->zero > 3 || L->tp < 0 || L->cp < 0 || L->pp < 0 || L->ep < 0 ||
        L->dp < 0 || L->micro_batch < 0 || L->global_batch_tokens < 1)
        return cli_usage_error("plan", "a size is out of range (--top is 1..%d, --zero 0..3, the rest positive)",
                               MAX_TOP);
    return 0;
}

/* ---------------------------------------------------------------- text helpers */
static const char *grp(double v, char *buf) { /* 1234567 → "1,234,567" */
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.0f", v);
    int n = (int)strlen(tmp), neg = tmp[0] == '-', j = 0;
    for (int i = 0; i < n; i++) {
        buf[j++] = tmp[i];
        int left = n - i - 1;
        if (left > 0 && left % 3 == 0 && !(neg && i == 0)) buf[j++] = ',';
    }
    buf[j] = 0;
    return buf;
}

static double gb(double bytes) { return bytes / 1e9; }

static void print_params(const k3c_config *cfg, const k3c_plan_params *p) {
    char a[48], b[48];
    int mla = k3c_config_num_mla(cfg), moe = k3c_config_num_moe(cfg);
    printf("model: %s, %lld layers (%lld KDA + %d MLA, %d MoE), hidden %lld, vocab %lld\n\n", cfg->model_type,
           (long long)cfg->num_layers, (long long)(cfg->num_layers - mla), mla, moe, (long long)cfg->hidden_size,
           (long long)cfg->vocab_size);
    printf("parameters %28s %22s\n", "total", "active per token");
    for (int c = 0; c < K3C_PC_COUNT; c++)
        if (p->total[c])
            printf("  %-12s %24s %22s\n", k3c_plan_comp_name(c), grp((double)p->total[c], a),
                   grp((double)p->active[c], b));
    printf("  %-12s %24s %22s\n", "total", grp((double)p->total_all, a), grp((double)p->active_all, b));
    printf("  text model %s + vision tower and projector %s\n", grp((double)p->text_total, a),
           grp((double)p->vision_total, b));
    printf("  trainable %s (router correction biases %s are set by balancing, not gradients); ",
           grp((double)p->trainable, a), grp((double)p->frozen, b));
    printf("%s checkpoint tensors\n", grp((double)p->tensors, a));
    printf("  release dtypes: BF16 %s, F32 %s", grp((double)p->bf16, a), grp((double)p->f32, b));
    printf(", MXFP4 %s (logical); %s tensor bytes\n\n", grp((double)p->mxfp4, a), grp(p->ckpt_bytes, b));
}

static void print_flops(const k3c_plan_flops *f, int64_t seq) {
    char a[48];
    printf("FLOPs per token, forward, causal sequences of %s tokens (backward = 2x forward)\n", grp((double)seq, a));
    for (int c = 0; c < K3C_PC_COUNT; c++) {
        if (f->fwd[c] == 0) continue;
        printf("  %-12s %12.4g", k3c_plan_comp_name(c), f->fwd[c]);
        if (c == K3C_PC_MLA) printf("   of which scores and values %.4g (grows with context)", f->mla_core);
        if (c == K3C_PC_KDA) printf("   of which chunked recurrence %.4g (C = %d)", f->kda_core, K3C_PLAN_KDA_CHUNK);
        printf("\n");
    }
    printf("  %-12s %12.4g   training (fwd + bwd) %.4g\n\n", "forward", f->fwd_total, f->model_total);
}

/* Activation bytes per token of each kind of layer the model has, for the three recomputation policies. */
static void print_layer_acts(const k3c_config *cfg) {
    static const char *const mix[] = {"KDA", "MLA"}, *const ffn[] = {"dense", "MoE"};
    printf("activations kept for backward per token per layer (bf16, before the TP x CP split)\n");
    for (int a = 0; a < 2; a++)
        for (int f = 0; f < 2; f++)
            for (int l = 0; l < cfg->num_layers; l++) {
                if (cfg->mixer[l] != a || cfg->ffn[l] != f) continue;
                char x[48], y[48], z[48];
                printf("  %s + %-5s  none %10s B   selective %10s B   full %8s B   (e.g. layer %d)\n", mix[a], ffn[f],
                       grp(k3c_plan_layer_act_bytes(cfg, l, K3C_RC_NONE), x),
                       grp(k3c_plan_layer_act_bytes(cfg, l, K3C_RC_SELECTIVE), y),
                       grp(k3c_plan_layer_act_bytes(cfg, l, K3C_RC_FULL), z), l);
                break;
            }
    printf("\n");
}

static void layout_line(const k3c_plan_layout *L, char *buf, size_t n) {
    snprintf(buf, n, "TP %lld x CP %lld x PP %lld x EP %lld x DP %lld", (long long)L->tp, (long long)L->cp,
             (long long)L->pp, (long long)L->ep, (long long)L->dp);
}

static void print_eval(const k3c_plan_eval *e, const plan_opts *o) {
    const k3c_plan_layout *L = &e->layout;
    const k3c_plan_memory *M = &e->mem;
    char s[128], a[48], b[48];
    layout_line(L, s, sizeof s);
    printf("layout: %s = %lld GPUs, ZeRO-%d, recompute %s, %s, micro-batch %lld x %s tokens, micro-batches "
           "per step %lld (%s tokens)\n",
           s, (long long)k3c_plan_gpus(L), L->zero, k3c_plan_recompute_name(L->recompute),
           k3c_plan_optimizer_name(L->optimizer), (long long)L->micro_batch, grp((double)L->seq, a),
           (long long)e->micro_batches, grp((double)L->global_batch_tokens, b));
    printf("memory per GPU (stage %lld of 0..%lld: %lld layers, micro-batches in flight %lld):\n", (long long)M->stage,
           (long long)L->pp - 1, (long long)M->layers, (long long)M->in_flight);
    printf("  weights %9.2f GB   gradients %9.2f GB   optimizer %9.2f GB\n", gb(M->weights), gb(M->grads),
           gb(M->optimizer));
    printf("  activations %5.2f GB   working %11.2f GB   total %13.2f GB of %.0f GB: %s\n", gb(M->activations),
           gb(M->working), gb(M->total), o->hw.gpu_mem_gb, e->fits ? "fits" : "DOES NOT FIT");
    printf("step time estimate %.4g s: compute %.4g s, communication %.4g s (%.1f%%), pipeline bubble %.4g s "
           "(%.1f%% of the schedule)\n",
           e->step_s, e->compute_s, e->comm_s, 100 * e->comm_share, e->bubble_s, 100 * e->bubble_frac);
    printf("  communication per GPU per step (slowest stage %lld):", (long long)e->slow_stage);
    for (int k = 0; k < K3C_COMM_COUNT; k++)
        if (e->comm_kind_bytes[k] > 0)
            printf(" %s %.3g GB %.3g s;", k3c_plan_comm_name(k), gb(e->comm_kind_bytes[k]), e->comm_kind_s[k]);
    printf("\n  throughput %s tokens/s, MFU %.1f%% (%.4g model FLOPs per token, peak %.0f TFLOPS)\n\n",
           grp(e->tokens_per_s, a), 100 * e->mfu, e->model_flops_per_token, o->hw.peak_tflops);
}

static void print_table(const k3c_plan_eval *best, int n) {
    printf(" rank  TP  CP  PP  EP  DP ZeRO recompute  mb    m  mem/GPU GB    step s   tokens/s   MFU  comm bubble\n");
    for (int i = 0; i < n; i++) {
        const k3c_plan_eval *e = &best[i];
        const k3c_plan_layout *L = &e->layout;
        char a[48];
        printf(" %4d %3lld %3lld %3lld %3lld %3lld %4d %-9s %3lld %4lld %11.2f %9.4g %10s %4.1f%% %4.1f%% %5.1f%%\n",
               i + 1, (long long)L->tp, (long long)L->cp, (long long)L->pp, (long long)L->ep, (long long)L->dp, L->zero,
               k3c_plan_recompute_name(L->recompute), (long long)L->micro_batch, (long long)e->micro_batches,
               gb(e->mem.total), e->step_s, grp(e->tokens_per_s, a), 100 * e->mfu, 100 * e->comm_share,
               100 * e->bubble_frac);
    }
    printf("\n");
}

/* ---------------------------------------------------------------- JSON */
static void jkey(k3c_sbuf *j, const char *k) {
    k3c_sbuf_json_string(j, k, strlen(k));
    k3c_sbuf_append(j, ":", 1);
}
static void jnum(k3c_sbuf *j, const char *k, double v, int last) {
    jkey(j, k);
    k3c_sbuf_json_number(j, v);
    if (!last) k3c_sbuf_append(j, ",", 1);
}
static void jstr(k3c_sbuf *j, const char *k, const char *v, int last) {
    jkey(j, k);
    k3c_sbuf_json_string(j, v, strlen(v));
    if (!last) k3c_sbuf_append(j, ",", 1);
}

static void json_params(k3c_sbuf *j, const k3c_plan_params *p) {
    jkey(j, "params");
    k3c_sbuf_printf(j, "{\"components\":{");
    for (int c = 0; c < K3C_PC_COUNT; c++) {
        jkey(j, k3c_plan_comp_name(c));
        k3c_sbuf_printf(j, "{\"total\":%lld,\"active\":%lld}%s", (long long)p->total[c], (long long)p->active[c],
                        c + 1 < K3C_PC_COUNT ? "," : "");
    }
    k3c_sbuf_printf(j,
                    "},\"total\":%lld,\"text\":%lld,\"vision\":%lld,\"active\":%lld,\"trainable\":%lld,"
                    "\"frozen\":%lld,\"tensors\":%lld,\"bf16\":%lld,\"f32\":%lld,\"mxfp4\":%lld,",
                    (long long)p->total_all, (long long)p->text_total, (long long)p->vision_total,
                    (long long)p->active_all, (long long)p->trainable, (long long)p->frozen, (long long)p->tensors,
                    (long long)p->bf16, (long long)p->f32, (long long)p->mxfp4);
    jnum(j, "checkpoint_bytes", p->ckpt_bytes, 1);
    k3c_sbuf_append(j, "},", 2);
}

static void json_flops(k3c_sbuf *j, const k3c_plan_flops *f, int64_t seq) {
    jkey(j, "flops_per_token");
    k3c_sbuf_printf(j, "{\"seq\":%lld,\"forward\":{", (long long)seq);
    for (int c = 0; c < K3C_PC_COUNT; c++) jnum(j, k3c_plan_comp_name(c), f->fwd[c], c + 1 == K3C_PC_COUNT);
    k3c_sbuf_append(j, "},", 2);
    jnum(j, "mla_core", f->mla_core, 0);
    jnum(j, "kda_core", f->kda_core, 0);
    jnum(j, "forward_total", f->fwd_total, 0);
    jnum(j, "training_total", f->model_total, 1);
    k3c_sbuf_append(j, "},", 2);
}

static void json_eval(k3c_sbuf *j, const k3c_plan_eval *e) {
    const k3c_plan_layout *L = &e->layout;
    k3c_sbuf_printf(j, "{\"tp\":%lld,\"cp\":%lld,\"pp\":%lld,\"ep\":%lld,\"dp\":%lld,\"gpus\":%lld,\"zero\":%d,",
                    (long long)L->tp, (long long)L->cp, (long long)L->pp, (long long)L->ep, (long long)L->dp,
                    (long long)k3c_plan_gpus(L), L->zero);
    jstr(j, "recompute", k3c_plan_recompute_name(L->recompute), 0);
    jstr(j, "optimizer", k3c_plan_optimizer_name(L->optimizer), 0);
    k3c_sbuf_printf(j,
                    "\"micro_batch\":%lld,\"seq\":%lld,\"global_batch_tokens\":%lld,\"micro_batches\":%lld,"
                    "\"fits\":%s,",
                    (long long)L->micro_batch, (long long)L->seq, (long long)L->global_batch_tokens,
                    (long long)e->micro_batches, e->fits ? "true" : "false");
    jkey(j, "memory_bytes");
    k3c_sbuf_printf(j, "{\"stage\":%lld,\"layers\":%lld,\"in_flight\":%lld,", (long long)e->mem.stage,
                    (long long)e->mem.layers, (long long)e->mem.in_flight);
    jnum(j, "weights", e->mem.weights, 0);
    jnum(j, "grads", e->mem.grads, 0);
    jnum(j, "optimizer", e->mem.optimizer, 0);
    jnum(j, "activations", e->mem.activations, 0);
    jnum(j, "working", e->mem.working, 0);
    jnum(j, "total", e->mem.total, 1);
    k3c_sbuf_append(j, "},", 2);
    jkey(j, "comm");
    k3c_sbuf_append(j, "{", 1);
    for (int k = 0; k < K3C_COMM_COUNT; k++) {
        jkey(j, k3c_plan_comm_name(k));
        k3c_sbuf_printf(j, "{\"bytes\":");
        k3c_sbuf_json_number(j, e->comm_kind_bytes[k]);
        k3c_sbuf_printf(j, ",\"seconds\":");
        k3c_sbuf_json_number(j, e->comm_kind_s[k]);
        k3c_sbuf_append(j, k + 1 < K3C_COMM_COUNT ? "}," : "}", k + 1 < K3C_COMM_COUNT ? 2 : 1);
    }
    k3c_sbuf_append(j, "},", 2);
    jnum(j, "step_s", e->step_s, 0);
    jnum(j, "compute_s", e->compute_s, 0);
    jnum(j, "comm_s", e->comm_s, 0);
    jnum(j, "bubble_s", e->bubble_s, 0);
    jnum(j, "comm_share", e->comm_share, 0);
    jnum(j, "bubble_fraction", e->bubble_frac, 0);
    jnum(j, "tokens_per_s", e->tokens_per_s, 0);
    jnum(j, "mfu", e->mfu, 0);
    jnum(j, "model_flops_per_token", e->model_flops_per_token, 1);
    k3c_sbuf_append(j, "}", 1);
}

static void json_serve(k3c_sbuf *j, const k3c_plan_serve_eval *e) {
    const k3c_plan_serve_layout *L = &e->layout;
    k3c_sbuf_printf(j,
                    "{\"tp\":%lld,\"pp\":%lld,\"ep\":%lld,\"dp\":%lld,\"context\":%lld,\"batch\":%lld,"
                    "\"experts\":\"%s\",\"fits\":%s,\"stage\":%d,",
                    (long long)L->tp, (long long)L->pp, (long long)L->ep, (long long)L->dp, (long long)L->context,
                    (long long)L->batch, L->experts_mxfp4 ? "mxfp4" : "bf16", e->fits ? "true" : "false", e->stage);
    jnum(j, "weights", e->weights, 0);
    jnum(j, "kv_cache", e->kv_cache, 0);
    jnum(j, "kda_state", e->kda_state, 0);
    jnum(j, "working", e->working, 0);
    jnum(j, "total", e->total, 0);
    jnum(j, "kv_bytes_per_token", e->kv_bytes_per_token, 0);
    jnum(j, "kda_bytes_per_sequence", e->kda_bytes_per_seq, 0);
    jnum(j, "decode_flops_per_token", e->decode_flops_per_token, 0);
    jnum(j, "decode_step_s", e->step_s, 0);
    jnum(j, "tokens_per_s", e->tokens_per_s, 1);
    k3c_sbuf_append(j, "}", 1);
}

/* ---------------------------------------------------------------- modes */
static void print_serve(const k3c_plan_serve_eval *e, const plan_opts *o) {
    const k3c_plan_serve_layout *L = &e->layout;
    char a[48], b[48];
    printf("serving layout: TP %lld x PP %lld x EP %lld x DP %lld, %s sequences x %s tokens of context, experts %s\n",
           (long long)L->tp, (long long)L->pp, (long long)L->ep, (long long)L->dp, grp((double)L->batch, a),
           grp((double)L->context, b), L->experts_mxfp4 ? "MXFP4" : "BF16");
    printf("  MLA latent cache %s bytes per token; KDA states + conv tails %.4g MB per sequence\n",
           grp(e->kv_bytes_per_token, a), e->kda_bytes_per_seq / 1e6);
    printf("  memory per GPU (stage %d): weights %.2f GB, MLA cache %.2f GB, KDA state %.2f GB, prefill working "
           "%.2f GB, total %.2f GB of %.0f GB: %s\n",
           e->stage, gb(e->weights), gb(e->kv_cache), gb(e->kda_state), gb(e->working), gb(e->total), o->hw.gpu_mem_gb,
           e->fits ? "fits" : "DOES NOT FIT");
    printf("  decode: %.4g FLOPs per token, step %.4g s for the batch, %s tokens/s\n\n", e->decode_flops_per_token,
           e->step_s, grp(e->tokens_per_s, a));
}

static int run_serve(const k3c_config *cfg, const plan_opts *o, k3c_sbuf *j) {
    k3c_err err = {0};
    k3c_plan_serve_layout L = {o->lay.tp,
                               o->lay.pp,
                               o->lay.ep,
                               o->lay.dp,
                               o->context,
                               o->batch,
                               o->lay.experts_mxfp4 >= 0 ? o->lay.experts_mxfp4 : cfg->experts_mxfp4};
    if (!L.context) L.context = cfg->max_positions > 0 ? cfg->max_positions : o->lay.seq;
    k3c_plan_serve_eval best[MAX_TOP];
    int n = 0;
    if (o->explicit_layout || !o->gpus) {
        if (!o->explicit_layout)
            L.tp = L.tp ? L.tp : 1, L.pp = L.pp ? L.pp : 1, L.ep = L.ep ? L.ep : 1, L.dp = L.dp ? L.dp : 1;
        if (k3c_plan_check_serve(cfg, &L, o->gpus, &err) || k3c_plan_serve_evaluate(cfg, &L, &o->hw, &best[0], &err))
            return cli_fail("plan", &err);
        n = 1;
    } else {
        int64_t valid;
        if (k3c_plan_check_grid(cfg, L.tp ? L.tp : 1, L.pp ? L.pp : 1, L.ep ? L.ep : 1, &err) ||
            k3c_plan_serve_search(cfg, o->gpus, &L, &o->hw, best, (int)o->top, &n, &valid, &err))
            return cli_fail("plan", &err);
        if (!n) {
            err.code = K3C_EINVAL;
            snprintf(err.msg, sizeof err.msg, "no serving layout of %lld GPUs fits %.0f GB per GPU (%lld valid)",
                     (long long)o->gpus, o->hw.gpu_mem_gb, (long long)valid);
            return cli_fail("plan", &err);
        }
    }
    if (o->json) {
        jkey(j, "serve");
        k3c_sbuf_append(j, "[", 1);
        for (int i = 0; i < n; i++) json_serve(j, &best[i]), k3c_sbuf_append(j, i + 1 < n ? "," : "", i + 1 < n);
        k3c_sbuf_append(j, "]", 1);
    } else {
        for (int i = 0; i < n; i++) print_serve(&best[i], o);
        if (!best[0].fits)
            fprintf(stderr, "k3c plan: warning: this layout needs %.1f GB per GPU, over %.0f GB\n", gb(best[0].total),
                    o->hw.gpu_mem_gb);
    }
    return 0;
}
/* The layout as the run config's "parallel" block (docs/PARALLEL.md), ready to paste, and its launch line; a layout
 * the trainer does not run yet (k3c_parallel_resolve: a combination not built) says so before anyone launches it. */
static void print_run_block(const k3c_config *cfg, const k3c_plan_layout *L) {
    printf("run config: \"parallel\": {\"dp\": %lld, \"ep\": %lld, \"tp\": %lld, \"pp\": %lld, \"cp\": %lld}\n"
           "launch: mpirun -np %lld k3c train --config RUN.json\n",
           (long long)L->dp, (long long)L->ep, (long long)L->tp, (long long)L->pp, (long long)L->cp,
           (long long)k3c_plan_gpus(L));
    const k3c_parallel p = {L->dp, L->ep, L->tp, L->pp, L->cp, 0};
    k3c_parallel out;
    k3c_err err = {0};
    if (k3c_parallel_resolve(&p, cfg, (int)k3c_plan_gpus(L), "RUN.json", &out, &err))
        printf("note: k3c train does not run this layout yet: %s\n", err.msg);
    printf("\n");
}

static int run_train(const k3c_config *cfg, const plan_opts *o, k3c_sbuf *j) {
    k3c_err err = {0};
    k3c_plan_layout L = o->lay;
    if (L.experts_mxfp4 < 0) L.experts_mxfp4 = 0;
    static k3c_plan_eval best[MAX_TOP];
    int n = 0;
    k3c_plan_search_result r = {best, 0, 0, 0, 0, 0};
    if (o->explicit_layout) {
        if (!L.cp) L.cp = 1;
        if (L.zero < 0) L.zero = 1;
        if (L.recompute < 0) L.recompute = K3C_RC_SELECTIVE;
        if (!L.micro_batch) L.micro_batch = 1;
        if (k3c_plan_check_layout(cfg, &L, o->gpus, &err) || k3c_plan_evaluate(cfg, &L, &o->hw, &best[0], &err))
            return cli_fail("plan", &err);
        n = 1;
    } else {
        k3c_plan_search_opts so = {o->gpus, L, (int)o->top};
        if (k3c_plan_check_grid(cfg, L.tp ? L.tp : 1, L.pp ? L.pp : 1, L.ep ? L.ep : 1, &err) ||
            k3c_plan_search(cfg, &so, &o->hw, &r, &err))
            return cli_fail("plan", &err);
        if (!r.n_best) {
            err.code = K3C_EINVAL;
            if (!r.valid)
                snprintf(err.msg, sizeof err.msg,
                         "no valid layout of %lld GPUs for this model, sequence "
                         "and global batch (%lld tried)",
                         (long long)o->gpus, (long long)r.tried);
            else
                snprintf(err.msg, sizeof err.msg,
                         "none of the %lld valid layouts of %lld GPUs fits %.0f GB per GPU "
                         "(the smallest needs %.1f GB)",
                         (long long)r.valid, (long long)o->gpus, o->hw.gpu_mem_gb, gb(r.min_mem));
            return cli_fail("plan", &err);
        }
        n = r.n_best;
    }
    if (o->json) {
        if (!o->explicit_layout)
            k3c_sbuf_printf(j, "\"search\":{\"gpus\":%lld,\"tried\":%lld,\"valid\":%lld,\"fitting\":%lld},",
                            (long long)o->gpus, (long long)r.tried, (long long)r.valid, (long long)r.fitting);
        jkey(j, "layouts");
        k3c_sbuf_append(j, "[", 1);
        for (int i = 0; i < n; i++) json_eval(j, &best[i]), k3c_sbuf_append(j, ",", i + 1 < n);
        k3c_sbuf_append(j, "]", 1);
    } else {
        if (!o->explicit_layout) {
            char a[48];
            printf("search: %lld GPUs (%lld per node), %s tokens per sequence: %lld layouts tried, %lld valid, %lld "
                   "fit %.0f GB; fastest first\n",
                   (long long)o->gpus, (long long)o->hw.gpus_per_node, grp((double)L.seq, a), (long long)r.tried,
                   (long long)r.valid, (long long)r.fitting, o->hw.gpu_mem_gb);
            print_table(best, n);
            printf("best ");
        }
        print_eval(&best[0], o);
        print_run_block(cfg, &best[0].layout);
        if (!best[0].fits)
            fprintf(stderr, "k3c plan: warning: this layout needs %.1f GB per GPU, over %.0f GB\n",
                    gb(best[0].mem.total), o->hw.gpu_mem_gb);
    }
    return 0;
}

int cmd_plan(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help();
        return 0;
    }
    plan_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    k3c_config cfg;
    k3c_err err = {0};
    k3c_plan_params p;
    k3c_plan_flops f;
    if (k3c_config_load(o.path, &cfg, &err) || k3c_plan_count_params(&cfg, &p, &err) ||
        k3c_plan_flops_train(&cfg, o.lay.seq, &f, &err))
        return cli_fail("plan", &err);
    k3c_sbuf j;
    k3c_sbuf_init(&j);
    k3c_sbuf_append(&j, "{", 1);
    jstr(&j, "config", o.path, 0);
    jstr(&j, "model_type", cfg.model_type, 0);
    json_params(&j, &p);
    json_flops(&j, &f, o.lay.seq);
    if (!o.json) print_params(&cfg, &p), print_flops(&f, o.lay.seq);
    if (!o.json && !o.serve) print_layer_acts(&cfg);
    int64_t gpus = o.explicit_layout ? (o.lay.tp * (o.lay.cp ? o.lay.cp : 1) * o.lay.pp * o.lay.ep * o.lay.dp) : o.gpus;
    if (o.step_time > 0) { /* MFU of a measured step: needs the GPU count and the tokens per step */
        if (!gpus) {
            k3c_sbuf_free(&j);
            return cli_usage_error("plan", "--step-time needs --gpus or a layout");
        }
        double mfu =
            k3c_plan_mfu(f.model_total, (double)o.lay.global_batch_tokens, o.step_time, gpus, o.hw.peak_tflops * 1e12);
        if (o.json)
            jnum(&j, "measured_mfu", mfu, 0);
        else
            printf("measured step %.4g s for %lld tokens on %lld GPUs: MFU %.2f%% (%.4g model FLOPs per token)\n\n",
                   o.step_time, (long long)o.lay.global_batch_tokens, (long long)gpus, 100 * mfu, f.model_total);
    }
    if (o.serve)
        rc = run_serve(&cfg, &o, &j);
    else if (o.explicit_layout || o.gpus)
        rc = run_train(&cfg, &o, &j);
    else
        k3c_sbuf_printf(&j, "\"layouts\":[]");
    if (!rc && o.json) {
        if (j.len && j.buf[j.len - 1] == ',') j.len--;
        k3c_sbuf_append(&j, "}\n", 2);
        if (!j.ok)
            fprintf(stderr, "k3c plan: out of memory\n"), rc = 1;
        else
            fwrite(j.buf, 1, j.len, stdout);
    }
    k3c_sbuf_free(&j);
    return rc;
}
