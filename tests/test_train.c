/* test_train.c — tests of the trainer end to end (src/train/trainer.c, run_config.c, checkpoint.c): bit-exact resume
 * across a stage boundary, checkpoint layout and pruning, crash safety, bad-input errors, loss decrease. Spec: TRAINING.md §1–§2.
 *
 * One fixture is built in the test's scratch directory: a synthetic two-source corpus, a BPE tokenizer trained on it
 * (287 ranks + 13 specials = 300 ids), shards of both sources (train + val) and a tiny K3 model config with vocab 300.
 * Run configs use kda_chunk 16, stages of seq_len 32 and 64 at 128 tokens per step, different mixtures per stage. */
#include "test.h"

#include "base/json.h"
#include "model/model.h"
#include "tok/tok.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "ops/optim.h"
#include "ops/qk_clip.h"
#include "train/schedule.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define VOCAB_RANKS 287
#define VOCAB 300
#define N_STEPS 10 /* stage s32: 6 steps, stage s64: 4 steps */
#define TPS 128

static const char *const SPECIALS[] = {"<|endoftext|>",  "[BOS]",           "[EOS]",
                                       "<|end_of_msg|>", "<|open|>",        "<|close|>",
                                       "<|sep|>",        "<|media_begin|>", "<|media_content|>",
                                       "<|media_end|>",  "<|media_pad|>",   "[UNK]",
                                       "[PAD]"};

typedef struct {
    char dir[512]; /* scratch root; run configs live here and name everything relative to it */
    char tok[640]; /* tokenizer (tiktoken + .specials.json) */
    char src[2][640];
    size_t optim_numel;
} fixture;

/* ---------------------------------------------------------------- small file helpers */

static int contains(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        printf("warning: cannot write %s\n", path);
        return;
    }
    fwrite(text, 1, strlen(text), f);
    fclose(f);
}

static char *slurp(const char *path, size_t *n) {
    char *d = NULL;
    size_t len = 0;
    if (k3c_read_file(path, &d, &len, NULL)) return NULL;
    if (n) *n = len;
    return d;
}

static int files_equal(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int eq = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return eq;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* dst becomes a copy of directory src (src NULL: dst is removed). Paths are the test's own, without quotes. */
static void replace_tree(const char *dst, const char *src) {
    char cmd[8400];
    if (src)
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    else
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dst);
    if (system(cmd) != 0) printf("warning: '%s' failed\n", cmd);
}

/* Step numbers of the out dir's step_* directories (sorted), and how many .tmp_step_* entries there are. */
static int list_steps(const char *out, long long *steps, int cap, int *n_tmp) {
    DIR *d = opendir(out);
    int n = 0;
    *n_tmp = 0;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step_%lld%c", &s, &tail) == 1 && n < cap) steps[n++] = s;
        if (strncmp(e->d_name, ".tmp_step_", 10) == 0) (*n_tmp)++;
    }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            long long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

/* ---------------------------------------------------------------- the fixture */

/* A deterministic synthetic corpus: documents of templated sentences separated by blank lines. The two sources use
 * different word lists so that mixtures change the token distribution. */
static char *make_corpus(uint64_t seed, const char *const *nouns, int nn, const char *const *verbs, int nv, int docs) {
    static const char *const dets[] = {"the", "a", "every", "this", "some"};
    static const char *const preps[] = {"with", "from", "into", "under", "after"};
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    uint64_t i = 0;
    /* draws happen one per statement, in a fixed order, so the corpus is the same with every compiler */
#define PICK(n) ((int)(k3c_uniform_at(seed, i++) * (n)))
    for (int d = 0; d < docs; d++) {
        int sentences = 1 + PICK(9);
        for (int k = 0; k < sentences; k++) {
            const char *det = dets[PICK(5)];
            const char *subj = nouns[PICK(nn)];
            const char *verb = verbs[PICK(nv)];
            const char *det2 = dets[PICK(5)];
            const char *obj = nouns[PICK(nn)];
            k3c_sbuf_printf(&s, "%c%s %s %s %s %s", det[0] - 32, det + 1, subj, verb, det2, obj);
            if (PICK(2)) {
                const char *prep = preps[PICK(5)];
                const char *det3 = dets[PICK(5)];
                const char *obj2 = nouns[PICK(nn)];
                k3c_sbuf_printf(&s, " %s %s %s", prep, det3, obj2);
            }
            int newline = PICK(3) == 0;
            k3c_sbuf_printf(&s, ".%s", k + 1 < sentences ? (newline ? "\n" : " ") : "\n\n");
        }
    }
#undef PICK
    return s.buf;
}

static int build_fixture(fixture *fx) {
    static const char *const nouns_a[] = {"function", "module", "list",       "string",    "class",
                                          "method",   "file",   "value",      "argument",  "object",
                                          "loop",     "index",  "dictionary", "exception", "iterator"};
    static const char *const verbs_a[] = {"returns", "calls",  "raises", "imports",
                                          "reads",   "writes", "sorts",  "copies"};
    static const char *const nouns_b[] = {"hacker", "kludge", "wizard", "daemon", "cruft", "nybble", "bogon",
                                          "frob",   "luser",  "hack",   "guru",   "foo",   "bar"};
    static const char *const verbs_b[] = {"groks", "munges", "frobs", "hacks", "twiddles", "zaps", "snarfs"};
    k3c_err err = {0};
    char p[1200];
    const char *tmp = test_tmpdir("train");
    if (strlen(tmp) >= sizeof fx->dir) {
        CHECK(0, "scratch path too long: %s", tmp);
        return K3C_EINVAL;
    }
    memcpy(fx->dir, tmp, strlen(tmp) + 1);
    snprintf(p, sizeof p, "%s/corpus", fx->dir);
    mkdir(p, 0755);
    char *text[2] = {make_corpus(11, nouns_a, 15, verbs_a, 8, 40), make_corpus(22, nouns_b, 13, verbs_b, 7, 40)};
    size_t lens[2] = {strlen(text[0]), strlen(text[1])};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/corpus/%c.txt", fx->dir, 'a' + i);
        write_text(p, text[i]);
    }
    k3c_tok *t = NULL;
    k3c_tok_train_opts to = {
        .vocab_size = VOCAB_RANKS, .pattern = K3C_TOK_PATTERN_CL100K, .specials = SPECIALS, .n_specials = 13};
    int rc = k3c_tok_train((const char *const *)text, lens, 2, &to, &t, &err);
    CHECK_OK(rc, &err);
    free(text[0]);
    free(text[1]);
    if (rc) return rc;
    CHECK(k3c_tok_n_ranks(t) == VOCAB_RANKS && k3c_tok_n_vocab(t) == VOCAB, "ranks %d vocab %d", k3c_tok_n_ranks(t),
          k3c_tok_n_vocab(t));
    char root[sizeof fx->dir]; /* a copy: gcc -O1 flags snprintf from fx->dir into fx->tok as a possible overlap */
    memcpy(root, fx->dir, sizeof root);
    snprintf(fx->tok, sizeof fx->tok, "%s/tok.tiktoken", root);
    CHECK_OK(rc = k3c_tok_save(t, fx->tok, &err), &err);
    k3c_tok_free(t);
    for (int i = 0; i < 2 && !rc; i++) {
        char in[1200];
        snprintf(in, sizeof in, "%s/corpus/%c.txt", fx->dir, 'a' + i);
        snprintf(fx->src[i], sizeof fx->src[i], "%s/data/%c", root, 'a' + i);
        snprintf(p, sizeof p, "%s/data", fx->dir);
        mkdir(p, 0755);
        const char *inputs[1] = {in};
        const char *names[2] = {"a", "b"};
        k3c_prepare_opts o = {.vocab_path = fx->tok,
                              .pattern = K3C_TOK_PATTERN_CL100K,
                              .inputs = inputs,
                              .n_inputs = 1,
                              .out_dir = fx->src[i],
                              .source = names[i],
                              .doc_split = K3C_DOC_SPLIT_BLANK,
                              .val_fraction = 0.1,
                              .seed = 5};
        k3c_prepare_result r;
        CHECK_OK(rc = k3c_data_prepare(&o, &r, &err), &err);
        if (!rc)
            CHECK(r.docs[0] > 20 && r.docs[1] >= 1 && r.tokens[0] > 1000 && r.vocab_size == VOCAB &&
                      r.eod_id == VOCAB_RANKS,
                  "source %c: docs %lld/%lld tokens %lld vocab %lld eod %lld", 'a' + i, (long long)r.docs[0],
                  (long long)r.docs[1], (long long)r.tokens[0], (long long)r.vocab_size, (long long)r.eod_id);
    }
    /* the tiny K3 test model (configs/k3_test_tiny.json) with a vocabulary that fits the tokenizer */
    static const char *const model_fmt =
        "{\"architectures\": [\"KimiK3ForConditionalGeneration\"], \"model_type\": \"kimi_k3\", "
        "\"tie_word_embeddings\": false,\n"
        " \"text_config\": {\"hidden_size\": 16, \"num_hidden_layers\": 4, \"vocab_size\": %d, \"rms_norm_eps\": "
        "1e-05,\n"
        "  \"tie_word_embeddings\": false, \"hidden_act\": \"situ\", \"activation_situ_beta\": 4.0,\n"
        "  \"activation_situ_linear_beta\": 25.0, \"num_attention_heads\": 2, \"num_key_value_heads\": 2, "
        "\"q_lora_rank\": 8,\n"
        "  \"kv_lora_rank\": 8, \"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 4, \"v_head_dim\": 4, \"mla_use_nope\": "
        "true,\n"
        "  \"mla_use_output_gate\": true, \"num_experts\": 4, \"num_experts_per_token\": 2, \"num_shared_experts\": "
        "2,\n"
        "  \"routed_expert_hidden_size\": 8, \"moe_intermediate_size\": 8, \"latent_moe_use_norm\": true,\n"
        "  \"moe_renormalize\": true, \"routed_scaling_factor\": 1.0, \"moe_router_activation_func\": \"sigmoid\",\n"
        "  \"num_expert_group\": 1, \"topk_group\": 1, \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1,\n"
        "  \"intermediate_size\": 16, \"attn_res_block_size\": 2,\n"
        "  \"linear_attn_config\": {\"num_heads\": 2, \"head_dim\": 8, \"short_conv_kernel_size\": 4, "
        "\"gate_lower_bound\": -5.0,\n"
        "   \"use_full_rank_gate\": true, \"full_attn_layers\": [3], \"kda_layers\": [1, 2, 4]},\n"
        "  \"num_nextn_predict_layers\": 0, \"max_position_embeddings\": 4096, \"bos_token_id\": 1, \"eos_token_id\": "
        "2,\n"
        "  \"pad_token_id\": 0}}\n";
    char body[4096];
    const int vocabs[2] = {VOCAB, VOCAB - 1};
    const char *names[2] = {"model.json", "model_small.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, model_fmt, vocabs[i]);
        snprintf(p, sizeof p, "%s/%s", fx->dir, names[i]);
        write_text(p, body);
    }
    /* optimizer state size of this model under Muon, to check optimizer.safetensors */
    snprintf(p, sizeof p, "%s/model.json", fx->dir);
    k3c_config cfg;
    k3c_model m;
    k3c_optim opt;
    CHECK_OK(rc = k3c_config_load(p, &cfg, &err), &err);
    if (!rc) CHECK_OK(rc = k3c_model_create_f32(&cfg, 0, &m, &err), &err);
    if (rc) return rc;
    k3c_optim_defaults(&opt);
    opt.matrix_optimizer = K3C_MATRIX_MUON;
    CHECK_OK(rc = k3c_optim_init(&opt, &m.table, &err), &err);
    fx->optim_numel = opt.state_numel;
    k3c_optim_free(&opt);
    k3c_model_free_f32(&m);
    return rc;
}

/* ---------------------------------------------------------------- run configs */

typedef struct {
    const char *out, *balancing, *model, *tokenizer, *kda_chunk, *data, *stage0, *stage1, *extra;
    int ckpt_every, keep, eval_every, threads;
} run_params;

static const char *const STAGE0 =
    "{\"name\": \"s32\", \"seq_len\": 32, \"steps\": 6, \"lr\": 0.01, \"warmup\": 1, \"schedule\": \"cosine\", "
    "\"mixture\": {\"a\": 0.8, \"b\": 0.2}}";
static const char *const STAGE1 = "{\"name\": \"s64\", \"seq_len\": 64, \"steps\": 4, \"lr\": 0.005, \"min_lr_ratio\": "
                                  "0.1, \"schedule\": \"linear\", "
                                  "\"mixture\": {\"a\": 0.2, \"b\": 0.8}}";

static run_params defaults(const char *out) {
    return (run_params){.out = out,
                        .balancing = "exact",
                        .model = "\"model.json\"",
                        .tokenizer = "tok.tiktoken",
                        .kda_chunk = "16",
                        .data = "{\"a\": \"data/a\", \"b\": \"data/b\"}",
                        .stage0 = STAGE0,
                        .stage1 = STAGE1,
                        .extra = "",
                        .ckpt_every = 2,
                        .keep = 2,
                        .eval_every = 4,
                        .threads = 1};
}

/* Writes <dir>/<name>.json and returns its path in path[n]. model NULL = no "model" key. */
static void write_run(const fixture *fx, const char *name, const run_params *p, char *path, size_t n) {
    k3c_sbuf s;
    k3c_sbuf_init(&s);
    k3c_sbuf_printf(&s, "{\n");
    if (p->model) k3c_sbuf_printf(&s, "  \"model\": %s,\n", p->model);
    k3c_sbuf_printf(&s,
                    "  \"tokenizer\": \"%s\", \"pattern\": \"cl100k\", \"out_dir\": \"%s\",\n  \"data\": %s,\n"
                    "  \"seed\": 77, \"init_std\": 0.02, \"kda_chunk\": %s, \"tokens_per_step\": %d, \"threads\": %d,\n"
                    "  \"optimizer\": {\"matrix\": \"muon\", \"weight_decay\": 0.1, \"grad_clip\": 1.0},\n"
                    "  \"balancing\": \"%s\", \"log_every\": 1, \"eval_every\": %d, \"eval_batches\": 2,\n"
                    "  \"checkpoint_every\": %d, \"keep_checkpoints\": %d%s,\n",
                    p->tokenizer, p->out, p->data, p->kda_chunk, TPS, p->threads, p->balancing, p->eval_every,
                    p->ckpt_every, p->keep, p->extra);
    if (p->stage1)
        k3c_sbuf_printf(&s, "  \"stages\": [\n    %s,\n    %s\n  ]\n}\n", p->stage0, p->stage1);
    else
        k3c_sbuf_printf(&s, "  \"stages\": [\n    %s\n  ]\n}\n", p->stage0);
    snprintf(path, n, "%s/%s.json", fx->dir, name);
    write_text(path, s.buf);
    k3c_sbuf_free(&s);
}

static int train(const char *cfg, int resume, int64_t max_steps, FILE *log, k3c_train_result *res, k3c_err *err) {
    k3c_run_config rc;
    int e = k3c_run_config_load(cfg, &rc, err);
    if (e) return e;
    k3c_train_opts o = {resume, max_steps, NULL, log, NULL};
    return k3c_train_run(&rc, &o, res, err);
}

static void out_path(const fixture *fx, const char *out, const char *rel, char *p, size_t n) {
    snprintf(p, n, "%s/%s%s%s", fx->dir, out, rel[0] ? "/" : "", rel);
}

/* ---------------------------------------------------------------- metrics.jsonl */

typedef struct {
    int64_t step, tokens;
    int stage, has_val;
    double loss, val_loss, lr, grad_norm, max_load_ratio;
} mrow;

static int num_field(const k3c_json *o, const char *k, double *v) {
    const k3c_json *x = k3c_json_get(o, k);
    if (!x || x->type != K3C_JSON_NUMBER || !isfinite(x->number)) return 0;
    *v = x->number;
    return 1;
}

/* Parses every line of <out>/metrics.jsonl; *bad counts lines that are not an object with the per-step fields. */
static int read_metrics(const fixture *fx, const char *out, mrow *rows, int cap, int *bad) {
    char p[1300];
    out_path(fx, out, "metrics.jsonl", p, sizeof p);
    char *text = slurp(p, NULL);
    int n = 0;
    *bad = 0;
    if (!text) {
        (*bad)++;
        return 0;
    }
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        k3c_json *o = NULL;
        mrow r = {0};
        double step = 0, tokens = 0, stage = 0;
        int ok = k3c_json_parse(line, strlen(line), "metrics", &o, NULL) == K3C_OK && o->type == K3C_JSON_OBJECT &&
                 num_field(o, "step", &step) && num_field(o, "tokens", &tokens) && num_field(o, "stage", &stage) &&
                 num_field(o, "loss", &r.loss) && num_field(o, "lr", &r.lr) &&
                 num_field(o, "grad_norm", &r.grad_norm) && num_field(o, "max_load_ratio", &r.max_load_ratio);
        if (ok) {
            r.step = (int64_t)step, r.tokens = (int64_t)tokens, r.stage = (int)stage;
            r.has_val = num_field(o, "val_loss", &r.val_loss);
            if (n < cap) rows[n++] = r;
        } else
            (*bad)++;
        k3c_json_free(o);
    }
    free(text);
    return n;
}

/* 1 when the rows are exactly steps 1..n_steps once each, in order. */
static int steps_once(const mrow *rows, int n, int n_steps) {
    if (n != n_steps) return 0;
    for (int i = 0; i < n; i++)
        if (rows[i].step != i + 1) return 0;
    return 1;
}

/* ---------------------------------------------------------------- checkpoint loading */

/* Loads every part of a checkpoint directory the way resume does: config + model, optimizer state of the right size,
 * trainer_state.json with the expected step and a loader state the data sources accept. why[] says what failed. */
static int ckpt_loads(const fixture *fx, const char *dir, int64_t step, char *why, size_t n) {
    k3c_err err = {0};
    k3c_config cfg;
    k3c_model m;
    int rc = k3c_config_load(dir, &cfg, &err);
    if (!rc) rc = k3c_model_open_f32(dir, 0, &m, &err);
    if (rc) {
        snprintf(why, n, "model: %s", err.msg);
        return rc;
    }
    k3c_model_free_f32(&m);
    float *ost = malloc(sizeof(float) * fx->optim_numel);
    char *state = NULL;
    rc = k3c_train_ckpt_load_state(dir, ost, fx->optim_numel, &state, &err);
    free(ost);
    if (rc) {
        snprintf(why, n, "optimizer/trainer state: %s", err.msg);
        return rc;
    }
    k3c_json *j = NULL;
    rc = k3c_json_parse(state, strlen(state), "trainer_state.json", &j, &err);
    free(state);
    if (rc) {
        snprintf(why, n, "%s", err.msg);
        return rc;
    }
    const k3c_json *s = k3c_json_get(j, "step"), *t = k3c_json_get(j, "tokens"), *l = k3c_json_get(j, "loader");
    if (!s || !s->is_integer || s->integer != step || !t || !t->is_integer || t->integer != step * TPS || !l ||
        l->type != K3C_JSON_STRING) {
        snprintf(why, n, "trainer_state.json: step/tokens/loader wrong (want step %lld)", (long long)step);
        k3c_json_free(j);
        return K3C_EFORMAT;
    }
    /* the tokenizer files a model directory carries (tiktoken.model, its specials, k3c_tokenizer.json) */
    static const char *const tok_files[] = {"tiktoken.model", "tiktoken.model.specials.json", "k3c_tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, tok_files[i]);
        if (!exists(p)) {
            snprintf(why, n, "%s missing", tok_files[i]);
            k3c_json_free(j);
            return K3C_ENOTFOUND;
        }
    }
    k3c_data_source src[2] = {{"a", fx->src[0]}, {"b", fx->src[1]}};
    k3c_loader *ld = NULL;
    rc = k3c_loader_open(src, 2, NULL, 77, &ld, &err);
    if (!rc) rc = k3c_loader_state_from_json(ld, l->string, l->len, &err);
    if (rc) snprintf(why, n, "loader state: %s", err.msg);
    k3c_loader_close(ld);
    k3c_json_free(j);
    return rc;
}

/* ---------------------------------------------------------------- 1. resume bit-exactness */

static int count_lines(FILE *f) {
    int n = 0, c;
    rewind(f);
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    return n;
}

/* Final model / optimizer / trainer state of out dir x and y at step `step` are byte-identical. */
static void check_same_final_at(const fixture *fx, const char *x, const char *y, int step, const char *what) {
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    for (int i = 0; i < 3; i++) {
        char a[1300], b[1300], rel[64];
        snprintf(rel, sizeof rel, "step_%08d/%s", step, files[i]);
        out_path(fx, x, rel, a, sizeof a);
        out_path(fx, y, rel, b, sizeof b);
        CHECK(files_equal(a, b), "%s: %s differs between %s and %s", what, rel, x, y);
    }
}

static void check_same_final(const fixture *fx, const char *x, const char *y, const char *what) {
    check_same_final_at(fx, x, y, N_STEPS, what);
}

/* Metrics of the resumed steps equal those of the straight run, bit for bit (they are written with %.9g). */
static void check_same_metrics(const fixture *fx, const char *x, const char *y, const char *what) {
    mrow ra[64], rb[64];
    int bad_a, bad_b, na = read_metrics(fx, x, ra, 64, &bad_a), nb = read_metrics(fx, y, rb, 64, &bad_b);
    CHECK(bad_a == 0 && bad_b == 0 && steps_once(ra, na, N_STEPS) && steps_once(rb, nb, N_STEPS),
          "%s: metrics rows %d / %d (bad %d / %d), want steps 1..%d once", what, na, nb, bad_a, bad_b, N_STEPS);
    int same = na == nb;
    for (int i = 0; same && i < na; i++)
        /* a run stopped by max_steps validates at its last step too, so y may have more val_loss entries than x */
        same = ra[i].loss == rb[i].loss && ra[i].lr == rb[i].lr && ra[i].grad_norm == rb[i].grad_norm &&
               ra[i].max_load_ratio == rb[i].max_load_ratio && (!ra[i].has_val || rb[i].has_val) &&
               (!ra[i].has_val || ra[i].val_loss == rb[i].val_loss);
    CHECK(same, "%s: per-step metrics of %s and %s differ", what, x, y);
}

static void test_resume(const fixture *fx, const char *balancing) {
    char cfg_a[1200], cfg_b[1200], out_a[64], out_b[64], name[64];
    k3c_err err = {0};
    k3c_train_result ra, rb;
    snprintf(out_a, sizeof out_a, "A_%s", balancing);
    snprintf(out_b, sizeof out_b, "B_%s", balancing);
    run_params p = defaults(out_a);
    p.balancing = balancing;
    snprintf(name, sizeof name, "run_A_%s", balancing);
    write_run(fx, name, &p, cfg_a, sizeof cfg_a);
    p.out = out_b;
    snprintf(name, sizeof name, "run_B_%s", balancing);
    write_run(fx, name, &p, cfg_b, sizeof cfg_b);

    CHECK_OK(train(cfg_a, 0, 0, NULL, &ra, &err), &err);
    CHECK(ra.steps == N_STEPS && isfinite(ra.last_loss) && isfinite(ra.last_val_loss), "%s: straight run: %lld steps",
          balancing, (long long)ra.steps);

    /* half-way (step 5 of stage s32's 6), then resume into stage s64 */
    CHECK_OK(train(cfg_b, 0, N_STEPS / 2, NULL, &rb, &err), &err);
    CHECK(rb.steps == N_STEPS / 2, "%s: max_steps run stopped at %lld", balancing, (long long)rb.steps);
    char latest[1300];
    out_path(fx, out_b, "latest", latest, sizeof latest);
    char *l = slurp(latest, NULL);
    CHECK(l && strcmp(l, "step_00000005\n") == 0, "%s: latest after 5 steps is '%s'", balancing, l ? l : "(none)");
    free(l);
    FILE *log = tmpfile();
    CHECK_OK(train(cfg_b, 1, 0, log, &rb, &err), &err);
    /* the resumed run did steps 6..10 only (a resume that restarted from scratch would log 10 lines) */
    int lines = log ? count_lines(log) : -1;
    CHECK(lines == N_STEPS - N_STEPS / 2, "%s: resumed run logged %d steps, want %d", balancing, lines,
          N_STEPS - N_STEPS / 2);
    if (log) fclose(log);
    CHECK(rb.steps == N_STEPS && rb.last_loss == ra.last_loss,
          "%s: resumed last loss %.17g vs straight %.17g (steps %lld)", balancing, rb.last_loss, ra.last_loss,
          (long long)rb.steps);
    CHECK(rb.last_val_loss == ra.last_val_loss, "%s: val loss %.17g vs %.17g", balancing, rb.last_val_loss,
          ra.last_val_loss);
    check_same_final(fx, out_a, out_b, balancing);
    check_same_metrics(fx, out_a, out_b, balancing);
    long long st[32];
    int n_tmp;
    out_path(fx, out_b, "", latest, sizeof latest);
    int ns = list_steps(latest, st, 32, &n_tmp);
    CHECK(ns == 2 && st[0] == 8 && st[1] == 10 && n_tmp == 0, "%s: B keeps %d checkpoints (%lld, %lld), %d temporary",
          balancing, ns, ns ? st[0] : -1, ns > 1 ? st[1] : -1, n_tmp);
}

/* Three invocations: 0→3, 3→6 (ends exactly at the stage boundary), 6→10. */
static void test_resume_chain(const fixture *fx) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_train_result r;
    run_params p = defaults("C_exact");
    write_run(fx, "run_C_exact", &p, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 3, NULL, &r, &err), &err);
    CHECK_OK(train(cfg, 1, 6, NULL, &r, &err), &err);
    CHECK(r.steps == 6, "chain: second leg ended at %lld", (long long)r.steps);
    CHECK_OK(train(cfg, 1, 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "chain: third leg ended at %lld", (long long)r.steps);
    check_same_final(fx, "A_exact", "C_exact", "chain 3/6/10");
    check_same_metrics(fx, "A_exact", "C_exact", "chain 3/6/10");
    /* resuming a finished run is a no-op that succeeds */
    CHECK_OK(train(cfg, 1, 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "resume of a finished run: %lld steps", (long long)r.steps);
}

/* The same with two OpenMP threads (the other runs use one, which keeps the test fast on a shared machine): 5 steps
 * across a stage boundary straight, and 2 + 3 resumed. */
static void test_resume_threads(const fixture *fx) {
    char cfg_x[1200], cfg_y[1200];
    k3c_err err = {0};
    k3c_train_result rx, ry;
    run_params p = defaults("T2_x");
    p.threads = 2;
    p.stage0 = "{\"seq_len\": 32, \"steps\": 3, \"lr\": 0.01, \"mixture\": {\"a\": 0.8, \"b\": 0.2}}";
    p.stage1 = "{\"seq_len\": 64, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 0.2, \"b\": 0.8}}";
    write_run(fx, "run_T2_x", &p, cfg_x, sizeof cfg_x);
    p.out = "T2_y";
    write_run(fx, "run_T2_y", &p, cfg_y, sizeof cfg_y);
    CHECK_OK(train(cfg_x, 0, 0, NULL, &rx, &err), &err);
    CHECK_OK(train(cfg_y, 0, 2, NULL, &ry, &err), &err);
    CHECK_OK(train(cfg_y, 1, 0, NULL, &ry, &err), &err);
    CHECK(rx.steps == 5 && ry.steps == 5 && rx.last_loss == ry.last_loss, "2 threads: last loss %.17g vs %.17g",
          rx.last_loss, ry.last_loss);
    check_same_final_at(fx, "T2_x", "T2_y", 5, "2 threads");
}

/* ---------------------------------------------------------------- 2. checkpoints and metrics */

static void test_checkpoints(const fixture *fx) {
    char p[2400], dir[1300];
    k3c_err err = {0};
    out_path(fx, "A_exact", "latest", p, sizeof p);
    char *l = slurp(p, NULL);
    CHECK(l && strcmp(l, "step_00000010\n") == 0, "latest is '%s'", l ? l : "(none)");
    free(l);
    long long st[32];
    int n_tmp;
    out_path(fx, "A_exact", "", p, sizeof p);
    int ns = list_steps(p, st, 32, &n_tmp);
    CHECK(ns == 2 && st[0] == 8 && st[1] == 10 && n_tmp == 0, "keep_checkpoints 2: %d left (%lld, %lld), %d temporary",
          ns, ns ? st[0] : -1, ns > 1 ? st[1] : -1, n_tmp);
    CHECK_OK(k3c_train_ckpt_latest(p, dir, sizeof dir, &err), &err);
    CHECK(contains(dir, "step_00000010"), "k3c_train_ckpt_latest: %s", dir);

    /* a Hugging Face model directory */
    char why[1200] = "";
    CHECK(ckpt_loads(fx, dir, N_STEPS, why, sizeof why) == K3C_OK, "step_10: %s", why);
    k3c_config cfg;
    CHECK_OK(k3c_config_load(dir, &cfg, &err), &err);
    CHECK(cfg.vocab_size == VOCAB && cfg.num_layers == 4 && k3c_config_num_moe(&cfg) == 3,
          "config: vocab %lld layers %lld", (long long)cfg.vocab_size, (long long)cfg.num_layers);
    k3c_checkpoint *ck = NULL;
    CHECK_OK(k3c_ckpt_open(dir, &ck, &err), &err);
    if (ck) {
        CHECK(k3c_ckpt_count(ck) > 20, "checkpoint has %d tensors", k3c_ckpt_count(ck));
        k3c_ckpt_close(ck);
    }
    /* the tokenizer travels with the model */
    snprintf(p, sizeof p, "%s/tiktoken.model", dir);
    CHECK(files_equal(p, fx->tok), "tiktoken.model is not a copy of the run's tokenizer");
    k3c_tok *t = NULL;
    CHECK_OK(k3c_tok_load_dir(dir, NULL, &t, &err), &err);
    if (t) {
        CHECK(k3c_tok_get_pattern(t) == K3C_TOK_PATTERN_CL100K, "checkpoint tokenizer pattern");
        CHECK(k3c_tok_n_vocab(t) == VOCAB && k3c_tok_n_specials(t) == 13 &&
                  k3c_tok_special_id(t, "<|endoftext|>") == VOCAB_RANKS,
              "checkpoint tokenizer: vocab %d specials %d", k3c_tok_n_vocab(t), k3c_tok_n_specials(t));
        k3c_tok_free(t);
    }
    snprintf(p, sizeof p, "%s/k3c_tokenizer.json", dir);
    k3c_json *j = NULL;
    CHECK_OK(k3c_json_parse_file(p, &j, &err), &err);
    const k3c_json *pat = k3c_json_get(j, "pattern");
    CHECK(pat && pat->type == K3C_JSON_STRING && strcmp(pat->string, "cl100k") == 0, "k3c_tokenizer.json pattern");
    k3c_json_free(j);

    /* metrics.jsonl: one object per step (log_every 1), validation at steps 4, 8 (eval_every) and 10 (last) */
    mrow rows[64];
    int bad, n = read_metrics(fx, "A_exact", rows, 64, &bad);
    CHECK(bad == 0 && steps_once(rows, n, N_STEPS), "metrics.jsonl: %d rows, %d bad", n, bad);
    int val_ok = 1, stage_ok = 1, tok_ok = 1, load_ok = 1;
    for (int i = 0; i < n; i++) {
        int want_val = rows[i].step % 4 == 0 || rows[i].step == N_STEPS;
        val_ok &= rows[i].has_val == want_val && (!want_val || rows[i].val_loss > 0);
        stage_ok &= rows[i].stage == (rows[i].step <= 6 ? 0 : 1);
        tok_ok &= rows[i].tokens == rows[i].step * TPS;
        /* an expert takes at most one route per token: max/mean ≤ n / k = 2 */
        load_ok &= rows[i].max_load_ratio >= 1 && rows[i].max_load_ratio <= 2 && rows[i].grad_norm > 0;
    }
    CHECK(val_ok, "val_loss must be present exactly at steps 4, 8, 10");
    CHECK(stage_ok && tok_ok && load_ok, "metrics stage %d tokens %d load/grad_norm %d", stage_ok, tok_ok, load_ok);
    /* the lr of each row is the stage schedule at the 1-based step within the stage (optim.h: "step is the 1-based
     * update index"): s32 warms up over 1 step so step 1 runs at the peak 0.01; s64 decays linearly to 0.1 · 0.005 at
     * its last step (10). */
    double worst = 0;
    int worst_step = 0;
    for (int i = 0; i < n; i++) {
        int s = rows[i].step <= 6 ? 0 : 1;
        int64_t in_stage = s == 0 ? rows[i].step : rows[i].step - 6;
        k3c_schedule sch = s == 0 ? (k3c_schedule){K3C_SCHED_COSINE, 0.01, 1, 6, 0.1}
                                  : (k3c_schedule){K3C_SCHED_LINEAR, 0.005, 0, 4, 0.1};
        double want = k3c_schedule_lr(&sch, in_stage), d = fabs(rows[i].lr - want) / want;
        if (d > worst) worst = d, worst_step = (int)rows[i].step;
    }
    CHECK(worst <= 1e-8,
          "lr schedule: step %d off by %.3g (relative); step 1 lr %g (want 0.01), step 10 lr %g (want 0.0005)",
          worst_step, worst, n ? rows[0].lr : NAN, n >= N_STEPS ? rows[N_STEPS - 1].lr : NAN);
    out_path(fx, "A_exact", "metrics.png", p, sizeof p);
    CHECK(!exists(p), "the library drew metrics.png (plotting belongs to `k3c train`)");
}

/* A new run (no resume) started in an out dir that still holds a finished run's checkpoints (step_8, step_10): either
 * a clear error naming the out dir before any step, or a run whose `latest` names a loadable checkpoint of its own. The
 * new checkpoints must not be pruned as "older" than the stale ones, and `latest` must never name a deleted directory. */
static void test_fresh_run_in_used_dir(const fixture *fx) {
    char cfg[1200], p[1300], q[1300];
    k3c_err err = {0};
    k3c_train_result r;
    out_path(fx, "A_exact", "", p, sizeof p);
    out_path(fx, "A_rerun", "", q, sizeof q);
    replace_tree(q, p);
    run_params rp = defaults("A_rerun");
    write_run(fx, "run_A_rerun", &rp, cfg, sizeof cfg);
    int e = train(cfg, 0, 4, NULL, &r, &err);
    if (e) {
        CHECK(r.steps == 0 && contains(err.msg, "A_rerun"), "fresh run in a used out dir failed after %lld steps: %s",
              (long long)r.steps, err.msg);
        return;
    }
    char dir[1300], why[1200] = "";
    CHECK_OK(k3c_train_ckpt_latest(q, dir, sizeof dir, &err), &err);
    CHECK(contains(dir, "step_00000004") && ckpt_loads(fx, dir, 4, why, sizeof why) == K3C_OK,
          "fresh run in a used out dir: latest %s: %s", dir, why);
}

/* ---------------------------------------------------------------- 3. crashes */

static void truncate_file(const char *path, long keep) {
    size_t n;
    char *d = slurp(path, &n);
    if (d) {
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(d, 1, (size_t)keep < n ? (size_t)keep : n, f);
            fclose(f);
        }
    }
    free(d);
}

/* A run killed while writing the checkpoint of step 6 (its temporary directory half-written, metrics of step 6 already
 * logged) and, separately, a step_7 directory renamed into place whose `latest` was never updated (made unloadable
 * here, so that loading it instead of `latest` would fail). Resume must restart from step 5 and finish bit-exactly. */
static void test_partial_checkpoint(const fixture *fx) {
    char cfg[1200], p[1400], q[1300];
    k3c_err err = {0};
    k3c_train_result r;
    run_params rp = defaults("K_partial");
    rp.ckpt_every = 1;
    rp.keep = 3;
    write_run(fx, "run_K_partial", &rp, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 7, NULL, &r, &err), &err);
    /* step_7 exists but latest still names step_5; step_6 is back in its temporary directory, model truncated */
    out_path(fx, "K_partial", "step_00000006", p, sizeof p);
    out_path(fx, "K_partial", ".tmp_step_00000006", q, sizeof q);
    CHECK(rename(p, q) == 0, "rename %s", p);
    snprintf(p, sizeof p, "%s/model.safetensors", q);
    truncate_file(p, 1000);
    out_path(fx, "K_partial", "step_00000007/model.safetensors", p, sizeof p);
    truncate_file(p, 1000);
    out_path(fx, "K_partial", "latest", p, sizeof p);
    CHECK_OK(k3c_write_file_atomic(p, "step_00000005\n", 14, &err), &err);
    /* the metrics of steps 6 and 7 were written before the crash */
    FILE *log = tmpfile();
    CHECK_OK(train(cfg, 1, 0, log, &r, &err), &err);
    int lines = log ? count_lines(log) : -1;
    if (log) fclose(log);
    CHECK(r.steps == N_STEPS && lines == N_STEPS - 5, "partial checkpoint: resumed to %lld with %d steps (want from 5)",
          (long long)r.steps, lines);
    check_same_final(fx, "A_exact", "K_partial", "after a partial checkpoint");
    long long st[32];
    int n_tmp;
    out_path(fx, "K_partial", "", p, sizeof p);
    int ns = list_steps(p, st, 32, &n_tmp);
    CHECK(n_tmp == 0 && ns == 3 && st[2] == 10, "partial checkpoint: %d temporary dirs left, %d step dirs", n_tmp, ns);
    char why[1200] = "";
    out_path(fx, "K_partial", "step_00000010", p, sizeof p);
    CHECK(ckpt_loads(fx, p, N_STEPS, why, sizeof why) == K3C_OK, "after partial checkpoint: %s", why);
    /* metrics.jsonl must still hold one object per step: the rows of steps 6-7 logged before the crash are replaced,
     * not repeated (a plot or a reader of the file would see steps going backwards). */
    mrow rows[64];
    int bad, n = read_metrics(fx, "K_partial", rows, 64, &bad);
    CHECK(bad == 0 && steps_once(rows, n, N_STEPS),
          "metrics.jsonl after crash + resume has %d rows for %d steps (steps logged before the crash are repeated)", n,
          N_STEPS);
}

/* The child of the kill test: trains the given config (resuming when asked) and exits. */
static int child_main(const char *cfg, int resume) {
    k3c_err err = {0};
    k3c_train_result r;
    int rc = train(cfg, resume, 0, NULL, &r, &err);
    if (rc) fprintf(stderr, "child: %s\n", err.msg);
    return rc ? 1 : 0;
}

/* SIGKILL a training child (checkpoint_every 1) at random moments; after each kill `latest` is either absent (killed
 * before the first checkpoint) or names a directory that fully loads; finally resume to the end and compare. */
static void test_kill(const fixture *fx, double run_seconds) {
    char cfg[1200], p[1300];
    k3c_err err = {0};
    run_params rp = defaults("K_kill");
    rp.ckpt_every = 1;
    write_run(fx, "run_K_kill", &rp, cfg, sizeof cfg);
    uint64_t seed = getenv("K3C_TEST_SEED") ? strtoull(getenv("K3C_TEST_SEED"), NULL, 10)
                                            : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    int fails_before = test_failed_, kills = 0;
    out_path(fx, "K_kill", "latest", p, sizeof p);
    for (int round = 0; round < 8; round++) {
        int resume = exists(p);
        long long done = 0;
        char *cur = resume ? slurp(p, NULL) : NULL;
        if (cur && sscanf(cur, "step_%lld", &done) != 1) done = 0;
        free(cur);
        if (done >= N_STEPS) { /* the last child finished: start over so that there is something to interrupt */
            char out[1300];
            out_path(fx, "K_kill", "", out, sizeof out);
            replace_tree(out, NULL);
            resume = 0, done = 0;
        }
        pid_t pid = fork();
        if (pid == 0) {
            /* a fresh image: OpenMP / OpenBLAS thread pools do not survive fork() */
            char r[4];
            snprintf(r, sizeof r, "%d", resume);
            execl("/proc/self/exe", "test_train", "--child", cfg, r, (char *)NULL);
            _exit(127);
        }
        /* a resumed child has only the remaining steps to run */
        double delay = k3c_uniform_at(seed, (uint64_t)round) * run_seconds * (double)(N_STEPS - done + 1) / N_STEPS;
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
        int status = 0;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        kills += WIFSIGNALED(status); /* else it had already finished */
        CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) != 0), "kill round %d: child failed with status %d", round,
              WEXITSTATUS(status));
        if (!exists(p)) continue;
        char dir[1300], why[1200] = "";
        long long step = -1;
        char *l = slurp(p, NULL);
        CHECK(l && sscanf(l, "step_%lld", &step) == 1, "kill round %d: latest '%s'", round, l ? l : "");
        free(l);
        char out[1300];
        out_path(fx, "K_kill", "", out, sizeof out);
        CHECK_OK(k3c_train_ckpt_latest(out, dir, sizeof dir, &err), &err);
        CHECK(ckpt_loads(fx, dir, step, why, sizeof why) == K3C_OK, "kill round %d (after %.3f s): latest %s: %s",
              round, delay, dir, why);
    }
    k3c_train_result r;
    CHECK_OK(train(cfg, exists(p), 0, NULL, &r, &err), &err);
    CHECK(r.steps == N_STEPS, "after kills: %lld steps", (long long)r.steps);
    check_same_final(fx, "A_exact", "K_kill", "after SIGKILLs");
    if (test_failed_ != fails_before || getenv("K3C_TEST_VERBOSE"))
        printf("  kill test: %d of 8 children killed (delays up to %.2f s), K3C_TEST_SEED=%llu\n", kills, run_seconds,
               (unsigned long long)seed);
}

/* ---------------------------------------------------------------- 4. bad input */

static void expect_config_error(const fixture *fx, const char *name, const run_params *p, const char *key1,
                                const char *key2) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_run_config rc;
    write_run(fx, name, p, cfg, sizeof cfg);
    int e = k3c_run_config_load(cfg, &rc, &err);
    CHECK(e == K3C_ECONFIG && contains(err.msg, cfg) && contains(err.msg, key1) && (!key2 || contains(err.msg, key2)),
          "%s: code %d, message '%s' (want ECONFIG naming %s and %s)", name, e, err.msg, key1, key2 ? key2 : "-");
}

static void test_bad_config(const fixture *fx) {
    run_params p;
    k3c_run_config rc;
    k3c_err err = {0};
    char cfg[1200];
    p = defaults("bad");
    write_run(fx, "good", &p, cfg, sizeof cfg);
    CHECK_OK(k3c_run_config_load(cfg, &rc, &err), &err);
    CHECK(rc.n_sources == 2 && rc.n_stages == 2 && rc.kda_chunk == 16 && rc.stage[0].tokens_per_step == TPS &&
              rc.stage[1].mixture[1] == 0.8 && contains(rc.source_dir[1], "/data/b") &&
              contains(rc.model_config, fx->dir),
          "good config read back wrong");

    p = defaults("bad"), p.extra = ", \"learning_rate\": 0.1";
    expect_config_error(fx, "bad_root_key", &p, "learning_rate", "unknown");
    p = defaults("bad"), p.stage1 = "{\"name\": \"x\", \"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"seqlen\": 64}";
    expect_config_error(fx, "bad_stage_key", &p, "stages[1].seqlen", "unknown");
    p = defaults("bad"), p.extra = ", \"optimizer_x\": {}";
    expect_config_error(fx, "bad_root_key2", &p, "optimizer_x", NULL);
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 256, \"steps\": 2, \"lr\": 0.01}";
    expect_config_error(fx, "bad_seq_len", &p, "stages[0].seq_len", "tokens_per_step");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 0, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps0", &p, "stages[0]", "steps");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": -3, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps_neg", &p, "stages[0]", "steps");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2.5, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps_frac", &p, "stages[0].steps", "integer");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"lr\": 0.01}";
    expect_config_error(fx, "bad_steps_missing", &p, "stages[0].steps", "missing");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 1, \"c\": 1}}";
    expect_config_error(fx, "bad_mix_source", &p, "stages[0].mixture.c", "no data source");
    p = defaults("bad"),
    p.stage1 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 1, \"b\": -0.5}}";
    expect_config_error(fx, "bad_mix_weight", &p, "stages[1].mixture.b", "≥ 0");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"mixture\": {\"a\": 0, \"b\": 0}}";
    expect_config_error(fx, "bad_mix_zero", &p, "stages[0].mixture", "sum to 0");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"schedule\": \"cosinus\"}";
    expect_config_error(fx, "bad_schedule", &p, "stages[0].schedule", "cosinus");
    p = defaults("bad"), p.balancing = "median";
    expect_config_error(fx, "bad_balancing", &p, "balancing", "median");
    p = defaults("bad"), p.model = NULL;
    expect_config_error(fx, "bad_no_model", &p, "model", "missing");
    p = defaults("bad"), p.kda_chunk = "7";
    expect_config_error(fx, "bad_kda_chunk", &p, "kda_chunk", NULL);
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2}";
    expect_config_error(fx, "bad_no_lr", &p, "stages[0].lr", "missing");
    p = defaults("bad"), p.stage0 = "{\"seq_len\": 32, \"steps\": 2, \"lr\": 0.01, \"warmup\": 3}";
    expect_config_error(fx, "bad_warmup", &p, "stages[0]", "warmup");
    /* a bad optimizer name (the default config already has an optimizer object, so this one is written whole) */
    {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        k3c_sbuf_printf(&s, "{\"model\": \"model.json\", \"tokenizer\": \"tok.tiktoken\", \"out_dir\": \"bad\", "
                            "\"data\": {\"a\": \"data/a\"}, \"optimizer\": {\"matrix\": \"sgd\"}, "
                            "\"stages\": [{\"seq_len\": 32, \"tokens_per_step\": 64, \"steps\": 1, \"lr\": 0.1}]}");
        snprintf(cfg, sizeof cfg, "%s/bad_matrix.json", fx->dir);
        write_text(cfg, s.buf);
        k3c_sbuf_free(&s);
        int e = k3c_run_config_load(cfg, &rc, &err);
        CHECK(e == K3C_ECONFIG && contains(err.msg, "optimizer.matrix") && contains(err.msg, cfg),
              "bad_matrix: %d '%s'", e, err.msg);
        snprintf(cfg, sizeof cfg, "%s/bad_json.json", fx->dir);
        write_text(cfg, "{\"model\": \"model.json\",\n \"stages\": [}\n");
        e = k3c_run_config_load(cfg, &rc, &err);
        CHECK(e != K3C_OK && contains(err.msg, "bad_json.json:2:"), "malformed JSON: %d '%s'", e, err.msg);
    }
}

/* Copies source a to a new directory and damages one byte of its first train shard. */
static void damaged_source(const fixture *fx, const char *name, long offset_from_end_or_start, int from_start) {
    char dst[1200], shard[1300];
    snprintf(dst, sizeof dst, "%s/data/%s", fx->dir, name);
    replace_tree(dst, fx->src[0]);
    snprintf(shard, sizeof shard, "%s/train-00000%s", dst, K3C_SHARD_EXT);
    size_t n;
    char *d = slurp(shard, &n);
    if (!d || n < 200) {
        CHECK(0, "no shard %s", shard);
        free(d);
        return;
    }
    long at = from_start ? offset_from_end_or_start : (long)n - offset_from_end_or_start;
    d[at] ^= 0x01;
    FILE *f = fopen(shard, "wb");
    if (f) {
        fwrite(d, 1, n, f);
        fclose(f);
    }
    free(d);
}

/* k3c_train_run of config cfg fails with code (0: any error), a message containing all of a, b, c, and trains nothing. */
static void expect_train_error(const fixture *fx, const char *what, const char *cfg, const char *out, int code,
                               const char *a, const char *b, const char *c) {
    k3c_err err = {0};
    k3c_train_result r;
    char p[1300];
    int e = train(cfg, 0, 0, NULL, &r, &err);
    CHECK((code ? e == code : e != K3C_OK) && contains(err.msg, a) && (!b || contains(err.msg, b)) &&
              (!c || contains(err.msg, c)),
          "%s: code %d (want %d), message '%s' (want %s, %s, %s)", what, e, code, err.msg, a, b ? b : "-", c ? c : "-");
    out_path(fx, out, "latest", p, sizeof p);
    CHECK(r.steps == 0 && !exists(p), "%s: the error came after %lld training steps (it should stop before the first)",
          what, (long long)r.steps);
}

static void test_bad_data(const fixture *fx) {
    char cfg[1200];
    run_params p;
    k3c_err err = {0};

    /* a flipped bit inside the tokens: the checksum names the file */
    damaged_source(fx, "a_flip", 40, 0);
    p = defaults("bad_shard"), p.data = "{\"a\": \"data/a_flip\", \"b\": \"data/b\"}";
    write_run(fx, "run_bad_shard", &p, cfg, sizeof cfg);
    expect_train_error(fx, "corrupt shard", cfg, "bad_shard", K3C_EFORMAT, "a_flip/train-00000.k3cshard", "checksum",
                       NULL);
    damaged_source(fx, "a_magic", 0, 1);
    p = defaults("bad_magic"), p.data = "{\"a\": \"data/a_magic\", \"b\": \"data/b\"}";
    write_run(fx, "run_bad_magic", &p, cfg, sizeof cfg);
    expect_train_error(fx, "wrong magic", cfg, "bad_magic", K3C_EFORMAT, "a_magic/train-00000.k3cshard", "magic", NULL);

    /* the model's vocabulary cannot hold the data's ids */
    p = defaults("bad_vocab"), p.model = "\"model_small.json\"";
    write_run(fx, "run_bad_vocab", &p, cfg, sizeof cfg);
    expect_train_error(fx, "model vocab < data vocab", cfg, "bad_vocab", K3C_ECONFIG, "vocab_size", "300", "299");

    /* a tokenizer that does not exist is found before any training step, not at the first checkpoint */
    p = defaults("bad_tok"), p.tokenizer = "no_such.tiktoken";
    write_run(fx, "run_bad_tok", &p, cfg, sizeof cfg);
    expect_train_error(fx, "missing tokenizer", cfg, "bad_tok", 0, "no_such.tiktoken", NULL, NULL);

    /* a tokenizer that cannot decode the data's ids (283 ids, data up to 299) would ship in every checkpoint */
    {
        char path[1200], corpus[1200];
        snprintf(corpus, sizeof corpus, "%s/corpus/a.txt", fx->dir);
        size_t len;
        char *t0 = slurp(corpus, &len);
        const char *texts[1] = {t0};
        k3c_tok *t = NULL;
        k3c_tok_train_opts to = {
            .vocab_size = VOCAB_RANKS - 17, .pattern = K3C_TOK_PATTERN_CL100K, .specials = SPECIALS, .n_specials = 13};
        CHECK_OK(k3c_tok_train(texts, &len, 1, &to, &t, &err), &err);
        free(t0);
        snprintf(path, sizeof path, "%s/tok_small.tiktoken", fx->dir);
        if (t) CHECK_OK(k3c_tok_save(t, path, &err), &err);
        k3c_tok_free(t);
        p = defaults("bad_tok_vocab"), p.tokenizer = "tok_small.tiktoken";
        write_run(fx, "run_bad_tok_vocab", &p, cfg, sizeof cfg);
        expect_train_error(fx, "tokenizer smaller than the data's vocabulary", cfg, "bad_tok_vocab", 0,
                           "tok_small.tiktoken", "283", "300");
    }

    /* a tokenizer file with a bad line: the error names the file and the line */
    size_t n;
    char *text = slurp(fx->tok, &n);
    if (!text) {
        CHECK(0, "cannot read %s", fx->tok);
        return;
    }
    static const struct {
        const char *line, *what;
    } bad[] = {{"@@notbase64@@ 99", "bad base64"}, {"YWJj", "without a space"}, {"YWJjZA== 7", "out of order"}};
    for (int k = 0; k < 3; k++) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        int line = 1;
        for (char *q = text, *nl; *q; q = nl + 1, line++) {
            nl = strchr(q, '\n');
            if (!nl) nl = q + strlen(q) - 1;
            if (line == 100)
                k3c_sbuf_printf(&s, "%s\n", bad[k].line);
            else
                k3c_sbuf_append(&s, q, (size_t)(nl - q + 1));
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/bad%d.tiktoken", fx->dir, k);
        write_text(path, s.buf);
        k3c_sbuf_free(&s);
        k3c_tok *t = NULL;
        int e = k3c_tok_load(path, K3C_TOK_PATTERN_CL100K, 0, &t, &err);
        char want[1300];
        snprintf(want, sizeof want, "%s:100:", path);
        CHECK(e == K3C_EFORMAT && contains(err.msg, want) && contains(err.msg, bad[k].what), "tokenizer %s: %d '%s'",
              bad[k].what, e, err.msg);
        k3c_tok_free(t);
    }
    free(text);
}

/* ---------------------------------------------------------------- 5. the loss goes down */

static void test_loss_decreases(const fixture *fx) {
    char cfg[1200];
    k3c_err err = {0};
    k3c_train_result r;
    run_params p = defaults("L");
    p.stage0 =
        "{\"name\": \"s64\", \"seq_len\": 64, \"steps\": 30, \"lr\": 0.01, \"warmup\": 2, \"schedule\": \"cosine\", "
        "\"mixture\": {\"a\": 0.5, \"b\": 0.5}}";
    p.stage1 = NULL;
    p.ckpt_every = 0;
    p.eval_every = 0;
    write_run(fx, "run_L", &p, cfg, sizeof cfg);
    CHECK_OK(train(cfg, 0, 0, NULL, &r, &err), &err);
    mrow rows[64];
    int bad, n = read_metrics(fx, "L", rows, 64, &bad);
    CHECK(bad == 0 && steps_once(rows, n, 30), "loss run: %d metrics rows", n);
    if (n < 30) return;
    /* at init (std 0.02) the logits are nearly flat, so the first loss is close to ln V */
    CHECK(fabs(rows[0].loss - log(VOCAB)) < 0.1, "first loss %.4f vs ln %d = %.4f", rows[0].loss, VOCAB, log(VOCAB));
    double tail = 0;
    for (int i = 25; i < 30; i++) tail += rows[i].loss / 5;
    /* "clearly below": at least 1 nat (a factor e in perplexity) under the first value, averaged over the last 5 steps */
    CHECK(tail < rows[0].loss - 1.0, "loss did not fall: first %.4f, mean of steps 26-30 %.4f (unigram entropy %.4f)",
          rows[0].loss, tail, r.unigram_entropy);
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  loss: first %.4f, last-5 mean %.4f, unigram entropy %.4f, %.0f tok/s\n", rows[0].loss, tail,
               r.unigram_entropy, r.tokens_per_s);
}

/* `k3c train` (the CLI) trains, then plots the trainer's metrics.jsonl to metrics.png when gnuplot exists. */
static void test_cli_train(const fixture *fx) {
    char cfg[1200], p[1300], cmd[3000];
    run_params rp = defaults("C");
    rp.stage1 = NULL;
    rp.ckpt_every = 0;
    write_run(fx, "run_C", &rp, cfg, sizeof cfg);
    snprintf(cmd, sizeof cmd, "%s train --config '%s' --quiet >/dev/null 2>&1", test_k3c_bin(), cfg);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    out_path(fx, "C", "metrics.jsonl", p, sizeof p);
    CHECK(exists(p), "k3c train wrote no metrics.jsonl");
    out_path(fx, "C", "metrics.png", p, sizeof p);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) CHECK(exists(p), "k3c train drew no metrics.png");
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--child") == 0) return child_main(argv[2], atoi(argv[3]));
    fixture fx;
    memset(&fx, 0, sizeof fx);
    double t0 = k3c_now();
    if (build_fixture(&fx)) return test_summary();
    double t1 = k3c_now();
    test_resume(&fx, "exact");
    double t2 = k3c_now();
    test_resume(&fx, "histogram");
    char a[1300], b[1300];
    out_path(&fx, "A_exact", "step_00000010/model.safetensors", a, sizeof a);
    out_path(&fx, "A_histogram", "step_00000010/model.safetensors", b, sizeof b);
    CHECK(!files_equal(a, b), "exact and histogram balancing trained identical models (balancing not applied?)");
    test_resume_chain(&fx);
    test_resume_threads(&fx);
    test_checkpoints(&fx);
    test_fresh_run_in_used_dir(&fx);
    double t3 = k3c_now();
    test_partial_checkpoint(&fx);
    test_kill(&fx, (t2 - t1) / 2 * 1.3); /* test_resume ran about two full runs */
    double t4 = k3c_now();
    test_bad_config(&fx);
    test_bad_data(&fx);
    double t5 = k3c_now();
    test_loss_decreases(&fx);
    test_cli_train(&fx);
    double t6 = k3c_now();
    if (test_failed_ == 0) replace_tree(fx.dir, NULL); /* kept for inspection when something failed */
    if (getenv("K3C_TEST_VERBOSE"))
        printf("  times: fixture %.2f s, resume %.2f s, crash %.2f s, bad input %.2f s, loss %.2f s\n", t1 - t0,
               t3 - t1, t4 - t3, t5 - t4, t6 - t5);
    return test_summary();
}
