/* model_info.c — the public accessors of a model (its config, its KDA implementation) and the checkpoint tensors a
 * config names, for callers that know k3c_model by name only. docs/FORMATS.md §5, docs/CODE.md "Layers". */
#include "model/model.h"

#include <stdio.h>

const k3c_config *k3c_model_config(const k3c_model *m) { return &m->cfg; }

void k3c_model_set_kda_chunk(k3c_model *m, int chunk) { m->kda_chunk = chunk; }

/* Stacked experts are one tensor per expert under the checkpoint's names (k3c_params_name). */
int k3c_config_tensors(const k3c_config *cfg, k3c_tensor_fn fn, void *ctx, int64_t *count, k3c_err *err) {
    k3c_param_table t;
    int rc = k3c_params_build(cfg, &t, err);
    if (rc) return rc;
    int64_t n = 0;
    char name[K3C_PARAM_NAME + 32];
    for (int i = 0; i < t.n && !rc; i++) {
        const k3c_param *p = &t.p[i];
        for (int64_t e = 0; e < (p->stack ? p->stack : 1) && !rc; e++, n++) {
            if (!fn) continue;
            k3c_params_name(p, p->stack ? e : -1, name, sizeof name);
            rc = fn(ctx, name, p->layer, p->ndim, p->shape, p->mxfp4);
        }
    }
    k3c_params_free(&t);
    if (count) *count = n;
    return rc;
}
