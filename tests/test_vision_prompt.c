/* test_vision_prompt.c — image tokens in the text model: the K3 image prompt (text and Kimi token ids), placeholder
 * positions, targets with no loss on image tokens, the model's input-embedding overrides (forward equivalence,
 * the d_embeds gradient by float64 finite differences, nothing into the embedding table) and a tiny vision tower
 * trained through the text model's loss (finite differences of a tower weight). Spec: docs/VISION.md. */
#include "test.h"

#include "model/model.h"
#include "tok/tok.h"
#include "vision/vision.h"

#define FD_TOL 1e-6
#define PAD 31 /* <|media_pad|> stand-in inside the tiny model's 32-token vocabulary */

/* ---------------------------------------------------------------- prompt text and ids */
static void test_prompt(void) {
    char *s = NULL;
    size_t n = 0;
    k3c_err err = {0};
    CHECK_OK(k3c_vision_image_prompt(84, 56, 6, &s, &n, &err), &err);
    const char *want = "<|media_begin|>image 84x56<|media_content|><|media_pad|><|media_pad|><|media_pad|><|media_pad|>"
                       "<|media_pad|><|media_pad|><|media_end|>"; /* golden cases.json, vLLM form */
    CHECK(s && n == strlen(want) && !strcmp(s, want), "prompt: %s", s ? s : "(null)");
    free(s);
    CHECK(k3c_vision_image_prompt(0, 5, 1, &s, &n, &err) == K3C_EINVAL && !s, "bad size refused");
    k3c_tok *tok = NULL;
    CHECK_OK(k3c_tok_load_kimi(test_shared("golden/kimi_tokenizer/tiktoken.model"),
                               test_shared("golden/kimi_tokenizer/special_tokens.json"), NULL, &tok, &err),
             &err);
    if (!tok) return;
    k3c_tok_ids ids = {0};
    CHECK_OK(k3c_vision_image_ids(tok, 28, 28, 3, &ids, &err), &err);
    const int32_t pad = k3c_tok_special_id(tok, "<|media_pad|>");
    CHECK(pad == 163605, "<|media_pad|> is 163605 (got %d)", pad);
    CHECK(ids.n > 6 && ids.ids[0] == 163602 && ids.ids[ids.n - 1] == 163604 && ids.ids[ids.n - 2] == pad &&
              ids.ids[ids.n - 4] == pad && ids.ids[ids.n - 5] == 163603,
          "ids: begin ... content pad pad pad end");
    CHECK(k3c_vision_pad_positions(ids.ids, (int64_t)ids.n, pad, NULL) == 3, "3 placeholders");
    char *text = NULL;
    size_t tl = 0;
    CHECK_OK(k3c_tok_decode(tok, ids.ids, ids.n, &text, &tl, &err), &err);
    CHECK(text && !strncmp(text, "<|media_begin|>image 28x28<|media_content|><|media_pad|>", 56), "decodes back: %s",
          text ? text : "");
    free(text);
    k3c_tok_ids_free(&ids);
    k3c_tok_free(tok);
}

static void test_targets(void) {
    const int32_t ids[10] = {5, 6, PAD, PAD, 7, 8, 9, PAD, 10, 11}, cu[3] = {0, 6, 10};
    int32_t t[10];
    k3c_err err = {0};
    CHECK_OK(k3c_vision_targets(ids, 10, cu, 2, PAD, t, &err), &err);
    const int32_t want[10] = {6, -1, -1, -1, 8, -1, -1, -1, 11, -1};
    CHECK(!memcmp(t, want, sizeof want), "targets: %d %d %d %d %d %d %d %d %d %d", t[0], t[1], t[2], t[3], t[4], t[5],
          t[6], t[7], t[8], t[9]);
    int32_t pos[4];
    CHECK(k3c_vision_pad_positions(ids, 10, PAD, pos) == 3 && pos[0] == 2 && pos[1] == 3 && pos[2] == 7, "positions");
}

/* ---------------------------------------------------------------- the text model's embedding overrides */
typedef struct {
    k3c_model m;
    k3c_arena ar;
    k3c_model_batch b;
    double *embeds; /* the override rows being differentiated */
    k3c_vision *v;  /* when set, embeds come from this tower on pixels */
    double *pixels;
    const k3c_grid_thw *g;
    int ng;
} lm_ctx;

static double lm_loss(void *p) {
    lm_ctx *c = p;
    k3c_err err = {0};
    k3c_acts *acts;
    double loss = NAN;
    k3c_vision_acts_f64 *va = NULL;
    if (c->v) {
        const double *e = NULL;
        if (k3c_vision_forward_f64(c->v, c->pixels, c->g, c->ng, &va, NULL, &e, NULL, &err)) return NAN;
        c->b.embeds = e;
    }
    k3c_arena_reset(&c->ar, 0);
    if (k3c_model_forward_f64(&c->m, &c->b, &c->ar, &acts, &loss, NULL, &err)) printf("forward: %s\n", err.msg);
    k3c_vision_acts_free_f64(va);
    if (c->v) c->b.embeds = c->embeds;
    return loss;
}

static int lm_open(lm_ctx *c, int32_t *ids, int32_t *cu, int32_t *targets, int32_t *pos) {
    k3c_err err = {0};
    k3c_config cfg;
    if (k3c_config_load("configs/k3_test_tiny.json", &cfg, &err)) {
        CHECK(0, "%s", err.msg);
        return -1;
    }
    CHECK_OK(k3c_model_create_f64(&cfg, 1, &c->m, &err), &err);
    k3c_model_init_f64(&c->m, 3, 0.3);
    for (int t = 0; t < 12; t++) ids[t] = (int32_t)((t * 7 + 2) % 30);
    ids[3] = ids[4] = ids[5] = ids[9] = PAD; /* a 3-token image in document 0, a 1-token image in document 1 */
    cu[0] = 0, cu[1] = 7, cu[2] = 12;
    CHECK_OK(k3c_vision_targets(ids, 12, cu, 2, PAD, targets, &err), &err);
    CHECK(k3c_vision_pad_positions(ids, 12, PAD, pos) == 4, "4 placeholders");
    c->b = (k3c_model_batch){12, 2, ids, cu, targets, 0, 4, pos, NULL, NULL, NULL};
    CHECK_OK(k3c_arena_init(&c->ar, k3c_model_plan_bytes_f64(&c->m, 12, 2), &err), &err);
    return 0;
}

static void test_overrides(void) {
    lm_ctx c = {0};
    int32_t ids[12], cu[3], targets[12], pos[4];
    if (lm_open(&c, ids, cu, targets, pos)) return;
    const int64_t D = c.m.cfg.hidden_size;
    const double *E = (const double *)c.m.w + c.m.table.glob.embed;
    k3c_err err = {0};
    /* 1. rows equal to another token's embeddings give the logits of that token at those positions */
    int32_t ids2[12];
    memcpy(ids2, ids, sizeof ids2);
    double rows[4 * 16];
    for (int i = 0; i < 4; i++) {
        ids2[pos[i]] = (int32_t)(10 + i);
        memcpy(rows + i * D, E + (10 + i) * D, (size_t)D * sizeof *rows);
    }
    c.b.embeds = rows;
    double l_over = lm_loss(&c);
    k3c_model_batch plain = c.b;
    plain.ids = ids2;
    plain.n_embeds = 0;
    k3c_model_batch keep = c.b;
    c.b = plain;
    double l_plain = lm_loss(&c);
    c.b = keep;
    CHECK(fabs(l_over - l_plain) <= 1e-13 * fabs(l_plain), "override rows = token rows: loss %.15g vs %.15g", l_over,
          l_plain);
    /* 2. d_embeds by finite differences; the pad token's table row gets nothing */
    c.embeds = test_randn(41, (size_t)(4 * D), 1.0);
    c.b.embeds = c.embeds;
    double *dE = test_filled((size_t)(4 * D), 9.0);
    c.b.d_embeds = dE;
    k3c_acts *acts;
    double loss;
    k3c_arena_reset(&c.ar, 0);
    CHECK_OK(k3c_model_forward_f64(&c.m, &c.b, &c.ar, &acts, &loss, NULL, &err), &err);
    memset(c.m.g, 0, c.m.table.total * sizeof(double));
    CHECK_OK(k3c_model_backward_f64(&c.m, acts, 1.0, &err), &err);
    const double *gE = (const double *)c.m.g + c.m.table.glob.embed;
    double pad_row = 0;
    for (int64_t j = 0; j < D; j++) pad_row += fabs(gE[PAD * D + j]);
    CHECK(pad_row == 0, "the <|media_pad|> table row gets no gradient (|g| = %g)", pad_row);
    c.b.d_embeds = NULL;
    CHECK_LE(test_fd_rel_err(lm_loss, &c, c.embeds, (size_t)(4 * D), dE), FD_TOL, "fd d_embeds through the text model");
    /* 3. bad positions are refused */
    int32_t bad[4] = {3, 3, 4, 9};
    c.b.embed_pos = bad;
    k3c_arena_reset(&c.ar, 0);
    CHECK(k3c_model_forward_f64(&c.m, &c.b, &c.ar, &acts, &loss, NULL, &err) == K3C_EINVAL &&
              strstr(err.msg, "embed_pos"),
          "repeated position: %s", err.msg);
    free(c.embeds);
    free(dE);
    k3c_arena_free(&c.ar);
    k3c_model_free_f64(&c.m);
}

/* A tiny tower whose embeddings feed the text model: the text loss's gradient reaches the tower's weights. */
static void test_tower_through_lm(void) {
    lm_ctx c = {0};
    int32_t ids[12], cu[3], targets[12], pos[4];
    if (lm_open(&c, ids, cu, targets, pos)) return;
    k3c_vision_config vc = {1, 2, 8, 12, 2, 1, 16, 8, 16, {2, 2}, 3, 3, 2, 1e-5, K3C_VISION_BICUBIC, PAD};
    k3c_err err = {0};
    CHECK_OK(k3c_vision_create_f64(&vc, 1, &c.v, &err), &err);
    if (!c.v) return;
    k3c_vision_init_f64(c.v, 5);
    static const k3c_grid_thw grids[2] = {{1, 2, 6}, {2, 2, 2}}; /* 3 + 1 merged tokens, the second a 2-frame clip */
    c.g = grids;
    c.ng = 2;
    c.pixels = test_randn(51, (size_t)((12 + 8) * 12), 1.0);
    const int64_t D = c.m.cfg.hidden_size;
    double dE[4 * 16];
    c.b.d_embeds = dE;
    k3c_vision_acts_f64 *va = NULL;
    const double *e = NULL;
    CHECK_OK(k3c_vision_forward_f64(c.v, c.pixels, grids, 2, &va, NULL, &e, NULL, &err), &err);
    c.b.embeds = e;
    k3c_acts *acts;
    double loss;
    k3c_arena_reset(&c.ar, 0);
    CHECK_OK(k3c_model_forward_f64(&c.m, &c.b, &c.ar, &acts, &loss, NULL, &err), &err);
    CHECK_OK(k3c_model_backward_f64(&c.m, acts, 1.0, &err), &err);
    double *g = k3c_vision_grads(c.v), *w = k3c_vision_weights(c.v);
    if (va) CHECK_OK(k3c_vision_backward_f64(c.v, va, dE, NULL, &err), &err);
    k3c_vision_acts_free_f64(va);
    c.b.d_embeds = NULL;
    (void)D;
    const k3c_vision_param *wq = &c.v->p[k3c_vision_bslot(0, VB_WQKV)], *p0 = &c.v->p[k3c_vision_tslot(c.v, VT_PROJ0)],
                           *pe = &c.v->p[VP_POS];
    CHECK_LE(test_fd_rel_err(lm_loss, &c, w + wq->off, wq->n, g + wq->off), FD_TOL, "fd text loss -> tower wqkv");
    CHECK_LE(test_fd_rel_err(lm_loss, &c, w + p0->off, p0->n, g + p0->off), FD_TOL, "fd text loss -> projector proj.0");
    CHECK_LE(test_fd_rel_err(lm_loss, &c, w + pe->off, pe->n, g + pe->off), FD_TOL,
             "fd text loss -> pos_emb (bicubic)");
    free(c.pixels);
    k3c_vision_free(c.v);
    k3c_arena_free(&c.ar);
    k3c_model_free_f64(&c.m);
}

int main(void) {
    test_prompt();
    test_targets();
    k3c_set_num_threads(1); /* tiny sizes: threads only cost on a shared machine */
    test_overrides();
    test_tower_through_lm();
    return test_summary();
}
