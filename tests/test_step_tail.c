/* test_step_tail.c — the step's tail (train/step_tail.c) on the CPU table against the functions the trainer, SFT / RL
 * and vision training called before it existed: the model's group bit for bit against k3c_clip_grad_norm +
 * k3c_optim_step, the vision tower's flat group against a sequential-norm clip + k3c_adamw_update over the whole
 * buffer; a non-finite norm in either group skips the update and touches nothing. docs/TRAINING.md "The step's tail". */
#include "test.h"

#include "base/check.h"
#include "model/model.h"
#include "ops/optim.h"
#include "train/step_tail.h"

#include <math.h>

/* Vision training's tower clip before the tail: one sequential double sum, torch's clip_grad_norm_ scale. */
static double old_clip_tower(float *g, size_t n, double max_norm) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    const double norm = sqrt(s);
    if (max_norm > 0 && norm > max_norm)
        for (size_t i = 0; i < n; i++) g[i] *= (float)(max_norm / (norm + 1e-6));
    return norm;
}

static void fill(float *x, size_t n, uint64_t seed, double sd) {
    k3c_rng r = {seed, 0};
    for (size_t i = 0; i < n; i++) x[i] = (float)(k3c_rng_normal(&r) * sd);
}

static float *fdup(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

typedef struct {
    k3c_model m;
    k3c_optim opt;
    float *state;
    void *inst;
    float *tw, *tg; /* a tower-sized flat group */
    size_t tn;
    k3c_flat_group tower;
    k3c_step_tail tail;
} rig;

static int rig_open(rig *r, size_t tower_n, k3c_err *err) {
    memset(r, 0, sizeof *r);
    const k3c_backend_f32 *be = k3c_backend_cpu_f32();
    k3c_config cfg;
    CHECK_RC(k3c_config_load(test_shared("golden/k3_tiny_a"), &cfg, err));
    CHECK_RC(k3c_model_create_f32(&cfg, 1, &r->m, err));
    k3c_model_init_f32(&r->m, 7, 0.02);
    k3c_optim_defaults(&r->opt);
    r->opt.weight_decay = 0.05;
    CHECK_RC(k3c_optim_init(&r->opt, &r->m.table, err));
    r->state = calloc(r->opt.state_numel + 1, sizeof(float));
    CHECK_RC(be->optim_open(be->ctx, &r->opt, &r->m.table, &r->inst, err));
    r->tn = tower_n;
    r->tw = malloc(sizeof(float) * tower_n), r->tg = malloc(sizeof(float) * tower_n);
    fill(r->tw, tower_n, 11, 0.1);
    CHECK_RC(k3c_flat_group_open(&r->tower, be, "tower", r->tw, r->tg, tower_n, &r->opt, err));
    r->tail.m = &r->m;
    r->tail.group[0] = (k3c_param_group){&r->m.table, &r->opt, r->inst, r->m.w, r->m.g, r->state};
    r->tail.group[1] = r->tower.group;
    r->tail.n_groups = 2;
    return K3C_OK;
}

static void rig_close(rig *r) {
    k3c_step_tail_free(&r->tail);
    k3c_flat_group_close(&r->tower);
    k3c_backend_cpu_f32()->optim_close(r->inst);
    k3c_optim_free(&r->opt);
    free(r->state), free(r->tw), free(r->tg);
    k3c_model_free_f32(&r->m);
}

/* Three steps of both groups through the tail against the previous code on copies, bit for bit. */
static void same_as_before(size_t tower_n) {
    k3c_err err = {0};
    rig r;
    if (rig_open(&r, tower_n, &err)) {
        CHECK(0, "rig: %s", err.msg);
        rig_close(&r);
        return;
    }
    const size_t n = r.m.table.total;
    float *w = fdup(r.m.w, n), *st = fdup(r.state, r.opt.state_numel), *tw = fdup(r.tw, r.tn);
    float *tm = calloc(r.tn, sizeof(float)), *tv = calloc(r.tn, sizeof(float));
    const double clip = 1.0;
    for (int64_t step = 1; step <= 3; step++) {
        fill(r.m.g, n, 100 + (uint64_t)step, step == 2 ? 1e-6 : 0.05); /* step 2: below the clip */
        fill(r.tg, r.tn, 200 + (uint64_t)step, 0.05);
        float *g = fdup(r.m.g, n), *tg = fdup(r.tg, r.tn);
        const double lr[2] = {3e-3 / (double)step, 1e-3 / (double)step};
        const k3c_tail_config c = {clip, 0, K3C_BALANCE_NONE, -1, 0};
        k3c_tail_result res;
        CHECK_OK(k3c_step_tail_run(&r.tail, &c, lr, step, &res, &err), &err);
        const double norm = k3c_clip_grad_norm(&r.m.table, g, clip), tnorm = old_clip_tower(tg, r.tn, clip);
        CHECK_OK(k3c_optim_step(&r.opt, &r.m.table, w, g, st, lr[0], step, &err), &err);
        const k3c_adamw_hp hp = {r.opt.beta1, r.opt.beta2, r.opt.eps};
        k3c_adamw_update(&hp, tw, tg, tm, tv, (int64_t)r.tn, lr[1], r.opt.weight_decay, step);
        CHECK(!res.skipped && res.grad_norm[0] == norm, "step %lld: model norm %.17g, before %.17g", (long long)step,
              res.grad_norm[0], norm);
        CHECK(res.grad_norm[1] == tnorm, "step %lld, tower of %zu: norm %.17g, before %.17g", (long long)step, r.tn,
              res.grad_norm[1], tnorm);
        CHECK(!memcmp(w, r.m.w, sizeof(float) * n) && !memcmp(g, r.m.g, sizeof(float) * n),
              "step %lld: the model's weights and clipped gradient as before", (long long)step);
        CHECK(!memcmp(st, r.state, sizeof(float) * r.opt.state_numel), "step %lld: optimizer state as before",
              (long long)step);
        CHECK(!memcmp(tw, r.tw, sizeof(float) * r.tn) && !memcmp(tg, r.tg, sizeof(float) * r.tn),
              "step %lld, tower of %zu: weights and clipped gradient as before", (long long)step, r.tn);
        CHECK(!memcmp(tm, r.tower.group.state, sizeof(float) * r.tn) &&
                  !memcmp(tv, r.tower.group.state + r.tn, sizeof(float) * r.tn),
              "step %lld: the tower's AdamW moments as before", (long long)step);
        free(g), free(tg);
    }
    free(w), free(st), free(tw), free(tm), free(tv);
    rig_close(&r);
}

/* A NaN in one group: the tail reports it in the guard's words and updates nothing, in either group. */
static void guard(int which) {
    k3c_err err = {0};
    rig r;
    if (rig_open(&r, 5000, &err)) {
        CHECK(0, "rig: %s", err.msg);
        rig_close(&r);
        return;
    }
    const size_t n = r.m.table.total;
    fill(r.m.g, n, 5, 0.05), fill(r.tg, r.tn, 6, 0.05);
    (which ? r.tg : (float *)r.m.g)[17] = NAN;
    float *w = fdup(r.m.w, n), *tw = fdup(r.tw, r.tn);
    const double lr[2] = {1e-2, 1e-2};
    const k3c_tail_config c = {1.0, 0, K3C_BALANCE_NONE, -1, 0};
    k3c_tail_result res;
    CHECK_OK(k3c_step_tail_run(&r.tail, &c, lr, 1, &res, &err), &err);
    CHECK(res.skipped && !strcmp(res.why, "gradient norm is nan") && isnan(res.grad_norm[which]) &&
              isfinite(res.grad_norm[!which]),
          "group %d NaN: skipped (%d, \"%s\")", which, res.skipped, res.why);
    CHECK(!memcmp(w, r.m.w, sizeof(float) * n) && !memcmp(tw, r.tw, sizeof(float) * r.tn),
          "group %d NaN: no weight changed", which);
    int zero = 1;
    for (size_t i = 0; i < r.opt.state_numel; i++) zero &= r.state[i] == 0;
    for (size_t i = 0; i < 2 * r.tn; i++) zero &= r.tower.group.state[i] == 0;
    CHECK(zero, "group %d NaN: the optimizer state untouched", which);
    free(w), free(tw);
    rig_close(&r);
}

int main(void) {
    same_as_before(7304);  /* test_vision_data's tower */
    same_as_before(32768); /* one norm block exactly: the blocked sum is the sequential one */
    guard(0);
    guard(1);
    return test_summary();
}
