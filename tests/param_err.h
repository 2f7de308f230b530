/* param_err.h — the worst per-tensor relative error between two whole-model gradient (or parameter) vectors, the
 * measure the model-equivalence tests (test_slice.c, test_head_chunk.c) compare at. Static: include once, after test.h. */
#ifndef K3C_TEST_PARAM_ERR_H
#define K3C_TEST_PARAM_ERR_H

#include "model/model.h"

/* max over the parameter table's tensors of ‖g − ref‖ / ‖ref‖ (test_rel_err_d); *head_err (when not NULL) gets
 * lm_head's. INFINITY when the table cannot be built. */
static double test_worst_param_err(const k3c_config *cfg, const double *g, const double *ref, double *head_err) {
    k3c_param_table t;
    k3c_err err = {0};
    if (k3c_params_build(cfg, &t, &err)) return INFINITY;
    double worst = 0;
    for (int i = 0; i < t.n; i++) {
        double e = test_rel_err_d(g + t.p[i].offset, ref + t.p[i].offset, (size_t)t.p[i].numel);
        if (head_err && t.p[i].offset == t.glob.lm_head) *head_err = e;
        if (e > worst) worst = e;
    }
    k3c_params_free(&t);
    return worst;
}

#endif
