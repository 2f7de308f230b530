/* test_plan.c — `k3c plan`: exact parameter totals (K3, the golden tiny models, a hand-built config), FLOPs, memory and
 * communication formulas against hand-computed small cases, layout errors, the K3 search at 4096 GPUs × 1M, the CLI. */
#include "base/json.h"
#include "parallel/pp.h"
#include "model/params.h"
#include "plan/plan.h"
#include "test.h"

/* Exact (integer-valued) doubles are compared exactly; everything else to a relative 1e-12. */
#define CHECK_NEAR(a, b, what)                                                                                         \
    do {                                                                                                               \
        double a_ = (a), b_ = (b);                                                                                     \
        CHECK(fabs(a_ - b_) <= 1e-12 * fabs(b_), "%s = %.17g, expected %.17g", what, a_, b_);                          \
    } while (0)

/* A hand-sized kimi_linear-style model: d 8, vocab 10, layer 0 = KDA + dense MLP, layer 1 = MLA + MoE.
 * KDA 2 heads × 4 (P = 8), conv 4, low-rank output gate; MLA 2 heads, no q_lora, kv_lora 4, nope 2, rope 2, v 2;
 * dense intermediate 6; 4 experts, top-2, 1 shared, moe_intermediate 4, experts on the full width. */
static void tiny_config(k3c_config *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->model_type, "kimi_linear");
    c->vocab_size = 10, c->hidden_size = 8, c->num_layers = 2, c->intermediate_size = 6;
    c->rms_norm_eps = 1e-5, c->max_positions = 64;
    c->mixer[0] = K3C_MIXER_KDA, c->ffn[0] = K3C_FFN_DENSE;
    c->mixer[1] = K3C_MIXER_MLA, c->ffn[1] = K3C_FFN_MOE;
    c->kda_heads = 2, c->kda_head_dim = 4, c->conv_kernel = 4;
    c->mla_heads = 2, c->mla_kv_heads = 2, c->kv_lora_rank = 4, c->qk_nope_dim = 2, c->qk_rope_dim = 2;
    c->v_head_dim = 2;
    c->num_experts = 4, c->top_k = 2, c->num_shared_experts = 1, c->moe_intermediate_size = 4;
    c->first_k_dense = 1, c->moe_layer_freq = 1, c->renormalize = 1, c->routed_scaling_factor = 1;
}

static void test_tiny_params(void) {
    k3c_config c;
    tiny_config(&c);
    k3c_plan_params p;
    k3c_err err = {0};
    CHECK_OK(k3c_plan_count_params(&c, &p, &err), &err);
    /* global: embed 10·8 = 80, lm_head 80, final norm 8 */
    CHECK(p.total[K3C_PC_EMBED] == 80 && p.total[K3C_PC_LM_HEAD] == 80, "embed/lm_head");
    /* KDA: q,k,v 3·8·8 = 192; convs 3·8·4 = 96; f_a 4·8 = 32; f_b 8·4 = 32; b 2·8 = 16; A_log [1,1,2,1] = 2;
     * dt_bias 8; o_norm 4; g_a 4·8 = 32; g_b 8·4 = 32; o_proj 8·8 = 64 → 510 */
    CHECK(p.total[K3C_PC_KDA] == 510, "kda %lld", (long long)p.total[K3C_PC_KDA]);
    /* MLA: q_proj 2·4·8 = 64; kv_a 6·8 = 48; kv_a_layernorm 4; kv_b 2·4·4 = 32; o_proj 8·4 = 32 → 180 */
    CHECK(p.total[K3C_PC_MLA] == 180, "mla %lld", (long long)p.total[K3C_PC_MLA]);
    CHECK(p.total[K3C_PC_DENSE] == 3 * 6 * 8, "dense");
    CHECK(p.total[K3C_PC_ROUTER] == 4 * 8 + 4, "router weight + correction bias");
    CHECK(p.total[K3C_PC_SHARED] == 3 * 4 * 8 && p.total[K3C_PC_ROUTED] == 4 * 3 * 8 * 4, "experts");
    CHECK(p.total[K3C_PC_NORM] == 2 * 8 * 2 + 8, "norms");
    /* 168 + (16 + 510 + 144) + (16 + 180 + 36 + 96 + 384) = 1550 */
    CHECK(p.total_all == 1550, "total %lld", (long long)p.total_all);
    /* active: no embedding lookup, 2 of 4 experts (192 of 384) */
    CHECK(p.active_all == 1550 - 80 - 192, "active %lld", (long long)p.active_all);
    CHECK(p.frozen == 4 && p.trainable == 1546, "trainable");
    /* tensors: 3 global; layer 0: 2 norms + 15 KDA + 3 dense; layer 1: 2 + 5 MLA + 2 router + 3 shared + 12 experts */
    CHECK(p.tensors == 47, "tensors %lld", (long long)p.tensors);
    /* the same model stored the K3 way: A_log padded to head_dim (4 instead of 2), full-rank gate 8·8 = 64 */
    strcpy(c.model_type, "kimi_k3");
    c.kda_full_rank_gate = 1;
    CHECK_OK(k3c_plan_count_params(&c, &p, &err), &err);
    CHECK(p.total[K3C_PC_KDA] == 510 + 2 /* A_log padding */ - 64 /* g_a, g_b */ + 64 /* g_proj */, "k3 kda %lld",
          (long long)p.total[K3C_PC_KDA]);
}

static void test_k3_params(void) {
    k3c_config c;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_k3_config.json"), &c, &err), &err);
    k3c_plan_params p;
    CHECK_OK(k3c_plan_count_params(&c, &p, &err), &err);
    CHECK(p.total_all == 2779931837184LL, "K3 total %lld", (long long)p.total_all);
    CHECK(p.text_total == 2779484478208LL, "K3 text %lld", (long long)p.text_total);
    CHECK(p.vision_total == 447358976LL, "K3 vision + projector %lld", (long long)p.vision_total);
    CHECK(p.active_all == 104189614848LL, "K3 active %lld", (long long)p.active_all);
    /* docs/FORMATS.md §1.1 (Hub API): U8 = the logical routed weights = 92 × 896 × 33,030,144; F32; BF16; tensors */
    CHECK(p.total[K3C_PC_ROUTED] == 2722740830208LL && p.mxfp4 == 2722740830208LL, "routed");
    CHECK(p.active[K3C_PC_ROUTED] == 92LL * 16 * 33030144, "active routed");
    CHECK(p.f32 == 11122432 && p.bf16 == 57179884544LL, "dtypes f32 %lld bf16 %lld", (long long)p.f32,
          (long long)p.bf16);
    CHECK(p.tensors == 497220, "tensors %lld", (long long)p.tensors);
    CHECK(p.frozen == 92 * 896, "router biases");
    /* tensor bytes: BF16 × 2 + F32 × 4 + MXFP4 × (0.5 + 1/32) */
    CHECK(p.ckpt_bytes == 1560860324864.0, "bytes %.0f", p.ckpt_bytes);
}

/* The golden checkpoints' own tensors: sum of element counts (MXFP4: 2 per packed byte, scales excluded). */
static void file_totals(const char *path, int64_t *numel, int64_t *tensors) {
    k3c_safetensors *st = NULL;
    k3c_err err = {0};
    *numel = *tensors = 0;
    CHECK_OK(k3c_st_open(path, &st, &err), &err);
    if (!st) return;
    for (int i = 0; i < k3c_st_count(st); i++) {
        const k3c_st_tensor *t = k3c_st_at(st, i);
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        size_t len = strlen(t->name);
        if (len > 12 && strcmp(t->name + len - 12, "weight_scale") == 0)
            n = 0;
        else if (len > 13 && strcmp(t->name + len - 13, "weight_packed") == 0)
            n *= 2;
        *numel += n;
        ++*tensors;
    }
    k3c_st_close(st);
}

static void test_golden_params(void) {
    k3c_config c;
    k3c_err err = {0};
    k3c_plan_params p;
    int64_t numel, tensors;
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_linear_tiny_a/config.json"), &c, &err), &err);
    CHECK_OK(k3c_plan_count_params(&c, &p, &err), &err);
    CHECK(p.total_all == 339828 && p.trainable == 339804 && p.frozen == 24, "tiny: %lld stored %lld trainable",
          (long long)p.total_all, (long long)p.trainable);
    file_totals(test_shared("golden/kimi_linear_tiny_a/model.safetensors"), &numel, &tensors);
    CHECK(numel == p.total_all && tensors == p.tensors, "tiny file %lld / %lld tensors", (long long)numel,
          (long long)tensors);
    CHECK_OK(k3c_config_load(test_shared("golden/k3_tiny_a/config.json"), &c, &err), &err);
    CHECK_OK(k3c_plan_count_params(&c, &p, &err), &err);
    file_totals(test_shared("golden/k3_tiny_a/model.safetensors"), &numel, &tensors);
    CHECK(numel == p.total_all && tensors == p.tensors && p.total_all == 5507776,
          "k3 tiny: %lld counted, %lld in the file; %lld / %lld tensors", (long long)p.total_all, (long long)numel,
          (long long)p.tensors, (long long)tensors);
}

static void test_flops(void) {
    k3c_config c;
    tiny_config(&c);
    k3c_plan_flops f;
    k3c_err err = {0};
    CHECK_OK(k3c_plan_flops_train(&c, 7, &f, &err), &err); /* causal, 7 tokens: 4 keys per query on average */
    /* KDA: 2·(192 + 32 + 32 + 16 + 32 + 32 + 64) = 800; conv 2·4·3·8 = 192; core 2 heads · (6·16 + 3·64·4 + 64²) */
    CHECK_NEAR(f.kda_core, 2 * (6 * 16 + 3 * 64 * 4 + 64 * 64), "kda core");
    CHECK_NEAR(f.fwd[K3C_PC_KDA], 800 + 192 + 9920, "kda");
    /* MLA: 2·(64 + 48 + 32 + 32) = 352; scores + values 2·2·(4 + 2)·4 = 96 */
    CHECK_NEAR(f.mla_core, 96, "mla core");
    CHECK_NEAR(f.fwd[K3C_PC_MLA], 352 + 96, "mla");
    CHECK_NEAR(f.fwd[K3C_PC_DENSE], 288, "dense");
    CHECK_NEAR(f.fwd[K3C_PC_ROUTER], 64, "router");
    CHECK_NEAR(f.fwd[K3C_PC_SHARED], 192, "shared");
    CHECK_NEAR(f.fwd[K3C_PC_ROUTED], 2 * 384 * 2 / 4, "routed (2 of 4)");
    CHECK_NEAR(f.fwd[K3C_PC_LM_HEAD], 160, "lm_head");
    CHECK_NEAR(f.fwd[K3C_PC_EMBED], 0, "embedding lookup");
    CHECK_NEAR(f.fwd_total, 12448, "forward");
    CHECK_NEAR(f.model_total, 3 * 12448, "training");
    /* decode at context 5: absorbed MLA 2·2·(2·4 + 2)·5 = 200, KDA step 2 heads · 7·4·4 = 224 */
    CHECK_NEAR(k3c_plan_flops_decode(&c, 5), 12448 - 96 + 200 - 9920 + 224, "decode");
    /* K3 at 1M: MLA scores/values 24 layers · 2·96·(192 + 128)·(2^20 + 1)/2 */
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_k3_config.json"), &c, &err), &err);
    CHECK_OK(k3c_plan_flops_train(&c, 1 << 20, &f, &err), &err);
    CHECK_NEAR(f.mla_core, 24.0 * 96 * 320 * (double)((1 << 20) + 1), "K3 mla core");
    CHECK_NEAR(f.kda_core, 69.0 * 96 * (6 * 128 * 128 + 3 * 64 * 128 + 64 * 64), "K3 kda core");
    /* Every matmul weight is used twice per token; the rest is attention, conv and AttnRes */
    k3c_plan_params p;
    CHECK_OK(k3c_plan_count_params(&c, &p, &err), &err);
    double vectors = 0; /* active non-matrix parameters: norms, vectors, convs, router bias */
    for (int l = 0; l < c.num_layers; l++) {
        k3c_plan_count lc;
        k3c_plan_layer_count(&c, l, &lc);
        for (int k = 0; k < K3C_PC_COUNT; k++)
            vectors += (double)(lc.n[k] - lc.matrix[k]) * (k == K3C_PC_ROUTED ? 16.0 / 896 : 1);
    }
    vectors += 7168 * 3; /* final norm, output AttnRes norm and query */
    double conv = 69.0 * 2 * 4 * 3 * 12288;
    CHECK_NEAR(f.fwd_total - f.mla_core - f.kda_core - conv - f.fwd[K3C_PC_ATTNRES],
               2 * ((double)p.active_all - vectors), "2 × active matmul weights");
    /* AttnRes: 8 completed blocks before the output mix (9 sources), 1 before layers 1..12 */
    CHECK(k3c_plan_attnres_sources(&c, 93) == 8 && k3c_plan_attnres_sources(&c, 12) == 1 &&
              k3c_plan_attnres_sources(&c, 13) == 2 && k3c_plan_attnres_sources(&c, 0) == 0,
          "attnres sources");
    CHECK_NEAR(k3c_plan_mfu(1e12, 1e6, 2.0, 1000, 1e15), 0.5, "mfu");
    CHECK_NEAR(k3c_plan_bubble(8, 64), 7.0 / 71, "bubble");
}

static void test_memory(void) {
    k3c_config c;
    tiny_config(&c);
    k3c_err err = {0};
    k3c_plan_layout L;
    k3c_plan_layout_default(&L);
    L.seq = 8, L.global_batch_tokens = 8, L.zero = 0, L.recompute = K3C_RC_FULL;
    k3c_plan_memory m;
    /* activation bytes per token (bf16 = 2, fp32 = 4), layer 0 = KDA + dense:
     * sublayers keep 2·(8·2 + 4) = 40, drop 2·8·2 = 32; KDA keeps 48 + 16 + 8 + 16 + 8 + 512 (A_qk, (I+L)⁻¹: 2·2·64·2)
     * + 16 + 8 + 16 + 8 (g_a) = 656, drops 48 + 32 + 16 = 96; dense keeps 24, drops 12 */
    CHECK_NEAR(k3c_plan_layer_act_bytes(&c, 0, K3C_RC_NONE), 860, "act none layer 0");
    CHECK_NEAR(k3c_plan_layer_act_bytes(&c, 0, K3C_RC_SELECTIVE), 720, "act selective layer 0");
    CHECK_NEAR(k3c_plan_layer_act_bytes(&c, 0, K3C_RC_FULL), 16, "act full");
    /* layer 1 = MLA + MoE: 72 common; MLA keeps 16 + 12 + 12 + 16 + 8 = 64, drops 8; MoE keeps 16 (scores) + 64
     * (2 × dispatched 2·8) + 32 (expert gate/up) + 16 (shared gate/up) = 128, drops 16 + 8 = 24 */
    CHECK_NEAR(k3c_plan_layer_act_bytes(&c, 1, K3C_RC_NONE), 296, "act none layer 1");
    CHECK_OK(k3c_plan_memory_train(&c, &L, &m, &err), &err);
    /* one GPU: weights 2·1550, fp32 grads 4·1546, AdamW 12·1546; stash 2 layers · 16 B · 8 tokens; working: the
     * recomputed layer 0 (8·860) + its chunk states (8·1) + fp32 dh (8·8·4) + bf16 logits (8·10·2) */
    CHECK_NEAR(m.weights, 3100, "weights");
    CHECK_NEAR(m.grads, 6184, "grads");
    CHECK_NEAR(m.optimizer, 18552, "optimizer");
    CHECK_NEAR(m.activations, 256, "activations");
    CHECK_NEAR(m.working, 6888 + 256 + 160, "working");
    CHECK_NEAR(m.total, 35396, "total");
    /* recomputed in slices of 2 tokens: the recomputed layer's activations and chunk states of 2 tokens */
    L.recompute_slice = 2;
    CHECK_OK(k3c_plan_memory_train(&c, &L, &m, &err), &err);
    CHECK_NEAR(m.working, 2 * 860 + 2 + 256 + 160, "working sliced");
    L.recompute = K3C_RC_SELECTIVE;
    CHECK(k3c_plan_memory_train(&c, &L, &m, &err) == K3C_EINVAL && strstr(err.msg, "recompute slice 2"),
          "a slice without full recompute: %s", err.msg);
    L.recompute = K3C_RC_FULL, L.recompute_slice = 0;
    /* the head in chunks of 3 tokens: the logits of 3 tokens (3·10·2) */
    L.head_chunk = 3;
    CHECK_OK(k3c_plan_memory_train(&c, &L, &m, &err), &err);
    CHECK_NEAR(m.working, 6888 + 256 + 60, "working, head in chunks");
    L.head_chunk = -1;
    CHECK(k3c_plan_memory_train(&c, &L, &m, &err) == K3C_EINVAL && strstr(err.msg, "head chunk -1"),
          "a negative head chunk: %s", err.msg);
    L.head_chunk = 0;
    /* TP 2 × EP 2 × DP 2, ZeRO-1, Muon, bf16 grads, selective, 4 tokens per GPU */
    L.tp = 2, L.ep = 2, L.dp = 2, L.zero = 1, L.optimizer = K3C_OPT_MUON, L.grad_bytes = 2;
    L.recompute = K3C_RC_SELECTIVE, L.global_batch_tokens = 32;
    CHECK_OK(k3c_plan_memory_train(&c, &L, &m, &err), &err);
    /* per GPU, as k3c train splits it (src/model/tp_split.c): of the 1090 mixer and MLP parameters the 120 of the
       latent projections and the mixers' shared tensors (f_a, o_norm, q_a, kv_a and their norms) whole, the other
       970 halved: 485 + 120 + replicated norms 40 + router 36 = 681; experts 384/2 = 192 */
    CHECK_NEAR(m.weights, 2 * 681 + 2 * 192, "weights tp/ep");
    CHECK_NEAR(m.grads, 2 * (677 + 192), "grads");
    /* Muon: matrices ((816 − 112)/2 + 112 whole + router 32 = 496) 8 B, other trainable 181 × 12 B, experts 192 × 8 B;
       ZeRO-1 over 4 */
    CHECK_NEAR(m.optimizer, (496 * 8 + 181 * 12) / 4.0 + 192 * 8 / 4.0, "optimizer muon zero1");
    CHECK_NEAR(m.activations, 4 * (720 + 232), "activations selective");
    /* MLA: the sequence's latent 8·6·2 (no CP: no remote k, v blocks); dh 4·8·4; logits 4·10·2 */
    CHECK_NEAR(m.working, 96 + 128 + 80, "working");
    CHECK_NEAR(m.total, 1746 + 1738 + 1919 + 3808 + 304, "total tp/ep");
    /* CP 2 (DP 1): 2 tokens per GPU; MLA adds two remote blocks of k, v: 2·(8/2)·(2 heads/2)·6·2 = 96 */
    L.cp = 2, L.dp = 1, L.global_batch_tokens = 16;
    CHECK_OK(k3c_plan_memory_train(&c, &L, &m, &err), &err);
    CHECK_NEAR(m.working, 96 + 96 + 2 * 8 * 4 + 2 * 10 * 2, "working cp");
    CHECK_NEAR(m.activations, 2 * (720 + 232), "activations cp");
    L.cp = 1, L.dp = 2, L.global_batch_tokens = 32;
    /* ZeRO-3 shards weights too; its gather buffer holds the two largest layers' weights */
    L.zero = 3;
    CHECK_OK(k3c_plan_memory_train(&c, &L, &m, &err), &err);
    CHECK_NEAR(m.weights, 2 * 681 / 4.0 + 2 * 192 / 4.0, "zero3 weights");
    CHECK_NEAR(m.grads, 2 * 677 / 4.0 + 2 * 192 / 4.0, "zero3 grads");
    CHECK_NEAR(k3c_plan_opt_bytes(K3C_OPT_ADAMW, 1), 12, "adamw");
    CHECK_NEAR(k3c_plan_opt_bytes(K3C_OPT_MUON, 1), 8, "muon");
}

static void test_comm(void) {
    k3c_plan_hw hw;
    k3c_plan_hw_default(&hw);
    /* 1 GB over 16 ranks, 8 per node: NVLink phase 7/8 GB at 900 GB/s, then 1/2 of 1/8 GB over 50 GB/s */
    CHECK_NEAR(k3c_plan_allgather_s(1e9, 16, 8, &hw), 7.0 / 8 * 1e9 / 9e11 + 0.5 * 1.25e8 / 5e10, "allgather");
    CHECK_NEAR(k3c_plan_allreduce_s(1e9, 16, 8, &hw), 2 * k3c_plan_allgather_s(1e9, 16, 8, &hw), "allreduce");
    /* all-to-all: 8/16 of the data leaves the node at 50 GB/s (slower than the 7/16 on NVLink) */
    CHECK_NEAR(k3c_plan_alltoall_s(1e9, 16, 8, &hw), 1e9 * 8 / 16 / 5e10, "alltoall");
    CHECK_NEAR(k3c_plan_allgather_s(1e9, 1, 1, &hw), 0, "one rank");
    k3c_plan_layout L;
    k3c_plan_layout_default(&L);
    L.tp = 8, L.ep = 64, L.cp = 8;
    CHECK(k3c_plan_ranks_per_node(&L, K3C_AX_TP, 8) == 8 && k3c_plan_ranks_per_node(&L, K3C_AX_EP, 8) == 1 &&
              k3c_plan_ranks_per_node(&L, K3C_AX_TP | K3C_AX_CP | K3C_AX_DP, 8) == 8,
          "ranks per node, TP 8");
    L.tp = 2, L.ep = 8;
    CHECK(k3c_plan_ranks_per_node(&L, K3C_AX_EP, 8) == 4 && k3c_plan_ranks_per_node(&L, K3C_AX_CP, 8) == 1,
          "ranks per node, TP 2");

    /* the tiny model on TP 2 × EP 2 × DP 2 inside one node: every byte moves at 900 GB/s */
    k3c_config c;
    tiny_config(&c);
    k3c_err err = {0};
    k3c_plan_layout_default(&L);
    L.seq = 8, L.tp = 2, L.ep = 2, L.dp = 2, L.zero = 1, L.optimizer = K3C_OPT_MUON, L.grad_bytes = 2;
    L.global_batch_tokens = 32;
    k3c_plan_model m;
    CHECK_OK(k3c_plan_model_init(&m, &c, L.seq, &err), &err);
    k3c_plan_comm cm;
    k3c_plan_stage_comm(&m, &L, &hw, 0, &cm);
    /* TP: 2 layers × 2 sublayers × (gather + scatter) × (fwd + bwd) of 8·8·2 B, half sent */
    CHECK_NEAR(cm.mb_bytes[K3C_COMM_TP], 16 * 64, "tp bytes");
    CHECK_NEAR(cm.mb_seconds[K3C_COMM_TP], 16 * 64 / 9e11, "tp time");
    /* EP: one MoE layer, dispatch + combine, fwd + bwd, 4 tokens · top-2 · 8 · 2 B, half leaves the GPU */
    CHECK_NEAR(cm.mb_bytes[K3C_COMM_EP], 4 * 64, "ep bytes");
    CHECK_NEAR(cm.mb_bytes[K3C_COMM_CP] + cm.mb_bytes[K3C_COMM_PP], 0, "no cp / pp");
    /* DP, ZeRO-1, once per step: reduce-scatter bf16 grads (677 + 192) and all-gather bf16 weights (681 + 192),
     * both groups of 4, 3/4 sent */
    CHECK_NEAR(cm.step_bytes[K3C_COMM_DP], 0.75 * (2 * 677 + 2 * 192 + 2 * 681 + 2 * 192), "dp bytes");
    CHECK_NEAR(cm.step_seconds[K3C_COMM_DP], cm.step_bytes[K3C_COMM_DP] / 9e11, "dp time");
    /* PP 2: stage 0 sends its output rows forward, 4 tokens · 8 · 2 B */
    L.pp = 2, L.dp = 1;
    k3c_plan_stage_comm(&m, &L, &hw, 0, &cm);
    CHECK_NEAR(cm.mb_bytes[K3C_COMM_PP], 64, "pp bytes");
    k3c_plan_model_free(&m);
}

static void test_layout_errors(void) {
    k3c_config c;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_k3_config.json"), &c, &err), &err);
    k3c_plan_layout L;
    k3c_plan_layout_default(&L);
    L.tp = 5;
    CHECK(k3c_plan_check_layout(&c, &L, 0, &err) == K3C_EINVAL && strstr(err.msg, "96 KDA heads"), "%s", err.msg);
    L.tp = 8, L.ep = 3;
    CHECK(k3c_plan_check_layout(&c, &L, 0, &err) == K3C_EINVAL && strstr(err.msg, "896 routed experts"), "%s", err.msg);
    L.ep = 8, L.pp = 94;
    CHECK(k3c_plan_check_layout(&c, &L, 0, &err) == K3C_EINVAL && strstr(err.msg, "93 decoder layers"), "%s", err.msg);
    L.pp = 4;
    CHECK(k3c_plan_check_layout(&c, &L, 1000, &err) == K3C_EINVAL && strstr(err.msg, "not the 1000 GPUs"), "%s",
          err.msg);
    CHECK_OK(k3c_plan_check_layout(&c, &L, 256, &err), &err);
    L.seq = 4100; /* not a multiple of TP = 8 */
    CHECK(k3c_plan_check_layout(&c, &L, 0, &err) == K3C_EINVAL && strstr(err.msg, "TP×CP"), "%s", err.msg);
    L.seq = 4096, L.dp = 3;
    CHECK(k3c_plan_check_layout(&c, &L, 0, &err) == K3C_EINVAL && strstr(err.msg, "global batch"), "%s", err.msg);
    /* 93 = 24 + 23 + 23 + 23: larger stages first */
    int64_t f, n;
    k3c_plan_stage_layers(93, 4, 0, &f, &n);
    CHECK(f == 0 && n == 24, "stage 0");
    k3c_plan_stage_layers(93, 4, 3, &f, &n);
    CHECK(f == 70 && n == 23, "stage 3");
    k3c_config bad = c;
    bad.hidden_size = 0;
    CHECK(k3c_plan_check_layout(&bad, &L, 0, &err) == K3C_ECONFIG && strstr(err.msg, "hidden_size"), "%s", err.msg);
}

static void test_search_k3(void) {
    k3c_config c;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_k3_config.json"), &c, &err), &err);
    k3c_plan_hw hw;
    k3c_plan_hw_default(&hw);
    k3c_plan_search_opts o = {4096, {0}, 5};
    k3c_plan_layout_default(&o.fixed);
    o.fixed.tp = o.fixed.cp = o.fixed.pp = o.fixed.ep = o.fixed.dp = o.fixed.micro_batch = 0;
    o.fixed.zero = o.fixed.recompute = -1;
    o.fixed.seq = 1 << 20;
    k3c_plan_eval best[5];
    k3c_plan_search_result r = {best, 0, 0, 0, 0, 0};
    CHECK_OK(k3c_plan_search(&c, &o, &hw, &r, &err), &err);
    CHECK(r.n_best == 5 && r.fitting >= 5, "found %d fitting layouts", r.n_best);
    for (int i = 0; i < r.n_best; i++) {
        CHECK(best[i].fits && best[i].mem.total <= 141e9 && k3c_plan_gpus(&best[i].layout) == 4096, "layout %d", i);
        CHECK(i == 0 || best[i].step_s >= best[i - 1].step_s, "ranked by step time");
    }
    /* the search's numbers are those of a direct evaluation */
    k3c_plan_eval e;
    CHECK_OK(k3c_plan_evaluate(&c, &best[0].layout, &hw, &e, &err), &err);
    CHECK_NEAR(e.step_s, best[0].step_s, "step");
    CHECK_NEAR(e.mem.total, best[0].mem.total, "memory");
    CHECK(e.step_s > 0 && e.comm_share > 0 && e.comm_share < 1 && e.mfu > 0 && e.mfu < 1, "sane estimate");
    CHECK_NEAR(e.compute_s + e.comm_s + e.bubble_s, e.step_s, "step decomposition");
    /* 8 GPUs cannot hold 2.78T parameters */
    o.gpus = 8;
    CHECK_OK(k3c_plan_search(&c, &o, &hw, &r, &err), &err);
    CHECK(r.n_best == 0 && r.valid > 0 && r.min_mem > 141e9, "nothing fits on 8 GPUs");
}

static void test_serve(void) {
    k3c_config c;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load(test_shared("golden/kimi_k3_config.json"), &c, &err), &err);
    k3c_plan_hw hw;
    k3c_plan_hw_default(&hw);
    k3c_plan_serve_layout L = {8, 1, 8, 1, 1 << 20, 1, 1};
    k3c_plan_serve_eval e;
    CHECK_OK(k3c_plan_serve_evaluate(&c, &L, &hw, &e, &err), &err);
    /* docs/MODEL.md §2.2: 24 MLA layers × 576 × 2 B per token; 69 × (6 MiB state + 3·12288·3 bf16 conv tails) */
    CHECK_NEAR(e.kv_bytes_per_token, 27648, "latent cache per token");
    CHECK_NEAR(e.kda_bytes_per_seq, 69.0 * (96 * 128 * 128 * 4 + 3 * 12288 * 3 * 2), "kda state per sequence");
    CHECK_NEAR(e.kv_cache, 27648.0 * (1 << 20), "one 1M sequence's cache on every GPU of its TP group");
    L.tp = 5;
    CHECK(k3c_plan_check_serve(&c, &L, 0, &err) == K3C_EINVAL, "serve tp 5");
}

/* Runs the CLI; returns its exit code and its stdout + stderr in out. */
static int run_cli(const char *args, char *out, size_t n) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s plan %s 2>&1", test_k3c_bin(), args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t len = fread(out, 1, n - 1, p);
    out[len] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void) {
    static char out[1 << 16];
    char args[2048];
    const char *k3 = test_shared("golden/kimi_k3_config.json");
    snprintf(args, sizeof args, "%s --gpus 4096 --seq 1048576", k3);
    CHECK(run_cli(args, out, sizeof out) == 0, "search exit: %s", out);
    CHECK(strstr(out, "2,779,931,837,184") && strstr(out, "104,189,614,848") && strstr(out, "447,358,976"),
          "totals printed");
    CHECK(strstr(out, "best layout") && strstr(out, ": fits") && strstr(out, "step time estimate") &&
              strstr(out, "communication"),
          "best layout report");
    /* the recommended block, which the trainer runs: at 512 GPUs ep16 × pp32 (93 layers: stages of 3 and 2), at
       2048 ep8 × tp2 × pp32 × cp4 */
    snprintf(args, sizeof args, "%s --gpus 512", k3);
    CHECK(run_cli(args, out, sizeof out) == 0 &&
              strstr(out, "run config: \"parallel\": {\"dp\": 1, \"ep\": 16, \"tp\": 1, \"pp\": 32, \"cp\": 1}") &&
              !strstr(out, "does not run this layout"),
          "512 GPUs: %s", out);
    snprintf(args, sizeof args, "%s --gpus 2048", k3);
    CHECK(run_cli(args, out, sizeof out) == 0 &&
              strstr(out, "run config: \"parallel\": {\"dp\": 1, \"ep\": 8, \"tp\": 2, \"pp\": 32, \"cp\": 4}") &&
              !strstr(out, "does not run this layout"),
          "2048 GPUs: %s", out);
    snprintf(args, sizeof args, "%s --gpus 4096 --seq 1048576 --json --top 3", k3);
    CHECK(run_cli(args, out, sizeof out) == 0, "json exit");
    k3c_json *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse(out, strlen(out), "plan --json", &j, &err), &err);
    if (j) {
        const k3c_json *p = k3c_json_get(j, "params"), *ls = k3c_json_get(j, "layouts");
        CHECK(p && k3c_json_get(p, "total") && k3c_json_get(p, "total")->integer == 2779931837184LL, "json total");
        CHECK(p && k3c_json_get(p, "active") && k3c_json_get(p, "active")->integer == 104189614848LL, "json active");
        CHECK(ls && ls->type == K3C_JSON_ARRAY && ls->n == 3, "three layouts");
        if (ls && ls->n) {
            const k3c_json *m = k3c_json_get(&ls->items[0], "memory_bytes");
            CHECK(m && k3c_json_get(m, "total")->number <= 141e9, "json memory");
            CHECK(k3c_json_get(&ls->items[0], "fits")->boolean, "json fits");
        }
        k3c_json_free(j);
    }
    static const char *const bad[][2] = {
        {"--tp 5 --pp 1 --ep 1 --dp 1", "96 KDA heads"},
        {"--tp 8 --pp 2 --ep 3 --dp 1", "896 routed experts"},
        {"--tp 8 --pp 100 --ep 1 --dp 1", "93 decoder layers"},
        {"--tp 8 --pp 4 --ep 8 --dp 2 --gpus 1000", "not the 1000 GPUs"},
        {"--gpus 8 --seq 1048576", "none of the"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "%s %s", k3, bad[i][0]);
        CHECK(run_cli(args, out, sizeof out) == 1 && strstr(out, bad[i][1]), "'%s': %s", bad[i][0], out);
    }
    CHECK(run_cli("/nonexistent/config.json", out, sizeof out) == 1 && strstr(out, "error"), "missing config");
    snprintf(args, sizeof args, "%s --frobnicate", k3);
    CHECK(run_cli(args, out, sizeof out) == 2 && strstr(out, "--frobnicate"), "unknown option");
    CHECK(run_cli("--help", out, sizeof out) == 0, "help");
    static const char *const flags[] = {"--gpus",
                                        "--seq",
                                        "--tp",
                                        "--cp",
                                        "--pp",
                                        "--ep",
                                        "--dp",
                                        "--zero",
                                        "--recompute",
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
                                        "--serve",
                                        "--context",
                                        "--batch",
                                        "--top",
                                        "--json"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) CHECK(strstr(out, flags[i]), "help lists %s", flags[i]);
    /* measured step time → MFU; the tiny model through its directory */
    snprintf(args, sizeof args, "%s --tp 8 --pp 16 --ep 32 --dp 1 --seq 8192 --step-time 60", k3);
    CHECK(run_cli(args, out, sizeof out) == 0 && strstr(out, "MFU") && strstr(out, "measured step"), "%s", out);
    snprintf(args, sizeof args, "%s --serve --tp 8 --pp 2 --ep 8 --dp 1 --context 1048576 --batch 4", k3);
    CHECK(run_cli(args, out, sizeof out) == 0 && strstr(out, "27,648 bytes per token"), "serve: %s", out);
    snprintf(args, sizeof args, "%s", test_shared("golden/kimi_linear_tiny_a"));
    CHECK(run_cli(args, out, sizeof out) == 0 && strstr(out, "339,828") && strstr(out, "339,804"), "tiny: %s", out);
}

/* The memory model's EP, TP and PP splits against what the trainer allocates: an EP rank's parameter table (its
 * residency, k3c_params_build_resident) holds the plan's per-GPU routed-expert parameters, ex / ep, and every other
 * parameter; a TP rank's table (its shares, the replicated tensors whole) the plan's per-GPU parameters; a
 * pipeline stage's table the plan's parameters of that stage (its layers, the embedding on the first, the head on the
 * last);
 * ZeRO-1 shards the experts' state over the ranks holding the same ones (dp·cp·tp, the plan's expert DP group) and the
 * rest over dp·ep·cp, as src/parallel/dp.c does (k3c_dp_init_experts). */
/* The plan's parameters per GPU of layout L's first stage (*sp) and the parameter table of one of its ranks (*t: its
 * EP rank's experts, TP rank 0's shares). */
static void plan_and_table(const k3c_config *c, const k3c_plan_layout *L, k3c_plan_stage_params *sp,
                           k3c_param_table *t) {
    k3c_err err = {0};
    k3c_plan_model m;
    CHECK_OK(k3c_plan_model_init(&m, c, L->seq, &err), &err);
    k3c_plan_stage_params_of(&m, L, 0, sp);
    k3c_plan_model_free(&m);
    k3c_residency r = k3c_residency_whole(c);
    r.experts = c->num_experts / L->ep, r.tp_size = (int)L->tp;
    CHECK_OK(k3c_params_build_resident(c, &r, t, &err), &err);
}

static void test_memory_matches_tables(void) {
    k3c_config c;
    k3c_err err = {0};
    CHECK_OK(k3c_config_load("configs/k3_test_tiny.json", &c, &err), &err);
    for (int64_t ep = 1; ep <= 4; ep *= 2) {
        k3c_plan_layout L;
        k3c_plan_layout_default(&L);
        L.seq = 8, L.ep = ep, L.dp = 2, L.global_batch_tokens = 8 * 2 * ep;
        k3c_plan_stage_params sp;
        k3c_param_table t;
        plan_and_table(&c, &L, &sp, &t);
        double held = 0;
        for (int i = 0; i < t.n; i++) held += t.p[i].stack ? (double)t.p[i].numel : 0;
        CHECK_NEAR(sp.ex, held, "routed-expert parameters per GPU");
        CHECK_NEAR(sp.ne + sp.ex, (double)t.total, "parameters per GPU");
        CHECK(k3c_plan_dp_group_expert(&L) == L.dp && k3c_plan_dp_group_dense(&L) == L.dp * ep, "ZeRO-1 groups");
        k3c_params_free(&t);
    }
    for (int64_t ep = 1; ep <= 2; ep *= 2) { /* tp2 and ep2 × tp2: a TP rank's share table (k3c_residency.tp_size) */
        k3c_plan_layout L;
        k3c_plan_layout_default(&L);
        L.seq = 8, L.ep = ep, L.tp = 2, L.global_batch_tokens = 8 * ep;
        k3c_plan_stage_params sp;
        k3c_param_table t;
        plan_and_table(&c, &L, &sp, &t);
        CHECK(fabs(sp.ne + sp.ex - (double)t.total) < 0.5, "ep%lld×tp2: plan %.0f parameters per GPU, table %zu",
              (long long)ep, sp.ne + sp.ex, t.total);
        k3c_params_free(&t);
    }
    for (int64_t pp = 2; pp <= 4; pp++) { /* pp3: stages of 2, 1 and 1 layers */
        k3c_plan_layout L;
        k3c_plan_layout_default(&L);
        L.seq = 8, L.pp = pp, L.global_batch_tokens = 8 * pp;
        k3c_plan_model m;
        CHECK_OK(k3c_plan_model_init(&m, &c, L.seq, &err), &err);
        double sum = 0;
        for (int64_t s = 0; s < pp; s++) {
            k3c_plan_stage_params sp;
            k3c_plan_stage_params_of(&m, &L, s, &sp);
            int64_t first, count;
            k3c_plan_stage_layers(c.num_layers, pp, s, &first, &count);
            k3c_residency r = k3c_residency_whole(&c); /* the trainer's stage (parallel/pp.c) is the plan's */
            k3c_pp_layers(&c, (int)s, (int)pp, &r.layer0, &r.layer1);
            CHECK(r.layer0 == first && r.layer1 == first + count,
                  "pp%lld stage %lld: layers [%d, %d), plan [%lld, %lld)", (long long)pp, (long long)s, r.layer0,
                  r.layer1, (long long)first, (long long)(first + count));
            k3c_param_table t;
            CHECK_OK(k3c_params_build_resident(&c, &r, &t, &err), &err);
            CHECK(fabs(sp.ne + sp.ex - (double)t.total) < 0.5, "pp%lld stage %lld: plan %.0f parameters, table %zu",
                  (long long)pp, (long long)s, sp.ne + sp.ex, t.total);
            sum += (double)t.total;
            k3c_params_free(&t);
        }
        k3c_param_table whole;
        CHECK_OK(k3c_params_build(&c, &whole, &err), &err);
        CHECK(sum == (double)whole.total, "pp%lld: the stages hold %.0f parameters, the model %zu", (long long)pp, sum,
              whole.total);
        k3c_params_free(&whole);
        k3c_plan_model_free(&m);
    }
}

int main(void) {
    test_tiny_params();
    test_memory_matches_tables();
    test_k3_params();
    test_golden_params();
    test_flops();
    test_memory();
    test_comm();
    test_layout_errors();
    test_search_k3();
    test_serve();
    test_cli();
    return test_summary();
}
