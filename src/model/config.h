/* config.h — internal to the model config (config_read.c, config_check.c, config_write.c) around the k3c_config of
 * include/k3c.h: shared spellings, the released-spelling JSON writer (also for `k3c inspect --json`), plan strings. */
#ifndef K3C_MODEL_CONFIG_H
#define K3C_MODEL_CONFIG_H

#include "base/json.h"
#include "base/base.h"

/* The spellings the reader, the validator and the writer share. */
#define K3C_CFG_KIMI_LINEAR "kimi_linear"
#define K3C_CFG_KIMI_K3 "kimi_k3"
#define K3C_CFG_K3_PREFIX "language_model."
#define K3C_CFG_MXFP4_FORMAT "mxfp4-pack-quantized"
#define K3C_CFG_MXFP4_GROUP 32 /* OCP MX block size: one E8M0 scale per 32 elements (docs/FORMATS.md §6) */

/* vision_config settings k3c implements one way only (§3.4): read as "must equal", written as is. */
typedef struct {
    const char *key, *value;
} k3c_cfg_fixed;
#define K3C_VISION_FIXED 7
#define K3C_VISION_NO_BIAS 3
extern const k3c_cfg_fixed k3c_vision_fixed[K3C_VISION_FIXED];
extern const char *const k3c_vision_no_bias[K3C_VISION_NO_BIAS]; /* booleans that must be false */
extern const char *const k3c_vision_interp[2];                   /* pos_emb_interpolation_mode values */

/* Appends cfg as a config.json in the released spelling (what k3c_config_save writes); validates cfg first. */
int k3c_config_to_json(const k3c_config *cfg, k3c_sbuf *out, k3c_err *err);

/* The mixer plan ("KKKM KKKM M": K = KDA, M = MLA) or, with ffn set, the FFN plan ("DEEE ...": D = dense, E = MoE),
 * grouped in fours. Truncated with "..." when buf is too small. */
void k3c_config_plan_string(const k3c_config *cfg, int ffn, char *buf, size_t n);

/* 1 iff zero-based layer l has a MoE FFN under the §4 rule (num_experts set, l >= first_k_dense, l % freq == 0). */
int k3c_config_layer_is_moe(const k3c_config *cfg, int64_t l);

#endif
