/* test_safetensors.c — the safetensors reader / writer and checkpoint directories (src/base/safetensors.c,
 * docs/FORMATS.md §1.2): golden files against values computed independently with python struct, round trips of
 * every dtype, sharded checkpoints, and malformed files that must fail with a message naming the file and the reason. */
#include "test.h"

#include "base/json.h"

static double sum_f64(const double *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

/* Expected values below were computed with python3 struct (no numpy) straight from the file bytes:
 * v0, v1, vlast = first, second and last element; sum = left-to-right float64 sum of all elements. */
typedef struct {
    const char *name;
    k3c_dtype dtype;
    int ndim;
    int64_t shape[4];
    double v0, v1, vlast, sum;
} golden_tensor;

static void check_golden_tensor(const k3c_st_tensor *t, const golden_tensor *g) {
    CHECK(t != NULL, "tensor %s not found", g->name);
    if (!t) return;
    int shape_ok = t->ndim == g->ndim;
    for (int d = 0; shape_ok && d < g->ndim; d++) shape_ok = t->shape[d] == g->shape[d];
    CHECK(t->dtype == g->dtype && shape_ok, "%s: dtype %s ndim %d", g->name, k3c_dtype_name(t->dtype), t->ndim);
    if (t->dtype == K3C_U8) {
        const unsigned char *b = t->data;
        double s = 0;
        for (size_t i = 0; i < t->nbytes; i++) s += b[i];
        CHECK(b[0] == g->v0 && b[1] == g->v1 && b[t->nbytes - 1] == g->vlast && s == g->sum, "%s: U8 bytes", g->name);
        return;
    }
    size_t n = 1;
    for (int d = 0; d < g->ndim; d++) n *= (size_t)g->shape[d];
    CHECK(t->nbytes == n * k3c_dtype_size(g->dtype), "%s: nbytes %zu", g->name, t->nbytes);
    double *x = malloc(n * sizeof *x);
    float *xf = malloc(n * sizeof *xf);
    k3c_err err = {0};
    CHECK_OK(k3c_st_read_f64(t, x, n, &err), &err);
    CHECK_OK(k3c_st_read_f32(t, xf, n, &err), &err);
    /* F32 / BF16 values are exact in double; the sum is the same left-to-right sum as python's, so equality is exact. */
    CHECK(x[0] == g->v0 && x[1] == g->v1 && x[n - 1] == g->vlast, "%s: values %.17g %.17g %.17g", g->name, x[0], x[1],
          x[n - 1]);
    CHECK(sum_f64(x, n) == g->sum, "%s: sum %.17g != %.17g", g->name, sum_f64(x, n), g->sum);
    CHECK((double)xf[0] == g->v0 && (double)xf[n - 1] == g->vlast, "%s: f32 read", g->name);
    free(x);
    free(xf);
}

static void check_golden_file(const char *rel, int count, int64_t numel, const golden_tensor *g, int ng) {
    const char *path = test_shared(rel);
    k3c_safetensors *st = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_st_open(path, &st, &err), &err);
    if (!st) return;
    CHECK(k3c_st_count(st) == count, "%s: %d tensors", rel, k3c_st_count(st));
    int64_t total = 0;
    for (int i = 0; i < k3c_st_count(st); i++) {
        const k3c_st_tensor *t = k3c_st_at(st, i);
        int64_t m = 1;
        for (int d = 0; d < t->ndim; d++) m *= t->shape[d];
        total += m;
        CHECK(t->file && strcmp(t->file, path) == 0 && k3c_st_find(st, t->name) == t, "find(at(%d))", i);
    }
    CHECK(total == numel, "%s: total numel %lld", rel, (long long)total);
    CHECK(k3c_st_at(st, -1) == NULL && k3c_st_at(st, count) == NULL && k3c_st_find(st, "nope") == NULL, "out of range");
    const char *fmt = k3c_st_metadata(st, "format");
    CHECK(fmt && strcmp(fmt, "pt") == 0 && k3c_st_metadata(st, "other") == NULL, "__metadata__ format = pt");
    for (int i = 0; i < ng; i++) check_golden_tensor(k3c_st_find(st, g[i].name), &g[i]);

    /* The same file through k3c_ckpt_open on its directory. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    k3c_checkpoint *c = NULL;
    CHECK_OK(k3c_ckpt_open(dir, &c, &err), &err);
    if (c) {
        CHECK(k3c_ckpt_count(c) == count, "ckpt count %d", k3c_ckpt_count(c));
        for (int i = 0; i < ng; i++) check_golden_tensor(k3c_ckpt_find(c, g[i].name), &g[i]);
        CHECK(k3c_ckpt_find(c, "missing.weight") == NULL && k3c_ckpt_at(c, count) == NULL, "ckpt misses");
        k3c_ckpt_close(c);
    }
    k3c_st_close(st);
}

static void test_golden(void) {
    static const golden_tensor kl[] = {
        {"lm_head.weight",
         K3C_F32,
         2,
         {512, 64},
         0.11918870359659195,
         -0.11249600350856781,
         0.20245276391506195,
         16.234495450091913},
        {"model.layers.0.input_layernorm.weight",
         K3C_F32,
         1,
         {64},
         0.9235298037528992,
         0.858880341053009,
         0.9571965932846069,
         63.94013375043869},
        {"model.layers.1.self_attn.A_log",
         K3C_F32,
         4,
         {1, 1, 4, 1},
         1.8291494846343994,
         2.4893457889556885,
         0.7898335456848145,
         6.572300434112549},
        {"model.layers.3.self_attn.kv_a_proj_with_mqa.weight",
         K3C_F32,
         2,
         {40, 64},
         -0.11145368218421936,
         -0.021239206194877625,
         -0.03413297235965729,
         5.062903354220907},
    };
    check_golden_file("golden/kimi_linear_tiny_a/model.safetensors", 151, 339828, kl, 4);
    static const golden_tensor k3[] = {
        {"language_model.model.layers.0.input_layernorm.weight",
         K3C_BF16,
         1,
         {128},
         0.84765625,
         1.1875,
         0.8125,
         125.0234375},
        {"language_model.lm_head.weight",
         K3C_BF16,
         2,
         {2048, 128},
         0.08447265625,
         -0.26953125,
         0.01513671875,
         -37.00638090074062},
        {"language_model.model.layers.1.self_attn.A_log",
         K3C_F32,
         1,
         {32},
         -0.017601339146494865,
         1.385082483291626,
         0.0,
         1.4256522972136736},
        {"language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed",
         K3C_U8,
         2,
         {64, 32},
         106,
         174,
         206,
         257694},
        {"language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale",
         K3C_U8,
         2,
         {64, 2},
         124,
         124,
         124,
         15912},
    };
    check_golden_file("golden/k3_tiny_a/model.safetensors", 1492, 4401856, k3, 5);

    /* Reading U8 as float is refused, and so is a destination of the wrong size. */
    k3c_safetensors *st = NULL;
    k3c_err err = {0};
    if (k3c_st_open(test_shared("golden/k3_tiny_a/model.safetensors"), &st, &err) != K3C_OK) return;
    const k3c_st_tensor *u8 = k3c_st_find(st, k3[3].name), *bf = k3c_st_find(st, k3[0].name);
    float buf[4096];
    double dbuf[256];
    CHECK(u8 && k3c_st_read_f32(u8, buf, 2048, &err) == K3C_EINVAL && strstr(err.msg, "U8 is not a floating type") &&
              strstr(err.msg, "weight_packed") && strstr(err.msg, "model.safetensors"),
          "U8 read refused: %s", err.msg);
    CHECK(bf && k3c_st_read_f32(bf, buf, 127, &err) == K3C_EINVAL &&
              strstr(err.msg, "holds 127 elements, tensor has 128"),
          "wrong count refused: %s", err.msg);
    CHECK(bf && k3c_st_read_f64(bf, dbuf, 129, &err) == K3C_EINVAL, "wrong count refused (f64)");
    k3c_st_close(st);
}

/* ------------------------------------------------------------------ round trips */

static void fill_bytes(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 2654435761u + seed) >> 7);
}

static void test_roundtrip(void) {
    const char *dir = test_tmpdir("test_safetensors_rt");
    char path[4200];
    snprintf(path, sizeof path, "%s/all.safetensors", dir);
    double f64[6] = {1.5, -2.25, 1e-300, 3.141592653589793, 0, -0.0};
    float f32[6] = {1.5f, -2.25f, 1e-30f, 3.14159265f, 65504.0f, -0.0f};
    uint16_t bf16[6], f16[6];
    for (int i = 0; i < 6; i++) {
        bf16[i] = k3c_f32_to_bf16(f32[i]);
        f16[i] = k3c_f32_to_f16(f32[i]);
    }
    int64_t i64[3] = {INT64_MIN, -1, INT64_MAX};
    int32_t i32[4] = {INT32_MIN, 0, 7, INT32_MAX};
    unsigned char u8[35];
    fill_bytes(u8, sizeof u8, 3);
    double scalar = 42.0;
    k3c_st_entry e[] = {
        {"w.f64", K3C_F64, 2, {2, 3}, f64},  {"w.f32", K3C_F32, 3, {1, 2, 3}, f32},
        {"w.bf16", K3C_BF16, 1, {6}, bf16},  {"w.f16", K3C_F16, 2, {3, 2}, f16},
        {"w.i64", K3C_I64, 1, {3}, i64},     {"w.i32", K3C_I32, 2, {2, 2}, i32},
        {"w.u8", K3C_U8, 2, {5, 7}, u8},     {"scalar", K3C_F64, 0, {0}, &scalar},
        {"empty", K3C_F32, 2, {0, 3}, NULL}, {"\xc3\xa9t\xc3\xa9 \"q\"\\", K3C_U8, 1, {3}, u8},
    };
    int n = (int)(sizeof e / sizeof *e);
    const char *meta[] = {"format", "pt", "note", "line\nbreak \"quoted\" \xe2\x82\xac", NULL};
    k3c_err err = {0};
    CHECK_OK(k3c_st_write(path, e, n, meta, &err), &err);
    /* Writing again replaces the file atomically and leaves no temporary behind. */
    CHECK_OK(k3c_st_write(path, e, n, meta, &err), &err);
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "temporary file removed");

    char *raw = NULL;
    size_t rawn = 0;
    CHECK_OK(k3c_read_file(path, &raw, &rawn, &err), &err);
    if (raw) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)raw[i];
        CHECK(hl % 8 == 0 && raw[8] == '{' && (raw[8 + hl - 1] == ' ' || raw[8 + hl - 1] == '}'),
              "header padded to 8: %llu", (unsigned long long)hl);
        CHECK(strncmp(raw + 8, "{\"__metadata__\":{\"format\":\"pt\"", 30) == 0, "metadata first");
        free(raw);
    }

    k3c_safetensors *st = NULL;
    CHECK_OK(k3c_st_open(path, &st, &err), &err);
    if (!st) return;
    CHECK(k3c_st_count(st) == n, "count %d", k3c_st_count(st));
    for (int i = 0; i < n && i < k3c_st_count(st); i++) {
        const k3c_st_tensor *t = k3c_st_at(st, i);
        size_t nb = k3c_dtype_size(e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++) nb *= (size_t)e[i].shape[d];
        int same = strcmp(t->name, e[i].name) == 0 && t->dtype == e[i].dtype && t->ndim == e[i].ndim && t->nbytes == nb;
        for (int d = 0; same && d < e[i].ndim; d++) same = t->shape[d] == e[i].shape[d];
        CHECK(same && (nb == 0 || memcmp(t->data, e[i].data, nb) == 0), "entry %d (%s) round trip, in order", i,
              e[i].name);
    }
    CHECK(strcmp(k3c_st_metadata(st, "note"), meta[3]) == 0, "metadata value with escapes");
    double back[6];
    CHECK_OK(k3c_st_read_f64(k3c_st_find(st, "w.f16"), back, 6, &err), &err);
    CHECK(back[0] == 1.5 && back[1] == -2.25 && back[4] == 65504.0 && signbit(back[5]), "f16 values");
    CHECK_OK(k3c_st_read_f64(k3c_st_find(st, "w.bf16"), back, 6, &err), &err);
    CHECK(back[0] == 1.5 && back[1] == -2.25 && fabs(back[3] - 3.14159265) < 0.01, "bf16 values (1/128 relative)");
    CHECK_OK(k3c_st_read_f64(k3c_st_find(st, "scalar"), back, 1, &err), &err);
    CHECK(back[0] == 42.0, "0-d scalar");
    CHECK_OK(k3c_st_read_f32(k3c_st_find(st, "empty"), NULL, 0, &err), &err);
    CHECK(k3c_st_read_f32(k3c_st_find(st, "w.i32"), (float *)back, 4, &err) == K3C_EINVAL, "I32 is not floating");
    k3c_st_close(st);

    /* An empty file (no tensors, no metadata) is valid. */
    snprintf(path, sizeof path, "%s/none.safetensors", dir);
    CHECK_OK(k3c_st_write(path, NULL, 0, NULL, &err), &err);
    CHECK_OK(k3c_st_open(path, &st, &err), &err);
    CHECK(st && k3c_st_count(st) == 0 && k3c_st_metadata(st, "format") == NULL, "empty file");
    k3c_st_close(st);

    /* The writer refuses what the reader would refuse. */
    k3c_st_entry dup[] = {{"a", K3C_F32, 1, {1}, f32}, {"a", K3C_F32, 1, {1}, f32}};
    CHECK(k3c_st_write(path, dup, 2, NULL, &err) == K3C_EINVAL && strstr(err.msg, "'a': duplicate name"), "dup: %s",
          err.msg);
    k3c_st_entry neg[] = {{"a", K3C_F32, 1, {-1}, f32}};
    CHECK(k3c_st_write(path, neg, 1, NULL, &err) == K3C_EINVAL && strstr(err.msg, "negative"), "neg: %s", err.msg);
    k3c_st_entry res[] = {{"__metadata__", K3C_F32, 1, {1}, f32}};
    CHECK(k3c_st_write(path, res, 1, NULL, &err) == K3C_EINVAL, "reserved name");
    const char *badmeta[] = {"k", NULL, NULL};
    CHECK(k3c_st_write(path, e, 1, badmeta, &err) == K3C_EINVAL && strstr(err.msg, "no value"), "meta: %s", err.msg);
    const char *dupmeta[] = {"k", "1", "k", "2", NULL};
    CHECK(k3c_st_write(path, e, 1, dupmeta, &err) == K3C_EINVAL && strstr(err.msg, "duplicate metadata"), "meta dup");
    CHECK(k3c_st_open(path, &st, &err) == K3C_OK && k3c_st_count(st) == 0, "failed writes left the old file intact");
    k3c_st_close(st);
}

/* ------------------------------------------------------------------ sharded checkpoints */

static void write_text(const char *path, const char *text) {
    k3c_err err = {0};
    CHECK_OK(k3c_write_file_atomic(path, text, strlen(text), &err), &err);
}

static int open_fails(const char *dir, const char *w1, const char *w2) {
    k3c_checkpoint *c = (k3c_checkpoint *)1;
    k3c_err err = {0};
    int rc = k3c_ckpt_open(dir, &c, &err);
    int ok = rc < 0 && c == NULL && strstr(err.msg, w1) && (!w2 || strstr(err.msg, w2));
    CHECK(ok, "ckpt open of %s should fail naming '%s' / '%s': rc %d, %s", dir, w1, w2 ? w2 : "", rc, err.msg);
    return ok;
}

static void test_sharded(void) {
    const char *dir0 = test_tmpdir("test_safetensors_shard");
    char dir[4096], p[4300], ip[4300];
    snprintf(dir, sizeof dir, "%s", dir0);
    float a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8}, cc[3] = {9, 10, 11};
    k3c_st_entry s1[] = {{"m.a", K3C_F32, 2, {2, 3}, a}, {"m.b", K3C_F32, 1, {2}, b}};
    k3c_st_entry s2[] = {{"m.c", K3C_F32, 1, {3}, cc}};
    k3c_err err = {0};
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    CHECK_OK(k3c_st_write(p, s1, 2, NULL, &err), &err);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    CHECK_OK(k3c_st_write(p, s2, 1, NULL, &err), &err);
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    write_text(ip,
               "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {\"m.a\": \"model-00001-of-00002.safetensors\", "
               "\"m.c\": \"model-00002-of-00002.safetensors\", \"m.b\": \"model-00001-of-00002.safetensors\"}}");
    k3c_checkpoint *c = NULL;
    CHECK_OK(k3c_ckpt_open(dir, &c, &err), &err);
    if (c) {
        CHECK(k3c_ckpt_count(c) == 3, "3 tensors");
        const k3c_st_tensor *t = k3c_ckpt_find(c, "m.c");
        float got[3] = {0};
        CHECK(t && strstr(t->file, "model-00002-of-00002.safetensors"), "m.c in shard 2");
        CHECK(t && k3c_st_read_f32(t, got, 3, &err) == K3C_OK && got[0] == 9 && got[2] == 11, "m.c values");
        t = k3c_ckpt_find(c, "m.b");
        CHECK(t && strstr(t->file, "model-00001") && ((const float *)t->data)[1] == 8, "m.b in shard 1");
        k3c_ckpt_close(c);
    }
    /* The index file itself may be given instead of the directory. */
    CHECK_OK(k3c_ckpt_open(ip, &c, &err), &err);
    CHECK(c && k3c_ckpt_count(c) == 3, "open by index path");
    k3c_ckpt_close(c);

    write_text(ip, "{\"weight_map\": {\"m.a\": \"model-00001-of-00002.safetensors\", \"m.b\": "
                   "\"model-00001-of-00002.safetensors\", "
                   "\"m.c\": \"model-00002-of-00002.safetensors\", \"m.d\": \"model-00003-of-00002.safetensors\"}}");
    open_fails(dir, "model-00003-of-00002.safetensors", "cannot open");
    write_text(ip, "{\"weight_map\": {\"m.a\": \"model-00001-of-00002.safetensors\", \"m.b\": "
                   "\"model-00001-of-00002.safetensors\", "
                   "\"m.zz\": \"model-00001-of-00002.safetensors\", \"m.c\": \"model-00002-of-00002.safetensors\"}}");
    open_fails(dir, "'m.zz'", "no such tensor");
    write_text(ip, "{\"weight_map\": {\"m.a\": \"model-00001-of-00002.safetensors\", \"m.c\": "
                   "\"model-00002-of-00002.safetensors\"}}");
    open_fails(dir, "'m.b'", "not listed in weight_map");
    write_text(ip, "{\"weight_map\": {\"m.a\": \"model-00002-of-00002.safetensors\", \"m.b\": "
                   "\"model-00001-of-00002.safetensors\", "
                   "\"m.c\": \"model-00002-of-00002.safetensors\"}}");
    open_fails(dir, "'m.a'", "no such tensor");
    write_text(ip, "{\"weight_map\": {\"m.a\": \"../model-00001-of-00002.safetensors\"}}");
    open_fails(dir, "model.safetensors.index.json", "inside the directory");
    write_text(ip, "{\"weight_map\": {\"m.a\": 3}}");
    open_fails(dir, "model.safetensors.index.json", "weight_map['m.a']");
    write_text(ip, "{\"metadata\": {}}");
    open_fails(dir, "model.safetensors.index.json", "missing weight_map");
    write_text(ip, "{\"weight_map\": {\"m.a\": \"x\",}}");
    open_fails(dir, "model.safetensors.index.json:1:28:", "trailing comma");
    unlink(ip);
    open_fails(dir, "neither model.safetensors.index.json nor model.safetensors", NULL);
    open_fails("build/tmp/no/such/dir", "build/tmp/no/such/dir", NULL);
}

/* Many tensors: the JSON header, duplicate check and name lookup must all stay near-linear. */
static void test_many(void) {
    const char *dir = test_tmpdir("test_safetensors_many");
    enum { N = 60000 };
    char(*names)[24] = malloc(sizeof(char[24]) * N);
    k3c_st_entry *e = calloc(N, sizeof *e);
    unsigned char *data = malloc(N);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.w", i);
        data[i] = (unsigned char)i;
        e[i] = (k3c_st_entry){names[i], K3C_U8, 1, {1}, data + i};
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    k3c_err err = {0};
    double t0 = k3c_now();
    CHECK_OK(k3c_st_write(path, e, N, NULL, &err), &err);
    k3c_checkpoint *c = NULL;
    CHECK_OK(k3c_ckpt_open(dir, &c, &err), &err);
    int found = 0;
    for (int i = 0; c && i < N; i++) {
        const k3c_st_tensor *t = k3c_ckpt_find(c, names[i]);
        found += t && *(const unsigned char *)t->data == (unsigned char)i;
    }
    double dt = k3c_now() - t0;
    CHECK(found == N, "found %d of %d", found, N);
    CHECK_LE(dt, 10.0, "seconds to write, open and look up 60k tensors");
    k3c_ckpt_close(c);
    free(names);
    free(e);
    free(data);
}

/* ------------------------------------------------------------------ malformed files */

/* Writes [u64 header length][header][data_len zero bytes]; hl_override replaces the length field when nonzero. */
static void write_raw(const char *path, const char *header, uint64_t hl_override, size_t data_len) {
    size_t hl = strlen(header), n = 8 + hl + data_len;
    unsigned char *buf = calloc(n, 1);
    uint64_t field = hl_override ? hl_override : hl;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(field >> (8 * i));
    memcpy(buf + 8, header, hl);
    k3c_err err = {0};
    CHECK_OK(k3c_write_file_atomic(path, buf, n, &err), &err);
    free(buf);
}

static void expect_bad(const char *dir, const char *header, uint64_t hl, size_t data_len, const char *why) {
    static int count;
    char path[4200];
    snprintf(path, sizeof path, "%s/bad%02d.safetensors", dir, count++);
    write_raw(path, header, hl, data_len);
    k3c_safetensors *st = (k3c_safetensors *)1;
    k3c_err err = {0};
    int rc = k3c_st_open(path, &st, &err);
    CHECK(rc < 0 && st == NULL && strstr(err.msg, path) && strstr(err.msg, why),
          "%s [%.60s]: rc %d, message '%s' should name the file and say '%s'", path, header, rc, err.msg, why);
}

#define T1(dt, shape, off) "{\"t\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}}"

static void test_malformed(void) {
    const char *dir = test_tmpdir("test_safetensors_bad");
    char path[4200];
    k3c_err err = {0};
    k3c_safetensors *st = NULL;

    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    CHECK_OK(k3c_write_file_atomic(path, "\x10\0\0\0\0", 5, &err), &err);
    CHECK(k3c_st_open(path, &st, &err) == K3C_EFORMAT && st == NULL && strstr(err.msg, path) &&
              strstr(err.msg, "shorter than the 8-byte header length"),
          "truncated: %s", err.msg);
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    CHECK(k3c_st_open(path, &st, &err) == K3C_ENOTFOUND && strstr(err.msg, path), "missing file: %s", err.msg);

    expect_bad(dir, T1("F32", "[2]", "[0,8]"), 100, 8, "runs past the end of the file");
    expect_bad(dir, T1("F32", "[2]", "[0,8]"), 100000001, 8, "exceeds the 100 MB limit");
    expect_bad(dir, "{\"t\": nope}", 0, 0, "(header):1:7: invalid literal");
    expect_bad(dir, "not json", 0, 0, "(header):1:1:");
    expect_bad(dir, "[1, 2]  ", 0, 0, "header is not a JSON object");
    expect_bad(dir, T1("F32", "[2]", "[0,8]"), 0, 4, "out of range (data region is 4 bytes)");
    expect_bad(dir,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               0, 12, "overlap");
    expect_bad(dir,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
               0, 20, "hole in the data region: bytes [8, 12)");
    expect_bad(dir, T1("F32", "[2]", "[4,12]"), 0, 12, "hole in the data region: bytes [0, 4)");
    expect_bad(dir, T1("F32", "[2]", "[0,8]"), 0, 12, "tensors end at byte 8 of a 12-byte data region");
    expect_bad(dir, T1("F32", "[3]", "[0,8]"), 0, 8, "span 8 bytes but F32 x 3 elements need 12");
    expect_bad(dir, T1("BF16", "[2,2]", "[0,16]"), 0, 16, "span 16 bytes but BF16 x 4 elements need 8");
    expect_bad(dir, T1("F8_E4M3", "[2]", "[0,2]"), 0, 2, "unknown or unsupported dtype 'F8_E4M3'");
    expect_bad(dir, T1("F32", "[-2]", "[0,8]"), 0, 8, "shape entries must be non-negative integers");
    expect_bad(dir, T1("F32", "[2.5]", "[0,8]"), 0, 8, "shape entries must be non-negative integers");
    expect_bad(dir, T1("F32", "[4294967296,4294967296]", "[0,8]"), 0, 8, "overflows");
    expect_bad(dir, T1("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 0, 4, "9 dims (max 8)");
    expect_bad(dir, T1("F32", "\"2\"", "[0,8]"), 0, 8, "shape is not an array");
    expect_bad(dir, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 8, "tensor 't': missing data_offsets");
    expect_bad(dir, "{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "tensor 't': missing dtype");
    expect_bad(dir, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 0, 8,
               "unexpected field 'x'");
    expect_bad(dir, T1("F32", "[2]", "[8,0]"), 0, 8, "begin 8 > end 0");
    expect_bad(dir, T1("F32", "[2]", "[0,8,9]"), 0, 8, "data_offsets must be two non-negative integers");
    expect_bad(dir, T1("F32", "[2]", "[0,-8]"), 0, 8, "data_offsets must be two non-negative integers");
    expect_bad(dir, "{\"t\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "dtype is not a string");
    expect_bad(dir, "{\"t\":[1,2]}", 0, 0, "tensor 't': entry is not a JSON object");
    expect_bad(dir, "{\"__metadata__\":{\"format\":1}}", 0, 0, "__metadata__ value of 'format' is not a string");
    expect_bad(dir, "{\"__metadata__\":[\"pt\"]}", 0, 0, "__metadata__ is not a JSON object");
    expect_bad(dir,
               "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               0, 2, "duplicate key \"a\"");
    expect_bad(dir,
               "{\"a\\u0000x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\\u0000y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               0, 2, "duplicate name");
    expect_bad(dir, "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 0, 8, "trailing comma");

    /* A zero-size tensor inside the tiling and an odd (unaligned) header length are both valid. */
    snprintf(path, sizeof path, "%s/odd.safetensors", dir);
    write_raw(path,
              "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[4,20]}} ",
              0, 20);
    CHECK_OK(k3c_st_open(path, &st, &err), &err);
    if (st) {
        const k3c_st_tensor *b = k3c_st_find(st, "b");
        double x[2] = {1, 1};
        CHECK(k3c_st_count(st) == 3 && b && k3c_st_read_f64(b, x, 2, &err) == K3C_OK && x[0] == 0 && x[1] == 0,
              "unaligned F64 data read through the bounce buffer");
        k3c_st_close(st);
    }
}

int main(void) {
    test_golden();
    test_roundtrip();
    test_sharded();
    test_many();
    test_malformed();
    return test_summary();
}
