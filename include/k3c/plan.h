/* k3c/plan.h — the public API of `k3c plan` (src/plan/): exact parameter accounting, FLOPs, per-GPU memory,
 * communication and layout search for a Kimi-K3-class model on TP×CP×PP×EP×DP GPUs (docs/PLAN.md; docs/MODEL.md
 * §2–5, §9–10; docs/FORMATS.md §1.1, §3, §5). */
#ifndef K3C_PLAN_H
#define K3C_PLAN_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- parameters (params.c) */
typedef enum {
    K3C_PC_EMBED,     /* embed_tokens */
    K3C_PC_LM_HEAD,   /* lm_head */
    K3C_PC_NORM,      /* input / post-attention layernorms and the final norm */
    K3C_PC_KDA,       /* every self_attn tensor of KDA layers (incl. g_proj, o_proj) */
    K3C_PC_MLA,       /* every self_attn tensor of MLA layers (incl. g_proj, o_proj) */
    K3C_PC_ATTNRES,   /* *_res_norm, *_res_proj per layer and the output ones */
    K3C_PC_DENSE,     /* dense MLP (layer 0) */
    K3C_PC_ROUTER,    /* gate.weight + gate.e_score_correction_bias */
    K3C_PC_LATENT,    /* routed_expert_down_proj, routed_expert_norm, routed_expert_up_proj */
    K3C_PC_SHARED,    /* shared_experts */
    K3C_PC_ROUTED,    /* experts.E.w1/w2/w3 (logical shape, also when stored as MXFP4) */
    K3C_PC_VISION,    /* vision_tower */
    K3C_PC_PROJECTOR, /* mm_projector */
    K3C_PC_COUNT
} k3c_plan_comp;

const char *k3c_plan_comp_name(int comp); /* "embedding", "lm_head", ... */

/* Counts for one layer or one group of tensors. */
typedef struct {
    int64_t n[K3C_PC_COUNT];      /* stored logical parameters per component */
    int64_t matrix[K3C_PC_COUNT]; /* of which hidden 2-D matrices (Muon covers these; embedding / lm_head excluded) */
    int64_t frozen;               /* stored but never trained: the router correction bias (set by QB, §7) */
    int64_t f32;                  /* F32 in the release: A_log, dt_bias, router bias; K3 also convs and o_norm */
    int64_t tensors;              /* checkpoint tensors (an MXFP4 weight is two: weight_packed + weight_scale) */
    int64_t rep[K3C_PC_COUNT];    /* of n, whole on every rank of a TP group (k3c train's replicated entries: KDA's
                                     f_a, g_a, o_norm, MLA's q_a, kv_a and their norms) */
    int64_t rep_matrix[K3C_PC_COUNT]; /* of rep, hidden matrices */
    int64_t pad;                      /* of n, elements no TP share holds (K3's A_log padding past the H used) */
} k3c_plan_count;

typedef struct {
    int64_t total[K3C_PC_COUNT];  /* stored logical parameters */
    int64_t active[K3C_PC_COUNT]; /* used per text token: k of n routed experts, lm_head, no embedding lookup */
    int64_t total_all, text_total, vision_total, active_all;
    int64_t trainable; /* total_all − frozen */
    int64_t frozen;
    int64_t tensors;
    int64_t f32, mxfp4, bf16; /* release dtype split of the logical parameters (sums to total_all) */
    double ckpt_bytes;        /* tensor bytes in the release dtypes (MXFP4 = 0.5 + 1/group bytes per weight) */
} k3c_plan_params;

/* Checks the fields the planner relies on (positive sizes, a complete layer plan, k ≤ n, ...). */
int k3c_plan_check_config(const k3c_config *cfg, k3c_err *err);
/* Parameters of decoder layer l (everything named model.layers.l.*). */
int k3c_plan_layer_count(const k3c_config *cfg, int l, k3c_plan_count *out);
/* Tensors outside the decoder layers: what the first pipeline stage holds (embedding, vision tower, projector) and
 * what the last one holds (final norm, output AttnRes, lm_head). */
void k3c_plan_head_count(const k3c_config *cfg, k3c_plan_count *first, k3c_plan_count *last);
/* Whole-model accounting. */
int k3c_plan_count_params(const k3c_config *cfg, k3c_plan_params *out, k3c_err *err);
void k3c_plan_count_add(k3c_plan_count *acc, const k3c_plan_count *x);

/* ---------------------------------------------------------------- FLOPs (flops.c)
 * FLOPs = 2 per multiply-add. Forward per token; backward = 2 × forward; element-wise work (norms, activations,
 * gates, softmax) is not counted except the short convolution and the AttnRes mixes. */
#define K3C_PLAN_KDA_CHUNK 64

typedef struct {
    double fwd[K3C_PC_COUNT]; /* forward FLOPs per token per component, attention cores included in KDA / MLA */
    double mla_core;          /* of fwd[MLA]: the context-dependent score + value products, all MLA layers */
    double kda_core;          /* of fwd[KDA]: the chunked recurrence (paper Eq. 13), all KDA layers */
    double fwd_total;
    double model_total; /* forward + backward = 3 × fwd_total: the model FLOPs of one trained token */
} k3c_plan_flops;

/* Training / prefill FLOPs per token for causal sequences of seq tokens (MLA averages (seq+1)/2 keys per query). */
int k3c_plan_flops_train(const k3c_config *cfg, int64_t seq, k3c_plan_flops *out, k3c_err *err);
/* Forward FLOPs of decoder layer l per token at a given average number of attended keys (training form). */
double k3c_plan_layer_fwd_flops(const k3c_config *cfg, int l, double keys);
/* Decode FLOPs of one new token at context ctx: absorbed MLA over 576-value latents, one KDA recurrent step. */
double k3c_plan_flops_decode(const k3c_config *cfg, int64_t ctx);
/* Decode FLOPs of decoder layer l for one new token at context ctx. */
double k3c_plan_layer_decode_flops(const k3c_config *cfg, int l, int64_t ctx);
/* Forward FLOPs per token outside the decoder layers: lm_head and the output AttnRes mix. */
double k3c_plan_head_fwd_flops(const k3c_config *cfg);
/* Per-head KDA chunked FLOPs per token (paper Eq. 13): 6 d² + 3 C d + C². */
double k3c_plan_kda_head_flops(int64_t head_dim, int64_t chunk);
/* Model FLOPs utilisation of a measured step: model_flops_per_token × tokens / (step_s × gpus × peak). */
double k3c_plan_mfu(double model_flops_per_token, double tokens, double step_s, int64_t gpus, double peak_flops);

/* ---------------------------------------------------------------- layouts */
typedef enum { K3C_RC_NONE = 0, K3C_RC_SELECTIVE = 1, K3C_RC_FULL = 2 } k3c_plan_recompute;
typedef enum { K3C_OPT_ADAMW = 0, K3C_OPT_MUON = 1 } k3c_plan_optimizer;
const char *k3c_plan_recompute_name(int rc);
const char *k3c_plan_optimizer_name(int opt);

/* Rank order, innermost first: TP, EP, CP, DP, PP (TP inside a node; EP next since it talks every MoE layer). */
typedef struct {
    int64_t tp, cp, pp, ep, dp;
    int zero;                    /* 0..3: what the data-parallel group shards (optimizer, +grads, +weights) */
    int recompute;               /* k3c_plan_recompute */
    int64_t recompute_slice;     /* full recompute in slices of this many tokens (TRAINING.md §1.4); 0 = off */
    int64_t head_chunk;          /* the head's logits in chunks of this many tokens (TRAINING.md §1.4); 0 = off */
    int64_t micro_batch;         /* sequences per micro-batch */
    int64_t seq;                 /* tokens per sequence */
    int64_t global_batch_tokens; /* tokens per optimizer step */
    int optimizer;               /* k3c_plan_optimizer */
    int grad_bytes;              /* 4 (fp32 accumulation, default) or 2 */
    int experts_mxfp4;           /* routed expert weights stored as MXFP4 on the GPU */
} k3c_plan_layout;

typedef struct {
    double gpu_mem_gb;  /* usable memory per GPU, 1e9 bytes */
    double nvlink_gbs;  /* GB/s per GPU inside a node */
    double ib_gbps;     /* Gb/s per GPU across nodes */
    double peak_tflops; /* dense BF16 peak per GPU */
    double compute_eff; /* fraction of peak the kernels reach (for the step-time estimate) */
    double hbm_gbs;     /* memory bandwidth per GPU, GB/s (serving) */
    int64_t gpus_per_node;
} k3c_plan_hw;

void k3c_plan_hw_default(k3c_plan_hw *hw);          /* H200: 141 GB, 900 GB/s, 400 Gb/s, 989 TF, 0.5, 4800 GB/s, 8 */
void k3c_plan_layout_default(k3c_plan_layout *lay); /* 1×1×1×1×1, ZeRO-1, selective, b 1, seq 4096, 2^26 tok, AdamW */
int64_t k3c_plan_gpus(const k3c_plan_layout *lay);

/* Layers of stage s: [*first, *first + *count). Stages get ⌈L/PP⌉ or ⌊L/PP⌋ layers, the larger ones first. */
void k3c_plan_stage_layers(int64_t layers, int64_t pp, int64_t s, int64_t *first, int64_t *count);
/* TP divides every head count and split width, EP divides the routed experts, PP ≤ layers. */
int k3c_plan_check_grid(const k3c_config *cfg, int64_t tp, int64_t pp, int64_t ep, k3c_err *err);
/* Explains (err) why a layout cannot run this model: TP not dividing heads, EP not dividing experts, ... gpus 0 =
 * do not check the product. */
int k3c_plan_check_layout(const k3c_config *cfg, const k3c_plan_layout *lay, int64_t gpus, k3c_err *err);
/* Micro-batches per pipeline per step: global_batch_tokens / (micro_batch · seq · EP · DP); 0 if not an integer. */
int64_t k3c_plan_micro_batches(const k3c_plan_layout *lay);

/* ---------------------------------------------------------------- per-layer summary (model.c)
 * Everything the layout evaluation needs from one decoder layer, computed once per (config, sequence length). */
typedef struct {
    double ne_tp, ne_rep, ex; /* parameters: TP-sharded non-expert, TP-replicated non-expert, routed experts */
    double pad;               /* of ne_tp, elements held only without TP (K3's A_log padding) */
    double mat_tp, mat_rep;   /* hidden matrices among ne_tp / ne_rep (Muon-eligible; experts all are) */
    double frozen;            /* replicated and never trained (router correction bias) */
    double fwd;               /* forward FLOPs per token (training form, causal keys (seq+1)/2) */
    double act[3];            /* bytes per token kept for backward, per recompute policy (before TP/CP split) */
    double kda_states;        /* bytes per GPU-local token of the chunk states the KDA kernels materialise */
    double latent;            /* MLA: values per token of the latent KV gathered over CP (kv_lora + rope) */
    double sources_in;        /* AttnRes sources completed before this layer */
    int mla, moe;
} k3c_plan_layer_sum;

typedef struct {
    const k3c_config *cfg;
    int64_t seq, layers;
    k3c_plan_layer_sum *layer; /* [layers] */
    k3c_plan_layer_sum first;  /* embedding, vision tower, projector: on the first stage */
    k3c_plan_layer_sum last;   /* final norm, output AttnRes, lm_head: on the last stage */
    double sources_out;        /* AttnRes sources read by the output mix */
    k3c_plan_flops flops;
} k3c_plan_model;

int k3c_plan_model_init(k3c_plan_model *m, const k3c_config *cfg, int64_t seq, k3c_err *err);
void k3c_plan_model_free(k3c_plan_model *m);

/* Activation bytes one token of decoder layer l keeps for backward, before any TP/CP split. */
double k3c_plan_layer_act_bytes(const k3c_config *cfg, int l, int recompute);
/* AttnRes sources (block representations, the first being the embedding) completed before layer l: a stage that
 * starts at l receives them and keeps them for its whole backward. 0 without AttnRes. */
int64_t k3c_plan_attnres_sources(const k3c_config *cfg, int64_t l);
/* Sources read by layer l's attention mix (0 at layer 0: its input is the embedding) and by its MLP mix. */
void k3c_plan_attnres_mix_sources(const k3c_config *cfg, int64_t l, int64_t *attn, int64_t *mlp);

/* ---------------------------------------------------------------- memory (memory.c), bytes per GPU */
typedef struct {
    int64_t stage;  /* the pipeline stage reported (the one needing the most memory) */
    int64_t layers; /* decoder layers on it */
    double weights, grads, optimizer, activations, working, total;
    int64_t in_flight;   /* micro-batches whose activations the stage holds at once (1F1B) */
    double stash_per_mb; /* activation bytes of one micro-batch on this GPU */
} k3c_plan_memory;

/* Optimizer-state bytes per trainable parameter: AdamW 12 (fp32 master, m, v); Muon 8 on hidden matrices (master +
 * momentum) and AdamW on the rest (embedding, lm_head, norms, vectors). */
double k3c_plan_opt_bytes(int optimizer, int is_matrix);
/* Data-parallel group sizes: non-expert weights are replicated over CP·EP·DP, routed experts over TP·CP·DP. */
int64_t k3c_plan_dp_group_dense(const k3c_plan_layout *lay);
int64_t k3c_plan_dp_group_expert(const k3c_plan_layout *lay);
/* Parameters one GPU of a stage holds before ZeRO sharding (non-expert ones already split over TP, experts over EP). */
typedef struct {
    double ne, ne_mat, ex, frozen;
    double max_layer_bytes; /* largest layer's bf16 / MXFP4 weights on the GPU (the ZeRO-3 gather buffer) */
} k3c_plan_stage_params;
void k3c_plan_stage_params_of(const k3c_plan_model *m, const k3c_plan_layout *lay, int64_t stage,
                              k3c_plan_stage_params *p);
/* Bytes per routed-expert weight: 2 (bf16) or MXFP4's 0.5 + 1/group. */
double k3c_plan_expert_weight_bytes(const k3c_config *cfg, int mxfp4);
void k3c_plan_stage_memory(const k3c_plan_model *m, const k3c_plan_layout *lay, int64_t stage, k3c_plan_memory *out);
/* The heaviest stage. */
int k3c_plan_memory_train(const k3c_config *cfg, const k3c_plan_layout *lay, k3c_plan_memory *out, k3c_err *err);

/* ---------------------------------------------------------------- communication (comm.c) */
typedef enum { K3C_COMM_TP, K3C_COMM_CP, K3C_COMM_EP, K3C_COMM_PP, K3C_COMM_DP, K3C_COMM_COUNT } k3c_plan_comm_kind;
const char *k3c_plan_comm_name(int kind);

typedef struct {
    double mb_bytes[K3C_COMM_COUNT]; /* sent per GPU per micro-batch (forward + backward + recomputation) */
    double mb_seconds[K3C_COMM_COUNT];
    double step_bytes[K3C_COMM_COUNT]; /* sent per GPU once per step (DP gradient / parameter sync) */
    double step_seconds[K3C_COMM_COUNT];
    double mb_total_s, step_total_s;
} k3c_plan_comm;

enum { K3C_AX_TP = 1, K3C_AX_EP = 2, K3C_AX_CP = 4, K3C_AX_DP = 8, K3C_AX_PP = 16 };
/* Members of the group made of the axes in mask that share a node with rank 0 (ranks ordered TP, EP, CP, DP, PP,
 * innermost first, gpus_per_node consecutive ranks per node). */
int64_t k3c_plan_ranks_per_node(const k3c_plan_layout *lay, unsigned mask, int64_t gpus_per_node);
/* Seconds for collectives over n ranks, m per node, on a full (unsharded) buffer of `bytes`, hierarchical: an
 * intra-node phase over NVLink, then an inter-node phase carrying 1/m of the data per GPU over its own NIC. */
double k3c_plan_allreduce_s(double bytes, int64_t n, int64_t m, const k3c_plan_hw *hw);
double k3c_plan_allgather_s(double bytes, int64_t n, int64_t m, const k3c_plan_hw *hw); /* = reduce-scatter */
/* All-to-all: each GPU holds `bytes` spread evenly over the n ranks (its own share stays); NVLink and NIC traffic
 * proceed at the same time. */
double k3c_plan_alltoall_s(double bytes, int64_t n, int64_t m, const k3c_plan_hw *hw);
void k3c_plan_stage_comm(const k3c_plan_model *m, const k3c_plan_layout *lay, const k3c_plan_hw *hw, int64_t stage,
                         k3c_plan_comm *out);
/* 1F1B bubble: (PP − 1) / (m + PP − 1). */
double k3c_plan_bubble(int64_t pp, int64_t micro_batches);

/* ---------------------------------------------------------------- evaluation and search (search.c) */
typedef struct {
    k3c_plan_layout layout;
    k3c_plan_memory mem; /* heaviest stage */
    k3c_plan_comm comm;  /* slowest stage */
    int64_t slow_stage;
    int64_t micro_batches; /* per pipeline per step */
    double mb_compute_s;   /* one micro-batch's forward + backward (+ recomputation) on the slowest stage */
    double step_s;         /* (m + PP − 1) × (compute + comm per micro-batch) + per-step DP sync */
    double compute_s, comm_s, bubble_s; /* step_s = compute_s + comm_s + bubble_s */
    double comm_kind_s[K3C_COMM_COUNT]; /* comm_s split by kind (m × per micro-batch + per step) */
    double comm_kind_bytes[K3C_COMM_COUNT];
    double bubble_frac, comm_share, tokens_per_s, mfu;
    double model_flops_per_token; /* 3 × forward: what MFU counts */
    double hw_flops_per_token;    /* adds the recomputed forward */
    int fits;
} k3c_plan_eval;

int k3c_plan_evaluate(const k3c_config *cfg, const k3c_plan_layout *lay, const k3c_plan_hw *hw, k3c_plan_eval *out,
                      k3c_err *err);

/* Search constraints: a layout field left 0 (tp, cp, pp, ep, dp, micro_batch) or −1 (zero, recompute) is free. */
typedef struct {
    int64_t gpus;
    k3c_plan_layout fixed;
    int top; /* how many best layouts to keep */
} k3c_plan_search_opts;

typedef struct {
    k3c_plan_eval *best; /* top entries, fastest first (caller-provided array of opts.top) */
    int n_best;
    int64_t tried, valid, fitting;
    double min_mem; /* smallest per-GPU memory seen among valid layouts (to explain "nothing fits") */
} k3c_plan_search_result;

int k3c_plan_search(const k3c_config *cfg, const k3c_plan_search_opts *opts, const k3c_plan_hw *hw,
                    k3c_plan_search_result *res, k3c_err *err);

/* ---------------------------------------------------------------- serving (serve.c) */
typedef struct {
    int64_t tp, pp, ep, dp;
    int64_t context, batch; /* tokens per sequence in cache, concurrent sequences (whole deployment) */
    int experts_mxfp4;      /* routed experts as MXFP4 (default: as the checkpoint stores them) */
} k3c_plan_serve_layout;

typedef struct {
    k3c_plan_serve_layout layout;
    int stage;
    double weights, kv_cache, kda_state, working, total; /* bytes per GPU, heaviest stage */
    double kv_bytes_per_token;                           /* MLA latent cache, whole model, per token of context */
    double kda_bytes_per_seq;                            /* KDA states + conv tails, whole model, per sequence */
    double decode_flops_per_token;
    double step_s, tokens_per_s, read_bytes; /* one decode step of the whole batch */
    int fits;
} k3c_plan_serve_eval;

int k3c_plan_check_serve(const k3c_config *cfg, const k3c_plan_serve_layout *lay, int64_t gpus, k3c_err *err);
int k3c_plan_serve_evaluate(const k3c_config *cfg, const k3c_plan_serve_layout *lay, const k3c_plan_hw *hw,
                            k3c_plan_serve_eval *out, k3c_err *err);
/* Enumerates TP×PP×EP×DP = gpus (fields of fixed left 0 are free), drops layouts over memory, ranks by decode step. */
int k3c_plan_serve_search(const k3c_config *cfg, int64_t gpus, const k3c_plan_serve_layout *fixed,
                          const k3c_plan_hw *hw, k3c_plan_serve_eval *best, int top, int *n_best, int64_t *valid,
                          k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
