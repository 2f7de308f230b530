/* test_eval.c — the evaluation tasks and their scorers (k3c/exp.h): MQAR and needle documents checked against their
 * definitions, determinism and the disjoint train / test splits, the argmax scorer on hand-made logits, the byte-level
 * task corpus, and the model evaluations (packed batches = one document at a time, loss by position = the cross-entropy
 * of the logits). */
#include "test.h"

#include "k3c/exp.h"
#include "model/model.h"
#include "train/data.h"

static int is_value(int32_t c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z'); }

static void test_mqar(void) {
    k3c_err err = {0};
    k3c_task_doc d;
    int ok = 1;
    for (int64_t i = 0; i < 50; i++) {
        const int pairs = 3 + (int)(i % 20), queries = 1 + (int)(i % pairs);
        CHECK_OK(k3c_task_mqar(pairs, queries, 42, K3C_SPLIT_TRAIN, i, &d, &err), &err);
        ok = ok && d.n == 2 * pairs + 1 + 2 * queries && d.n_q == queries && d.ids[2 * pairs] == '|';
        int seen[128] = {0};
        for (int p = 0; ok && p < pairs; p++) {
            const int32_t k = d.ids[2 * p], v = d.ids[2 * p + 1];
            ok = k >= 'a' && k <= 'z' && !seen[k]++ && is_value(v);
        }
        int asked[128] = {0};
        for (int64_t q = 0; ok && q < queries; q++) {
            const int64_t at = d.q_pos[q];
            const int32_t k = d.ids[at];
            ok = at == 2 * pairs + 1 + 2 * q && seen[k] && !asked[k]++ && d.ids[at + 1] == d.q_ans[q];
            for (int p = 0; ok && p < pairs; p++) /* the answer is the value the key was paired with */
                if (d.ids[2 * p] == k) ok = d.ids[2 * p + 1] == d.q_ans[q];
        }
        k3c_task_doc_free(&d);
    }
    CHECK(ok, "MQAR: distinct keys, '|', every query a key of the document followed by its value");
    k3c_task_doc a, b, c;
    CHECK_OK(k3c_task_mqar(8, 4, 9, K3C_SPLIT_TEST, 3, &a, &err), &err);
    CHECK_OK(k3c_task_mqar(8, 4, 9, K3C_SPLIT_TEST, 3, &b, &err), &err);
    CHECK_OK(k3c_task_mqar(8, 4, 9, K3C_SPLIT_TEST, 4, &c, &err), &err);
    CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n), "same (seed, split, index): same doc");
    CHECK(memcmp(a.ids, c.ids, sizeof(int32_t) * (size_t)a.n) != 0, "another index: another document");
    k3c_task_doc_free(&a), k3c_task_doc_free(&b), k3c_task_doc_free(&c);
    CHECK(k3c_task_mqar(5, 6, 1, 0, 0, &d, &err) == K3C_EINVAL && d.ids == NULL, "queries > pairs: %s", err.msg);
    CHECK(k3c_task_mqar(27, 2, 1, 0, 0, &d, &err) == K3C_EINVAL, "27 pairs refused: %s", err.msg);
    CHECK(k3c_task_mqar(4, 2, 1, 2, 0, &d, &err) == K3C_EINVAL, "split 2 refused: %s", err.msg);
}

static uint64_t hash_of(const k3c_task_doc *d) {
    uint64_t h = K3C_FNV1A64_INIT;
    for (int64_t t = 0; t < d->n; t++) {
        unsigned char c = (unsigned char)d->ids[t];
        h = k3c_fnv1a64(&c, 1, h);
    }
    return h;
}

/* The splits: every test document hashes to 0 mod K3C_TASK_TEST_MOD, no train document does, so no test document is
 * ever a training document (small documents, where collisions would show: 2 pairs, 1 query). */
static void test_splits(void) {
    k3c_err err = {0};
    enum { N = 300 };
    static uint64_t train[N], test[N];
    int ok = 1, overlap = 0, distinct_test = 0;
    for (int64_t i = 0; i < N; i++) {
        k3c_task_doc a, b;
        CHECK_OK(k3c_task_mqar(2, 1, 5, K3C_SPLIT_TRAIN, i, &a, &err), &err);
        CHECK_OK(k3c_task_mqar(2, 1, 5, K3C_SPLIT_TEST, i, &b, &err), &err);
        train[i] = hash_of(&a), test[i] = hash_of(&b);
        ok = ok && train[i] % K3C_TASK_TEST_MOD != 0 && test[i] % K3C_TASK_TEST_MOD == 0;
        k3c_task_doc_free(&a), k3c_task_doc_free(&b);
    }
    for (int i = 0; i < N; i++) {
        int dup = 0;
        for (int j = 0; j < N; j++) overlap += train[j] == test[i], dup += j < i && test[j] == test[i];
        distinct_test += !dup;
    }
    CHECK(ok, "train documents never, test documents always hash to 0 mod %d", K3C_TASK_TEST_MOD);
    CHECK(overlap == 0 && distinct_test > 50, "train and test disjoint (%d shared), %d distinct test docs", overlap,
          distinct_test);
    k3c_task_doc a, b;
    CHECK_OK(k3c_task_needle(64, 0.5, 5, K3C_SPLIT_TEST, 0, &a, &err), &err);
    CHECK_OK(k3c_task_filler(64, 5, K3C_SPLIT_TEST, 0, &b, &err), &err);
    CHECK(hash_of(&a) % K3C_TASK_TEST_MOD == 0 && hash_of(&b) % K3C_TASK_TEST_MOD == 0, "needle / filler splits");
    k3c_task_doc_free(&a), k3c_task_doc_free(&b);
}

static void test_needle(void) {
    k3c_err err = {0};
    static const int64_t lens[] = {8, 9, 64, 333};
    static const double depths[] = {0, 0.3, 0.5, 1};
    int ok = 1;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            k3c_task_doc d;
            CHECK_OK(k3c_task_needle(lens[i], depths[j], 3, K3C_SPLIT_TRAIN, i * 4 + j, &d, &err), &err);
            const int64_t n = lens[i], at = llround(depths[j] * (double)(n - 6));
            ok = ok && d.n == n && d.n_q == 1 && d.ids[at] == '#' && d.ids[n - 3] == '?' && d.q_pos[0] == n - 2 &&
                 d.ids[at + 1] == d.ids[n - 2] && d.ids[at + 1] >= 'A' && d.ids[at + 1] <= 'Z' &&
                 d.ids[at + 2] == d.ids[n - 1] && d.q_ans[0] == d.ids[n - 1] && d.ids[n - 1] >= '0' &&
                 d.ids[n - 1] <= '9';
            for (int64_t t = 0; ok && t < n - 3; t++)
                if (t < at || t > at + 2) ok = (d.ids[t] >= 'a' && d.ids[t] <= 'z') || d.ids[t] == ' ';
            k3c_task_doc_free(&d);
        }
    CHECK(ok, "needle '#KV' at round(depth (len - 6)), question '?K' + V at the end, filler elsewhere");
    k3c_task_doc d;
    CHECK_OK(k3c_task_filler(100, 3, K3C_SPLIT_TRAIN, 0, &d, &err), &err);
    int words = d.n == 100 && d.n_q == 0;
    for (int64_t t = 0; t < d.n; t++) words = words && ((d.ids[t] >= 'a' && d.ids[t] <= 'z') || d.ids[t] == ' ');
    CHECK(words, "filler: 100 tokens of lowercase words and spaces, no query");
    k3c_task_doc_free(&d);
    CHECK(k3c_task_needle(7, 0.5, 1, 0, 0, &d, &err) == K3C_EINVAL, "length 7 refused: %s", err.msg);
    CHECK(k3c_task_needle(64, 1.5, 1, 0, 0, &d, &err) == K3C_EINVAL, "depth 1.5 refused: %s", err.msg);
    CHECK(k3c_task_filler(0, 1, 0, 0, &d, &err) == K3C_EINVAL, "length 0 refused: %s", err.msg);
}

/* Hand-made logits: a document of 4 tokens with queries at 1 and 2. */
static void test_score(void) {
    int32_t ids[4] = {1, 2, 3, 4};
    int64_t pos[2] = {1, 2};
    int32_t ans[2] = {3, 0};
    k3c_task_doc d = {ids, 4, 2, pos, ans};
    float logits[4 * 5] = {0};
    logits[1 * 5 + 3] = 2.0f; /* row 1: 3 first (right) */
    logits[2 * 5 + 4] = 1.0f; /* row 2: 4 first (wrong, the answer is 0) */
    CHECK(k3c_task_score(&d, logits, 5) == 1, "one of two answered");
    logits[2 * 5 + 4] = 0.0f; /* row 2 all zero: a tie, resolved to the smaller id, 0: right */
    CHECK(k3c_task_score(&d, logits, 5) == 2, "ties go to the smaller id");
    logits[1 * 5 + 2] = 2.0f; /* row 1: 2 and 3 tie at 2.0 → 2: wrong */
    CHECK(k3c_task_score(&d, logits, 5) == 1, "a tie at the answer's logit goes to the smaller id");
}

static void test_write_data(void) {
    k3c_err err = {0};
    const char *dir = test_tmpdir("eval_data");
    k3c_task_data_opts o = {40, 3, 4, 8, 16, 24, 0.5, 0.1};
    CHECK_OK(k3c_task_write_data(dir, &o, &err), &err);
    char p[4200];
    snprintf(p, sizeof p, "%s/data", dir);
    k3c_shard_set *tr = NULL, *va = NULL;
    CHECK_OK(k3c_shard_set_open(p, "train", &tr, &err), &err);
    CHECK_OK(k3c_shard_set_open(p, "val", &va, &err), &err);
    if (tr && va) {
        CHECK(tr->n_docs + va->n_docs == 40 && va->n_docs > 0 && tr->vocab_size == 257 && tr->eod_id == 256,
              "40 documents (%lld + %lld), vocabulary 257, <|endoftext|> = 256", (long long)tr->n_docs,
              (long long)va->n_docs);
        /* the first training document is the first corpus line unless it went to val: find it among the lines */
        snprintf(p, sizeof p, "%s/corpus.txt", dir);
        char *text;
        size_t n;
        CHECK_OK(k3c_read_file(p, &text, &n, &err), &err);
        const int64_t len = k3c_shard_set_doc_len(tr, 0);
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)len);
        const k3c_shard *sh;
        int64_t local;
        k3c_shard_set_locate(tr, 0, &sh, &local);
        k3c_shard_copy(sh, local, 0, len, tok);
        int found = 0, lines = 0;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
            int same = (int64_t)strlen(line) + 1 == len && tok[len - 1] == 256;
            for (int64_t t = 0; same && t + 1 < len; t++) same = tok[t] == (unsigned char)line[t];
            found += same;
        }
        CHECK(lines == 40 && found >= 1, "a document's tokens are its bytes then <|endoftext|> (%d lines)", lines);
        int mqar = 0;
        for (char *c = text; c < text + n; c++) mqar += *c == '|';
        CHECK(mqar == 20, "half of the documents MQAR (%d)", mqar);
        free(tok);
        free(text);
    }
    k3c_shard_set_close(tr);
    k3c_shard_set_close(va);
    o.pairs_max = 27;
    CHECK(k3c_task_write_data(dir, &o, &err) == K3C_EINVAL, "27 pairs refused: %s", err.msg);
}

/* The model evaluations against one forward per document and the cross-entropy computed here. */
static void test_model_evals(void) {
    k3c_err err = {0};
    k3c_config cfg;
    k3c_model m;
    CHECK_OK(k3c_config_load("configs/ablate/model.json", &cfg, &err), &err);
    CHECK_OK(k3c_model_create_f32(&cfg, 0, &m, &err), &err);
    k3c_model_init_f32(&m, 11, 0.3); /* a large init: logits far from uniform, so argmaxes differ by position */
    m.kda_chunk = 16;
    enum { N = 6 };
    k3c_task_doc d[N];
    for (int i = 0; i < N; i++) {
        int e = i % 2 ? k3c_task_needle(40 + 7 * i, 0.5, 1, K3C_SPLIT_TEST, i, &d[i], &err)
                      : k3c_task_mqar(4 + i, 2 + i / 2, 1, K3C_SPLIT_TEST, i, &d[i], &err);
        CHECK_OK(e, &err);
    }
    int64_t c, t, c1 = 0, t1 = 0;
    CHECK_OK(k3c_eval_tasks(&m, d, N, 64, &c, &t, &err), &err); /* 64 tokens: several batches */
    int64_t edge[4] = {0, 8, 20, 1000};
    double loss[3], sum[3] = {0}, ref[3];
    int64_t cnt[3] = {0};
    CHECK_OK(k3c_eval_position_loss(&m, d, N, edge, 3, 0, loss, &err), &err);
    const int64_t V = cfg.vocab_size;
    for (int i = 0; i < N; i++) { /* alone */
        int64_t ci, ti;
        CHECK_OK(k3c_eval_tasks(&m, &d[i], 1, 0, &ci, &ti, &err), &err);
        c1 += ci, t1 += ti;
        k3c_arena a;
        int32_t cu[2] = {0, (int32_t)d[i].n};
        k3c_model_batch b = {d[i].n, 1, d[i].ids, cu, NULL, 0, 0, NULL, NULL, NULL, NULL};
        k3c_acts *acts;
        double l;
        float *lg;
        CHECK_OK(k3c_model_arena_init_f32(&m, k3c_model_plan_bytes_f32(&m, d[i].n, 1), &a, &err), &err);
        CHECK_OK(k3c_model_forward_f32(&m, &b, &a, &acts, &l, &lg, &err), &err);
        for (int64_t p = 0; p + 1 < d[i].n; p++) {
            double mx = lg[p * V], z = 0;
            for (int64_t v = 0; v < V; v++) mx = fmax(mx, lg[p * V + v]);
            for (int64_t v = 0; v < V; v++) z += exp(lg[p * V + v] - mx);
            const int bucket = p < 8 ? 0 : p < 20 ? 1 : 2;
            sum[bucket] += log(z) + mx - lg[p * V + d[i].ids[p + 1]];
            cnt[bucket]++;
        }
        k3c_model_arena_free_f32(&m, &a);
    }
    CHECK(c == c1 && t == t1 && t == 2 + 1 + 3 + 1 + 4 + 1, "packed = alone: %lld of %lld (alone %lld of %lld)",
          (long long)c, (long long)t, (long long)c1, (long long)t1);
    for (int b = 0; b < 3; b++) ref[b] = sum[b] / (double)cnt[b];
    CHECK_LE(fabs(loss[0] - ref[0]) + fabs(loss[1] - ref[1]) + fabs(loss[2] - ref[2]), 1e-4, "position loss error");
    CHECK(loss[0] > 0 && isfinite(loss[2]), "losses %g %g %g", loss[0], loss[1], loss[2]);
    int64_t bad[3] = {0, 5, 5};
    CHECK(k3c_eval_position_loss(&m, d, N, bad, 2, 0, loss, &err) == K3C_EINVAL, "edges not ascending: %s", err.msg);
    int32_t big = 300;
    k3c_task_doc out = {&big, 1, 0, NULL, NULL};
    CHECK(k3c_eval_tasks(&m, &out, 1, 0, &c, &t, &err) == K3C_EINVAL, "a token outside the vocabulary: %s", err.msg);
    for (int i = 0; i < N; i++) k3c_task_doc_free(&d[i]);
    k3c_model_free_f32(&m);
}

int main(void) {
    test_mqar();
    test_splits();
    test_needle();
    test_score();
    test_write_data();
    test_model_evals();
    return test_summary();
}
