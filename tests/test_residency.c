/* test_residency.c — a model that holds only part of the parameters (k3c_model_create_resident; docs/PARALLEL.md
 * "Residency"): some routed experts (expert parallelism), a pipeline stage's layers, or a tensor-parallel share of the
 * split tensors. It starts from the whole init's part, loads its part of a whole checkpoint, refuses one that lacks a
 * held tensor (naming it), saves only what it holds (a TP share: not at all, its group gathers whole tensors), and
 * QK-Clip leaves the layers and heads it does not hold alone. One process; the MPI tests train with it. */
#include "test.h"

#include "model/model.h"
#include "ops/qk_clip.h"

#include <sys/stat.h>

static int load_dir(k3c_model *m, const char *dir, k3c_err *err) {
    k3c_checkpoint *ck = NULL;
    int rc = k3c_ckpt_open(dir, &ck, err);
    if (!rc) rc = k3c_model_load_f32(m, ck, err);
    if (ck) k3c_ckpt_close(ck);
    return rc;
}

static int save_dir(const k3c_model *m, const char *dir, k3c_err *err) {
    char p[4300];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return k3c_model_save_f32(m, p, err);
}

static int create(const k3c_config *cfg, int64_t e0, int64_t n, int l0, int l1, k3c_model *m, k3c_err *err) {
    const k3c_residency r = {e0, n, l0, l1, 0, 1};
    return k3c_model_create_resident_f32(cfg, 0, &r, m, err);
}

/* whole's part under `part`'s table equals part's weights (entries by index; nothing of an absent one). */
static int same_part(const k3c_model *whole, const k3c_model *part) {
    const k3c_param_table *w = &whole->table, *h = &part->table;
    if (w->n != h->n) return 0;
    for (int i = 0; i < h->n; i++) {
        const k3c_param *p = &h->p[i];
        const float *a = (const float *)whole->w + w->p[i].offset + (size_t)(p->stack0 * k3c_param_slice_numel(p));
        if (memcmp(a, (const float *)part->w + p->offset, sizeof(float) * (size_t)p->numel)) return 0;
    }
    return 1;
}

/* Pipeline stages of the 4-layer model: [0, 2) with the embedding, [2, 4) with the head, [2, 4) with half the
 * experts too. */
static void stages(const k3c_config *cfg, const k3c_model *whole, const char *whole_dir, const char *tmp) {
    k3c_err err = {0};
    const int L = (int)cfg->num_layers;
    const int64_t E = cfg->num_experts;
    k3c_model first, last, last_init, both;
    CHECK_OK(create(cfg, 0, E, 0, L / 2, &first, &err), &err);
    CHECK_OK(create(cfg, 0, E, L / 2, L, &last, &err), &err);
    CHECK_OK(create(cfg, 0, E, L / 2, L, &last_init, &err), &err);
    CHECK_OK(create(cfg, E / 2, E - E / 2, L / 2, L, &both, &err), &err);
    const k3c_param_table *t = &last.table;
    size_t held = 0, absent = 0, sum = 0;
    for (int i = 0; i < t->n; i++) {
        const k3c_param *p = &t->p[i];
        const int at = p->layer >= 0 ? p->layer : i == 0 ? 0 : L - 1; /* the embedding first, the head last */
        const int in = at >= L / 2;
        held += in, absent += p->absent, sum += (size_t)p->numel;
        CHECK(p->absent == !in && (in || p->numel == 0) && (!in || p->numel == whole->table.p[i].numel),
              "stage [%d, %d): %s absent %d, %lld elements", L / 2, L, p->name, p->absent, (long long)p->numel);
    }
    CHECK(held > 0 && absent > 0 && sum == t->total && first.table.total + last.table.total == whole->table.total,
          "stages hold %zu + %zu of %zu parameters (%zu entries held, %zu absent)", first.table.total, t->total,
          whole->table.total, held, absent);
    k3c_model_init_f32(&last_init, 7, 0.1);
    k3c_model_init_f32(&first, 7, 0.1);
    k3c_model_init_f32(&both, 7, 0.1);
    CHECK(same_part(whole, &last_init) && same_part(whole, &first) && same_part(whole, &both),
          "a stage's init differs from its part of the whole init");
    CHECK_OK(load_dir(&last, whole_dir, &err), &err); /* its part of the whole checkpoint; the rest is skipped */
    CHECK(memcmp(last.w, last_init.w, sizeof(float) * t->total) == 0, "stage [%d, %d) loaded differs from its init",
          L / 2, L);
    /* a checkpoint of the first stage only lacks the last stage's tensors */
    char first_dir[4200];
    snprintf(first_dir, sizeof first_dir, "%s/first", tmp);
    CHECK_OK(save_dir(&first, first_dir, &err), &err);
    k3c_checkpoint *ck = NULL;
    CHECK_OK(k3c_ckpt_open(first_dir, &ck, &err), &err);
    int n_first = 0;
    for (int i = 0; i < first.table.n; i++)
        n_first += first.table.p[i].absent ? 0 : first.table.p[i].stack ? (int)E : 1;
    CHECK(ck && k3c_ckpt_count(ck) == n_first, "stage [0, %d) saved %d tensors, holds %d", L / 2,
          ck ? k3c_ckpt_count(ck) : -1, n_first);
    if (ck) k3c_ckpt_close(ck);
    k3c_err e2 = {0};
    int rc = load_dir(&last, first_dir, &e2);
    CHECK(rc == K3C_EFORMAT && strstr(e2.msg, "missing tensor") && strstr(e2.msg, "layers.2."),
          "stage [%d, %d) from a checkpoint of [0, %d): rc %d, '%s'", L / 2, L, L / 2, rc, e2.msg);
    printf("a held layer missing from the checkpoint: %s\n", e2.msg);
    /* QK-Clip of a stage touches only its own MLA layers (layer 2 here): every S_max far above τ */
    float *smax = malloc(sizeof(float) * (size_t)(L * cfg->mla_heads));
    for (int64_t i = 0; i < L * cfg->mla_heads; i++) smax[i] = 1e6f;
    int n0 = -1, n1 = -1;
    CHECK_OK(k3c_qk_clip(cfg, &first.table, first.w, smax, 100.0, &n0, &err), &err);
    CHECK_OK(k3c_qk_clip(cfg, &last.table, last.w, smax, 100.0, &n1, &err), &err);
    CHECK(n0 == 0 && n1 == k3c_config_num_mla(cfg) * cfg->mla_heads,
          "QK-Clip clipped %d heads on stage [0, %d) and %d on [%d, %d)", n0, L / 2, n1, L / 2, L);
    free(smax);
    /* impossible residencies */
    k3c_model bad;
    rc = create(cfg, 0, E, 2, 2, &bad, &e2);
    CHECK(rc == K3C_EINVAL && strstr(e2.msg, "layers [2, 2) of a model of 4"), "empty stage: rc %d '%s'", rc, e2.msg);
    rc = create(cfg, 0, E, 0, L + 1, &bad, &e2);
    CHECK(rc == K3C_EINVAL && strstr(e2.msg, "layers [0, 5)"), "stage past the last layer: rc %d '%s'", rc, e2.msg);
    k3c_model *all[] = {&first, &last, &last_init, &both};
    for (int i = 0; i < 4; i++) k3c_model_free_f32(all[i]);
}

/* Tensor-parallel shares of the 4-layer model at tp2: each split entry holds its rows or columns, the two shares put
 * back into a whole tensor give the whole init (and the whole checkpoint loaded into a share equals the share's own
 * init), the replicated entries are whole, QK-Clip clips the share's heads as the whole model clips them, and saving
 * a share table refuses with a message. */
static void tp_shares(const k3c_config *cfg, const k3c_model *whole, const char *whole_dir) {
    k3c_err err = {0};
    const int tp = 2;
    k3c_model sh[2], loaded;
    k3c_residency r = k3c_residency_whole(cfg);
    r.tp_size = tp;
    for (int t = 0; t < tp; t++) {
        r.tp_rank = t;
        CHECK_OK(k3c_model_create_resident_f32(cfg, 0, &r, &sh[t], &err), &err);
        k3c_model_init_f32(&sh[t], 7, 0.1);
    }
    CHECK_OK(k3c_model_create_resident_f32(cfg, 0, &r, &loaded, &err), &err); /* rank 1's */
    CHECK_OK(load_dir(&loaded, whole_dir, &err), &err);
    CHECK(memcmp(loaded.w, sh[1].w, sizeof(float) * loaded.table.total) == 0,
          "TP share 1 of 2 loaded from the whole checkpoint differs from its init");
    const k3c_param_table *w = &whole->table, *h = &sh[0].table;
    int rows = 0, cols = 0, bad = 0;
    float *put = malloc(sizeof(float) * w->total);
    memcpy(put, whole->w, sizeof(float) * w->total);
    for (int i = 0; i < h->n; i++) {
        const k3c_param *p = &h->p[i], *q = &w->p[i];
        const int split = p->tp_split == K3C_TP_ROWS || p->tp_split == K3C_TP_COLS;
        rows += p->tp_split == K3C_TP_ROWS, cols += p->tp_split == K3C_TP_COLS;
        bad += p->tp_share != split || p->whole_numel != q->numel ||
               (split ? p->numel != q->used / tp : p->numel != q->numel);
        float *x = put + q->offset;
        for (int64_t j = 0; split && j < q->numel; j++) x[j] = j < q->used ? NAN : x[j]; /* K3's A_log padding kept */
        for (int t = 0; split && t < tp; t++)
            k3c_param_share_copy(p, t, sizeof(float), x, (float *)sh[t].w + sh[t].table.p[i].offset, 1);
    }
    CHECK(bad == 0 && rows > 0 && cols > 0, "share shapes: %d wrong (%d row splits, %d column splits)", bad, rows,
          cols);
    CHECK(memcmp(put, whole->w, sizeof(float) * w->total) == 0,
          "the tp2 shares put together differ from the whole init");
    printf("tp2 share 0: %zu of %zu parameters (%d entries split by rows, %d by columns)\n", h->total, w->total, rows,
           cols);
    /* QK-Clip: every head far above τ; each share clips its own heads, as the whole model clips them */
    const int64_t L = cfg->num_layers, H = cfg->mla_heads;
    float *smax = malloc(sizeof(float) * (size_t)(L * H)), *wc = malloc(sizeof(float) * w->total);
    for (int64_t i = 0; i < L * H; i++) smax[i] = 1e3f * (float)(1 + i);
    memcpy(wc, whole->w, sizeof(float) * w->total);
    int nw = 0, n[2] = {0, 0};
    CHECK_OK(k3c_qk_clip(cfg, w, wc, smax, 100.0, &nw, &err), &err);
    memcpy(put, wc, sizeof(float) * w->total);
    for (int t = 0; t < tp; t++) CHECK_OK(k3c_qk_clip(cfg, &sh[t].table, sh[t].w, smax, 100.0, &n[t], &err), &err);
    for (int i = 0; i < h->n; i++)
        for (int t = 0; h->p[i].tp_share && t < tp; t++)
            k3c_param_share_copy(&h->p[i], t, sizeof(float), put + w->p[i].offset,
                                 (float *)sh[t].w + sh[t].table.p[i].offset, 1);
    CHECK(n[0] + n[1] == nw && n[0] == n[1] && memcmp(put, wc, sizeof(float) * w->total) == 0,
          "QK-Clip of the shares (%d + %d heads) differs from the whole model's (%d)", n[0], n[1], nw);
    char p[4300];
    snprintf(p, sizeof p, "%s/share.safetensors", whole_dir);
    k3c_err e2 = {0};
    int rc = k3c_model_save_f32(&sh[0], p, &e2);
    CHECK(rc == K3C_EINVAL && strstr(e2.msg, "tensor-parallel share 0 of 2"), "saving a share table: rc %d '%s'", rc,
          e2.msg);
    k3c_model bad3;
    r.tp_size = 3, r.tp_rank = 0; /* 3 divides no head count of the tiny model */
    rc = k3c_model_create_resident_f32(cfg, 0, &r, &bad3, &e2);
    CHECK(rc == K3C_ECONFIG && strstr(e2.msg, "tensor parallelism over 3 ranks does not divide"),
          "tp3 shares: rc %d '%s'", rc, e2.msg);
    r.tp_size = 2, r.tp_rank = 2;
    rc = k3c_model_create_resident_f32(cfg, 0, &r, &bad3, &e2);
    CHECK(rc == K3C_EINVAL && strstr(e2.msg, "share 2 of 2"), "share 2 of 2: rc %d '%s'", rc, e2.msg);
    free(put), free(smax), free(wc);
    k3c_model_free_f32(&sh[0]), k3c_model_free_f32(&sh[1]), k3c_model_free_f32(&loaded);
}

int main(void) {
    k3c_err err = {0};
    k3c_config cfg;
    CHECK_OK(k3c_config_load("configs/k3_test_tiny.json", &cfg, &err), &err);
    const int64_t E = cfg.num_experts, half = E / 2;
    const char *tmp = test_tmpdir("residency");
    char whole_dir[4200], low_dir[4200]; /* test_tmpdir gives at most 4,095 bytes */
    snprintf(whole_dir, sizeof whole_dir, "%s/whole", tmp);
    snprintf(low_dir, sizeof low_dir, "%s/low", tmp);

    k3c_model whole, low, high, high_init;
    CHECK_OK(k3c_model_create_f32(&cfg, 0, &whole, &err), &err);
    k3c_model_init_f32(&whole, 7, 0.1);
    CHECK_OK(save_dir(&whole, whole_dir, &err), &err);

    /* experts [E/2, E) from the whole checkpoint: the same values as the residency's own init (which equals the
     * whole init's part, test_dist_dp), everything else too */
    CHECK_OK(create(&cfg, half, E - half, 0, (int)cfg.num_layers, &high, &err), &err);
    CHECK_OK(create(&cfg, half, E - half, 0, (int)cfg.num_layers, &high_init, &err), &err);
    k3c_model_init_f32(&high_init, 7, 0.1);
    CHECK(high.table.total < whole.table.total, "residency holds %zu of %zu parameters", high.table.total,
          whole.table.total);
    CHECK_OK(load_dir(&high, whole_dir, &err), &err);
    CHECK(memcmp(high.w, high_init.w, sizeof(float) * high.table.total) == 0,
          "experts [%lld, %lld) loaded from the whole checkpoint differ from their init", (long long)half,
          (long long)E);

    /* a checkpoint of experts [0, E/2) only lacks what `high` holds: a clear error naming an expert tensor */
    CHECK_OK(create(&cfg, 0, half, 0, (int)cfg.num_layers, &low, &err), &err);
    k3c_model_init_f32(&low, 7, 0.1);
    CHECK_OK(save_dir(&low, low_dir, &err), &err);
    k3c_err e2 = {0};
    const int rc = load_dir(&high, low_dir, &e2);
    CHECK(rc == K3C_EFORMAT && strstr(e2.msg, "missing tensor") && strstr(e2.msg, "experts."),
          "loading experts [%lld, %lld) from a checkpoint of [0, %lld): rc %d, '%s'", (long long)half, (long long)E,
          (long long)half, rc, e2.msg);
    printf("a held expert missing from the checkpoint: %s\n", e2.msg);
    /* and the low half loads its own checkpoint back */
    k3c_model low2;
    CHECK_OK(create(&cfg, 0, half, 0, (int)cfg.num_layers, &low2, &err), &err);
    CHECK_OK(load_dir(&low2, low_dir, &err), &err);
    CHECK(memcmp(low2.w, low.w, sizeof(float) * low.table.total) == 0, "experts [0, %lld) round trip", (long long)half);

    stages(&cfg, &whole, whole_dir, tmp);
    tp_shares(&cfg, &whole, whole_dir);
    k3c_model *all[] = {&whole, &low, &low2, &high, &high_init};
    for (int i = 0; i < 5; i++) k3c_model_free_f32(all[i]);
    return test_summary();
}
