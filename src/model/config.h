/* config.h — internal helpers around the k3c_config of include/k3c.h: the released-spelling JSON writer used by
 * k3c_config_save (also for `k3c inspect --json`) and the compact layer-plan strings (spec/CHECKPOINTS.md §2–4). */
#ifndef K3C_MODEL_CONFIG_H
#define K3C_MODEL_CONFIG_H

#include "base/json.h"
#include "k3c.h"

/* Appends cfg as a config.json in the released spelling (what k3c_config_save writes); validates cfg first. */
int k3c_config_to_json(const k3c_config *cfg, k3c_sbuf *out, k3c_err *err);

/* The mixer plan ("KKKM KKKM M": K = KDA, M = MLA) or, with ffn set, the FFN plan ("DEEE ...": D = dense, E = MoE),
 * grouped in fours. Truncated with "..." when buf is too small. */
void k3c_config_plan_string(const k3c_config *cfg, int ffn, char *buf, size_t n);

/* 1 iff zero-based layer l has a MoE FFN under the §4 rule (num_experts set, l >= first_k_dense, l % freq == 0). */
int k3c_config_layer_is_moe(const k3c_config *cfg, int64_t l);

#endif
