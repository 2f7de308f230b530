/* rl.c — RL with verifiable rewards on an environment: per step, G rollouts for each of P training prompts, rewards
 * from the environment's verifier (+ overlong penalty), group-relative advantages with zero-variance groups dropped,
 * one on-policy policy-gradient update (GRPO / DAPO / Dr. GRPO weights), held-out evaluation, metrics, checkpoints.
 * TRAINING.md §3; docs/POST.md "RL". */
#include "base/base.h"
#include "base/check.h"
#include "base/json.h"
#include "post/post.h"
#include "post/post_run.h"
#include "tok/tok.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- config */

static int pick(const k3c_json_ctx *c, const k3c_json *o, const char *key, const char *const *names, int def,
                int *out) {
    const char *v = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_OPT, K3C_SPOT(o, "", key), &v));
    *out = def;
    if (!v) return K3C_OK;
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], v)) return *out = i, K3C_OK;
    return k3c_errf(c->err, K3C_ECONFIG, "%s: %s: \"%s\" is not one of the accepted values", c->file, key, v);
}

static int read_rl(const k3c_json_ctx *c, const k3c_json *j, k3c_rl_config *r) {
    static const char *const keys[] = {"init",
                                       "env",
                                       "out_dir",
                                       "steps",
                                       "prompts_per_step",
                                       "group_size",
                                       "max_turns",
                                       "max_tokens",
                                       "max_new",
                                       "temperature",
                                       "top_p",
                                       "lr",
                                       "advantage",
                                       "loss_agg",
                                       "eps_low",
                                       "eps_high",
                                       "beta",
                                       "overlong_buffer",
                                       "overlong_penalty",
                                       "eval_every",
                                       "eval_episodes",
                                       "checkpoint_every",
                                       "keep_checkpoints",
                                       "seed",
                                       "thinking",
                                       "format_gate",
                                       "kda_chunk",
                                       "threads",
                                       "grad_clip",
                                       "matrix_optimizer",
                                       "ppo_epochs",
                                       "tis_cap",
                                       "dynamic_sampling",
                                       "max_draws",
                                       "pass_k",
                                       "pass_n",
                                       "pass_tasks",
                                       NULL};
    static const char *const advs[] = {"grpo", "dr_grpo", NULL}, *const aggs[] = {"token_mean", "seq_mean", "const",
                                                                                  NULL};
    static const char *const mats[] = {"muon", "adamw", NULL};
    if (j->type != K3C_JSON_OBJECT) return k3c_errf(c->err, K3C_ECONFIG, "%s: expected a JSON object", c->file);
    CHECK_RC(k3c_post_cfg_keys(c, j, "", keys));
    CHECK_RC(k3c_post_cfg_path(c, j, "init", 1, r->init, sizeof r->init));
    CHECK_RC(k3c_post_cfg_path(c, j, "out_dir", 1, r->out_dir, sizeof r->out_dir));
    const char *env = NULL;
    CHECK_RC(k3c_json_get_str(c, K3C_JSON_REQ, K3C_SPOT(j, "", "env"), &env));
    snprintf(r->env, sizeof r->env, "%s", env);
    k3c_env *probe;
    k3c_err e2 = {0};
    if (k3c_env_new(r->env, 0, 0, 0, &probe, &e2)) return k3c_errf(c->err, K3C_ECONFIG, "%s: env: %s", c->file, e2.msg);
    k3c_env_free(probe);
    int64_t v;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "steps", 0, 1, &r->steps));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "prompts_per_step", 4, 1, &r->prompts_per_step));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "group_size", 4, 2, &r->group_size));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "max_turns", 4, 1, &v));
    r->max_turns = (int)v;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "max_tokens", 1024, 16, &r->max_tokens));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "max_new", 128, 1, &r->max_new));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "temperature", 1.0, &r->temperature));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "top_p", 1.0, &r->top_p));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "lr", 1e-4, &r->lr));
    CHECK_RC(pick(c, j, "advantage", advs, 0, &r->std_norm));
    r->std_norm = !r->std_norm; /* grpo (index 0) divides by the std */
    CHECK_RC(pick(c, j, "loss_agg", aggs, K3C_RL_TOKEN_MEAN, &r->loss.agg));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "eps_low", 0.2, &r->loss.eps_low));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "eps_high", 0.28, &r->loss.eps_high));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "beta", 0, &r->loss.beta));
    if (!(r->loss.beta >= 0)) return k3c_errf(c->err, K3C_EINVAL, "%s: beta: must be >= 0", c->file);
    CHECK_RC(k3c_post_cfg_int(c, j, "", "ppo_epochs", 1, 1, &r->ppo_epochs));
    r->loss.max_len = r->max_tokens;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "overlong_buffer", 0, 0, &r->overlong_buffer));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "overlong_penalty", 1.0, &r->overlong_penalty));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "eval_every", 0, 0, &r->eval_every));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "eval_episodes", 16, 1, &r->eval_episodes));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "checkpoint_every", 0, 0, &r->checkpoint_every));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "keep_checkpoints", 2, 1, &r->keep_checkpoints));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "seed", 1, 0, &v));
    r->seed = (uint64_t)v;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "kda_chunk", 16, 0, &v));
    r->kda_chunk = (int)v;
    CHECK_RC(k3c_post_cfg_int(c, j, "", "threads", 0, 0, &v));
    r->threads = (int)v;
    CHECK_RC(k3c_post_cfg_num(c, j, "", "grad_clip", 1.0, &r->grad_clip));
    CHECK_RC(pick(c, j, "matrix_optimizer", mats, 1, &r->matrix_optimizer));
    CHECK_RC(k3c_post_cfg_num(c, j, "", "tis_cap", 0, &r->loss.tis_cap));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "max_draws", 4, 1, &r->max_draws));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "pass_k", 0, 0, &r->pass_k));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "pass_n", r->pass_k > 8 ? r->pass_k : 8, 1, &r->pass_n));
    CHECK_RC(k3c_post_cfg_int(c, j, "", "pass_tasks", 32, 1, &r->pass_tasks));
    if (r->pass_k > r->pass_n)
        return k3c_errf(c->err, K3C_ECONFIG, "%s: pass_k: %lld is more than pass_n (%lld samples per task)", c->file,
                        (long long)r->pass_k, (long long)r->pass_n);
    int present;
    CHECK_RC(k3c_json_get_bool(c, K3C_JSON_OPT, K3C_SPOT(j, "", "dynamic_sampling"), K3C_NOSPOT, &r->dynamic_sampling,
                               &present));
    CHECK_RC(k3c_json_get_bool(c, K3C_JSON_OPT, K3C_SPOT(j, "", "thinking"), K3C_NOSPOT, &r->thinking, &present));
    CHECK_RC(k3c_json_get_bool(c, K3C_JSON_OPT, K3C_SPOT(j, "", "format_gate"), K3C_NOSPOT, &r->format_gate, &present));
    if (!present) r->format_gate = 1;
    return K3C_OK;
}

int k3c_rl_config_load(const char *path, k3c_rl_config *r, k3c_err *err) {
    memset(r, 0, sizeof *r);
    snprintf(r->path, sizeof r->path, "%s", path);
    k3c_json *j;
    CHECK_RC(k3c_json_parse_file(path, &j, err));
    k3c_json_ctx c = {path, err};
    int rc = read_rl(&c, j, r);
    k3c_json_free(j);
    return rc;
}

/* ---------------------------------------------------------------- the run */

typedef struct {
    const k3c_rl_config *c;
    k3c_post_run r;
    k3c_model ref; /* the frozen reference (the init checkpoint) when beta > 0 */
    int has_ref;
    int64_t step, episodes; /* episodes: drawn for training in this process */
} rl;

/* Episodes of tasks task0 + i / G of `split`, G samples each, decoded together (k3c_rollout_batch); sample g of a
 * task draws with the seed of (seed, step, task, g); temperature 0: greedy. */
static int episodes(rl *s, int split, int64_t task0, int n, int G, double temperature, k3c_episode *ep, k3c_err *err) {
    k3c_env **e = calloc((size_t)n, sizeof *e);
    k3c_sampler *sm = calloc((size_t)n, sizeof *sm);
    int rc = e && sm ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < n; i++) {
        int64_t task = task0 + i / G;
        rc = k3c_env_new(s->c->env, s->c->seed, split, task, &e[i], err);
        sm[i] = (k3c_sampler){.temperature = temperature,
                              .top_p = s->c->top_p,
                              .seed = s->c->seed ^ (uint64_t)(s->step * 1000003 + task * 131 + i % G)};
    }
    k3c_rollout_opts o = {s->c->max_turns, s->c->max_tokens, s->c->max_new, s->c->thinking};
    if (!rc) rc = k3c_rollout_batch(&s->r.m, e, sm, n, s->r.tok, &o, s->c->threads, ep, err);
    for (int i = 0; e && i < n; i++) k3c_env_free(e[i]);
    free(e);
    free(sm);
    return rc;
}

/* Next-token targets of an episode: the sampled ids (mask 1), −1 elsewhere; the count of targets. */
static int64_t sampled_targets(const k3c_episode *ep, int32_t *tg) {
    int64_t counted = 0;
    for (int64_t t = 0; t < ep->n; t++) {
        tg[t] = t + 1 < ep->n && ep->mask[t + 1] ? ep->ids[t + 1] : -1;
        counted += tg[t] >= 0;
    }
    return counted;
}

/* One forward of model m over the episode (the run's arena: m has the trained model's shape): lp[t + 1] = log-prob of
 * the sampled id at t + 1; *ent (may be NULL) += the mean entropy of those positions. With w (per position, −∂L/∂logp
 * of the next token) the weighted cross-entropy's backward follows, which adds ∇ Σ_t ∂L/∂logp_t · logp_t = ∇L. */
static int seq_pass(rl *s, k3c_model *m, const k3c_episode *ep, double *lp, double *ent, const float *w, k3c_err *err) {
    int64_t T = ep->n;
    int32_t *tg = malloc(sizeof *tg * (size_t)T);
    if (!tg) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    int64_t counted = sampled_targets(ep, tg);
    int32_t cu[2] = {0, (int32_t)T};
    k3c_model_batch b = {
        .T = T, .n_docs = 1, .ids = ep->ids, .cu_seqlens = cu, .targets = tg, .loss_norm = 1.0, .weight = w};
    int rc = counted ? k3c_post_run_arena(&s->r, T, 1, err) : K3C_OK;
    k3c_acts *acts;
    float *logits = NULL;
    if (!rc && counted) {
        k3c_arena_reset(&s->r.arena, 0);
        rc = k3c_model_forward_f32(m, &b, &s->r.arena, &acts, NULL, &logits, err);
    }
    const int64_t V = m->cfg.vocab_size;
    float *row = !rc && counted && lp ? malloc(sizeof *row * (size_t)V) : NULL;
    if (!rc && counted && lp && !row) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int64_t t = 0; !rc && row && t < T; t++) {
        if (tg[t] < 0) continue;
        rc = k3c_model_download_f32(m, row, logits + t * V, sizeof *row * (size_t)V, err);
        double h;
        k3c_logp_entropy(row, V, tg[t], &lp[t + 1], &h);
        if (ent) *ent += h / (double)counted;
    }
    free(row);
    if (!rc && counted && w) rc = k3c_model_backward_f32(m, acts, 1.0, err);
    free(tg);
    return rc;
}

/* The policy-gradient updates of one batch of episodes (TRAINING.md §3): π_old's log-probs recomputed by the trained
 * model before the first update (ρ = 1 there), the reference's when beta > 0, then ppo_epochs times: the current
 * log-probs, k3c_rl_loss → ∂L/∂logp per token, one weighted backward per sequence (weight −∂L/∂logp on the position
 * that predicts the token) and an optimizer step. Sequences of dropped groups, and with beta = 0 those with advantage
 * 0, contribute nothing and are skipped. */
typedef struct {
    int B;
    const k3c_episode *ep;
    const int64_t *off;
    double *lp, *lp_old, *lp_ref, *dl;
    const uint8_t *mk;
    const double *adv;
    const double *lp_roll; /* the rollout engine's log-probs (TIS) */
} rl_batch;

static int active(const rl *s, const rl_batch *b, int i) {
    return b->off[i + 1] > b->off[i] && (b->adv[i] != 0 || s->c->loss.beta > 0);
}

static int rl_updates(rl *s, rl_batch *b, k3c_rl_loss_stats *st, double *ent, double *gnorm, int *n_upd, k3c_err *err) {
    int rc = K3C_OK;
    *n_upd = 0;
    for (int i = 0; !rc && i < b->B; i++) {
        if (!active(s, b, i)) continue;
        double *o = b->lp_old + b->off[i];
        rc = seq_pass(s, &s->r.m, &b->ep[i], o, ent, NULL, err);
        if (!rc && s->has_ref) rc = seq_pass(s, &s->ref, &b->ep[i], b->lp_ref + b->off[i], NULL, NULL, err);
        (*n_upd)++;
    }
    float *w = NULL;
    for (int e = 0; !rc && *n_upd && e < s->c->ppo_epochs; e++) {
        for (int i = 0; !rc && e > 0 && i < b->B; i++)
            if (active(s, b, i)) rc = seq_pass(s, &s->r.m, &b->ep[i], b->lp + b->off[i], NULL, NULL, err);
        if (!rc && e == 0) memcpy(b->lp, b->lp_old, sizeof *b->lp * (size_t)b->off[b->B]);
        k3c_rl_tokens tk = {b->B, b->off, b->lp, b->lp_old, s->has_ref ? b->lp_ref : NULL, b->mk, b->adv, b->lp_roll};
        k3c_rl_loss_stats es = {0};
        if (!rc) rc = k3c_rl_loss(&tk, &s->c->loss, b->dl, &es, err);
        if (!rc && e == 0) *st = es;
        st->clip_low = es.clip_low, st->clip_high = es.clip_high, st->ratio_mean = es.ratio_mean;
        st->tis_mean = es.tis_mean, st->tis_capped = es.tis_capped;
        if (!rc) rc = s->r.be->zero(s->r.m.g, (int64_t)s->r.m.table.total, err);
        for (int i = 0; !rc && i < b->B; i++) {
            if (!active(s, b, i)) continue;
            const k3c_episode *ep = &b->ep[i];
            float *nw = realloc(w, sizeof *w * (size_t)ep->n);
            if (!nw) {
                rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
                break;
            }
            w = nw;
            for (int64_t t = 0; t < ep->n; t++) w[t] = t + 1 < ep->n ? (float)-b->dl[b->off[i] + t + 1] : 0.0f;
            rc = seq_pass(s, &s->r.m, ep, NULL, NULL, w, err);
        }
        if (!rc) rc = k3c_post_run_update(&s->r, s->c->grad_clip, s->c->lr, s->step + 1, gnorm, err);
    }
    free(w);
    if (*n_upd) *ent /= *n_upd;
    return rc;
}

/* The verifier's reward, or 0 for an episode whose output is not valid XTML when format_gate is on: an answer in an
 * unclosed or unparsable message is not an answer, and without the gate nothing in the reward keeps the markup. */
static double gated(const k3c_rl_config *c, const k3c_episode *ep) {
    return c->format_gate && !ep->format_valid ? 0.0 : ep->reward.reward;
}

/* What the draws of one step saw: batches, groups drawn, flat groups, and the reward metrics over every drawn episode. */
typedef struct {
    int draws, drawn, flat, kept;
    double reward, fmt, len, comp[K3C_REWARD_MAX_COMPONENTS];
    k3c_reward names; /* the components' names (the first drawn episode's reward) */
    int64_t sampled;
    double t_roll;
} draw_stats;

/* The step's groups into ep / r (room for prompts_per_step groups). DAPO dynamic sampling: batches of
 * prompts_per_step prompts × group_size samples are drawn until prompts_per_step groups have reward variance, at most
 * max_draws batches; without it one batch, every group kept (the flat ones are dropped by their advantages). Each step
 * reserves max_draws batches of task indices, so a resumed run draws the same tasks. */
static int draw_groups(rl *s, k3c_episode *ep, double *r, draw_stats *d, k3c_err *err) {
    const k3c_rl_config *c = s->c;
    int P = (int)c->prompts_per_step, G = (int)c->group_size, B = P * G;
    int64_t cap = c->dynamic_sampling ? c->max_draws : 1, n_ep = 0;
    k3c_episode *tmp = calloc((size_t)B, sizeof *tmp);
    double *tr = calloc((size_t)B, sizeof *tr), t0 = k3c_now();
    int *sel = calloc((size_t)P, sizeof *sel);
    int rc = tmp && tr && sel ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int64_t dr = 0; !rc && dr < cap && d->kept < P; dr++) {
        if ((rc = episodes(s, 0, (s->step * cap + dr) * P, B, G, c->temperature, tmp, err))) break;
        if (!dr) d->names = tmp[0].reward;
        d->draws++, d->drawn += P, n_ep += B;
        for (int i = 0; i < B; i++) {
            tr[i] = gated(c, &tmp[i]) +
                    k3c_rl_overlong_penalty(tmp[i].n, c->max_tokens, c->overlong_buffer, c->overlong_penalty);
            d->reward += tr[i];
            for (int k = 0; k < tmp[i].reward.n; k++) d->comp[k] += tmp[i].reward.c[k].value;
            d->len += (double)(tmp[i].n - tmp[i].n_prompt);
            d->fmt += tmp[i].format_valid;
            for (int64_t t = tmp[i].n_prompt; t < tmp[i].n; t++) d->sampled += tmp[i].mask[t];
        }
        int n_sel = 0;
        d->flat += k3c_rl_select_groups(tr, P, G, c->dynamic_sampling ? P - d->kept : 0, sel, &n_sel);
        for (int g = 0; !c->dynamic_sampling && g < P; g++) sel[n_sel++] = g;
        for (int k = 0; k < n_sel; k++, d->kept++) {
            memcpy(ep + (size_t)d->kept * G, tmp + (size_t)sel[k] * G, sizeof *ep * (size_t)G);
            memcpy(r + (size_t)d->kept * G, tr + (size_t)sel[k] * G, sizeof *r * (size_t)G);
            memset(tmp + (size_t)sel[k] * G, 0, sizeof *tmp * (size_t)G); /* moved: nothing left to free */
        }
        for (int i = 0; i < B; i++) k3c_episode_free(&tmp[i]);
    }
    double n = n_ep ? (double)n_ep : 1;
    d->reward /= n, d->fmt /= n, d->len /= n;
    for (int k = 0; k < K3C_REWARD_MAX_COMPONENTS; k++) d->comp[k] /= n;
    d->t_roll = k3c_now() - t0;
    s->episodes += n_ep;
    free(tmp), free(tr), free(sel);
    return rc;
}

/* One RL step: the draws, advantages, the policy-gradient update; fills the metrics line. */
static int rl_step(rl *s, k3c_sbuf *line, double *mean_reward, k3c_err *err) {
    const k3c_rl_config *c = s->c;
    int G = (int)c->group_size, rc = K3C_OK;
    k3c_episode *ep = calloc((size_t)(c->prompts_per_step * G), sizeof *ep);
    double *r = calloc((size_t)(c->prompts_per_step * G), sizeof *r);
    draw_stats d = {0};
    if (!ep || !r) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) rc = draw_groups(s, ep, r, &d, err);
    int P = d.kept, B = P * G;
    double *adv = calloc((size_t)(B ? B : 1), sizeof *adv);
    uint8_t *keep = calloc((size_t)(P ? P : 1), 1);
    if (!rc && (!adv || !keep)) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    int zero = rc ? 0 : k3c_rl_advantages(r, P, G, c->std_norm, adv, keep);
    int64_t *off = calloc((size_t)B + 1, sizeof *off);
    if (!rc && !off) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < B; i++) off[i + 1] = off[i] + (keep[i / G] ? ep[i].n : 0);
    int64_t N = rc ? 0 : off[B];
    size_t nn = (size_t)(N ? N : 1);
    double *lp = calloc(nn, sizeof *lp), *lo = calloc(nn, sizeof *lo), *lr = calloc(nn, sizeof *lr),
           *dl = calloc(nn, sizeof *dl), *lroll = calloc(nn, sizeof *lroll);
    uint8_t *mk = calloc(nn, 1);
    if (!rc && (!lp || !lo || !lr || !dl || !mk || !lroll)) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < B; i++) {
        if (!keep[i / G]) continue;
        memcpy(mk + off[i], ep[i].mask, (size_t)ep[i].n);
        for (int64_t t = 0; t < ep[i].n; t++) lroll[off[i] + t] = ep[i].logp[t];
    }
    k3c_rl_loss_stats st = {0};
    rl_batch rb = {B, ep, off, lp, lo, lr, dl, mk, adv, lroll};
    double ent = 0, gnorm = 0, t1 = k3c_now();
    int n_upd = 0;
    if (!rc) rc = rl_updates(s, &rb, &st, &ent, &gnorm, &n_upd, err);
    /* the rollout engine's log-probs against the trainer's recomputation of the same policy (float32 noise) */
    double lp_diff = 0;
    for (int i = 0; !rc && !s->r.m.backend && i < B; i++)
        for (int64_t t = 0; active(s, &rb, i) && t < ep[i].n; t++)
            if (mk[off[i] + t]) lp_diff = fmax(lp_diff, fabs(ep[i].logp[t] - lo[off[i] + t]));
    *mean_reward = d.reward;
    if (!rc) {
        s->step++;
        k3c_sbuf_printf(line, "{\"step\":%lld,\"reward\":%.6g,\"loss\":%.6g", (long long)s->step, d.reward, st.loss);
        for (int k = 0; k < d.names.n; k++) k3c_sbuf_printf(line, ",\"r_%s\":%.6g", d.names.c[k].name, d.comp[k]);
        k3c_sbuf_printf(
            line,
            ",\"format_valid\":%.4g,\"response_len\":%.4g,\"zero_var_groups\":%.4g,\"draws\":%d,"
            "\"groups_drawn\":%d,\"groups_filtered\":%d,\"groups_kept\":%d,"
            "\"kl\":%.6g,\"clip_low\":%.4g,\"clip_high\":%.4g,\"grad_norm\":%.6g,\"updated_seqs\":%d,"
            "\"rollout_tok_s\":%.4g,\"update_tok_s\":%.4g,\"ratio_mean\":%.6g,\"rollout_logp_diff\":%.3g,"
            "\"tis_mean\":%.6g,\"tis_capped\":%.4g",
            d.fmt, d.len, (double)d.flat / (d.drawn ? d.drawn : 1), d.draws, d.drawn, d.flat, P - zero, st.kl,
            st.clip_low, st.clip_high, gnorm, n_upd, (double)d.sampled / (d.t_roll > 0 ? d.t_roll : 1),
            (double)N * s->c->ppo_epochs / (k3c_now() - t1 + 1e-9), st.ratio_mean, lp_diff, st.tis_mean, st.tis_capped);
        /* JSON has no NaN: without an updated sequence there is no entropy, and the key is left out (as the
         * trainer's metrics do with non-finite values) */
        if (n_upd) k3c_sbuf_printf(line, ",\"entropy\":%.6g", ent);
    }
    for (int i = 0; ep && i < c->prompts_per_step * G; i++) k3c_episode_free(&ep[i]);
    free(ep), free(r), free(adv), free(keep), free(off), free(lp), free(lo), free(lr), free(dl), free(mk), free(lroll);
    return rc;
}

/* Greedy pass@1 and the unbiased pass@k (pass_n samples at the rollout temperature) over the first pass_tasks
 * training tasks; an episode solves its task when its (gated) reward is full. */
static int pass_eval(rl *s, double *pass1, double *passk, k3c_err *err) {
    int T = (int)s->c->pass_tasks, n = (int)s->c->pass_n, N = T * n;
    k3c_episode *ep = calloc((size_t)N, sizeof *ep);
    *pass1 = *passk = 0;
    int rc = ep ? episodes(s, 0, 0, T, 1, 0.0, ep, err) : k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < T; i++) {
        *pass1 += (gated(s->c, &ep[i]) >= 1 - 1e-9) / (double)T;
        k3c_episode_free(&ep[i]);
    }
    if (!rc) rc = episodes(s, 0, 0, N, n, s->c->temperature, ep, err);
    for (int t = 0; !rc && t < T; t++) {
        int solved = 0;
        for (int g = 0; g < n; g++) solved += gated(s->c, &ep[t * n + g]) >= 1 - 1e-9;
        *passk += k3c_rl_pass_at_k(n, solved, (int)s->c->pass_k) / T;
    }
    for (int i = 0; !rc && i < N; i++) k3c_episode_free(&ep[i]);
    free(ep);
    return rc;
}

/* OUT/eval_step_N.jsonl: per held-out episode its reward (and components), format validity, turns and everything
 * after the prompt as the model wrote it (its turns and the observations between them), so a reader can see what the
 * policy does at this step. Written atomically. */
static int dump_eval(rl *s, const k3c_episode *ep, int n, k3c_err *err) {
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    int rc = K3C_OK;
    for (int i = 0; !rc && i < n; i++) {
        char *text = NULL;
        size_t len = 0;
        rc = k3c_tok_decode(s->r.tok, ep[i].ids + ep[i].n_prompt, (size_t)(ep[i].n - ep[i].n_prompt), &text, &len, err);
        if (rc) break;
        k3c_sbuf_printf(&b, "{\"task\":%d,\"reward\":%.6g", i, ep[i].reward.reward);
        for (int k = 0; k < ep[i].reward.n; k++)
            k3c_sbuf_printf(&b, ",\"r_%s\":%.6g", ep[i].reward.c[k].name, ep[i].reward.c[k].value);
        k3c_sbuf_printf(&b, ",\"format_valid\":%d,\"turns\":%d,\"truncated\":%d,\"info\":", ep[i].format_valid,
                        ep[i].turns, ep[i].truncated);
        k3c_sbuf_json_string(&b, ep[i].info, strlen(ep[i].info));
        k3c_sbuf_printf(&b, "%s", ",\"output\":");
        k3c_sbuf_json_string(&b, text, len);
        k3c_sbuf_printf(&b, "%s", "}\n");
        free(text);
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/eval_step_%08lld.jsonl", s->c->out_dir, (long long)s->step);
    if (!rc && !b.ok) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) rc = k3c_write_file_atomic(path, b.buf, b.len, err);
    k3c_sbuf_free(&b);
    return rc;
}

/* Greedy episodes of the first eval_episodes held-out tasks: mean reward and format-valid fraction. */
static int evaluate(rl *s, double *reward, double *format, k3c_err *err) {
    int n = (int)s->c->eval_episodes;
    k3c_episode *ep = calloc((size_t)(n ? n : 1), sizeof *ep);
    *reward = *format = 0;
    int rc = ep ? episodes(s, 1, 0, n, 1, 0.0, ep, err) : k3c_errf(err, K3C_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < n; i++) {
        *reward += gated(s->c, &ep[i]) / n;
        *format += ep[i].format_valid / (double)n;
    }
    int have = !rc; /* on failure episodes() left none allocated */
    if (!rc) rc = dump_eval(s, ep, n, err);
    for (int i = 0; have && i < n; i++) k3c_episode_free(&ep[i]);
    free(ep);
    return rc;
}

static int restore(rl *s, const char *ts, k3c_err *err) {
    k3c_json *j = NULL;
    CHECK_RC(k3c_json_parse(ts, strlen(ts), "trainer_state.json", &j, err));
    const k3c_json *st = k3c_json_get(j, "step");
    int rc = st && st->is_integer && st->integer >= 0
                 ? K3C_OK
                 : k3c_errf(err, K3C_EFORMAT, "%s/latest: trainer_state.json has no step", s->c->out_dir);
    if (!rc) s->step = st->integer;
    k3c_json_free(j);
    return rc;
}

int k3c_rl_run(const k3c_rl_config *c, const k3c_train_opts *o, k3c_rl_result *res, k3c_err *err) {
    rl s = {.c = c};
    memset(res, 0, sizeof *res);
    res->first_eval_reward = res->last_eval_reward = res->last_eval_format = NAN;
    static const char *const mats[] = {"muon", "adamw"};
    k3c_post_run_opts ro = {c->init, NULL, NULL, c->out_dir, c->kda_chunk, c->threads, mats[c->matrix_optimizer],
                            0.0,     0.9,  0.95, 1e-8};
    char *ts = NULL;
    int rc = k3c_post_run_open(&s.r, &ro, o, &ts, err);
    if (!rc && c->loss.beta > 0) { /* the frozen reference: the init checkpoint, on the same backend */
        s.has_ref = 1;             /* freed below also after a partial open */
        rc = k3c_model_open_f32(c->init, 0, &s.ref, err);
        s.ref.kda_chunk = c->kda_chunk;
        if (!rc && s.r.m.backend) rc = k3c_model_use_backend_f32(&s.ref, s.r.m.backend, err);
    }
    if (!rc && ts) rc = restore(&s, ts, err);
    free(ts);
    int64_t stop = o->max_steps > 0 && o->max_steps < c->steps ? o->max_steps : c->steps;
    k3c_progress bar;
    k3c_progress_init(&bar, "rl", stop, "step", o->progress ? o->progress : stderr, 0);
    if (!o->progress) bar.enabled = 0;
    bar.done = s.step;
    double t0 = k3c_now();
    res->pass1[0] = res->pass1[1] = res->pass_k[0] = res->pass_k[1] = NAN;
    if (!rc && c->eval_every > 0 && s.step == 0) {
        double f;
        rc = evaluate(&s, &res->first_eval_reward, &f, err);
        if (!rc && c->pass_k) rc = pass_eval(&s, &res->pass1[0], &res->pass_k[0], err);
        if (!rc) {
            fprintf(s.r.metrics, "{\"step\":0,\"eval_reward\":%.6g,\"eval_format_valid\":%.4g", res->first_eval_reward,
                    f);
            if (c->pass_k)
                fprintf(s.r.metrics, ",\"pass_k\":%lld,\"train_pass1\":%.6g,\"train_pass_k\":%.6g",
                        (long long)c->pass_k, res->pass1[0], res->pass_k[0]);
            fputs("}\n", s.r.metrics);
        }
    }
    while (!rc && s.step < stop) {
        k3c_sbuf line;
        k3c_sbuf_init(&line);
        rc = rl_step(&s, &line, &res->last_train_reward, err);
        int last = s.step == stop;
        double er = NAN, ef = NAN;
        int ev = c->eval_every > 0 && (s.step % c->eval_every == 0 || last);
        if (!rc && ev) rc = evaluate(&s, &er, &ef, err);
        if (!rc && ev && c->pass_k) rc = pass_eval(&s, &res->pass1[1], &res->pass_k[1], err);
        if (!rc) {
            if (isfinite(er)) k3c_sbuf_printf(&line, ",\"eval_reward\":%.6g,\"eval_format_valid\":%.4g", er, ef);
            if (ev && c->pass_k)
                k3c_sbuf_printf(&line, ",\"pass_k\":%lld,\"train_pass1\":%.6g,\"train_pass_k\":%.6g",
                                (long long)c->pass_k, res->pass1[1], res->pass_k[1]);
            k3c_sbuf_printf(&line, "%s", "}\n");
            fputs(line.buf, s.r.metrics);
            fflush(s.r.metrics);
            if (o->log) fputs(line.buf, o->log);
            if (isfinite(er)) res->last_eval_reward = er, res->last_eval_format = ef;
            k3c_progress_update(&bar, s.step, 1, NULL);
        }
        k3c_sbuf_free(&line);
        if (!rc && ((c->checkpoint_every > 0 && s.step % c->checkpoint_every == 0) || last)) {
            char st[192]; /* "chat": the chat options of the rollouts, serve's and chat's defaults */
            snprintf(st, sizeof st,
                     "{\"step\": %lld, \"seed\": %llu, \"kind\": \"rl\", \"chat\": {\"format\": \"xtml\", "
                     "\"thinking\": %s}}\n",
                     (long long)s.step, (unsigned long long)c->seed, c->thinking ? "true" : "false");
            rc = k3c_post_run_save(&s.r, c->out_dir, s.step, st, (int)c->keep_checkpoints, err);
        }
    }
    k3c_progress_finish(&bar, NULL);
    res->steps = s.step;
    res->episodes = s.episodes;
    res->wall_s = k3c_now() - t0;
    k3c_post_run_close(&s.r);
    if (s.has_ref) k3c_model_free_f32(&s.ref);
    return rc;
}
