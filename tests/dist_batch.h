/* dist_batch.h — the global batch and the model variant the parallel-training tests share (test_dist_dp.c on the CPU,
 * nccl/dist_nccl.c on the GPU): packed documents of the tiny K3 model's vocabulary, a layout whose context-parallel
 * ranges cross documents in every way, the same documents reversed (the fp32 floor), the 4-head variant for tp4.
 * Include after test.h and model/config.h. */
#ifndef K3C_TEST_DIST_BATCH_H
#define K3C_TEST_DIST_BATCH_H

#define T_BATCH 160

typedef struct {
    int32_t ids[T_BATCH], targets[T_BATCH], cu[T_BATCH + 1];
    int n_docs;
} batch;

/* Documents of 1..29 tokens (a one-token document has no counted target), ids from a fixed LCG. */
static void make_batch(batch *b) {
    uint64_t s = 12345;
    int t = 0;
    b->n_docs = 0;
    b->cu[0] = 0;
    while (t < T_BATCH) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int len = 1 + (int)((s >> 33) % 29);
        if (t + len > T_BATCH) len = T_BATCH - t;
        for (int i = 0; i < len; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            b->ids[t + i] = (int32_t)((s >> 35) % 32);
        }
        for (int i = 0; i < len; i++) b->targets[t + i] = i + 1 < len ? b->ids[t + i + 1] : -1;
        t += len;
        b->cu[++b->n_docs] = t;
    }
}

/* Documents laid out so that context-parallel ranges cross them in every way (cp2: boundary 80; cp4: 40, 80, 120;
 * cp2×dp2: the data-parallel split at 78, boundaries 39 and 119): a piece starting one token before a boundary (its
 * conv tail partly before the document), a piece starting at a boundary, pieces continuing across one, a piece
 * covering a whole rank (its state passes through), one-token pieces. */
static void make_batch_cp(batch *b) {
    static const int len[] = {5, 34, 2, 37, 47, 10, 1, 23, 1};
    uint64_t s = 777;
    int t = 0;
    b->n_docs = 0;
    b->cu[0] = 0;
    for (size_t d = 0; d < sizeof len / sizeof *len; d++) {
        for (int i = 0; i < len[d]; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            b->ids[t + i] = (int32_t)((s >> 35) % 32);
        }
        for (int i = 0; i < len[d]; i++) b->targets[t + i] = i + 1 < len[d] ? b->ids[t + i + 1] : -1;
        t += len[d];
        b->cu[++b->n_docs] = t;
    }
}

/* The same documents in reverse order: the same loss, gradients and updates in exact arithmetic, other fp32 sums. */
static void reverse_docs(const batch *a, batch *b) {
    int t = 0;
    b->n_docs = a->n_docs;
    b->cu[0] = 0;
    for (int d = a->n_docs - 1; d >= 0; d--) {
        int len = a->cu[d + 1] - a->cu[d];
        memcpy(b->ids + t, a->ids + a->cu[d], sizeof(int32_t) * (size_t)len);
        memcpy(b->targets + t, a->targets + a->cu[d], sizeof(int32_t) * (size_t)len);
        t += len;
        b->cu[a->n_docs - d] = t;
    }
}

/* The tiny model has 2 heads per mixer: 4 of each for tp4, MLA's head dims halved (2) so its widths stay those of the
 * 2-head model (with 4 heads of dims 4 its fp32 floor, test_dist_dp.c's fp32_floor, is 2.9e-5: the single process
 * differs from itself by more than the tests' 1e-5 there; 5.7e-6 here). */
static void tp_variant(k3c_config *cfg, int tp) {
    if (tp <= 2) return;
    cfg->kda_heads = cfg->mla_heads = cfg->mla_kv_heads = tp;
    cfg->qk_nope_dim = cfg->qk_rope_dim = cfg->v_head_dim = 2;
}

#endif
