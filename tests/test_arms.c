/* test_arms.c — the experiment arms end to end (docs/TRAINING.md §1.6): a short training run of the tiny test model
 * with each balancing method, activation, KDA gate, hybrid layout, AttnRes, QK-Clip, optimizer and stage arm, each with
 * finite losses and the effect its switch must have; the run-config errors of the switches; the auxiliary loss's
 * gradient inside the model's backward. Fixture: tests/train_fixture.h. */
#pragma GCC diagnostic ignored "-Wunused-function" /* the fixture helpers this program does not need */
#include "train_fixture.h"

/* the routers' logits and routes of a forward (the float64 build: real is double), for the objective with the
 * auxiliary loss */
#include "base/real.h"
#include "model/acts.h"

#define ARM_STEPS 4

/* out/<rel> of the arm's final checkpoint */
static void final_path(const fixture *fx, const char *out, const char *rel, char *p, size_t n) {
    char r[256];
    snprintf(r, sizeof r, "step_%08d%s%s", ARM_STEPS, rel[0] ? "/" : "", rel);
    out_path(fx, out, r, p, n);
}

/* A copy of the fixture's model config with one substitution (from must occur), as <name>.json. */
static void model_variant(const fixture *fx, const char *name, const char *from, const char *to) {
    char src[1200], dst[1200];
    snprintf(src, sizeof src, "%s/model.json", fx->dir);
    snprintf(dst, sizeof dst, "%s/%s.json", fx->dir, name);
    char *text = slurp(src, NULL), *at = text ? strstr(text, from) : NULL;
    CHECK(at != NULL, "model variant %s: '%s' not in model.json", name, from);
    if (!at) {
        free(text);
        return;
    }
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    write_text(dst, s.buf);
    k3c_sbuf_free(&s);
    free(text);
}

/* Replaces `from` by `to` in a written run config (the fixture writes the optimizer block itself). */
static void edit_run(const char *path, const char *from, const char *to) {
    char *text = slurp(path, NULL), *at = text ? strstr(text, from) : NULL;
    CHECK(at != NULL, "%s: '%s' not found", path, from);
    if (at) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        k3c_sbuf_printf(&s, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
        write_text(path, s.buf);
        k3c_sbuf_free(&s);
    }
    free(text);
}

/* Trains ARM_STEPS steps of run config `cfg`; every logged loss must be finite. Returns 0 on success. */
static int train_arm(const fixture *fx, const char *cfg, const char *out, const char *what) {
    k3c_err err = {0};
    k3c_train_result res;
    int rc = train(cfg, 0, ARM_STEPS, NULL, &res, &err);
    CHECK(rc == K3C_OK, "%s: %s", what, err.msg);
    if (rc) return rc;
    mrow rows[16];
    int bad, n = read_metrics(fx, out, rows, 16, &bad);
    int finite = n == ARM_STEPS && bad == 0;
    for (int i = 0; i < n; i++) finite &= isfinite(rows[i].loss) && isfinite(rows[i].grad_norm);
    CHECK(res.steps == ARM_STEPS && isfinite(res.last_loss) && finite, "%s: %lld steps, last loss %g, %d rows (%d bad)",
          what, (long long)res.steps, res.last_loss, n, bad);
    return finite ? 0 : 1;
}

/* The router biases of every MoE layer of the arm's final checkpoint: their number, and *absmax. */
static int router_biases(const fixture *fx, const char *out, float *b, int cap, double *absmax) {
    char dir[1300];
    final_path(fx, out, "", dir, sizeof dir);
    k3c_model m;
    k3c_err err = {0};
    *absmax = NAN;
    if (k3c_model_open_f32(dir, 0, &m, &err)) {
        CHECK(0, "%s: %s", dir, err.msg);
        return 0;
    }
    int n = 0;
    *absmax = 0;
    const float *w = m.w;
    for (int l = 0; l < m.cfg.num_layers; l++)
        for (int64_t j = 0; m.cfg.ffn[l] == K3C_FFN_MOE && j < m.cfg.num_experts && n < cap; j++) {
            b[n] = w[m.table.layer[l].router_bias + (size_t)j];
            *absmax = fmax(*absmax, fabs(b[n++]));
        }
    k3c_model_free_f32(&m);
    return n;
}

static int same_model(const fixture *fx, const char *x, const char *y) {
    char a[1300], b[1300];
    final_path(fx, x, "model.safetensors", a, sizeof a);
    final_path(fx, y, "model.safetensors", b, sizeof b);
    return files_equal(a, b);
}

static void arm_run(const fixture *fx, const char *out, run_params p, char *cfg, size_t n) {
    p.out = out;
    p.ckpt_every = ARM_STEPS;
    p.eval_every = ARM_STEPS;
    char name[96];
    snprintf(name, sizeof name, "run_%s", out);
    write_run(fx, name, &p, cfg, n);
}

/* ---------------------------------------------------------------- balancing */

static void test_balancing(const fixture *fx) {
    static const char *const arms[6] = {"quantile", "histogram", "bias", "aux", "none", "off"};
    static const char *const extra[6] = {"", "", ", \"bias_gamma\": 0.004", ", \"aux_alpha\": 0.05", "", ""};
    char out[6][32], cfg[1200];
    int ok[6];
    for (int i = 0; i < 6; i++) {
        snprintf(out[i], sizeof out[i], "bal_%s", arms[i]);
        run_params p = defaults(out[i]);
        p.balancing = arms[i];
        p.extra = extra[i];
        arm_run(fx, out[i], p, cfg, sizeof cfg);
        ok[i] = train_arm(fx, cfg, out[i], arms[i]) == 0;
    }
    float b[64];
    double mx[6];
    int nb[6];
    for (int i = 0; i < 6; i++) nb[i] = ok[i] ? router_biases(fx, out[i], b, 64, &mx[i]) : 0;
    CHECK(nb[0] == 12 && mx[0] > 0 && mx[1] > 0, "quantile balancing moved the biases (max |b| %g, %g)", mx[0], mx[1]);
    /* the sign step moves each bias by ±γ or 0 per step: a multiple of γ, at most ARM_STEPS·γ */
    int multiples = nb[2] == 12;
    router_biases(fx, out[2], b, 64, &mx[2]);
    for (int j = 0; j < nb[2]; j++) {
        double q = b[j] / 0.004;
        multiples &= fabs(q - round(q)) < 1e-3 && fabs(q) <= ARM_STEPS + 1e-3;
    }
    CHECK(mx[2] > 0 && multiples, "bias arm: max |b| %g, every bias a multiple of γ = 0.004 up to %d·γ", mx[2],
          ARM_STEPS);
    CHECK(mx[3] == 0 && mx[4] == 0 && mx[5] == 0, "aux / none / off left the biases at 0 (max %g, %g, %g)", mx[3],
          mx[4], mx[5]);
    CHECK(!same_model(fx, out[3], out[4]), "the auxiliary loss changed nothing against no balancing");
    CHECK(same_model(fx, out[4], out[5]), "\"none\" and \"off\" trained different models");
    CHECK(!same_model(fx, out[0], out[2]), "the bias arm trained the quantile-balancing model");
    /* per-layer recomputation rebuilds the routes the auxiliary gradient reads: the same model bit for bit */
    run_params p = defaults("bal_aux_rc");
    p.balancing = "aux";
    p.extra = ", \"aux_alpha\": 0.05, \"recompute\": \"all\"";
    arm_run(fx, "bal_aux_rc", p, cfg, sizeof cfg);
    if (train_arm(fx, cfg, "bal_aux_rc", "aux with recompute") == 0 && ok[3])
        CHECK(same_model(fx, "bal_aux_rc", out[3]), "the auxiliary loss with recompute trained another model");
}

/* ---------------------------------------------------------------- model arms */

static void test_model_arms(const fixture *fx) {
    static const struct {
        const char *name, *from, *to;
    } v[] = {
        {"act_silu", "\"hidden_act\": \"situ\"", "\"hidden_act\": \"silu\""},
        {"act_gelu", "\"hidden_act\": \"situ\"", "\"hidden_act\": \"gelu\""},
        {"gate_softplus", "\"gate_lower_bound\": -5.0,", ""},
        {"gate_m2", "\"gate_lower_bound\": -5.0,", "\"gate_lower_bound\": -2.0,"},
        {"all_kda", "\"full_attn_layers\": [3], \"kda_layers\": [1, 2, 4]",
         "\"full_attn_layers\": [], \"kda_layers\": [1, 2, 3, 4]"},
        {"all_mla", "\"full_attn_layers\": [3], \"kda_layers\": [1, 2, 4]",
         "\"full_attn_layers\": [1, 2, 3, 4], \"kda_layers\": []"},
        {"ratio_1_1", "\"full_attn_layers\": [3], \"kda_layers\": [1, 2, 4]",
         "\"full_attn_layers\": [2, 4], \"kda_layers\": [1, 3]"},
        {"attnres_off", "\"attn_res_block_size\": 2", "\"attn_res_block_size\": 0"},
        {"attnres_1", "\"attn_res_block_size\": 2", "\"attn_res_block_size\": 1"},
    };
    const int n = (int)(sizeof v / sizeof v[0]);
    char cfg[1200], model[96], out[64];
    run_params p = defaults("base");
    arm_run(fx, "arm_base", p, cfg, sizeof cfg);
    int base_ok = train_arm(fx, cfg, "arm_base", "base arm") == 0;
    for (int i = 0; i < n; i++) {
        model_variant(fx, v[i].name, v[i].from, v[i].to);
        snprintf(model, sizeof model, "\"%s.json\"", v[i].name);
        snprintf(out, sizeof out, "arm_%s", v[i].name);
        p = defaults(out);
        p.model = model;
        arm_run(fx, out, p, cfg, sizeof cfg);
        if (train_arm(fx, cfg, out, v[i].name) == 0 && base_ok)
            CHECK(!same_model(fx, out, "arm_base"), "%s trained the base model", v[i].name);
        /* the checkpoint's config is the arm's */
        char ck[1300];
        k3c_config c;
        k3c_err err = {0};
        final_path(fx, out, "config.json", ck, sizeof ck);
        if (k3c_config_load(ck, &c, &err) == K3C_OK) {
            int mla = k3c_config_num_mla(&c);
            int want = strcmp(v[i].name, "all_kda") == 0     ? 0
                       : strcmp(v[i].name, "all_mla") == 0   ? 4
                       : strcmp(v[i].name, "ratio_1_1") == 0 ? 2
                                                             : 1;
            CHECK(mla == want, "%s: checkpoint has %d MLA layers, want %d", v[i].name, mla, want);
            if (strcmp(v[i].name, "act_gelu") == 0) CHECK(c.act == K3C_ACT_GELU, "gelu arm: act %d", c.act);
            if (strcmp(v[i].name, "gate_softplus") == 0)
                CHECK(c.kda_gate == K3C_GATE_SOFTPLUS, "softplus arm: gate %d", c.kda_gate);
        } else
            CHECK(0, "%s: %s", ck, err.msg);
    }
}

/* ---------------------------------------------------------------- run-config arms: QK-Clip, optimizer, stages */

static void test_run_arms(const fixture *fx) {
    char cfg[1200];
    /* QK-Clip off (tau 0) against a tau every head exceeds from the first step, and the default tau 100 */
    run_params p = defaults("qk_off");
    arm_run(fx, "qk_off", p, cfg, sizeof cfg);
    edit_run(cfg, "\"grad_clip\": 1.0}", "\"grad_clip\": 1.0, \"qk_clip_tau\": 0}");
    int off = train_arm(fx, cfg, "qk_off", "QK-Clip off") == 0;
    p = defaults("qk_tiny");
    arm_run(fx, "qk_tiny", p, cfg, sizeof cfg);
    edit_run(cfg, "\"grad_clip\": 1.0}", "\"grad_clip\": 1.0, \"qk_clip_tau\": 1e-3}");
    int tiny = train_arm(fx, cfg, "qk_tiny", "QK-Clip tau 1e-3") == 0;
    char metrics[1300];
    out_path(fx, "qk_tiny", "metrics.jsonl", metrics, sizeof metrics);
    char *m = slurp(metrics, NULL);
    CHECK(tiny && m && strstr(m, "\"qk_clipped\":2"), "tau 1e-3 clips both MLA heads");
    free(m);
    out_path(fx, "qk_off", "metrics.jsonl", metrics, sizeof metrics);
    m = slurp(metrics, NULL);
    CHECK(off && m && !strstr(m, "\"qk_clipped\":1") && !strstr(m, "\"qk_clipped\":2"), "QK-Clip off clipped heads");
    free(m);
    if (off && tiny) CHECK(!same_model(fx, "qk_off", "qk_tiny"), "QK-Clip off and tau 1e-3 trained the same model");

    p = defaults("adamw");
    arm_run(fx, "adamw", p, cfg, sizeof cfg);
    edit_run(cfg, "\"matrix\": \"muon\"", "\"matrix\": \"adamw\"");
    if (train_arm(fx, cfg, "adamw", "AdamW on matrices") == 0 && off)
        CHECK(!same_model(fx, "adamw", "qk_off"), "AdamW trained the Muon model");

    /* one long stage (seq_len 64 from the start) against the staged 32 → 64 context */
    p = defaults("one_stage");
    p.stage0 = "{\"name\": \"long\", \"seq_len\": 64, \"steps\": 6, \"lr\": 0.01, \"warmup\": 1}";
    p.stage1 = NULL;
    arm_run(fx, "one_stage", p, cfg, sizeof cfg);
    train_arm(fx, cfg, "one_stage", "one long stage");
}

/* ---------------------------------------------------------------- errors of the switches */

static void expect_run_error(const fixture *fx, const char *name, const char *balancing, const char *extra,
                             const char *needle) {
    char cfg[1200];
    run_params p = defaults(name);
    p.balancing = balancing;
    p.extra = extra;
    write_run(fx, name, &p, cfg, sizeof cfg);
    k3c_run_config rc;
    k3c_err err = {0};
    int e = k3c_run_config_load(cfg, &rc, &err);
    CHECK(e == K3C_ECONFIG && strstr(err.msg, needle) && strstr(err.msg, cfg), "%s: %s (want '%s')", name, err.msg,
          needle);
}

static void test_switch_errors(const fixture *fx) {
    expect_run_error(fx, "e_method", "switch", "", "is not exact (= quantile), histogram, bias, aux or none");
    expect_run_error(fx, "e_gamma_q", "quantile", ", \"bias_gamma\": 0.01", "bias_gamma: only with balancing \"bias\"");
    expect_run_error(fx, "e_alpha_b", "bias", ", \"aux_alpha\": 0.01", "aux_alpha: only with balancing \"aux\"");
    expect_run_error(fx, "e_gamma0", "bias", ", \"bias_gamma\": 0", "bias_gamma: 0, must be > 0");
    expect_run_error(fx, "e_alpha_neg", "aux", ", \"aux_alpha\": -1", "aux_alpha: -1, must be > 0");
    char cfg[1200];
    run_params p = defaults("e_tau");
    write_run(fx, "e_tau", &p, cfg, sizeof cfg);
    edit_run(cfg, "\"grad_clip\": 1.0}", "\"grad_clip\": 1.0, \"qk_clip_tau\": -1}");
    k3c_run_config rc;
    k3c_err err = {0};
    CHECK(k3c_run_config_load(cfg, &rc, &err) == K3C_ECONFIG && strstr(err.msg, "qk_clip_tau: -1"), "tau -1: %s",
          err.msg);
    /* the coefficients are read as given; absent ones take DeepSeek-V3's γ and Switch's α */
    p = defaults("e_ok");
    p.balancing = "bias";
    write_run(fx, "e_ok", &p, cfg, sizeof cfg);
    CHECK_OK(k3c_run_config_load(cfg, &rc, &err), &err);
    CHECK(rc.balancing == K3C_BALANCE_BIAS && rc.bias_gamma == 0.001 && rc.qb_mode == -1, "bias defaults: %d %g %d",
          rc.balancing, rc.bias_gamma, rc.qb_mode);
    p.balancing = "aux";
    p.extra = ", \"aux_alpha\": 0.0125";
    write_run(fx, "e_ok", &p, cfg, sizeof cfg);
    CHECK_OK(k3c_run_config_load(cfg, &rc, &err), &err);
    CHECK(rc.balancing == K3C_BALANCE_AUX && rc.aux_alpha == 0.0125, "aux alpha %g", rc.aux_alpha);
    /* the auxiliary loss over the parallel step is refused by name, before anything is written */
    p = defaults("e_aux_par");
    p.balancing = "aux";
    p.extra = ", \"parallel\": {\"force\": true}";
    write_run(fx, "e_aux_par", &p, cfg, sizeof cfg);
    k3c_train_result res;
    CHECK(train(cfg, 0, 1, NULL, &res, &err) == K3C_EUNSUPPORTED && strstr(err.msg, "balancing \"aux\""),
          "aux with parallel.force: %s", err.msg);
    char ck[1300];
    out_path(fx, "e_aux_par", "latest", ck, sizeof ck);
    CHECK(!exists(ck), "a refused run wrote a checkpoint");
}

/* ---------------------------------------------------------------- sliced recompute */

/* The arm `name` (trained, ok) starts from the loss of "rc_all" — the same model with every layer recomputed whole:
 * first steps within 1e-5 (another summation order) — and ends with a model that is not rc_all's bit for bit (what
 * the setting changes was used). */
static void check_against_rc_all(const fixture *fx, int ok, const char *name, const char *what) {
    mrow a[16], b[16];
    int bad;
    char msg[200];
    if (!ok || read_metrics(fx, "rc_all", a, 16, &bad) < 1 || read_metrics(fx, name, b, 16, &bad) < 1) return;
    snprintf(msg, sizeof msg, "%s: first step's loss rel diff", what);
    CHECK_LE(fabs(b[0].loss - a[0].loss) / a[0].loss, 1e-5, msg);
    CHECK(!same_model(fx, "rc_all", name), "%s changed nothing: it was not used", what);
}

/* "recompute_slice" is read, checked and used: bad values are errors naming it (nothing written); a run whose layers
 * recompute in slices of 8 tokens starts from the loss of the unsliced run (the same model, another summation order)
 * and trains a model that is not the unsliced one bit for bit. */
static void test_recompute_slice(const fixture *fx) {
    expect_run_error(fx, "e_slice_neg", "exact", ", \"recompute\": \"all\", \"recompute_slice\": -8",
                     "recompute_slice: -8, must be ≥ 0");
    expect_run_error(fx, "e_slice_norc", "exact", ", \"recompute_slice\": 8",
                     "recompute_slice: 8, only with recompute");
    expect_run_error(fx, "e_slice_str", "exact", ", \"recompute\": \"all\", \"recompute_slice\": \"8\"",
                     "recompute_slice");
    char cfg[1200];
    k3c_err err = {0};
    k3c_train_result res;
    run_params p = defaults("e_slice_tail");
    p.extra = ", \"recompute\": \"all\", \"recompute_slice\": 2";
    arm_run(fx, "e_slice_tail", p, cfg, sizeof cfg);
    CHECK(train(cfg, 0, 1, NULL, &res, &err) == K3C_ECONFIG && strstr(err.msg, "recompute_slice: 2") &&
              strstr(err.msg, "tail"),
          "a slice shorter than the conv tail: %s", err.msg);
    char ck[1300];
    out_path(fx, "e_slice_tail", "latest", ck, sizeof ck);
    CHECK(!exists(ck), "a refused run wrote a checkpoint");
    p = defaults("e_slice_aux");
    p.balancing = "aux";
    p.extra = ", \"recompute\": \"all\", \"recompute_slice\": 8";
    arm_run(fx, "e_slice_aux", p, cfg, sizeof cfg);
    CHECK(train(cfg, 0, 1, NULL, &res, &err) == K3C_ECONFIG && strstr(err.msg, "recompute_slice: 8") &&
              strstr(err.msg, "balancing \"aux\""),
          "slices with the auxiliary loss: %s", err.msg);
    p = defaults("rc_all");
    p.extra = ", \"recompute\": \"all\"";
    arm_run(fx, "rc_all", p, cfg, sizeof cfg);
    int ok = train_arm(fx, cfg, "rc_all", "recompute all") == 0;
    p = defaults("rc_slice");
    p.extra = ", \"recompute\": \"all\", \"recompute_slice\": 8";
    arm_run(fx, "rc_slice", p, cfg, sizeof cfg);
    k3c_run_config rc;
    CHECK_OK(k3c_run_config_load(cfg, &rc, &err), &err);
    CHECK(rc.recompute && rc.recompute_slice == 8, "recompute_slice read as %lld", (long long)rc.recompute_slice);
    ok &= train_arm(fx, cfg, "rc_slice", "recompute in slices of 8") == 0;
    check_against_rc_all(fx, ok, "rc_slice", "recompute_slice");
}

/* "head_chunk" is read and checked (bad values are errors naming it) and used: a run whose head computes its logits in
 * chunks of 5 tokens starts from the loss of the whole head's run (after test_recompute_slice's "rc_all") and trains a
 * model that is not that run's bit for bit (the lm_head gradient summed over the chunks). */
static void test_head_chunk(const fixture *fx) {
    expect_run_error(fx, "e_head_neg", "exact", ", \"head_chunk\": -8", "head_chunk: -8, must be ≥ 0");
    expect_run_error(fx, "e_head_str", "exact", ", \"head_chunk\": \"8\"", "head_chunk");
    expect_run_error(fx, "e_head_frac", "exact", ", \"head_chunk\": 8.5", "head_chunk");
    char cfg[1200];
    k3c_err err = {0};
    run_params p = defaults("rc_head");
    p.extra = ", \"recompute\": \"all\", \"head_chunk\": 5";
    arm_run(fx, "rc_head", p, cfg, sizeof cfg);
    k3c_run_config rc;
    CHECK_OK(k3c_run_config_load(cfg, &rc, &err), &err);
    CHECK(rc.head_chunk == 5, "head_chunk read as %lld", (long long)rc.head_chunk);
    int ok = train_arm(fx, cfg, "rc_head", "the head in chunks of 5") == 0;
    check_against_rc_all(fx, ok, "rc_head", "head_chunk");
}

/* ---------------------------------------------------------------- the auxiliary loss inside the model's backward */

/* One float64 backward of the fixture's model at α: the gradient is the cross-entropy's plus α times the auxiliary
 * loss's, so it is affine in α, touches the routers and what lies below them, and not the head. */
static void test_model_aux(const fixture *fx) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.json", fx->dir);
    k3c_config cfg;
    k3c_model m;
    k3c_err err = {0};
    if (k3c_config_load(path, &cfg, &err) || k3c_model_create_f64(&cfg, 1, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    m.kda_chunk = 16;
    k3c_model_init_f64(&m, 3, 0.2);
    enum { T = 24 };
    int32_t ids[T], cu[3] = {0, 11, T};
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 37 + 5) % VOCAB);
    k3c_model_batch b = {T, 2, ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_arena ar;
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f64(&m, T, 2), &err), &err);
    const size_t N = m.table.total;
    double *g[3];
    static const double alpha[3] = {0, 0.1, 0.2};
    for (int i = 0; i < 3; i++) {
        k3c_acts *acts;
        double loss;
        m.aux_loss_alpha = alpha[i];
        k3c_arena_reset(&ar, 0);
        memset(m.g, 0, N * sizeof(double));
        CHECK_OK(k3c_model_forward_f64(&m, &b, &ar, &acts, &loss, NULL, &err), &err);
        CHECK_OK(k3c_model_backward_f64(&m, acts, 1.0, &err), &err);
        g[i] = malloc(N * sizeof(double));
        memcpy(g[i], m.g, N * sizeof(double));
    }
    const k3c_layer_offsets *o = &m.table.layer[1]; /* the first MoE layer */
    const size_t head = m.table.glob.lm_head, nh = (size_t)(cfg.vocab_size * cfg.hidden_size);
    const size_t nr = (size_t)(cfg.num_experts * cfg.hidden_size);
    double dhead = 0, d1 = 0, lin = 0, scale = 0;
    for (size_t j = 0; j < nh; j++) dhead = fmax(dhead, fabs(g[1][head + j] - g[0][head + j]));
    for (size_t j = 0; j < nr; j++) {
        double a = g[1][o->router + j] - g[0][o->router + j], c = g[2][o->router + j] - g[0][o->router + j];
        d1 = fmax(d1, fabs(a));
        lin = fmax(lin, fabs(c - 2 * a));
        scale = fmax(scale, fabs(g[0][o->router + j]));
    }
    CHECK(dhead == 0, "the auxiliary loss changed the head's gradient by %g", dhead);
    CHECK(d1 > 1e-9 * scale && d1 > 0, "the auxiliary loss left the router's gradient as it was (%g)", d1);
    CHECK(lin <= 1e-12 * (d1 + scale), "router gradient not affine in alpha: %g (step %g)", lin, d1);
    for (int i = 0; i < 3; i++) free(g[i]);
    k3c_arena_free(&ar);
    k3c_model_free_f64(&m);
}

/* The objective J = cross-entropy + α·Σ_l L_aux,l with each layer's routes held at those of the base point (f is a
 * constant of the loss), from the forward's own router logits. */
static double aux_objective(k3c_model *m, const k3c_model_batch *b, k3c_arena *ar, int32_t *const *ids0, double alpha,
                            k3c_acts **acts) {
    k3c_err err = {0};
    double loss = NAN, ws[64];
    k3c_arena_reset(ar, 0);
    if (k3c_model_forward_f64(m, b, ar, acts, &loss, NULL, &err)) return NAN;
    const k3c_config *c = &m->cfg;
    for (int l = 0; l < c->num_layers; l++) {
        if (c->ffn[l] != K3C_FFN_MOE) continue;
        k3c_router_sizes rs = {b->T, c->num_experts, c->top_k, 0, 1.0};
        double aux = NAN;
        if (k3c_aux_loss_fwd_f64(&rs, (*acts)->ffn[l].logits, ids0 ? ids0[l] : (*acts)->ffn[l].ids, alpha, &aux, ws,
                                 &err))
            return NAN;
        loss += aux;
    }
    return loss;
}

/* Central differences of J in float64 against the backward with aux_loss_alpha = α: the routers' weights (the loss's
 * direct inputs) and entries below them (the gradient that flows on through the MoE layers' inputs). */
static void test_model_aux_fd(const fixture *fx) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.json", fx->dir);
    k3c_config cfg;
    k3c_model m;
    k3c_err err = {0};
    if (k3c_config_load(path, &cfg, &err) || k3c_model_create_f64(&cfg, 1, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    m.kda_chunk = 16;
    k3c_model_init_f64(&m, 11, 0.3);
    enum { T = 20 };
    const double alpha = 0.5;
    int32_t tok[T], cu[3] = {0, 9, T};
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 53 + 7) % VOCAB);
    k3c_model_batch b = {T, 2, tok, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
    k3c_arena ar;
    CHECK_OK(k3c_arena_init(&ar, k3c_model_plan_bytes_f64(&m, T, 2), &err), &err);
    k3c_acts *acts;
    int32_t *ids0[K3C_MAX_LAYERS] = {0};
    aux_objective(&m, &b, &ar, NULL, alpha, &acts);
    for (int l = 0; l < cfg.num_layers; l++)
        if (cfg.ffn[l] == K3C_FFN_MOE) {
            ids0[l] = malloc(sizeof(int32_t) * T * (size_t)cfg.top_k);
            memcpy(ids0[l], acts->ffn[l].ids, sizeof(int32_t) * T * (size_t)cfg.top_k);
        }
    m.aux_loss_alpha = alpha;
    memset(m.g, 0, m.table.total * sizeof(double));
    CHECK_OK(k3c_model_backward_f64(&m, acts, 1.0, &err), &err);
    double *w = m.w, *g = malloc(m.table.total * sizeof(double)), num = 0, den = 0;
    memcpy(g, m.g, m.table.total * sizeof(double));
    int checked = 0;
    for (int i = 0; i < m.table.n; i++) {
        const k3c_param *p = &m.table.p[i];
        if (p->kind == K3C_PK_ROUTER_BIAS || p->used == 0) continue;
        const int router = strstr(p->name, "block_sparse_moe.gate.weight") != NULL;
        for (int k = 0; k < (router ? 6 : 1); k++) {
            int64_t j = (int64_t)(k3c_uniform_at(17 + (uint64_t)i, (uint64_t)k) * (double)p->used);
            double *x = &w[p->offset + j], x0 = *x, h = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
            *x = x0 + h;
            double jp = aux_objective(&m, &b, &ar, ids0, alpha, &acts);
            *x = x0 - h;
            double jm = aux_objective(&m, &b, &ar, ids0, alpha, &acts);
            *x = x0;
            double fd = (jp - jm) / (2 * h), an = g[p->offset + j];
            num += (fd - an) * (fd - an);
            den += an * an;
            checked++;
        }
    }
    char what[160];
    snprintf(what, sizeof what, "objective with the auxiliary loss: f64 finite differences, normwise over %d entries",
             checked);
    CHECK_LE(sqrt(num / den), 1e-6, what);
    /* without the term in the backward the same differences disagree: the check sees the auxiliary gradient */
    m.aux_loss_alpha = 0;
    aux_objective(&m, &b, &ar, NULL, alpha, &acts);
    memset(m.g, 0, m.table.total * sizeof(double));
    CHECK_OK(k3c_model_backward_f64(&m, acts, 1.0, &err), &err);
    double off = 0, scale = 0;
    for (size_t j = 0; j < m.table.total; j++) {
        off += (g[j] - ((double *)m.g)[j]) * (g[j] - ((double *)m.g)[j]);
        scale += g[j] * g[j];
    }
    CHECK(sqrt(off / scale) > 1e-4, "the auxiliary term moves the gradient by %.3g of its norm", sqrt(off / scale));
    for (int l = 0; l < cfg.num_layers; l++) free(ids0[l]);
    free(g);
    k3c_arena_free(&ar);
    k3c_model_free_f64(&m);
}

int main(void) {
    fixture fx;
    memset(&fx, 0, sizeof fx);
    if (build_fixture(&fx, "test_arms")) return test_summary();
    test_switch_errors(&fx);
    test_recompute_slice(&fx);
    test_head_chunk(&fx);
    test_model_aux(&fx);
    test_model_aux_fd(&fx);
    test_balancing(&fx);
    test_model_arms(&fx);
    test_run_arms(&fx);
    if (test_failed_ == 0) replace_tree(fx.dir, NULL); /* kept for inspection when something failed */
    return test_summary();
}
