/* config.h — internal to the model config (config_read.c, config_check.c, config_write.c) around the k3c_config of
 * include/k3c.h (which declares its JSON writer and plan strings): the spellings reader, validator and writer share. */
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

/* 1 iff zero-based layer l has a MoE FFN under the §4 rule (num_experts set, l >= first_k_dense, l % freq == 0). */
int k3c_config_layer_is_moe(const k3c_config *cfg, int64_t l);

#endif
