/* cmd_inspect.c — `k3c inspect <checkpoint dir> [--json]`: the config summary, tensor count, dtype histogram, logical
 * parameter count and a name/shape cross-check against the config's inventory (docs/FORMATS.md §2–6). */
#include "cli.h"
#include "base/json.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOW_WARNINGS 20 /* the text report lists this many; --json lists up to KEEP_WARNINGS */
#define KEEP_WARNINGS 200

static const char *HELP =
    "usage: k3c inspect <checkpoint dir> [--json]\n"
    "\n"
    "Reads <dir>/config.json (kimi_linear or kimi_k3) and the checkpoint (model.safetensors or\n"
    "model.safetensors.index.json + shards) and prints:\n"
    "  - the config summary: model type, layer plan (K = KDA, M = MLA; D = dense FFN, E = MoE), dimensions,\n"
    "    MoE, KDA gate form, AttnRes, quantization, vision tower;\n"
    "  - the tensor count and a dtype histogram (tensors and bytes per dtype);\n"
    "  - the logical parameter count: an MXFP4 *.weight_packed U8 [rows, cols] counts rows x cols x 2 and its\n"
    "    *.weight_scale is not a parameter; router correction biases (*e_score_correction_bias) are reported apart;\n"
    "  - warnings where tensor names or shapes differ from what the config implies (missing, unexpected, wrong "
    "shape).\n"
    "\n"
    "options:\n"
    "  --json      one JSON object instead of text (config in the released spelling, counts, warnings)\n"
    "  -h, --help  this text\n"
    "\n"
    "exit status: 0 when config and checkpoint load (warnings do not fail), 1 on an error, 2 on a usage error.\n";

/* ---------------------------------------------------------------- what the checkpoint holds */

typedef struct {
    int64_t count, bytes;
} dtype_stat;

typedef struct {
    int ntensors;
    dtype_stat dt[K3C_DTYPE_COUNT];
    int64_t params, corr_bias;
    char *warn[KEEP_WARNINGS];
    int nwarn_kept;
    int64_t nwarn;
} report;

static void warnf(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(report *r, const char *fmt, ...) {
    r->nwarn++;
    if (r->nwarn_kept == KEEP_WARNINGS) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    r->warn[r->nwarn_kept] = strdup(buf);
    if (r->warn[r->nwarn_kept]) r->nwarn_kept++;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int64_t numel(const k3c_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Logical parameters: MXFP4 packs two weights per byte and its per-group scales are storage, not parameters. */
static void count_tensors(const k3c_checkpoint *ck, report *r) {
    r->ntensors = k3c_ckpt_count(ck);
    for (int i = 0; i < r->ntensors; i++) {
        const k3c_st_tensor *t = k3c_ckpt_at(ck, i);
        r->dt[t->dtype].count++;
        r->dt[t->dtype].bytes += (int64_t)t->nbytes;
        if (t->dtype == K3C_U8 && ends_with(t->name, ".weight_scale")) continue;
        int64_t n = numel(t) * (t->dtype == K3C_U8 && ends_with(t->name, ".weight_packed") ? 2 : 1);
        r->params += n;
        if (ends_with(t->name, "e_score_correction_bias")) r->corr_bias += n;
    }
}

/* ---------------------------------------------------------------- what the config implies */

typedef struct {
    char *name;
    int ndim, layer, found;
    int64_t shape[4];
} want;

static int cmp_want(const void *a, const void *b) { return strcmp(((const want *)a)->name, ((const want *)b)->name); }

typedef struct {
    want *w;
    size_t n, cap;
    int oom;
} want_set;

static void want_add(want_set *s, const char *name, int layer, int ndim, int64_t d0, int64_t d1, int64_t d2,
                     int64_t d3) {
    if (s->oom) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        want *w = realloc(s->w, cap * sizeof *w);
        if (!w) {
            s->oom = 1;
            return;
        }
        s->w = w;
        s->cap = cap;
    }
    want *w = &s->w[s->n];
    w->name = strdup(name);
    if (!w->name) {
        s->oom = 1;
        return;
    }
    int64_t d[4] = {d0, d1, d2, d3};
    w->ndim = ndim;
    w->layer = layer;
    w->found = 0;
    for (int i = 0; i < 4; i++) w->shape[i] = i < ndim ? d[i] : 0;
    s->n++;
}

enum { CKPT_NAME = 160, NAME_BYTES = CKPT_NAME + 96 }; /* a checkpoint name's bytes at most; with a suffix */

/* The names of one checkpoint tensor: MXFP4 experts become weight_packed [rows, cols/2] + weight_scale
 * [rows, cols/group]. */
typedef struct {
    want_set *s;
    int64_t group, names;
} want_walk;

static int count_names(void *ctx, const char *name, int layer, int ndim, const int64_t *d, int mxfp4) {
    ((want_walk *)ctx)->names += mxfp4 ? 2 : 1;
    return 0;
}

static int add_names(void *ctx, const char *name, int layer, int ndim, const int64_t *d, int mxfp4) {
    want_walk *ww = ctx;
    if (!mxfp4) {
        want_add(ww->s, name, layer, ndim, d[0], d[1], d[2], d[3]);
        return ww->s->oom;
    }
    char buf[NAME_BYTES];
    snprintf(buf, sizeof buf, "%s_packed", name);
    want_add(ww->s, buf, layer, 2, d[0], d[1] / 2, 0, 0);
    snprintf(buf, sizeof buf, "%s_scale", name);
    want_add(ww->s, buf, layer, 2, d[0], d[1] / ww->group, 0, 0);
    return ww->s->oom;
}

/* Expands the model's parameter inventory (k3c_config_tensors) into checkpoint tensor names. */
static int build_wants(const k3c_config *cfg, want_set *s, k3c_err *err) {
    want_walk ww = {s, cfg->mxfp4_group, 0};
    int rc = k3c_config_tensors(cfg, count_names, &ww, NULL, err);
    /* each name a struct and its strdup'd name */
    if (!rc)
        rc = k3c_mem_check((uint64_t)ww.names * (sizeof(want) + 2 * CKPT_NAME), "inspect: the tensor inventory", err);
    if (!rc) rc = k3c_config_tensors(cfg, add_names, &ww, NULL, err);
    if (s->oom) return k3c_errf(err, K3C_ENOMEM, "inspect: out of memory building the tensor inventory");
    if (rc) return rc;
    qsort(s->w, s->n, sizeof *s->w, cmp_want);
    return 0;
}

static void free_wants(want_set *s) {
    for (size_t i = 0; i < s->n; i++) free(s->w[i].name);
    free(s->w);
}

/* transformers saves the dense layer-0 MLP as block_sparse_moe.{gate,up,down}_proj; the release calls it mlp.*
 * (docs/FORMATS.md §5.1): map the former onto the latter before looking it up. */
static const char *canonical_name(const char *name, char *buf, size_t n) {
    static const char *const leaves[] = {"gate_proj.", "up_proj.", "down_proj."};
    const char *at = strstr(name, ".block_sparse_moe.");
    if (!at) return name;
    const char *leaf = at + strlen(".block_sparse_moe.");
    for (int i = 0; i < 3; i++)
        if (strncmp(leaf, leaves[i], strlen(leaves[i])) == 0) {
            snprintf(buf, n, "%.*s.mlp.%s", (int)(at - name), name, leaf);
            return buf;
        }
    return name;
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t p = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && p < n; i++)
        p += (size_t)snprintf(buf + p, n - p, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (p < n) snprintf(buf + p, n - p, "]");
}

static const char *layer_kind(const k3c_config *cfg, int l) {
    static const char *kinds[2][2] = {{"KDA, dense", "KDA, MoE"}, {"MLA, dense", "MLA, MoE"}};
    return kinds[cfg->mixer[l] == K3C_MIXER_MLA][cfg->ffn[l] == K3C_FFN_MOE];
}

/* The mixer a layer's tensors reveal (A_log only in KDA, kv_a_proj_with_mqa only in MLA): -1 when neither or both. */
static int ckpt_mixer(const k3c_config *cfg, const k3c_checkpoint *ck, int l) {
    char name[160];
    snprintf(name, sizeof name, "%smodel.layers.%d.self_attn.A_log", cfg->tensor_prefix, l);
    int kda = k3c_ckpt_find(ck, name) != NULL;
    snprintf(name, sizeof name, "%smodel.layers.%d.self_attn.kv_a_proj_with_mqa.weight", cfg->tensor_prefix, l);
    int mla = k3c_ckpt_find(ck, name) != NULL;
    return kda == mla ? -1 : mla ? K3C_MIXER_MLA : K3C_MIXER_KDA;
}

/* Per layer first (the most telling warning), then per tensor: every checkpoint tensor must be one the config
 * implies, with that shape, and every implied tensor must be present. */
static int cross_check(const k3c_config *cfg, const k3c_checkpoint *ck, report *r, k3c_err *err) {
    static const char *const mixer_name[2] = {"KDA", "MLA"};
    for (int l = 0; l < cfg->num_layers; l++) {
        int m = ckpt_mixer(cfg, ck, l);
        if (m < 0)
            warnf(r, "layer %d: the config says %s but the checkpoint has no clear KDA or MLA tensors", l,
                  mixer_name[cfg->mixer[l]]);
        else if (m != cfg->mixer[l])
            warnf(r, "layer %d: the config says %s but the checkpoint holds %s tensors", l, mixer_name[cfg->mixer[l]],
                  mixer_name[m]);
    }
    want_set s = {0};
    int rc = build_wants(cfg, &s, err);
    if (rc) {
        free_wants(&s);
        return rc;
    }
    char buf[NAME_BYTES], a[160], b[160];
    for (int i = 0; i < r->ntensors; i++) {
        const k3c_st_tensor *t = k3c_ckpt_at(ck, i);
        if (cfg->vision.present &&
            (strncmp(t->name, "vision_tower.", 13) == 0 || strncmp(t->name, "mm_projector.", 13) == 0))
            continue; /* the vision tower's inventory belongs to vision/ */
        want key = {.name = (char *)canonical_name(t->name, buf, sizeof buf)};
        want *w = bsearch(&key, s.w, s.n, sizeof *s.w, cmp_want);
        if (!w) {
            warnf(r, "unexpected tensor %s (not implied by the config)", t->name);
            continue;
        }
        w->found = 1;
        int same = w->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = w->shape[d] == t->shape[d];
        if (!same) {
            shape_str(t->ndim, t->shape, a, sizeof a);
            shape_str(w->ndim, w->shape, b, sizeof b);
            warnf(r, "%s: shape %s but the config implies %s", t->name, a, b);
        }
    }
    for (size_t i = 0; i < s.n; i++) {
        if (s.w[i].found) continue;
        if (s.w[i].layer >= 0)
            warnf(r, "layer %d (%s): missing %s", s.w[i].layer, layer_kind(cfg, s.w[i].layer), s.w[i].name);
        else
            warnf(r, "missing %s", s.w[i].name);
    }
    free_wants(&s);
    return 0;
}

/* ---------------------------------------------------------------- printing */

/* 339828 -> "339,828" */
static const char *commas(int64_t x, char *buf, size_t n) {
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%lld", (long long)(x < 0 ? -x : x)), p = 0;
    if (x < 0 && (size_t)p + 1 < n) buf[p++] = '-';
    for (int i = 0; i < len && (size_t)p + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[p++] = ',';
        buf[p++] = digits[i];
    }
    buf[p] = 0;
    return buf;
}

static void print_config(const k3c_config *c) {
    char plan[K3C_MAX_LAYERS * 2], ffn[K3C_MAX_LAYERS * 2];
    k3c_config_plan_string(c, 0, plan, sizeof plan);
    k3c_config_plan_string(c, 1, ffn, sizeof ffn);
    int nmla = k3c_config_num_mla(c), nmoe = k3c_config_num_moe(c), L = (int)c->num_layers;
    printf("model         %s (tensor prefix \"%s\")\n", c->model_type, c->tensor_prefix);
    printf("layers        %d: %s  (K = KDA, M = MLA)\n", L, plan);
    printf("ffn plan      %s  (D = dense, E = MoE)\n", ffn);
    printf("              %d KDA + %d MLA; %d dense + %d MoE\n", L - nmla, nmla, L - nmoe, nmoe);
    printf("dims          hidden %lld, vocab %lld, dense intermediate %lld, max positions %lld, tied embeddings %s\n",
           (long long)c->hidden_size, (long long)c->vocab_size, (long long)c->intermediate_size,
           (long long)c->max_positions, c->tie_word_embeddings ? "yes" : "no");
    printf("norms         rms_norm_eps %g, MLA q_a/kv_a norm eps %g\n", c->rms_norm_eps, c->mla_norm_eps);
    if (nmla < L) {
        printf("KDA           %lld heads x %lld, conv %lld, gate ", (long long)c->kda_heads, (long long)c->kda_head_dim,
               (long long)c->conv_kernel);
        if (c->kda_gate == K3C_GATE_LOWER_BOUND)
            printf("lower-bound (g_min %g)", c->gate_lower_bound);
        else
            printf("softplus");
        printf(", output gate %s\n", c->kda_full_rank_gate ? "full-rank (g_proj)" : "low-rank (g_a_proj/g_b_proj)");
    }
    if (nmla > 0) {
        printf("MLA           %lld heads, q_lora ", (long long)c->mla_heads);
        if (c->q_lora_rank)
            printf("%lld", (long long)c->q_lora_rank);
        else
            printf("none (q_proj)");
        printf(", kv_lora %lld, qk %lld nope + %lld unrotated, v %lld, output gate %s\n", (long long)c->kv_lora_rank,
               (long long)c->qk_nope_dim, (long long)c->qk_rope_dim, (long long)c->v_head_dim,
               c->mla_output_gate ? "yes" : "no");
    }
    if (c->num_experts > 0) {
        printf("MoE           %lld routed experts, top-%lld, %lld shared, expert width %lld, renormalize %s, "
               "routed scale %g, groups %lld/%lld, first %lld dense, every %lld\n",
               (long long)c->num_experts, (long long)c->top_k, (long long)c->num_shared_experts,
               (long long)c->moe_intermediate_size, c->renormalize ? "yes" : "no", c->routed_scaling_factor,
               (long long)c->topk_group, (long long)c->num_expert_group, (long long)c->first_k_dense,
               (long long)c->moe_layer_freq);
        if (c->latent_dim)
            printf("latent MoE    width %lld, norm %s\n", (long long)c->latent_dim, c->latent_norm ? "yes" : "no");
    } else {
        printf("MoE           none (dense model)\n");
    }
    if (c->act == K3C_ACT_SITU)
        printf("activation    situ (beta %g, linear beta %g)\n", c->situ_beta, c->situ_linear_beta);
    else
        printf("activation    %s\n", c->act == K3C_ACT_GELU ? "gelu" : "silu");
    if (c->attn_res_block)
        printf("AttnRes       block size %lld layers\n", (long long)c->attn_res_block);
    else
        printf("AttnRes       none (plain residuals)\n");
    if (c->experts_mxfp4)
        printf("quantization  routed experts MXFP4 (group %lld)\n", (long long)c->mxfp4_group);
    else
        printf("quantization  none\n");
    if (c->vision.present)
        printf("vision        %lld layers x %lld wide, %lld heads, patch %lld, merge %lldx%lld\n",
               (long long)c->vision.layers, (long long)c->vision.hidden, (long long)c->vision.heads,
               (long long)c->vision.patch_size, (long long)c->vision.merge_kernel[0],
               (long long)c->vision.merge_kernel[1]);
    else
        printf("vision        none\n");
}

static void print_report(const report *r) {
    char a[32], b[32], c[32];
    printf("tensors       %s\n", commas(r->ntensors, a, sizeof a));
    int first = 1;
    for (int t = 0; t < K3C_DTYPE_COUNT; t++) {
        if (!r->dt[t].count) continue;
        printf("%-14s%-5s %s tensors, %s bytes\n", first ? "dtypes" : "", k3c_dtype_name((k3c_dtype)t),
               commas(r->dt[t].count, a, sizeof a), commas(r->dt[t].bytes, b, sizeof b));
        first = 0;
    }
    printf("parameters    %s parameters (%s trainable + %s router correction biases)\n", commas(r->params, a, sizeof a),
           commas(r->params - r->corr_bias, b, sizeof b), commas(r->corr_bias, c, sizeof c));
    if (!r->nwarn) {
        printf("checks        ok: every tensor the config implies is present with its shape, and no other\n");
        return;
    }
    printf("warnings      %lld\n", (long long)r->nwarn);
    for (int i = 0; i < r->nwarn_kept && i < SHOW_WARNINGS; i++) printf("  warning: %s\n", r->warn[i]);
    if (r->nwarn > SHOW_WARNINGS)
        printf("  ... and %lld more (--json lists up to %d)\n", (long long)(r->nwarn - SHOW_WARNINGS), KEEP_WARNINGS);
}

static int print_json(const char *dir, const k3c_config *cfg, const report *r, k3c_err *err) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    char plan[K3C_MAX_LAYERS * 2], ffn[K3C_MAX_LAYERS * 2];
    k3c_config_plan_string(cfg, 0, plan, sizeof plan);
    k3c_config_plan_string(cfg, 1, ffn, sizeof ffn);
    k3c_sbuf_printf(&s, "{\"path\": ");
    k3c_sbuf_json_string(&s, dir, strlen(dir));
    k3c_sbuf_printf(&s,
                    ",\n\"plan\": \"%s\", \"ffn_plan\": \"%s\", \"num_mla\": %d, \"num_moe\": %d,\n\"config\": ", plan,
                    ffn, k3c_config_num_mla(cfg), k3c_config_num_moe(cfg));
    int rc = k3c_config_to_json(cfg, &s, err);
    if (rc) {
        k3c_sbuf_free(&s);
        return rc;
    }
    k3c_sbuf_printf(&s, ",\"tensors\": %d,\n\"dtypes\": {", r->ntensors);
    int first = 1;
    for (int t = 0; t < K3C_DTYPE_COUNT; t++) {
        if (!r->dt[t].count) continue;
        k3c_sbuf_printf(&s, "%s\"%s\": {\"count\": %lld, \"bytes\": %lld}", first ? "" : ", ",
                        k3c_dtype_name((k3c_dtype)t), (long long)r->dt[t].count, (long long)r->dt[t].bytes);
        first = 0;
    }
    k3c_sbuf_printf(&s,
                    "},\n\"parameters\": {\"total\": %lld, \"trainable\": %lld, \"router_correction_biases\": %lld},\n",
                    (long long)r->params, (long long)(r->params - r->corr_bias), (long long)r->corr_bias);
    k3c_sbuf_printf(&s, "\"num_warnings\": %lld, \"warnings\": [", (long long)r->nwarn);
    for (int i = 0; i < r->nwarn_kept; i++) {
        k3c_sbuf_printf(&s, "%s\n  ", i ? "," : "");
        k3c_sbuf_json_string(&s, r->warn[i], strlen(r->warn[i]));
    }
    k3c_sbuf_printf(&s, "]}\n");
    if (!s.ok) {
        k3c_sbuf_free(&s);
        return k3c_errf(err, K3C_ENOMEM, "inspect: out of memory");
    }
    fwrite(s.buf, 1, s.len, stdout);
    k3c_sbuf_free(&s);
    return 0;
}

/* ---------------------------------------------------------------- the command */

int cmd_inspect(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    for (int i = 1; i < argc; i++)
        if (argv[i][0] == '-' && strcmp(argv[i], "--json") != 0)
            return cli_usage_error("inspect", "unknown option %s", argv[i]);
    const char *dir = cli_positional(argc, argv, 0, NULL);
    if (!dir) return cli_usage_error("inspect", "missing <checkpoint dir>");
    if (cli_positional(argc, argv, 1, NULL)) return cli_usage_error("inspect", "one checkpoint dir at a time");
    int json = cli_flag(argc, argv, "--json");

    k3c_err err = {0};
    k3c_config *cfg = malloc(sizeof *cfg);
    k3c_checkpoint *ck = NULL;
    report r;
    memset(&r, 0, sizeof r);
    int rc = cfg ? k3c_config_load(dir, cfg, &err) : k3c_errf(&err, K3C_ENOMEM, "out of memory");
    if (!rc) rc = k3c_ckpt_open(dir, &ck, &err);
    if (!rc) {
        count_tensors(ck, &r);
        rc = cross_check(cfg, ck, &r, &err);
    }
    if (!rc) {
        if (json)
            rc = print_json(dir, cfg, &r, &err);
        else {
            printf("checkpoint    %s\n", dir);
            char sums[4200]; /* k3c_ckpt_open has verified it */
            snprintf(sums, sizeof sums, "%s/" K3C_CHECKSUMS_FILE, dir);
            if (access(sums, F_OK) == 0) printf("checksums     every file matches " K3C_CHECKSUMS_FILE "\n");
            print_config(cfg);
            print_report(&r);
        }
    }
    for (int i = 0; i < r.nwarn_kept; i++) free(r.warn[i]);
    k3c_ckpt_close(ck);
    free(cfg);
    return rc ? cli_fail("inspect", &err) : 0;
}
