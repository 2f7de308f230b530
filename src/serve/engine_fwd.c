/* engine_fwd.c — the engine's step over a batch of sequence segments: the inputs checked and staged at the fixed
 * addresses of the model's decode step (model/decode.h: the layer code of training in its decode mode), the step run
 * directly or, for repeated decode steps, captured once per batch size and replayed (ops/decode.h run), the states
 * advanced and the sampled rows' logits returned. docs/ENGINE.md "The step", "Two backends, one engine". */
#include "base/check.h"
#include "model/decode.h"
#include "serve/engine.h"

#include <stdlib.h>
#include <string.h>

void k3c_eng_dims_of(const k3c_config *c, k3c_eng_dims *d) {
    memset(d, 0, sizeof *d);
    d->L = (int)c->num_layers;
    for (int l = 0; l < d->L; l++) d->idx[l] = c->mixer[l] == K3C_MIXER_KDA ? d->n_kda++ : d->n_mla++;
    d->D = c->hidden_size, d->V = c->vocab_size;
    d->H = c->kda_heads, d->dk = c->kda_head_dim, d->P = d->H * d->dk, d->W = c->conv_kernel;
    d->Hm = c->mla_heads, d->nope = c->qk_nope_dim, d->rope = c->qk_rope_dim, d->dv = c->v_head_dim;
    d->rkv = c->kv_lora_rank, d->r = c->q_lora_rank;
    d->kda_floats = d->n_kda ? d->H * d->dk * d->dk + 3 * d->P * (d->W - 1) : 0;
    d->lat_w = d->rkv + d->rope;
}

struct k3c_eng_ws {
    const k3c_weights *w;
    const k3c_backend_f32 *be;
    k3c_decode_step *step;
    const k3c_decode_inputs *in;
    k3c_eng_dims d;
    int64_t max_rows, max_out;
    void *graphs; /* the decode ops' graph holder */
    int use_graphs;
    /* host staging of the step's segments */
    k3c_dec_seg *hsegs;
    int32_t *hrow_seg;
    int64_t *img_row, n_img; /* the step rows whose embedding is an image row (in->img holds them in this order) */
    /* the step being run (step_body's arguments) */
    k3c_dec_batch batch;
    const int64_t *out_rows;
    int64_t n_out;
};

int k3c_eng_ws_init(const k3c_weights *w, int64_t max_rows, int64_t max_out, k3c_eng_ws **out, k3c_err *err) {
    *out = NULL;
    k3c_eng_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    ws->w = w, ws->be = w->be ? w->be : k3c_backend_cpu_f32();
    k3c_eng_dims_of(&w->cfg, &ws->d);
    ws->max_rows = max_rows, ws->max_out = max_out, ws->use_graphs = 1;
    int rc = k3c_decode_step_init(w, max_rows, max_out, &ws->step, err);
    if (rc) {
        free(ws);
        return rc;
    }
    ws->in = k3c_decode_step_inputs(ws->step);
    ws->hsegs = malloc(sizeof(k3c_dec_seg) * (size_t)max_rows);
    ws->hrow_seg = malloc(sizeof(int32_t) * (size_t)max_rows);
    ws->img_row = malloc(sizeof(int64_t) * (size_t)max_rows);
    ws->graphs = k3c_decode_step_ops(ws->step)->graph_open();
    if (!ws->hsegs || !ws->hrow_seg || !ws->img_row) {
        k3c_eng_ws_free(ws);
        return k3c_errf(err, K3C_ENOMEM, "engine: out of memory");
    }
    *out = ws;
    return K3C_OK;
}

void k3c_eng_ws_use_graphs(k3c_eng_ws *ws, int on) { ws->use_graphs = on; }

void k3c_eng_ws_free(k3c_eng_ws *ws) {
    if (!ws) return;
    if (ws->step) k3c_decode_step_ops(ws->step)->graph_close(ws->graphs);
    k3c_decode_step_free(ws->step);
    free(ws->hsegs);
    free(ws->hrow_seg);
    free(ws->img_row);
    free(ws);
}

/* The whole step from the staged inputs to the logits in backend memory (what a backend may capture and replay). */
static int step_body(void *arg, k3c_err *err) {
    k3c_eng_ws *ws = arg;
    return k3c_decode_step_run(ws->step, &ws->batch, ws->img_row, ws->n_img, ws->out_rows, ws->n_out, err);
}

int k3c_eng_forward(const k3c_weights *w, k3c_eng_ws *ws, const int32_t *ids, const k3c_eng_seg *segs, int nseg,
                    const int64_t *out_rows, int64_t n_out, float *logits, k3c_err *err) {
    const k3c_eng_dims *d = &ws->d;
    const int64_t V = d->V;
    if (w != ws->w) return k3c_errf(err, K3C_EINVAL, "engine: the step buffers belong to other weights");
    int64_t n = 0, max_len = 0;
    for (int s = 0; s < nseg; s++) {
        if (segs[s].row0 != n || segs[s].len < 1 || segs[s].st->pos + segs[s].len > segs[s].st->cap ||
            n + segs[s].len > ws->max_rows)
            return k3c_errf(
                err, K3C_EINVAL,
                "engine: segment %d (rows %lld+%lld at position %lld) does not fit (step buffers: %lld rows)", s,
                (long long)segs[s].row0, (long long)segs[s].len, (long long)segs[s].st->pos, (long long)ws->max_rows);
        const k3c_eng_state *st = segs[s].st;
        ws->hsegs[s] = (k3c_dec_seg){st->kda, st->mla, st->pos, st->cap, segs[s].row0, segs[s].len};
        for (int64_t r = n; r < n + segs[s].len; r++) ws->hrow_seg[r] = s;
        n += segs[s].len;
        if (segs[s].len > max_len) max_len = segs[s].len;
    }
    if (n < 1) return k3c_errf(err, K3C_EINVAL, "engine: a step of no rows");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return k3c_errf(err, K3C_EINVAL, "engine: token id %d at row %lld is outside [0, %lld)", ids[i],
                            (long long)i, (long long)V);
    if (!out_rows) n_out = n;
    if (n_out < 0 || n_out > ws->max_out)
        return k3c_errf(err, K3C_EINVAL, "engine: %lld logits rows, the step buffers hold %lld", (long long)n_out,
                        (long long)ws->max_out);
    int identity = n_out == n; /* out_rows 0, 1, .., n−1: the step's shape depends on n alone */
    for (int64_t i = 0; out_rows && i < n_out; i++) {
        if (out_rows[i] < 0 || out_rows[i] >= n)
            return k3c_errf(err, K3C_EINVAL, "engine: output row %lld outside the step", (long long)out_rows[i]);
        identity &= out_rows[i] == i;
    }
    const k3c_decode_inputs *b = ws->in;
    CHECK_RC(ws->be->upload(b->tok, ids, sizeof(int32_t) * (size_t)n, err));
    CHECK_RC(ws->be->upload(b->segs, ws->hsegs, sizeof(k3c_dec_seg) * (size_t)nseg, err));
    CHECK_RC(ws->be->upload(b->row_seg, ws->hrow_seg, sizeof(int32_t) * (size_t)n, err));
    ws->n_img = 0;
    for (int s = 0; s < nseg; s++)
        for (int64_t i = 0; segs[s].emb && i < segs[s].len; i++)
            if (segs[s].emb[i]) {
                CHECK_RC(
                    ws->be->upload(b->img + ws->n_img * ws->d.D, segs[s].emb[i], sizeof(float) * (size_t)ws->d.D, err));
                ws->img_row[ws->n_img++] = segs[s].row0 + i;
            }
    ws->batch = (k3c_dec_batch){ws->hsegs, b->segs, b->row_seg, nseg, n, max_len};
    ws->out_rows = identity ? NULL : out_rows, ws->n_out = n_out;
    /* a decode step (one token per sequence, every row's logits) repeats its shape: key it by its row count */
    const int64_t key = ws->use_graphs && max_len == 1 && identity && !ws->n_img ? n : 0; /* image rows: not captured */
    CHECK_RC(k3c_decode_step_ops(ws->step)->run(ws->graphs, key, step_body, ws, err));
    for (int s = 0; s < nseg; s++) segs[s].st->pos += segs[s].len;
    return n_out ? ws->be->download(logits, b->logits, sizeof(float) * (size_t)(n_out * V), err) : ws->be->sync(err);
}
