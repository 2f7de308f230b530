/* trainer.c — the training loop: packed batches → forward/backward → clipping → Per-Head Muon + AdamW → QK-Clip →
 * balancing of every MoE router (quantile balancing, or an experiment arm) → metrics, validation, checkpoints; stages
 * change context length, schedule and mixture. Spec: docs/TRAINING.md §1–§2 and "Arms", docs/MODEL.md §7.2 (QB after
 * the optimizer step), §10.
 *
 * Every step op runs through the model's backend table (ops/backend.h), the same code on the CPU and a device. The host
 * waits for the device twice per step: for the loss (end of the forward) and the gradient norm (it decides the clip and
 * is logged); after QB it downloads the step's telemetry (the MoE layers' routed expert ids and the QK-Clip count, one
 * contiguous range of the step statistics) for the load metrics. Under mpirun the step is split by parallel/ (dp.h, ep.h,
 * pp.h; docs/PARALLEL.md). */
#include "base/check.h"
#include "base/json.h"
#include "parallel/cp.h"
#include "parallel/dp.h"
#include "parallel/ep.h"
#include "parallel/pp.h"
#include "parallel/tp.h"
#include "ops/backend.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/guard.h"
#include "train/metrics.h"
#include "train/schedule.h"
#include "train/step_tail.h"
#include "tok/tok.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const k3c_run_config *rc;
    k3c_model m;
    k3c_optim opt;
    const k3c_backend_f32 *be; /* the model's backend, once it has moved there */
    float *ostate;             /* optimizer state in the backend's memory */
    void *opt_inst;            /* the backend's optimizer instance (optim_open) */
    char resume_dir[4200];     /* the checkpoint whose optimizer state optim_state loads ("": none) */
    k3c_step_stats stats;      /* what each forward records for QK-Clip, QB and telemetry */
    unsigned char *telemetry;  /* host copy of stats' telemetry range */
    k3c_arena arena;
    size_t arena_cap;
    k3c_loader *loader;
    k3c_batch batch;    /* the loader's buffers for one step */
    k3c_step_tail tail; /* clip, guard, optimizer, QK-Clip, balancing over the model's parameters */
    k3c_tail_parallel tail_par;
    int64_t step, tokens; /* completed optimizer steps, tokens consumed */
    FILE *metrics;
    int n_mla;
    int moe_layer[K3C_MAX_LAYERS]; /* per-layer load telemetry of the last step */
    double layer_ratio[K3C_MAX_LAYERS], layer_cv[K3C_MAX_LAYERS];
    int n_moe;
    k3c_dp *dp; /* data parallelism over opts->comm (parallel/dp.h); NULL: this process alone */
    k3c_dp dp_store;
    k3c_comm *ep_comm; /* expert parallelism (parallel/ep.h): the EP group; NULL: every rank holds every expert */
    k3c_ep ep;
    int ep_rank, ep_size; /* this rank's place in its EP group (it holds experts ep_rank·E/ep_size onwards) */
    k3c_comm *x_comm;     /* ep_size > 1: the ranks holding this rank's experts (one per DP replica), ZeRO-1's group
                             for them */
    k3c_pp *pp; /* pipeline parallelism (parallel/pp.h) over pp_comm, dp over the stage's stage_comm; NULL: one stage */
    k3c_pp pp_store;
    k3c_comm *pp_comm, *stage_comm;
    k3c_comm *tp_comm; /* tensor parallelism (parallel/tp.h): the TP group; NULL: every rank computes whole layers */
    k3c_tp tp;
    k3c_comm *t_comm;            /* tp: the ranks of the DP group with this TP rank (ZeRO-1's group for its shares) */
    k3c_param_table whole_table; /* tp: the table of whole tensors and its state layout (checkpoints hold them) */
    k3c_optim whole_layout;
    k3c_comm *cp_comm;  /* context parallelism (parallel/cp.h): the CP group; NULL: every rank holds whole sequences */
    k3c_comm *own_comm; /* parallel.force without the caller's communicator: the one-rank one (owned) */
    k3c_cp cp;
    int rank;        /* in the world: rank 0 writes metrics, each rank its part of the checkpoints */
    k3c_comm *world; /* the parallel step's communicator (not owned); NULL: this process alone */
    k3c_guard guard;
    int64_t attempts; /* batches tried in this invocation (the test fault hook counts them) */
    FILE *log;       /* where events are noted for the user (the per-step log, else the progress stream; may be NULL) */
    char note[8400]; /* how --resume started, when not from the latest checkpoint */
    char skip[256];  /* why the guard refused the last batch, "" when it did not */
} trainer;

static int stage_of(const k3c_run_config *rc, int64_t step, int64_t *stage_step) {
    int64_t s = step;
    for (int i = 0; i < rc->n_stages; i++) {
        if (s < rc->stage[i].steps) {
            *stage_step = s;
            return i;
        }
        s -= rc->stage[i].steps;
    }
    *stage_step = s;
    return rc->n_stages;
}

static int64_t total_steps(const k3c_run_config *rc) {
    int64_t n = 0;
    for (int i = 0; i < rc->n_stages; i++) n += rc->stage[i].steps;
    return n;
}

static int ensure_arena(trainer *tr, int64_t T, int n_docs, k3c_err *err);

/* The next training (or validation) batch of the stage's shape, as the model's input. */
static int next_batch(trainer *tr, const k3c_stage *st, int val, k3c_val_iter *it, k3c_model_batch *mb, k3c_err *err) {
    if (tr->batch.T != st->tokens_per_step) {
        k3c_batch_free(&tr->batch);
        int e = k3c_batch_alloc(&tr->batch, st->tokens_per_step, err);
        if (e) return e;
    }
    int e = val ? k3c_loader_val_next(tr->loader, it, st->seq_len, &tr->batch, err)
                : k3c_loader_next(tr->loader, st->seq_len, &tr->batch, err);
    if (e) return e;
    k3c_batch *b = &tr->batch;
    *mb = (k3c_model_batch){b->T, b->n_docs, b->ids, b->cu_seqlens, b->targets, 0, 0, NULL, NULL, NULL, NULL};
    if (tr->dp && !val && /* this rank's share: whole pieces, or a range of them (context parallelism; with pipeline
                             stages its group's part, each micro-batch cut into ranges by k3c_pp_step) */
        (e = !tr->cp_comm ? k3c_dp_split_batch(tr->dp, mb, err)
             : tr->pp     ? k3c_cp_part(&tr->cp, tr->dp, mb, err)
                          : k3c_cp_split_batch(&tr->cp, tr->dp, mb, err)))
        return e;
    tr->m.context = tr->cp_comm && !val ? &tr->cp.exchange : NULL; /* validation batches run whole on every rank */
    return ensure_arena(tr, mb->T, mb->n_docs, err);
}

/* The step statistics and the activation arena for a batch of T tokens. */
static int ensure_arena(trainer *tr, int64_t T, int n_docs, k3c_err *err) {
    if (T > tr->stats.cap_T) {
        k3c_step_stats_free_f32(&tr->m, &tr->stats);
        free(tr->telemetry);
        tr->telemetry = NULL;
        CHECK_RC(k3c_step_stats_init_f32(&tr->m, T, &tr->stats, err));
        tr->telemetry = malloc(tr->stats.telemetry_bytes);
        if (!tr->telemetry) return k3c_errf(err, K3C_ENOMEM, "trainer: out of memory");
        tr->m.stats = &tr->stats;
    }
    size_t need = tr->pp ? k3c_model_plan_bytes_range_f32(&tr->m, T, n_docs, tr->pp->l0, tr->pp->l1) /* its stage */
                         : k3c_model_plan_bytes_f32(&tr->m, T, n_docs);
    if (need <= tr->arena_cap) return K3C_OK;
    k3c_model_arena_free_f32(&tr->m, &tr->arena);
    tr->arena_cap = need + need / 4;
    return k3c_model_arena_init_f32(&tr->m, tr->arena_cap, &tr->arena, err);
}

/* Router load statistics of the last forward (per MoE layer, and the worst layer) from the downloaded telemetry: the
 * host computes the per-expert counts from the routed ids (T·k words per layer, small next to the step). */
static int load_telemetry(trainer *tr, k3c_metrics_row *row, k3c_err *err) {
    const k3c_config *c = &tr->m.cfg;
    double *max_ratio = &row->max_load_ratio, *cv = &row->load_cv, entropy = 0;
    *max_ratio = NAN;
    *cv = NAN;
    row->dead_experts = 0;
    row->load_entropy = NAN;
    CHECK_RC(tr->be->download(tr->telemetry, tr->stats.mem, tr->stats.telemetry_bytes, err));
    int64_t *loads = malloc(sizeof(int64_t) * (size_t)(c->num_experts > 0 ? c->num_experts : 1));
    tr->n_moe = 0;
    for (int l = 0; loads && l < c->num_layers; l++) {
        const k3c_route_stats *r = &tr->stats.route[l];
        k3c_load_stats st;
        if (c->ffn[l] != K3C_FFN_MOE || r->T == 0) continue;
        const int32_t *ids = (const int32_t *)(tr->telemetry + ((char *)r->topk_ids - (char *)tr->stats.mem));
        if (k3c_moe_load_stats(ids, NULL, r->T, r->k, r->n, loads, &st, NULL)) continue;
        tr->moe_layer[tr->n_moe] = l;
        tr->layer_ratio[tr->n_moe] = st.max_over_mean;
        tr->layer_cv[tr->n_moe++] = st.cv;
        if (!(st.max_over_mean <= *max_ratio)) *max_ratio = st.max_over_mean;
        if (!(st.cv <= *cv)) *cv = st.cv;
        /* experts no token reached, and the entropy of the load shares over log n (1 = perfectly even) */
        for (int64_t e = 0; e < r->n; e++) {
            row->dead_experts += loads[e] == 0;
            double p = st.routes > 0 ? (double)loads[e] / (double)st.routes : 0;
            if (p > 0 && r->n > 1) entropy -= p * log(p) / log((double)r->n);
        }
    }
    if (tr->n_moe > 0) row->load_entropy = entropy / tr->n_moe;
    free(loads);
    return K3C_OK;
}

/* The guard's test fault hook, for tests only: K3C_TEST_FAULT="loss:FROM:COUNT" (or "grad:FROM:COUNT") gives batches
 * FROM .. FROM+COUNT-1 of this invocation (counted from 1 over every batch tried, skipped ones included) a NaN loss (or a
 * NaN in one gradient element, written through the backend table after the backward). Returns 1 (loss), 2 (grad) or 0. */
static int test_fault(trainer *tr) {
    int64_t a = ++tr->attempts;
    const char *f = getenv("K3C_TEST_FAULT");
    long long from, count;
    char kind[8];
    if (!f || sscanf(f, "%7[a-z]:%lld:%lld", kind, &from, &count) != 3 || a < from || a >= from + count) return 0;
    return strcmp(kind, "loss") == 0 ? 1 : strcmp(kind, "grad") == 0 ? 2 : 0;
}

/* One optimizer step on the next batch; a batch the guard refuses leaves tr->skip set and the weights, the optimizer
 * state, the router biases and the step count as they were. */
static int train_step(trainer *tr, const k3c_stage *st, int64_t stage_step, k3c_metrics_row *row, k3c_err *err) {
    const k3c_run_config *rc = tr->rc;
    k3c_model_batch b;
    int e = next_batch(tr, st, 0, NULL, &b, err);
    if (e) return e;
    const k3c_backend_f32 *be = tr->be;
    if ((e = be->zero(tr->m.g, (int64_t)tr->m.table.total, err))) return e; /* where the backward adds */
    k3c_arena_reset(&tr->arena, 0);
    k3c_acts *acts;
    double loss;
    /* data parallelism: each layer's gradient sum starts as soon as the backward completes it (tensor parallelism's
       replicated entries counted once per layer first); k3c_dp_grads_finish completes the sum */
    if (tr->dp && (e = k3c_dp_grads_begin(tr->dp, &tr->m, tr->tp_comm ? &tr->tp : NULL, err))) return e;
    if (tr->pp) { /* the stages' 1F1B over micro-batches: forward and backward together */
        if ((e = k3c_pp_step(tr->pp, &tr->m, &b, &tr->arena, 1, &loss, err))) return e;
        if (tr->cp_comm && (e = k3c_dp_local_tokens(tr->dp, tr->dp->replica ? 0 : tr->pp->T_local, err)))
            return e; /* its ranges (a TP group's once) */
    } else if ((e = k3c_model_forward_f32(&tr->m, &b, &tr->arena, &acts, &loss, NULL, err))) {
        return e;
    }
    if (tr->dp && (e = k3c_dp_sum(tr->dp, &loss, err))) return e; /* the ranks' shares of the global mean */
    /* every rank sees the same loss and (after the reduction) the same gradient norm, so all judge alike */
    const int fault = test_fault(tr);
    tr->skip[0] = 0;
    if (fault == 1) loss = NAN;
    row->loss = loss;
    row->grad_norm = NAN;
    if (k3c_guard_judge(&tr->guard, rc, loss, 0, tr->skip, sizeof tr->skip)) /* before the backward */
        return tr->dp ? k3c_dp_grads_finish(tr->dp, &tr->m, err) : K3C_OK; /* what is in flight (pp), then discarded */
    if (!tr->pp && (e = k3c_model_backward_f32(&tr->m, acts, 1.0, err))) return e;
    if (fault == 2) {
        const float nan = NAN;
        if ((e = be->upload(tr->m.g, &nan, sizeof nan, err))) return e;
    }
    if (tr->dp && (e = k3c_dp_grads_finish(tr->dp, &tr->m, err))) return e; /* the embedding's, then wait for all */
    k3c_schedule sch = {st->schedule, st->lr, st->warmup, st->steps, st->min_lr_ratio};
    const double lr = k3c_schedule_lr(&sch, stage_step + 1) * tr->guard.lr_scale; /* schedules count steps from 1 */
    const k3c_tail_config tc = {rc->grad_clip, rc->qk_clip_tau, rc->balancing, rc->qb_mode, rc->bias_gamma};
    k3c_tail_result tres;
    if ((e = k3c_step_tail_run(&tr->tail, &tc, &lr, tr->step + 1, &tres, err))) return e;
    row->grad_norm = tres.grad_norm[0];
    if (tres.skipped) { /* the guard's second look: the gradient norm */
        snprintf(tr->skip, sizeof tr->skip, "%s", tres.why);
        return K3C_OK;
    }
    k3c_guard_accept(&tr->guard, rc, loss);
    row->lr = lr;
    const int clip = tr->n_mla && rc->qk_clip_tau > 0; /* qk_clip_tau 0: QK-Clip off (an experiment arm) */
    if ((e = load_telemetry(tr, row, err))) return e;
    row->qk_clipped = 0;
    if (clip) {
        int32_t n;
        memcpy(&n, tr->telemetry + ((char *)tr->stats.qk_clipped - (char *)tr->stats.mem), sizeof n);
        if (tr->pp && (e = k3c_comm_allreduce(tr->pp_comm, &n, &n, 1, K3C_I32, K3C_COMM_SUM, NULL, err))) return e;
        if (tr->tp_comm && (e = k3c_comm_allreduce(tr->tp_comm, &n, &n, 1, K3C_I32, K3C_COMM_SUM, NULL, err)))
            return e; /* each TP rank clips its own heads */
        if (n < 0) return k3c_errf(err, K3C_ENUMERIC, "step %lld: QK-Clip: non-finite S_max", (long long)tr->step + 1);
        row->qk_clipped = n;
    }
    tr->step++;
    tr->tokens += b.T;
    return K3C_OK;
}

static int validate(trainer *tr, const k3c_stage *st, double *val, k3c_err *err) {
    double sum = 0;
    int64_t n = 0;
    k3c_val_iter it;
    k3c_loader_val_begin(tr->loader, -1, &it);
    for (int64_t i = 0; i < tr->rc->eval_batches; i++) {
        k3c_model_batch b;
        int e = next_batch(tr, st, 1, &it, &b, err);
        if (e == K3C_ENOTFOUND) {
            *val = NAN;
            return K3C_OK;
        } /* no validation split */
        if (e) return e;
        k3c_arena_reset(&tr->arena, 0);
        k3c_acts *acts;
        double loss;
        e = tr->pp ? k3c_pp_step(tr->pp, &tr->m, &b, &tr->arena, 0, &loss, err) /* through the stages */
                   : k3c_model_forward_f32(&tr->m, &b, &tr->arena, &acts, &loss, NULL, err);
        if (e) return e;
        sum += loss;
        n++;
    }
    *val = n ? sum / (double)n : NAN;
    return K3C_OK;
}

static int set_mixture(trainer *tr, int stage, k3c_err *err) {
    return stage < tr->rc->n_stages ? k3c_loader_set_weights(tr->loader, tr->rc->stage[stage].mixture, err) : K3C_OK;
}

/* Entropy (nats/token) of the unigram distribution of all training tokens: the loss of the best model that ignores
 * context, the baseline a trained model must beat. */
static double unigram_entropy(const k3c_loader *ld) {
    int64_t V = k3c_loader_vocab_size(ld), total = 0;
    int64_t *count = calloc((size_t)(V > 0 ? V : 1), sizeof *count);
    int32_t *buf = NULL;
    int64_t cap = 0;
    for (int i = 0; count && i < k3c_loader_n_sources(ld); i++) {
        const k3c_shard_set *set = k3c_loader_split(ld, i, 0);
        for (int64_t d = 0; set && d < set->n_docs; d++) {
            const k3c_shard *sh;
            int64_t local, n = k3c_shard_set_doc_len(set, d);
            if (n > cap) {
                free(buf);
                cap = n;
                buf = malloc(sizeof *buf * (size_t)cap);
                if (!buf) {
                    cap = 0;
                    break;
                }
            }
            k3c_shard_set_locate(set, d, &sh, &local);
            k3c_shard_copy(sh, local, 0, n, buf);
            for (int64_t t = 0; t < n; t++) count[buf[t]]++;
            total += n;
        }
    }
    double h = 0;
    for (int64_t v = 0; count && v < V; v++)
        if (count[v]) {
            double p = (double)count[v] / (double)total;
            h -= p * log(p);
        }
    free(count);
    free(buf);
    return total ? h : NAN;
}

/* trainer_state.json: step, tokens, seed, the loader's and the guard's state (the same text on every rank). */
static int trainer_state_json(trainer *tr, k3c_sbuf *sb, k3c_err *err) {
    char *ls = NULL;
    CHECK_RC(k3c_loader_state_to_json(tr->loader, &ls, err));
    k3c_sbuf_init(sb);
    k3c_sbuf_printf(sb, "{\"step\": %lld, \"tokens\": %lld, \"seed\": %llu, \"loader\": ", (long long)tr->step,
                    (long long)tr->tokens, (unsigned long long)tr->rc->seed);
    k3c_sbuf_json_string(sb, ls, strlen(ls));
    k3c_guard_to_json(&tr->guard, sb);
    k3c_sbuf_printf(sb, "}\n");
    free(ls);
    return sb->ok ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "checkpoint: out of memory");
}

/* The checkpoint's test fault hook, for tests only: K3C_TEST_FAULT="save:R" makes world rank R's write of its part of
 * a parallel checkpoint fail (a state size the writer refuses), so that the others must fail the save with it. */
static int save_fault(const trainer *tr) {
    const char *f = getenv("K3C_TEST_FAULT");
    int r;
    return f && sscanf(f, "save:%d", &r) == 1 && r == tr->rank;
}

/* Tensor parallelism: the checkpoint holds whole tensors, so any layout reads it. The weights: the writing rank's TP
 * group gathers every share of [w0, w1) to it (*w_host: the whole layout of tr->whole_table); the state: each TP group
 * gathers the shares it owns to its TP rank 0, which writes them whole (*out, *mine: the entries this rank writes,
 * in order). Every rank of a TP group gathers the same entries in the same order. */
static int tp_whole(trainer *tr, k3c_train_ckpt *ck, int gathers, const float *state, float **w_host, float **out,
                    uint8_t **mine, k3c_err *err) {
    const k3c_param_table *t = &tr->m.table, *W = &tr->whole_table;
    const int e0 = tr->pp ? tr->pp->e0 : 0, e1 = tr->pp ? tr->pp->e1 : t->n, first = tr->tp.rank == 0;
    size_t most = 1, n_out = 0;
    for (int i = 0; i < t->n; i++) { /* a share's state has at most 2 blocks (AdamW's m, v) */
        const size_t len = k3c_optim_entry_floats(&tr->opt, i);
        if ((size_t)t->p[i].numel * 2 > most) most = (size_t)t->p[i].numel * 2;
        if (tr->dp->mine[i] && (first || !t->p[i].tp_share))
            n_out += t->p[i].numel ? len / (size_t)t->p[i].numel * (size_t)W->p[i].numel : 0;
    }
    float *tmp = malloc(sizeof(float) * most);
    *mine = calloc((size_t)t->n + 1, 1);
    *out = malloc(sizeof(float) * (n_out + 1));
    *w_host = ck->w0 < ck->w1
                  ? malloc(sizeof(float) * (W->p[e1 - 1].offset + (size_t)W->p[e1 - 1].numel - W->p[e0].offset + 1))
                  : NULL;
    int e = !tmp || !*mine || !*out || (ck->w0 < ck->w1 && !*w_host)
                ? k3c_errf(err, K3C_ENOMEM, "checkpoint: out of memory")
                : K3C_OK;
    k3c_err e2 = {0}; /* the group agrees on the room, so all of it gathers or none does */
    const int room = k3c_tp_gather_room(&tr->tp, most, e ? &e2 : err);
    if (!e) e = room;
    if (e) {
        free(tmp);
        return e;
    }
    for (int i = e0; gathers && !e && i < e1; i++) { /* the weights, to the writer (TP rank 0) */
        const k3c_param *p = &t->p[i];
        if (p->absent || (ck->w_experts_only && !p->stack) || (!p->tp_share && !*w_host)) continue;
        float *dst = *w_host ? *w_host + (W->p[i].offset - W->p[e0].offset) : NULL;
        e = tr->be->download(p->tp_share ? tmp : dst, (const float *)tr->m.w + p->offset,
                             sizeof(float) * (size_t)p->numel, err);
        if (!e && p->tp_share) e = k3c_tp_gather_entry(&tr->tp, p, tmp, 1, dst, err);
    }
    size_t at = 0;
    for (int i = 0; !e && i < t->n; i++) { /* the state of this rank's entries */
        const k3c_param *p = &t->p[i];
        if (!tr->dp->mine[i]) continue;
        const size_t len = k3c_optim_entry_floats(&tr->opt, i);
        const size_t blocks = p->numel ? len / (size_t)p->numel : 0;
        (*mine)[i] = (uint8_t)(first || !p->tp_share);
        if (p->tp_share)
            e = k3c_tp_gather_entry(&tr->tp, p, state + tr->dp->shard.state_off[i], (int64_t)blocks,
                                    first ? *out + at : NULL, err);
        else
            memcpy(*out + at, state + tr->dp->shard.state_off[i], sizeof(float) * len);
        at += (*mine)[i] ? blocks * (size_t)W->p[i].numel : 0;
    }
    free(tmp);
    ck->table = W, ck->opt = &tr->whole_layout, ck->mine = *mine;
    ck->w_host = *w_host, ck->optim_state = *out, ck->optim_numel = n_out;
    return e;
}

/* Every rank writes its part (docs/PARALLEL.md "Checkpoints"): its ZeRO-1 state shard; the weights from rank 0, or
 * with pipeline parallelism from each stage's first rank (its stage's entries); one process the single-file layout.
 * Tensor parallelism writes whole tensors (tp_whole). */
static int save(trainer *tr, k3c_err *err) {
    const k3c_optim *o = tr->dp ? &tr->dp->shard : &tr->opt;
    float *state = malloc(sizeof(float) * (o->state_numel ? o->state_numel : 1)), *w_host = NULL, *whole = NULL;
    uint8_t *mine = NULL;
    if (!state) return k3c_errf(err, K3C_ENOMEM, "checkpoint: out of memory");
    k3c_sbuf sb = {0};
    int e = tr->be->download(state, tr->ostate, sizeof(float) * o->state_numel, err); /* after the ops */
    if (!e) e = trainer_state_json(tr, &sb, err);
    if (!e) {
        k3c_train_ckpt ck = {.model = &tr->m,
                             .optim_state = state,
                             .optim_numel = o->state_numel,
                             .trainer_state = sb.buf,
                             .vocab = tr->rc->vocab,
                             .pattern = tr->rc->pattern};
        if (tr->dp) { /* sharded: this rank's entries; the weights from the first DP replica's ranks, one file per
                         pipeline stage and EP rank (the EP rank 0 with the stage's every entry, the others their
                         experts) */
            const int stage = tr->pp ? tr->pp->stage : 0, stages = tr->pp ? tr->pp->stages : 1;
            const k3c_comm *first = tr->x_comm ? tr->x_comm : tr->pp ? tr->stage_comm : tr->world;
            const int writes = first->rank == 0;
            ck.comm = tr->world, ck.opt = &tr->opt, ck.mine = tr->dp->mine;
            ck.w0 = !writes ? 0 : tr->pp ? tr->pp->e0 : 0;
            ck.w1 = !writes ? 0 : tr->pp ? tr->pp->e1 : tr->m.table.n;
            ck.w_part = stage * tr->ep_size + (tr->x_comm ? tr->ep_rank : 0);
            ck.w_parts = stages * tr->ep_size;
            ck.w_experts_only = tr->x_comm && tr->ep_rank > 0;
            if (tr->tp_comm) /* the writer's TP group: the first tp ranks of `first` */
                ck.failed = tp_whole(tr, &ck, first->rank < tr->tp.size, state, &w_host, &whole, &mine, err);
            ck.optim_numel += (size_t)save_fault(tr);
        }
        e = k3c_train_ckpt_save(tr->rc->out_dir, tr->step, &ck, (int)tr->rc->keep_checkpoints, err);
    }
    k3c_sbuf_free(&sb);
    free(state);
    free(w_host);
    free(whole);
    free(mine);
    return e;
}

/* metrics.jsonl after a resume: keep the rows up to the checkpoint's step (a crash may have logged later ones). */
static int truncate_metrics(const char *path, int64_t step, k3c_err *err) {
    char *text;
    size_t n;
    if (k3c_read_file(path, &text, &n, NULL)) return K3C_OK; /* no metrics yet */
    k3c_sbuf out;
    k3c_sbuf_init(&out);
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        long long st;
        if (sscanf(line, "{\"step\":%lld", &st) == 1 && st <= step) {
            k3c_sbuf_append(&out, line, strlen(line));
            k3c_sbuf_append(&out, "\n", 1);
        }
    }
    free(text);
    int e = out.ok ? k3c_write_file_atomic(path, out.buf ? out.buf : "", out.len, err)
                   : k3c_errf(err, K3C_ENOMEM, "%s", path);
    k3c_sbuf_free(&out);
    return e;
}

/* The tokenizer the run names must load and agree with the data's vocabulary (checked before the first step, not at
 * the first checkpoint). */
static int check_tokenizer(const k3c_run_config *rc, int64_t data_vocab, k3c_err *err) {
    k3c_tok_pattern pat;
    if (k3c_tok_pattern_parse(rc->pattern, &pat))
        return k3c_errf(err, K3C_ECONFIG, "%s: pattern: '%s' is not cl100k or kimi", rc->path, rc->pattern);
    k3c_tok *tok;
    if (k3c_tok_load_with_specials(rc->vocab, pat, 0, &tok, err)) return k3c_err_wrap(err, "%s: tokenizer", rc->path);
    int64_t nv = k3c_tok_n_vocab(tok);
    k3c_tok_free(tok);
    if (nv != data_vocab)
        return k3c_errf(err, K3C_ECONFIG, "%s: tokenizer %s has %lld ids but the data was encoded with %lld", rc->path,
                        rc->vocab, (long long)nv, (long long)data_vocab);
    return K3C_OK;
}

/* The optimizer state of checkpoint `dir` into tr->ostate: the whole state, or under ZeRO-1 this rank's entries only,
 * read from whichever files of the checkpoint hold them (any layout wrote it). */
static int load_optim_state(trainer *tr, const char *dir, k3c_err *err) {
    const k3c_optim *o = tr->dp ? &tr->dp->shard : &tr->opt;
    float *host = malloc(sizeof(float) * (o->state_numel ? o->state_numel : 1));
    if (!host) return k3c_errf(err, K3C_ENOMEM, "resume: out of memory");
    int e = k3c_train_ckpt_load_state(dir, &tr->m.table, &tr->opt, tr->dp ? tr->dp->mine : NULL, host, NULL, err);
    if (!e) e = tr->be->upload(tr->ostate, host, sizeof(float) * o->state_numel, err);
    if (!e) e = tr->be->sync(err); /* the host copy is freed next */
    free(host);
    return e;
}

/* The model of checkpoint `dir` on the host, holding the part of it the run's model holds (its experts and layers,
 * from whichever of its files have them; a held tensor no file has is an error naming it). */
static int open_held(trainer *tr, const char *dir, k3c_model *host, k3c_err *err) {
    k3c_config cfg;
    k3c_checkpoint *ck = NULL;
    CHECK_RC(k3c_config_load(dir, &cfg, err));
    CHECK_RC(k3c_ckpt_open(dir, &ck, err));
    int e = k3c_model_create_resident_f32(&cfg, 0, &tr->m.table.res, host, err);
    if (!e && (e = k3c_model_load_f32(host, ck, err))) {
        k3c_model_free_f32(host);
        k3c_err_wrap(err, "%s (model.safetensors or the files model.safetensors.index.json names)", dir);
    }
    k3c_ckpt_close(ck);
    return e;
}

/* Loads checkpoint `dir` into the run: the weights through the model's backend (read into a host model, then uploaded),
 * the optimizer state (now when the run's state already lives on the backend, else read by optim_state once this rank's
 * entries are known), step, tokens, the loader and the guard. Used by --resume before the model moves and by a
 * rollback after. */
static int resume_from(trainer *tr, const char *dir, k3c_err *err) {
    k3c_model host;
    int e = open_held(tr, dir, &host, err); /* verifies the directory's checksums.json first */
    if (e) return e;
    const k3c_backend_f32 *be = k3c_model_backend_f32(&tr->m);
    if (host.table.total != tr->m.table.total)
        e = k3c_errf(err, K3C_EFORMAT, "%s: holds %zu parameters but the run's model has %zu", dir, host.table.total,
                     tr->m.table.total);
    if (!e) e = be->upload(tr->m.w, host.w, sizeof(float) * host.table.total, err);
    if (!e) e = be->sync(err); /* the host copy is freed next */
    k3c_model_free_f32(&host);
    char *state = NULL, p[4300];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    /* the optimizer state: now on a rollback; at start once optim_state knows this rank's shard (its files checked
       now, so that a checkpoint without them falls back to an older one) */
    float none;
    uint8_t *no = e || tr->ostate ? NULL : calloc((size_t)tr->m.table.n + 1, 1); /* the files only, no entry */
    if (!e && !tr->ostate && !no) e = k3c_errf(err, K3C_ENOMEM, "resume: out of memory");
    if (!e)
        e = tr->ostate ? load_optim_state(tr, dir, err)
                       : k3c_train_ckpt_load_state(dir, &tr->m.table, &tr->opt, no, &none, NULL, err);
    free(no);
    if (!e) snprintf(tr->resume_dir, sizeof tr->resume_dir, "%s", tr->ostate ? "" : dir);
    if (!e) e = k3c_read_file(p, &state, NULL, err);
    if (e) {
        free(state);
        return k3c_err_wrap(err, "resume from %s", dir);
    }
    k3c_json *j = NULL;
    e = k3c_json_parse(state, strlen(state), "trainer_state.json", &j, err);
    free(state);
    if (e) return e;
    const k3c_json *s = k3c_json_get(j, "step"), *t = k3c_json_get(j, "tokens"), *l = k3c_json_get(j, "loader");
    if (!s || !s->is_integer || !t || !t->is_integer || !l || l->type != K3C_JSON_STRING)
        e = k3c_errf(err, K3C_EFORMAT, "%s/trainer_state.json: needs integer step, tokens and a loader state", dir);
    if (!e) {
        tr->step = s->integer;
        tr->tokens = t->integer;
        e = k3c_loader_state_from_json(tr->loader, l->string, l->len, err);
    }
    if (!e) e = k3c_guard_from_json(&tr->guard, j, dir, err);
    k3c_json_free(j);
    return e;
}

/* The first of the checkpoints steps[0..n) that loads and passes its checksums; a fallback is noted in tr->note. */
static int load_newest(trainer *tr, const int64_t *steps, int n, k3c_err *err) {
    const char *out = tr->rc->out_dir;
    k3c_err first = {0};
    for (int i = 0; i < n; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/step_%08lld", out, (long long)steps[i]);
        k3c_err e1 = {0};
        int e = resume_from(tr, dir, &e1);
        if (!e) {
            if (i) snprintf(tr->note, sizeof tr->note, "resumed from %s: %s", dir, first.msg);
            return K3C_OK;
        }
        if (!i) first = e1;
        if (tr->log) fprintf(tr->log, "resume: %s; trying an older checkpoint\n", e1.msg);
    }
    *err = first;
    return k3c_err_wrap(err, "resume: no checkpoint in %s loads", out);
}

/* --resume: from the newest checkpoint that loads and passes its checksums, falling back to older ones (each fallback
 * is noted in tr->note for metrics.jsonl); with no checkpoint yet, from step 0. Stale temporaries are removed first. */
static int resume(trainer *tr, k3c_err *err) {
    const char *out = tr->rc->out_dir;
    int64_t steps[64];
    k3c_train_ckpt_clean(out);
    int n = k3c_train_ckpt_candidates(out, steps, 64, err);
    if (n < 0) return n;
    if (n == 0) {
        snprintf(tr->note, sizeof tr->note, "no checkpoint in %s yet: starting from step 0", out);
        return K3C_OK;
    }
    return load_newest(tr, steps, n, err);
}

/* The optimizer's state next to w and g in the backend's memory (zero = step 0, or the resumed state) and its
 * backend instance. */
static int optim_state(trainer *tr, k3c_comm *comm, const k3c_parallel *lay, k3c_err *err) {
    tr->be = k3c_model_backend_f32(&tr->m);
    int64_t ep = lay->ep;
    /* EP groups: ep consecutive ranks (EP inside DP), or every tp-th or cp-th (TP or CP innermost,
       docs/PARALLEL.md); with parallel.force even groups of one rank. The ranks holding the same experts (one per
       DP replica and TP rank) own and sum those experts' entries among themselves (ZeRO-1 over them), the other
       entries over every rank. */
    if (comm && (ep > 1 || tr->rc->parallel_force)) {
        int ep_rank, color;
        k3c_ep_place(comm->rank, (int)ep, (int)(lay->tp * lay->cp), &ep_rank, &color);
        CHECK_RC(k3c_comm_split(comm, color, comm->rank, &tr->ep_comm, err));
        if (tr->ep_comm->rank != tr->ep_rank)
            return k3c_errf(err, K3C_EINVAL, "expert parallelism: rank %d is EP rank %d, expected %d", comm->rank,
                            tr->ep_comm->rank, tr->ep_rank);
        CHECK_RC(k3c_ep_init(&tr->ep, tr->ep_comm, tr->be, &tr->m.cfg, err));
        tr->ep.resident = ep > 1;
        tr->m.experts = &tr->ep.exchange;
    }
    k3c_comm *group = comm; /* the DP group: every rank, or a stage's */
    int e0 = 0, e1 = tr->m.table.n;
    if (comm && lay->pp > 1) { /* stages outermost: stage = rank / (dp·ep), DP with ZeRO-1 and EP inside a stage */
        const int per = comm->size / (int)lay->pp;
        CHECK_RC(k3c_comm_split(comm, comm->rank / per, comm->rank, &tr->stage_comm, err));
        CHECK_RC(k3c_comm_split(comm, comm->rank % per, comm->rank, &tr->pp_comm, err));
        CHECK_RC(
            k3c_pp_init(&tr->pp_store, tr->pp_comm, &tr->m.cfg, &tr->m.table, (int)lay->micro_batches, tr->be, err));
        tr->pp = &tr->pp_store;
        group = tr->stage_comm, e0 = tr->pp->e0, e1 = tr->pp->e1;
    }
    if (lay->tp > 1) { /* TP groups: tp consecutive ranks (TP innermost, docs/PARALLEL.md), one part of the batch */
        CHECK_RC(k3c_comm_split(comm, comm->rank / (int)lay->tp, comm->rank, &tr->tp_comm, err));
        CHECK_RC(k3c_comm_split(group, group->rank % (int)lay->tp, group->rank, &tr->t_comm, err));
        CHECK_RC(k3c_tp_init(&tr->tp, tr->tp_comm, tr->be, &tr->m.cfg, &tr->m.table, err));
        tr->m.tp = &tr->tp.hook;
    }
    if (comm) {
        if (ep > 1) CHECK_RC(k3c_comm_split(group, tr->ep_rank, group->rank, &tr->x_comm, err));
        const k3c_dp_groups g = {group, tr->x_comm, tr->t_comm, tr->tp_comm};
        CHECK_RC(k3c_dp_init_groups(&tr->dp_store, &g, tr->be, &tr->opt, &tr->m.table, e0, e1, err));
        tr->dp = &tr->dp_store;
    }
    if (lay->cp > 1) { /* CP groups: cp consecutive ranks (every tp-th with TP innermost), each a range of its DP
                          part's tokens */
        int64_t T_cap = 0;
        for (int i = 0; i < tr->rc->n_stages; i++)
            if (tr->rc->stage[i].tokens_per_step > T_cap) T_cap = tr->rc->stage[i].tokens_per_step;
        const int tp = (int)lay->tp, tc = tp * (int)lay->cp;
        CHECK_RC(k3c_comm_split(comm, comm->rank / tc * tp + comm->rank % tp, comm->rank, &tr->cp_comm, err));
        CHECK_RC(k3c_cp_init(&tr->cp, tr->cp_comm, &tr->m, T_cap, err));
        if (tr->pp) tr->pp->cp = &tr->cp; /* CP inside the stages: each micro-batch cut into ranges */
    }
    const k3c_optim *o = tr->dp ? &tr->dp->shard : &tr->opt; /* ZeRO-1: this rank's shard of the state */
    const size_t n_state = o->state_numel ? o->state_numel : 1;
    tr->ostate = tr->be->alloc(sizeof(float) * n_state);
    if (!tr->ostate) return k3c_errf(err, K3C_ENOMEM, "trainer: cannot allocate the optimizer state");
    CHECK_RC(tr->be->zero(tr->ostate, (int64_t)n_state, err));
    if (tr->resume_dir[0] && load_optim_state(tr, tr->resume_dir, err)) /* this rank's entries */
        return k3c_err_wrap(err, "resume from %s", tr->resume_dir);
    CHECK_RC(tr->be->optim_open(tr->be->ctx, o, &tr->m.table, &tr->opt_inst, err));
    tr->tail_par = (k3c_tail_parallel){tr->dp, tr->pp ? tr->pp_comm : NULL, tr->tp_comm ? &tr->tp : NULL};
    tr->tail.m = &tr->m;
    tr->tail.group[0] = (k3c_param_group){&tr->m.table, &tr->opt, tr->opt_inst, tr->m.w, tr->m.g, tr->ostate};
    tr->tail.n_groups = 1;
    tr->tail.par = &tr->tail_par;
    return K3C_OK;
}

static int setup(trainer *tr, const k3c_run_config *rc, const k3c_train_opts *o, k3c_err *err) {
    memset(tr, 0, sizeof *tr);
    tr->rc = rc;
    k3c_guard_init(&tr->guard);
    if (rc->threads > 0) k3c_set_num_threads(rc->threads);
    if (mkdir(rc->out_dir, 0755) != 0 && errno != EEXIST)
        return k3c_errf(err, K3C_EIO, "%s: cannot create: %s", rc->out_dir, strerror(errno));
    k3c_config cfg;
    int e = k3c_config_load(rc->model_config, &cfg, err);
    if (e) return e;
    k3c_comm *comm = o->comm;
    k3c_parallel lay; /* the "parallel" block against the ranks there are (one without a communicator) */
    if ((e = k3c_parallel_resolve(&rc->parallel, &cfg, comm ? comm->size : 1, rc->path, &lay, err))) return e;
    /* expert parallelism: this rank holds its EP group's share of the routed experts only (EP groups: optim_state) */
    tr->ep_size = comm && lay.ep > 1 ? (int)lay.ep : 1;
    int color;
    if (tr->ep_size > 1) k3c_ep_place(comm->rank, tr->ep_size, (int)(lay.tp * lay.cp), &tr->ep_rank, &color);
    k3c_residency res = k3c_residency_whole(&cfg); /* and a pipeline stage its layers (docs/PARALLEL.md "Residency") */
    if (tr->ep_size > 1) k3c_ep_experts(&cfg, tr->ep_rank, tr->ep_size, &res.expert0, &res.experts);
    if (comm && lay.pp > 1) /* stages outermost (optim_state) */
        k3c_pp_layers(&cfg, comm->rank / (comm->size / (int)lay.pp), (int)lay.pp, &res.layer0, &res.layer1);
    if (comm && lay.tp > 1) { /* TP innermost: its shares of the split tensors, and the whole ones' inventory */
        if ((e = k3c_params_build_resident(&cfg, &res, &tr->whole_table, err))) return e;
        res.tp_rank = comm->rank % (int)lay.tp, res.tp_size = (int)lay.tp;
    }
    if ((e = k3c_model_create_resident_f32(&cfg, 1, &res, &tr->m, err))) return e;
    if (lay.dp * lay.ep * lay.tp * lay.pp * lay.cp == 1 && !rc->parallel_force) comm = NULL; /* alone */
    if (rc->parallel_force && !comm) { /* the parallel step over the one-rank communicator (parallel.force) */
        if ((e = k3c_comm_self(&tr->own_comm, err))) return e;
        comm = tr->own_comm;
    }
    if (lay.cp > 1 && rc->recompute)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: recompute with parallel.cp = %lld is not built yet", rc->path,
                        (long long)lay.cp);
    for (int i = 0; lay.cp > 1 && i < rc->n_stages; i++) /* each rank an equal range of every sequence */
        if (rc->stage[i].seq_len % lay.cp || rc->stage[i].tokens_per_step % lay.cp)
            return k3c_errf(err, K3C_ECONFIG,
                            "%s: parallel.cp = %lld does not divide stage %d (%s): seq_len %lld, tokens_per_step %lld",
                            rc->path, (long long)lay.cp, i, rc->stage[i].name, (long long)rc->stage[i].seq_len,
                            (long long)rc->stage[i].tokens_per_step);
    tr->rank = comm ? comm->rank : 0;
    tr->world = comm;
    if (rc->balancing == K3C_BALANCE_AUX &&
        comm) /* its f_e and P_e would be one rank's, its gradient summed over all */
        return k3c_errf(err, K3C_EUNSUPPORTED,
                        "%s: balancing \"aux\" with the parallel step (a \"parallel\" block or several ranks) is not "
                        "built yet",
                        rc->path);
    tr->m.aux_loss_alpha = rc->balancing == K3C_BALANCE_AUX ? rc->aux_alpha : 0;
    tr->m.kda_chunk = rc->kda_chunk;
    for (int l = 0; l < cfg.num_layers; l++) tr->m.recompute[l] = (uint8_t)rc->recompute;
    tr->m.recompute_slice = rc->recompute_slice;
    if (rc->recompute_slice > 0 && (lay.tp > 1 || lay.ep > 1))
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: recompute_slice with parallel.%s = %lld is not built yet", rc->path,
                        lay.tp > 1 ? "tp" : "ep", (long long)(lay.tp > 1 ? lay.tp : lay.ep));
    tr->m.head_chunk = rc->head_chunk;
    if (rc->head_chunk > 0 && lay.tp > 1)
        return k3c_errf(err, K3C_EUNSUPPORTED, "%s: head_chunk with parallel.tp = %lld is not built yet", rc->path,
                        (long long)lay.tp);
    if (rc->recompute_slice > 0 && (rc->recompute_slice < cfg.conv_kernel - 1 || tr->m.aux_loss_alpha > 0))
        return k3c_errf(err, K3C_ECONFIG, "%s: recompute_slice: %lld, %s", rc->path, (long long)rc->recompute_slice,
                        tr->m.aux_loss_alpha > 0 ? "not with balancing \"aux\" (its loss is the whole batch's)"
                                                 : "a slice must hold the short conv's tail (conv_kernel − 1 tokens)");
    k3c_model_init_f32(&tr->m, rc->seed, rc->init_std);
    k3c_optim_defaults(&tr->opt);
    tr->opt.weight_decay = rc->weight_decay;
    tr->opt.beta1 = rc->beta1;
    tr->opt.beta2 = rc->beta2;
    tr->opt.eps = rc->eps;
    if ((e = k3c_optim_parse_matrix(rc->matrix_optimizer, &tr->opt.matrix_optimizer, err))) return e;
    if ((e = k3c_optim_parse_muon_precision(rc->muon_precision, &tr->opt.muon_precision, err))) return e;
    if ((e = k3c_optim_init(&tr->opt, &tr->m.table, err))) return e;
    tr->whole_layout = tr->opt;
    tr->whole_layout.state_off = NULL, tr->whole_layout.ws = NULL;
    if (tr->whole_table.p && (e = k3c_optim_layout(&tr->whole_layout, &tr->whole_table, err))) return e;
    if ((e = k3c_mem_check(sizeof(float) * tr->opt.state_numel, "trainer: optimizer state", err))) return e;
    tr->n_mla = k3c_config_num_mla(&cfg);
    k3c_data_source src[K3C_RUN_MAX_SOURCES];
    for (int i = 0; i < rc->n_sources; i++) src[i] = (k3c_data_source){rc->source_name[i], rc->source_dir[i]};
    if ((e = k3c_loader_open(src, rc->n_sources, rc->stage[0].mixture, rc->seed, &tr->loader, err))) return e;
    if (k3c_loader_vocab_size(tr->loader) > cfg.vocab_size)
        return k3c_errf(err, K3C_ECONFIG, "%s: data vocabulary %lld exceeds the model's vocab_size %lld", rc->path,
                        (long long)k3c_loader_vocab_size(tr->loader), (long long)cfg.vocab_size);
    if ((e = check_tokenizer(rc, k3c_loader_vocab_size(tr->loader), err))) return e;
    char p[4200];
    snprintf(p, sizeof p, "%s/latest", rc->out_dir);
    tr->log = o->log ? o->log : o->progress;
    if (!o->resume && access(p, F_OK) == 0)
        return k3c_errf(err, K3C_EINVAL, "%s already holds a run (%s exists): use --resume, or another out_dir",
                        rc->out_dir, p);
    if (o->resume && (e = resume(tr, err))) return e;
    e = k3c_model_use_backend_f32(&tr->m, o->backend, err);
    if (!e) e = optim_state(tr, comm, &lay, err);
    if (e) return e;
    if (tr->rank != 0) return K3C_OK; /* rank 0 writes the metrics */
    snprintf(p, sizeof p, "%s/metrics.jsonl", rc->out_dir);
    if (o->resume && (e = truncate_metrics(p, tr->step, err))) return e;
    tr->metrics = fopen(p, o->resume ? "a" : "w");
    if (!tr->metrics) return k3c_errf(err, K3C_EIO, "%s: cannot write", p);
    if (tr->note[0]) {
        k3c_metrics_event(tr->metrics, tr->step, tr->step ? "resume_fallback" : "resume_from_scratch", tr->note, NULL);
        if (tr->log) fprintf(tr->log, "resume: %s\n", tr->note);
    }
    return K3C_OK;
}

static void teardown(trainer *tr) {
    /* before the model: its backend owns the arena, the statistics, the state and the workspaces */
    const k3c_backend_f32 *be = k3c_model_backend_f32(&tr->m);
    if (tr->opt_inst) be->optim_close(tr->opt_inst);
    k3c_model_arena_free_f32(&tr->m, &tr->arena);
    k3c_step_stats_free_f32(&tr->m, &tr->stats);
    k3c_step_tail_free(&tr->tail);
    if (tr->ostate && be->sync(NULL) == K3C_OK) be->free(tr->ostate); /* never memory a device may still use */
    k3c_model_free_f32(&tr->m);
    if (tr->dp) k3c_dp_free(tr->dp);
    if (tr->ep_comm) {
        k3c_ep_free(&tr->ep);
        k3c_comm_free(tr->ep_comm);
    }
    k3c_comm_free(tr->x_comm);
    if (tr->pp) k3c_pp_free(tr->pp);
    if (tr->tp_comm) {
        k3c_tp_free(&tr->tp);
        k3c_comm_free(tr->tp_comm);
    }
    k3c_comm_free(tr->t_comm);
    k3c_params_free(&tr->whole_table);
    k3c_optim_free(&tr->whole_layout);
    if (tr->pp_comm) k3c_comm_free(tr->pp_comm);
    if (tr->stage_comm) k3c_comm_free(tr->stage_comm);
    if (tr->cp_comm) {
        k3c_cp_free(&tr->cp);
        k3c_comm_free(tr->cp_comm);
    }
    k3c_comm_free(tr->own_comm);
    k3c_optim_free(&tr->opt);
    free(tr->telemetry);
    k3c_loader_close(tr->loader);
    k3c_batch_free(&tr->batch);
    if (tr->metrics) fclose(tr->metrics);
}

/* Back to the newest checkpoint that loads, with the guard's learning-rate factor applied once more (a batch that keeps
 * failing at one rate may pass at a lower one); noted in metrics.jsonl and the log. */
static int rollback(trainer *tr, k3c_err *err) {
    int64_t steps[64], from = tr->step;
    int n = k3c_train_ckpt_candidates(tr->rc->out_dir, steps, 64, err);
    if (n < 0) return n;
    if (n == 0)
        return k3c_errf(err, K3C_ENUMERIC,
                        "step %lld: %lld batches in a row skipped (the last: %s) and no checkpoint in %s"
                        " to roll back to",
                        (long long)from + 1, (long long)tr->guard.fails, tr->skip, tr->rc->out_dir);
    k3c_guard before = tr->guard;
    tr->note[0] = 0;
    CHECK_RC(load_newest(tr, steps, n, err));
    tr->guard.lr_scale = before.lr_scale * tr->rc->guard_lr_factor;
    tr->guard.fails = 0;
    tr->guard.skipped = before.skipped;
    tr->guard.rollbacks = before.rollbacks + 1;
    char why[9400], extra[96];
    snprintf(why, sizeof why, "%lld batches in a row skipped (the last: %s): back from step %lld to step %lld%s%s",
             (long long)before.fails, tr->skip, (long long)from, (long long)tr->step, tr->note[0] ? "; " : "",
             tr->note);
    snprintf(extra, sizeof extra, ",\"lr_scale\":%.9g", tr->guard.lr_scale);
    k3c_metrics_event(tr->metrics, tr->step, "rollback", why, extra);
    if (tr->log) fprintf(tr->log, "rollback: %s, learning rate x %g\n", why, tr->guard.lr_scale);
    return K3C_OK;
}

/* A batch the guard refused: noted in metrics.jsonl and the log; after guard_max_skips in a row, a rollback. */
static int skipped(trainer *tr, const k3c_metrics_row *row, k3c_err *err) {
    char extra[160]; /* JSON has no NaN: the numbers as strings ("nan", "inf", "12.5") */
    snprintf(extra, sizeof extra, ",\"stage\":%d,\"loss\":\"%.9g\",\"grad_norm\":\"%.9g\"", row->stage, row->loss,
             row->grad_norm);
    k3c_metrics_event(tr->metrics, tr->step + 1, "skip", tr->skip, extra);
    if (tr->log) fprintf(tr->log, "step %lld: batch skipped: %s\n", (long long)tr->step + 1, tr->skip);
    return k3c_guard_reject(&tr->guard, tr->rc) ? rollback(tr, err) : K3C_OK;
}

int k3c_train_run(const k3c_run_config *rc, const k3c_train_opts *o, k3c_train_result *res, k3c_err *err) {
    trainer tr;
    memset(res, 0, sizeof *res);
    res->last_val_loss = NAN;
    int e = setup(&tr, rc, o, err);
    int64_t total = total_steps(rc), stop = o->max_steps > 0 && o->max_steps < total ? o->max_steps : total;
    k3c_progress bar;
    k3c_progress_init(&bar, "train", stop, "tok", o->progress ? o->progress : stderr, 0);
    if (!o->progress) bar.enabled = 0;
    bar.done = tr.step;
    double t0 = k3c_now();
    int64_t tokens0 = tr.tokens, stage_step;
    int cur = -1;
    while (!e && tr.step < stop) {
        int s = stage_of(rc, tr.step, &stage_step);
        if (s != cur && (e = set_mixture(&tr, s, err))) break;
        cur = s;
        k3c_metrics_row row = {0};
        row.val_loss = NAN;
        row.stage = s;
        if ((e = train_step(&tr, &rc->stage[s], stage_step, &row, err))) break;
        if (tr.skip[0]) {
            int64_t rollbacks = tr.guard.rollbacks;
            if ((e = skipped(&tr, &row, err))) break;
            if (tr.guard.rollbacks != rollbacks) cur = -1; /* the mixture is set again after a rollback, as on resume */
            continue;
        }
        row.step = tr.step;
        row.n_moe = tr.n_moe;
        row.moe_layer = tr.moe_layer;
        row.layer_max_ratio = tr.layer_ratio;
        row.layer_cv = tr.layer_cv;
        row.tokens = tr.tokens;
        row.tokens_per_s = (double)(tr.tokens - tokens0) / (k3c_now() - t0);
        int last = tr.step == stop;
        if (rc->eval_every > 0 && (tr.step % rc->eval_every == 0 || last) &&
            (e = validate(&tr, &rc->stage[s], &row.val_loss, err)))
            break;
        if (tr.metrics && (tr.step % rc->log_every == 0 || last || isfinite(row.val_loss)))
            k3c_metrics_write(tr.metrics, &row);
        if (o->log)
            fprintf(o->log, "step %lld stage %s loss %.4f lr %.2e gnorm %.3f load %.2f %.0f tok/s\n",
                    (long long)tr.step, rc->stage[s].name, row.loss, row.lr, row.grad_norm, row.max_load_ratio,
                    row.tokens_per_s);
        char extra[160];
        snprintf(extra, sizeof extra, "%s loss %.3f%s", rc->stage[s].name, row.loss, "");
        k3c_progress_update(&bar, tr.step, (double)(rc->stage[s].tokens_per_step), extra);
        if ((rc->checkpoint_every > 0 && tr.step % rc->checkpoint_every == 0) || last) e = save(&tr, err);
        res->last_loss = row.loss;
        if (isfinite(row.val_loss)) res->last_val_loss = row.val_loss;
        res->max_load_ratio = row.max_load_ratio;
        res->tokens_per_s = row.tokens_per_s;
    }
    k3c_progress_finish(&bar, NULL);
    res->steps = tr.step;
    res->skipped = tr.guard.skipped;
    res->rollbacks = tr.guard.rollbacks;
    res->lr_scale = tr.guard.lr_scale;
    res->wall_s = k3c_now() - t0;
    if (tr.loader) res->unigram_entropy = unigram_entropy(tr.loader);
    teardown(&tr);
    return e;
}
