/* train_fixture.h — the shared fixture of the trainer tests (test_train.c, test_train_faults.c): a synthetic two-source
 * corpus, a BPE tokenizer trained on it (287 ranks + 13 specials = 300 ids), shards of both sources (train + val) and a
 * tiny K3 model config with vocab 300, built in the program's own scratch directory; the run-config writer (kda_chunk 16,
 * stages of seq_len 32 and 64 at 128 tokens per step, different mixtures per stage), the metrics.jsonl reader and the
 * checkpoint helpers. Static functions: each test program includes it once, after test.h. */
#ifndef K3C_TRAIN_FIXTURE_H
#define K3C_TRAIN_FIXTURE_H

#include "test.h"

#include "base/json.h"
#include "model/model.h"
#include "ops/optim.h"
#include "tok/tok.h"
#include "train/checkpoint.h"
#include "train/data.h"

#include <dirent.h>
#include <sys/stat.h>

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

/* Builds the fixture in build/tmp/<name>.<pid> (name: the test program, so that two programs never share a directory). */
static int build_fixture(fixture *fx, const char *name) {
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
    const char *tmp = test_tmpdir(name);
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
    k3c_train_opts o = {resume, max_steps, NULL, log, NULL, NULL};
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
        if (strstr(line, "\"event\":")) continue; /* trainer events (skipped batches, rollbacks, resumes) */
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

/* The whole optimizer state (single-process layout, Muon as the fixture's runs) of a checkpoint written at any layout,
 * and its trainer_state.json (ts NULL: not read). */
static int ckpt_state(const char *dir, float *state, char **ts, k3c_err *err) {
    k3c_config cfg;
    k3c_param_table t;
    k3c_optim opt;
    int rc = k3c_config_load(dir, &cfg, err);
    if (!rc) rc = k3c_params_build(&cfg, &t, err);
    if (rc) return rc;
    k3c_optim_defaults(&opt);
    opt.matrix_optimizer = K3C_MATRIX_MUON;
    rc = k3c_optim_init(&opt, &t, err);
    if (!rc) {
        rc = k3c_train_ckpt_load_state(dir, &t, &opt, NULL, state, ts, err);
        k3c_optim_free(&opt);
    }
    k3c_params_free(&t);
    return rc;
}

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
    rc = ckpt_state(dir, ost, &state, &err);
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

/* ---------------------------------------------------------------- comparing runs */

static int count_lines(FILE *f) {
    int n = 0, c;
    rewind(f);
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    return n;
}

/* Final model / optimizer / trainer state of out dir x and y at step `step` are byte-identical: every model*,
 * optimizer* and trainer_state.json file x's checksums.json lists (single files or shards and their indices). */
static void check_same_final_at(const fixture *fx, const char *x, const char *y, int step, const char *what) {
    char a[1300], b[1300], rel[64];
    snprintf(rel, sizeof rel, "step_%08d/checksums.json", step);
    out_path(fx, x, rel, a, sizeof a);
    k3c_json *j = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_json_parse_file(a, &j, &err), &err);
    const k3c_json *files = k3c_json_get(j, "files");
    int n = 0;
    for (size_t i = 0; files && i < files->n; i++) {
        const char *f = files->keys[i];
        if (strncmp(f, "model", 5) && strncmp(f, "optimizer", 9) && strcmp(f, "trainer_state.json")) continue;
        snprintf(rel, sizeof rel, "step_%08d/%s", step, f);
        out_path(fx, x, rel, a, sizeof a);
        out_path(fx, y, rel, b, sizeof b);
        CHECK(files_equal(a, b), "%s: %s differs between %s and %s", what, rel, x, y);
        n++;
    }
    CHECK(n >= 3, "%s: %s step %d lists %d model/optimizer/trainer files", what, x, step, n);
    k3c_json_free(j);
}

static void check_same_final(const fixture *fx, const char *x, const char *y, const char *what) {
    check_same_final_at(fx, x, y, N_STEPS, what);
}

#endif
