/* model_step.h — what the model-equivalence tests (test_slice.c, test_head_chunk.c) share: one forward + backward of a
 * prepared model with its loss and gradients as doubles, and the worst per-tensor relative error between two gradient
 * vectors. Static: include once, after test.h. */
#ifndef K3C_TEST_MODEL_STEP_H
#define K3C_TEST_MODEL_STEP_H

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

/* One forward + backward of m over b in an arena of its planned size: *loss, and *g (malloc'd, m's table order) the
 * gradients widened to double. */
#define TEST_MODEL_STEP(S, real)                                                                                       \
    static int test_model_step_##S(k3c_model *m, const k3c_model_batch *b, double *loss, double **g, k3c_err *err) {   \
        k3c_arena ar = {0};                                                                                            \
        k3c_acts *acts;                                                                                                \
        int rc = k3c_arena_init(&ar, k3c_model_plan_bytes_##S(m, b->T, b->n_docs), err);                               \
        if (!rc) rc = k3c_model_forward_##S(m, b, &ar, &acts, loss, NULL, err);                                        \
        if (!rc) rc = k3c_model_backward_##S(m, acts, 1.0, err);                                                       \
        if (!rc && !(*g = malloc(m->table.total * sizeof(double))))                                                    \
            rc = k3c_errf(err, K3C_ENOMEM, "test step: gradients");                                                    \
        for (size_t i = 0; !rc && i < m->table.total; i++) (*g)[i] = ((const real *)m->g)[i];                          \
        k3c_arena_free(&ar);                                                                                           \
        return rc;                                                                                                     \
    }
TEST_MODEL_STEP(f64, double)
TEST_MODEL_STEP(f32, float)

#endif
