/* test_vision_data.c — interleaved image-text training data: JSONL samples (images → prompts with their placeholder
 * count, targets without loss on image tokens or before the answer), bad lines reported with file, line and reason
 * and skipped; `k3c vision train` on two images learns to tell them apart (tower and model both trained, held-out
 * scoring on the same two), and its output directory serves images. Built by make cuda-tests (-DK3C_CUDA) and run on
 * a GPU, vision training on the CUDA table against the CPU from the same weights; the CPU build reports it as not
 * run. */
#include "serve_fixture.h"

#include "base/check.h"
#include "k3c/device.h"
#include "vision/vision.h"

#include <sys/stat.h>

/* 30x20 PNGs (2 image tokens each: padded to 56x28), made with zlib once: two patterns, and bright left / right. */
#define PNG_A                                                                                                          \
    "iVBORw0KGgoAAAANSUhEUgAAAB4AAAAUCAIAAAAVyRqTAAAALklEQVR42mNgENGAoBN3PkAQ1URGjUYTob6JMJFRo9GNHk18o+l6NF2PpmsKRA"   \
    "Akp0vutlNl+wAAAABJRU5ErkJggg=="
#define PNG_B                                                                                                          \
    "iVBORw0KGgoAAAANSUhEUgAAAB4AAAAUCAIAAAAVyRqTAAAAL0lEQVR42mPYcukDMmKQs0FGlMgy0NBoKpqFLktDo0fDejSsR8N6NKxHw3pIhDUA" \
    "br"                                                                                                               \
    "VL7r05uEsAAAAASUVORK5CYII="

#define PNG_L                                                                                                          \
    "iVBORw0KGgoAAAANSUhEUgAAAB4AAAAUCAIAAAAVyRqTAAAAIElEQVR42mP4QArgIgUwjBo9avSo0aNGjxo9avRQNBoAEGxvFv5jPfMAAAAASUVO" \
    "RK5CYII="
#define PNG_R                                                                                                          \
    "iVBORw0KGgoAAAANSUhEUgAAAB4AAAAUCAIAAAAVyRqTAAAAIElEQVR42mPgIgV8IAUwjBo9avSo0aNGjxo9avRQNBoA5VNvFhdIsfoAAAAASUVO" \
    "RK5CYII="

static void write_b64(const char *dir, const char *name, const char *b64) {
    unsigned char bytes[256];
    size_t n = 0;
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    k3c_err err = {0};
    CHECK(k3c_base64_decode(b64, strlen(b64), bytes, &n) == 0, "%s decodes", name);
    CHECK_OK(k3c_write_file_atomic(p, bytes, n, &err), &err);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    serve_write(p, text);
}

static void samples(const char *dir) {
    k3c_err err = {0};
    write_b64(dir, "a.png", PNG_A);
    write_b64(dir, "b.png", PNG_B);
    write_text(dir, "notimage.png", "hello, not an image\n");
    write_text(dir, "data.jsonl",
               "{\"text\": \"<image>What is this?\", \"images\": [\"a.png\"], \"answer\": \" stripes\"}\n"
               "{\"text\": \"Compare <image> with <image>.\", \"images\": [\"a.png\", \"b.png\"]}\n"
               "{\"text\": \"<image>\", \"images\": [\"missing.png\"], \"answer\": \" x\"}\n"
               "{\"text\": \"no closing brace\"\n"
               "\n"
               "{\"text\": \"<image><image>\", \"images\": [\"a.png\"]}\n"
               "{\"text\": \"<image>?\", \"images\": [\"notimage.png\"], \"answer\": \" y\"}\n"
               "{\"text\": 5}\n");
    k3c_tok *tok = NULL;
    k3c_config cfg;
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK_OK(k3c_tok_load_dir(dir, NULL, &tok, &err), &err);
    CHECK_OK(k3c_config_load(p, &cfg, &err), &err);
    if (!tok) return;
    snprintf(p, sizeof p, "%s/data.jsonl", dir);
    k3c_vdata d;
    CHECK_OK(k3c_vdata_load(p, tok, &cfg.vision, 512, &d, &err), &err);
    CHECK(d.n == 2 && d.n_bad == 5, "2 samples, 5 bad lines (got %zu, %d)", d.n, d.n_bad);
    const char *want[5] = {":3: ", ":4: ", ":6: ", ":7: ", ":8: "};
    for (int i = 0; i < 5 && d.report; i++) {
        char needle[4500];
        snprintf(needle, sizeof needle, "%s%s", p, want[i]);
        CHECK(strstr(d.report, needle) != NULL, "the report names line %s: %s", want[i], d.report);
    }
    CHECK(d.report && strstr(d.report, "missing.png") && strstr(d.report, "2 <image> markers for 1 images") &&
              strstr(d.report, "notimage.png") && strstr(d.report, "\"text\""),
          "reasons: %s", d.report ? d.report : "");
    const int32_t pad = (int32_t)cfg.vision.media_pad_id;
    for (size_t i = 0; i < d.n; i++) {
        const k3c_vsample *s = &d.s[i];
        CHECK(k3c_vision_pad_positions(s->ids, s->n, pad, NULL) == s->n_img_tokens && s->n_img_tokens == 2 * s->n_img,
              "sample %zu: %lld placeholders for %d images", i, (long long)s->n_img_tokens, s->n_img);
        CHECK(s->n_patches == 8 * s->n_img && s->grid[0].h == 2 && s->grid[0].w == 4, "sample %zu: 2x4 patches", i);
        int bad = 0, counted = 0;
        for (int64_t t = 0; t + 1 < s->n; t++) {
            const int img = s->ids[t] == pad || s->ids[t + 1] == pad, before = t + 1 < s->answer_at;
            const int32_t want_t = img || before ? -1 : s->ids[t + 1];
            bad += s->targets[t] != want_t;
            counted += want_t >= 0;
        }
        CHECK(!bad && s->targets[s->n - 1] == -1 && counted > 0, "sample %zu: targets (%d wrong)", i, bad);
    }
    CHECK(d.s[0].answer && !strcmp(d.s[0].answer, " stripes") && d.s[0].answer_at > 0 && !d.s[1].answer,
          "answers kept");
    k3c_vdata_free(&d);
    write_text(dir, "allbad.jsonl", "{\"text\": 1}\n");
    snprintf(p, sizeof p, "%s/allbad.jsonl", dir);
    CHECK(k3c_vdata_load(p, tok, &cfg.vision, 512, &d, &err) == K3C_EFORMAT && strstr(err.msg, "no usable sample"),
          "no usable line is an error: %s", err.msg);
    k3c_tok_free(tok);
}

/* Two images, two answers: after training, each image's answer scores best; the tower moved. */
static void train_two(const char *dir) {
    k3c_err err = {0};
    write_b64(dir, "l.png", PNG_L);
    write_b64(dir, "r.png", PNG_R);
    write_text(dir, "two.jsonl",
               "{\"text\": \"<image>Which side is bright?\", \"images\": [\"l.png\"], \"answer\": \" left\"}\n"
               "{\"text\": \"<image>Which side is bright?\", \"images\": [\"r.png\"], \"answer\": \" right\"}\n");
    char data[4400];
    snprintf(data, sizeof data, "%s/two.jsonl", dir);
    k3c_vision *before = NULL, *after = NULL;
    k3c_vtrain_opts o = {.dir = dir,
                         .data = data,
                         .eval = data,
                         .steps = 0,
                         .batch = 8,
                         .max_tokens = 256,
                         .lr = 1e-2,
                         .tower_lr = 1e-2,
                         .grad_clip = 1,
                         .seed = 3,
                         .log_every = 10,
                         .log = getenv("K3C_TEST_VERBOSE") ? stdout : NULL};
    k3c_vtrain_result r;
    CHECK_OK(k3c_vision_train(&o, &r, &err), &err); /* no weights in dir: a seeded init, saved */
    CHECK_OK(k3c_vision_open_f32(dir, 0, &before, &err), &err);
    o.steps = 50;
    CHECK_OK(k3c_vision_train(&o, &r, &err), &err); /* continues from the saved weights */
    CHECK(r.last_loss < 0.2 * r.first_loss, "loss falls: %.4f -> %.4f", r.first_loss, r.last_loss);
    CHECK(r.n_eval == 2 && r.chance == 0.5 && r.accuracy == 1.0, "both images answered right (%.2f of %lld)",
          r.accuracy, (long long)r.n_eval);
    CHECK_OK(k3c_vision_open_f32(dir, 0, &after, &err), &err);
    if (before && after)
        CHECK(memcmp(k3c_vision_weights(before), k3c_vision_weights(after),
                     sizeof(float) * k3c_vision_param_count(after)) != 0,
              "the tower was trained and saved");
    k3c_vision_free(before);
    k3c_vision_free(after);
    o.data = "/nonexistent/x.jsonl";
    CHECK(k3c_vision_train(&o, &r, &err) == K3C_EIO && strstr(err.msg, "/nonexistent/x.jsonl"),
          "a missing data file is an error naming it: %s", err.msg);
}

/* ‖a − b‖ / ‖b − base‖ over n floats: how far a is from b, relative to how far b moved from base. */
static double moved_err(const float *a, const float *b, const float *base, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    for (size_t i = 0; i < n; i++) den += ((double)b[i] - base[i]) * ((double)b[i] - base[i]);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The weights of a trained directory: the text model's flat buffer and the tower (host copies; free them). */
static int read_weights(const char *dir, float **m, size_t *nm, float **v, size_t *nv, k3c_err *err) {
    k3c_model mo;
    k3c_vision *t = NULL;
    CHECK_RC(k3c_model_open_f32(dir, 0, &mo, err));
    *nm = mo.table.total, *m = malloc(sizeof(float) * *nm);
    memcpy(*m, mo.w, sizeof(float) * *nm);
    k3c_model_free_f32(&mo);
    CHECK_RC(k3c_vision_open_f32(dir, 0, &t, err));
    *nv = k3c_vision_param_count(t), *v = malloc(sizeof(float) * *nv);
    memcpy(*v, k3c_vision_weights(t), sizeof(float) * *nv);
    k3c_vision_free(t);
    return K3C_OK;
}

/* Four steps of `dir`'s two-image training from its saved weights on the CPU and on CUDA (fp32 GEMMs and kernels,
 * the checking modes), each in its own copy: the same first loss, the same updates within the CUDA table's
 * tolerance of GEMM-based ops (test_backend_ops: 1e-4 per op; a few percent of slack for four steps of them). */
static void train_on_cuda(const char *dir) {
    k3c_err err = {0};
    k3c_device *dev = NULL;
    int rc = k3c_device_open("cuda", 0, "fp32", "fp32", &dev, &err);
#ifdef K3C_CUDA
    CHECK_OK(rc, &err);
#else
    if (rc == K3C_EUNSUPPORTED) printf("vision training on CUDA: not run (%s)\n", err.msg);
    else CHECK(0, "a CPU build opens no CUDA device: %s", k3c_status_name(rc));
#endif
    if (rc) return;
    char cpu[4400], gpu[4400], cmd[24000], data[4400];
    snprintf(cpu, sizeof cpu, "%s/on_cpu", dir), snprintf(gpu, sizeof gpu, "%s/on_gpu", dir);
    snprintf(data, sizeof data, "%s/two.jsonl", dir);
    snprintf(cmd, sizeof cmd, "for d in '%s' '%s'; do mkdir -p $d && cp '%s'/*.json '%s'/*.safetensors '%s'/*.model $d/; "
             "done", cpu, gpu, dir, dir, dir);
    CHECK(system(cmd) == 0, "copy %s", dir);
    float *m0, *v0, *mc, *vc, *mg, *vg;
    size_t nm, nv;
    CHECK_OK(read_weights(dir, &m0, &nm, &v0, &nv, &err), &err);
    k3c_vtrain_opts o = {.data = data, .steps = 4, .batch = 8, .max_tokens = 256, .lr = 1e-2, .tower_lr = 1e-2,
                         .grad_clip = 1, .seed = 3, .log_every = 10};
    k3c_vtrain_result rc_cpu, rc_gpu;
    o.dir = cpu;
    CHECK_OK(k3c_vision_train(&o, &rc_cpu, &err), &err);
    o.dir = gpu, o.backend = k3c_device_backend(dev);
    CHECK_OK(k3c_vision_train(&o, &rc_gpu, &err), &err);
    k3c_device_close(dev);
    CHECK(fabs(rc_gpu.first_loss - rc_cpu.first_loss) <= 1e-5 * rc_cpu.first_loss,
          "CUDA first loss %.9g, CPU %.9g", rc_gpu.first_loss, rc_cpu.first_loss);
    CHECK(fabs(rc_gpu.last_loss - rc_cpu.last_loss) <= 1e-3 * rc_cpu.last_loss, "CUDA last loss %.9g, CPU %.9g",
          rc_gpu.last_loss, rc_cpu.last_loss);
    CHECK_OK(read_weights(cpu, &mc, &nm, &vc, &nv, &err), &err);
    CHECK_OK(read_weights(gpu, &mg, &nm, &vg, &nv, &err), &err);
    const double em = moved_err(mg, mc, m0, nm), ev = moved_err(vg, vc, v0, nv);
    CHECK(em <= 5e-3 && ev <= 5e-3, "CUDA updates against the CPU's: model %.3e, tower %.3e", em, ev);
    printf("vision training on CUDA: loss %.6f -> %.6f (CPU %.6f -> %.6f); updates against the CPU's: model %.3e, "
           "tower %.3e\n",
           rc_gpu.first_loss, rc_gpu.last_loss, rc_cpu.first_loss, rc_cpu.last_loss, em, ev);
    free(m0), free(v0), free(mc), free(vc), free(mg), free(vg);
}

int main(void) {
    const char *tmp = test_tmpdir("vision_data");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tmp);
    if (serve_model_dir_v(dir, 1) != 0) return test_summary();
    samples(dir);
    static const char *const weights[3] = {"model.safetensors.index.json", "model.safetensors", "vision.safetensors"};
    for (int i = 0; i < 3; i++) { /* train_two starts from a seeded init (the fixture's model is a wide one) */
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, weights[i]);
        CHECK(remove(p) == 0, "remove %s", p);
    }
    train_two(dir);
    train_on_cuda(dir);
    return test_summary();
}
