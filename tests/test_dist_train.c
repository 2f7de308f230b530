/* test_dist_train.c — the parallel launch end to end: `mpirun -np N k3c train --config RUN.json` with a "parallel"
 * block on the trainer fixture (tiny K3 model, real tokenizer and shards; tests/train_fixture.h), against the same run
 * in one process: the checkpoints after 2 and 4 steps equal within 1e-5 (per-tensor relative, fp32; router biases
 * absolute, see ckpt_diff), a dp2 run resumed from its own checkpoint continues bit for bit, a dp2 checkpoint resumed
 * by one process (and a one-process checkpoint resumed at dp2) continues like the single process; the same for ep2,
 * dp2×ep2, pp2, dp2×pp2, ep2×pp2 (its checkpoint resumed by one process and at pp2, a pp2 one at ep2×pp2), tp2,
 * tp2×pp2 (a dp2×ep2 checkpoint resumed at tp2, a tp2 checkpoint by one process), ep2×tp2 (its checkpoint resumed by
 * one process, a tp2 one at ep2×tp2), ep2×tp2×pp2 on 8 ranks, cp2,
 * dp2×cp2, ep2×cp2, cp2×pp2 and cp2×tp2; one rank with "force" (the parallel step kept) equals one process; and impossible layouts fail
 * with messages naming the field. */
#include "test.h"

#pragma GCC diagnostic ignored "-Wunused-function" /* the fixture's helpers this test does not need */
#include "train_fixture.h"
#include "mpi_launch.h"

#define TOL 1e-5

/* Two stages of 2 steps with their own schedules and mixtures, seq_len 32 at 128 tokens per step (at least 4 pieces
 * per step, one for each of 4 ranks), lr 1e-3. */
static const char *const ST0 = "{\"name\": \"s32\", \"seq_len\": 32, \"steps\": 2, \"lr\": 0.001, \"warmup\": 1, "
                               "\"schedule\": \"cosine\", \"mixture\": {\"a\": 0.8, \"b\": 0.2}}";
static const char *const ST1 = "{\"name\": \"s32b\", \"seq_len\": 32, \"steps\": 2, \"lr\": 0.001, \"schedule\": "
                               "\"linear\", \"mixture\": {\"a\": 0.2, \"b\": 0.8}}";

/* For context parallelism: sequences of 128 then 64 tokens (cp2: one sequence per step), so the ranks' ranges cut
 * through pieces; dp2×cp2 runs CP1 then ST0 (a sequence of 64, then 32, per data-parallel part). */
static const char *const CP0 = "{\"name\": \"s128\", \"seq_len\": 128, \"steps\": 2, \"lr\": 0.001, \"warmup\": 1, "
                               "\"schedule\": \"cosine\", \"mixture\": {\"a\": 0.8, \"b\": 0.2}}";
static const char *const CP1 = "{\"name\": \"s64\", \"seq_len\": 64, \"steps\": 2, \"lr\": 0.001, \"schedule\": "
                               "\"linear\", \"mixture\": {\"a\": 0.2, \"b\": 0.8}}";

static void write_cfg_stages(const fixture *fx, const char *name, const char *parallel, const char *st0,
                             const char *st1, char *path, size_t n) {
    run_params p = defaults(name);
    char extra[256];
    snprintf(extra, sizeof extra, "%s%s", parallel ? ", \"parallel\": " : "", parallel ? parallel : "");
    p.stage0 = st0;
    p.stage1 = st1;
    p.ckpt_every = 1;
    p.keep = 10;
    p.eval_every = 0;
    p.extra = extra;
    write_run(fx, name, &p, path, n);
}

static void write_cfg(const fixture *fx, const char *name, const char *parallel, char *path, size_t n) {
    write_cfg_stages(fx, name, parallel, ST0, ST1, path, n);
}

/* `mpirun -np np k3c train --config cfg args`; returns the exit status, output in out. */
static int k3c_mpi(int np, const char *cfg, const char *args, char *out, size_t n) {
    char a[2048];
    snprintf(a, sizeof a, "train --config '%s' --quiet %s", cfg, args);
    return test_mpirun_capture(np, test_k3c_bin(), a, out, n);
}

/* Largest per-tensor relative difference between the models (router biases apart) and the optimizer states of two
 * checkpoints; *bias_diff the largest absolute difference of a router bias. A router bias is a mean-free offset on
 * sigmoid scores in (0, 1), computed from differences of those scores, and shrinks towards 0 as the router balances:
 * its own magnitude is no scale for its error, the scores it shifts are (scale 1). */
static double ckpt_diff(const fixture *fx, const char *x, const char *y, int step, double *state_diff,
                        double *bias_diff) {
    char a[1300], b[1300], rel[64];
    snprintf(rel, sizeof rel, "step_%08d", step);
    out_path(fx, x, rel, a, sizeof a);
    out_path(fx, y, rel, b, sizeof b);
    k3c_err err = {0};
    k3c_model ma, mb;
    double d = INFINITY;
    *state_diff = *bias_diff = INFINITY;
    if (k3c_model_open_f32(a, 0, &ma, &err)) {
        CHECK(0, "%s", err.msg);
        return d;
    }
    if (k3c_model_open_f32(b, 0, &mb, &err)) {
        CHECK(0, "%s", err.msg);
        k3c_model_free_f32(&ma);
        return d;
    }
    d = *bias_diff = 0;
    for (int i = 0; i < ma.table.n; i++) {
        const k3c_param *p = &ma.table.p[i];
        const float *x = (float *)ma.w + p->offset, *y = (float *)mb.w + p->offset;
        if (p->kind != K3C_PK_ROUTER_BIAS) {
            d = fmax(d, test_rel_err_f(x, y, (size_t)p->numel));
            continue;
        }
        for (int64_t j = 0; j < p->numel; j++) *bias_diff = fmax(*bias_diff, fabs((double)x[j] - y[j]));
    }
    float *sa = malloc(sizeof(float) * fx->optim_numel), *sb = malloc(sizeof(float) * fx->optim_numel);
    char *ta = NULL, *tb = NULL;
    if (!ckpt_state(a, sa, &ta, &err) && !ckpt_state(b, sb, &tb, &err))
        *state_diff = test_rel_err_f(sa, sb, fx->optim_numel);
    else
        CHECK(0, "optimizer state: %s", err.msg);
    free(sa);
    free(sb);
    free(ta);
    free(tb);
    k3c_model_free_f32(&ma);
    k3c_model_free_f32(&mb);
    return d;
}

static void check_close(const fixture *fx, const char *x, const char *y, int step, const char *what) {
    double sd, bd, d = ckpt_diff(fx, x, y, step, &sd, &bd);
    CHECK(d <= TOL && sd <= TOL && bd <= TOL,
          "%s: step %d weights differ by %.3e, optimizer state by %.3e (relative), router biases by %.3e", what, step,
          d, sd, bd);
    printf("%s, step %d: weights %.2e, optimizer state %.2e (largest per-tensor relative differences), router biases "
           "%.2e (absolute)\n",
           what, step, d, sd, bd);
}

/* Out dir `dst` becomes run `src` as it was after step 2 (its later checkpoints removed, `latest` pointing at 2). */
static void copy_at_step2(const fixture *fx, const char *dst, const char *src) {
    char p[1400], q[1500];
    out_path(fx, dst, "", p, sizeof p);
    out_path(fx, src, "", q, sizeof q);
    replace_tree(p, q);
    for (int s = 3; s <= 4; s++) {
        snprintf(q, sizeof q, "%s/step_%08d", p, s);
        replace_tree(q, NULL);
    }
    snprintf(q, sizeof q, "%s/latest", p);
    write_text(q, "step_00000002\n");
}

/* Checkpoint `step` of run `run` holds every file of `present` (NULL-terminated) and none of `absent`. */
static void check_files(const fixture *fx, const char *run, int step, const char *const *present,
                        const char *const *absent) {
    char p[1400], rel[160];
    for (int k = 0; k < 2; k++)
        for (const char *const *f = k ? absent : present; *f; f++) {
            snprintf(rel, sizeof rel, "step_%08d/%s", step, *f);
            out_path(fx, run, rel, p, sizeof p);
            CHECK(exists(p) == !k, "%s: %s %s", run, rel, k ? "should not exist" : "missing");
        }
}

/* Which files each layout writes: one process the single files (the old format), ZeRO-1 one optimizer shard per
 * rank and its index, pipeline parallelism one model file per stage and expert parallelism one per EP rank, with the
 * Hugging Face index. */
static void check_layouts(const fixture *fx) {
    typedef const char *const list[];
    static list one = {"model.safetensors", "optimizer.safetensors", "checksums.json", NULL};
    static list one_not = {"optimizer.safetensors.index.json", "model.safetensors.index.json", NULL};
    static list force = {"model.safetensors", "optimizer-00001-of-00001.safetensors",
                         "optimizer.safetensors.index.json", NULL};
    static list dp2 = {"model.safetensors", "optimizer-00001-of-00002.safetensors",
                       "optimizer-00002-of-00002.safetensors", "optimizer.safetensors.index.json", NULL};
    static list dp2_not = {"optimizer.safetensors", "model.safetensors.index.json", NULL};
    /* expert parallelism: each EP rank of the first DP replica writes its experts (the first every other tensor too) */
    static list dpep = {"optimizer-00001-of-00004.safetensors", "optimizer-00004-of-00004.safetensors",
                        "model-00001-of-00002.safetensors",     "model-00002-of-00002.safetensors",
                        "model.safetensors.index.json",         NULL};
    static list dpep_not = {"model.safetensors", "optimizer.safetensors", NULL};
    static list pp2 = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                       "model.safetensors.index.json", "optimizer-00002-of-00002.safetensors", NULL};
    static list dppp = {"model-00002-of-00002.safetensors", "optimizer-00004-of-00004.safetensors", NULL};
    static list pp2_not = {"model.safetensors", "optimizer.safetensors", NULL};
    /* expert parallelism inside stages: one model file per stage and EP rank */
    static list eppp = {"model-00001-of-00004.safetensors", "model-00004-of-00004.safetensors",
                        "model.safetensors.index.json", "optimizer-00004-of-00004.safetensors", NULL};
    check_files(fx, "one", 2, one, one_not);
    check_files(fx, "force1", 2, force, dp2_not);
    check_files(fx, "dp2", 2, dp2, dp2_not);
    check_files(fx, "dpep", 4, dpep, dpep_not);
    check_files(fx, "pp2", 4, pp2, pp2_not);
    check_files(fx, "dppp", 4, dppp, pp2_not);
    check_files(fx, "eppp", 4, eppp, pp2_not);
}

/* A sharded checkpoint with a shard missing or damaged: resume fails with a message naming the file (step 2 is the
 * only checkpoint, so there is nothing to fall back to); without checksums.json the reader names it too. */
static void check_bad_shards(const fixture *fx) {
    static const char *const shard = "optimizer-00002-of-00002.safetensors";
    char cfg[1400], dir[1400], p[1500];
    k3c_train_result r;
    for (int k = 0; k < 2; k++) {
        k3c_err err = {0};
        write_cfg(fx, "badshard", NULL, cfg, sizeof cfg);
        copy_at_step2(fx, "badshard", "dp2b");
        out_path(fx, "badshard", "step_00000001", dir, sizeof dir);
        replace_tree(dir, NULL);
        out_path(fx, "badshard", "step_00000002", dir, sizeof dir);
        snprintf(p, sizeof p, "%s/%s", dir, shard);
        if (k == 0)
            unlink(p);
        else {
            FILE *f = fopen(p, "r+b");
            if (f && fseek(f, -3, SEEK_END) == 0) fputc('#', f);
            if (f) fclose(f);
        }
        int rc = train(cfg, 1, 0, NULL, &r, &err);
        CHECK(rc != K3C_OK && contains(err.msg, shard) && (k == 0 || contains(err.msg, "checksum")),
              "resume with shard %s: rc %d: %s", k ? "damaged" : "missing", rc, err.msg);
        printf("resume with a %s shard: %s\n", k ? "damaged" : "missing", err.msg);
    }
    snprintf(p, sizeof p, "%s/checksums.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/%s", dir, shard);
    unlink(p);
    k3c_err err = {0};
    float *st = malloc(sizeof(float) * fx->optim_numel);
    int rc = ckpt_state(dir, st, NULL, &err);
    CHECK(rc != K3C_OK && contains(err.msg, shard), "optimizer state without a shard or checksums: rc %d: %s", rc,
          err.msg);
    free(st);
}

/* `name` (its "parallel" block) trained from scratch on np ranks continues like one process (steps 2 and 4). */
static void run_mpi(const fixture *fx, const char *name, const char *parallel, int np, const char *what) {
    static char out[1 << 16];
    char cfg[1400];
    write_cfg(fx, name, parallel, cfg, sizeof cfg);
    int st = k3c_mpi(np, cfg, "", out, sizeof out);
    CHECK(st == 0, "mpirun -np %d k3c train (%s) exited %d:\n%s", np, what, st, out);
    check_close(fx, name, "one", 2, what);
    check_close(fx, name, "one", 4, what);
}

/* `name` (one process) resumed from `from`'s checkpoint of step 2 continues like one process. */
static void resume_one(const fixture *fx, const char *name, const char *from, const char *what) {
    char cfg[1400];
    k3c_err err = {0};
    k3c_train_result r;
    write_cfg(fx, name, NULL, cfg, sizeof cfg);
    copy_at_step2(fx, name, from);
    CHECK_OK(train(cfg, 1, 0, NULL, &r, &err), &err);
    check_close(fx, name, "one", 4, what);
}

/* Run `name` (its "parallel" block) resumed on np ranks from `from`'s checkpoint of step 2 continues like one process. */
static void resume_mpi(const fixture *fx, const char *name, const char *parallel, int np, const char *from,
                       const char *what) {
    static char out[1 << 16];
    char cfg[1400];
    write_cfg(fx, name, parallel, cfg, sizeof cfg);
    copy_at_step2(fx, name, from);
    int st = k3c_mpi(np, cfg, "--resume", out, sizeof out);
    CHECK(st == 0, "%s exited %d:\n%s", what, st, out);
    check_close(fx, name, "one", 4, what);
}

/* A rank whose write of its part fails (the test fault hook) fails the save on every rank, and nothing is left: no
 * step directory, no temporary, no `latest`. */
static void check_failed_save(const fixture *fx) {
    static char out[1 << 16];
    char cfg[1400], p[1500];
    write_cfg(fx, "failsave", "{\"dp\": 2}", cfg, sizeof cfg);
    setenv("K3C_TEST_FAULT", "save:1", 1);
    int st = k3c_mpi(2, cfg, "--max-steps 1", out, sizeof out);
    unsetenv("K3C_TEST_FAULT");
    CHECK(st != 0 && (contains(out, "another rank failed to write its part") || contains(out, "state floats given")),
          "a failed shard write: exit %d:\n%s", st, out);
    static const char *const none_left[] = {"step_00000001", ".tmp_step_00000001", "latest"};
    for (int i = 0; i < 3; i++) {
        out_path(fx, "failsave", none_left[i], p, sizeof p);
        CHECK(!exists(p), "a failed save left %s behind", p);
    }
}

/* `k3c plan` prints the recommended layout as a "parallel" block that a run config accepts as it is. */
static void plan_block(const fixture *fx) {
    char cmd[1024], line[1024], block[1024] = "", path[1400];
    snprintf(cmd, sizeof cmd, "%s plan configs/k3_test_tiny.json --gpus 4 --seq 64 --global-batch-tokens 4096 2>&1",
             test_k3c_bin());
    FILE *p = popen(cmd, "r");
    while (p && fgets(line, sizeof line, p))
        if (!strncmp(line, "run config: \"parallel\": ", 24)) snprintf(block, sizeof block, "%s", line + 24);
    if (p) pclose(p);
    block[strcspn(block, "\n")] = 0;
    CHECK(block[0] == '{', "k3c plan printed no run-config block");
    write_cfg(fx, "planned", block, path, sizeof path);
    k3c_run_config rc;
    k3c_err err = {0};
    CHECK_OK(k3c_run_config_load(path, &rc, &err), &err);
    const k3c_parallel *q = &rc.parallel;
    CHECK(q->dp * q->ep * q->tp * q->pp * q->cp == 4, "planned block %s: %lld×%lld×%lld×%lld×%lld", block,
          (long long)q->dp, (long long)q->ep, (long long)q->tp, (long long)q->pp, (long long)q->cp);
}

int main(void) {
    fixture fx;
    if (build_fixture(&fx, "dist_train")) {
        printf("%d passed, %d failed\n", test_passed_, test_failed_ + 1);
        return 1;
    }
    static char out[1 << 16];
    char one[1400], dp2b[1400], bad[1400];
    k3c_err err = {0};
    k3c_train_result r;
    write_cfg(&fx, "one", NULL, one, sizeof one);
    CHECK_OK(train(one, 0, 0, NULL, &r, &err), &err); /* 4 steps, a checkpoint after each */

    /* "force": the parallel step (ZeRO-1, the expert exchange) with one rank, in this process (the one-rank
       communicator) and under mpirun -np 1 (MPI's) */
    char force1[1400], force2[1400];
    write_cfg(&fx, "force1", "{\"dp\": 1, \"force\": true}", force1, sizeof force1);
    CHECK_OK(train(force1, 0, 0, NULL, &r, &err), &err);
    check_close(&fx, "force1", "one", 4, "one rank with parallel.force vs one process");
    write_cfg(&fx, "force2", "{\"force\": true}", force2, sizeof force2);
    int st = k3c_mpi(1, force2, "", out, sizeof out);
    CHECK(st == 0, "mpirun -np 1 k3c train (parallel.force) exited %d:\n%s", st, out);
    check_close(&fx, "force2", "one", 4, "mpirun -np 1 with parallel.force vs one process");

    run_mpi(&fx, "dp2", "{\"dp\": 2}", 2, "dp2 vs one process");

    /* dp2 stopped after 2 steps and resumed at dp2: bit for bit the uninterrupted dp2 run */
    write_cfg(&fx, "dp2b", "{\"dp\": 2}", dp2b, sizeof dp2b);
    st = k3c_mpi(2, dp2b, "--max-steps 2", out, sizeof out);
    if (!st) st = k3c_mpi(2, dp2b, "--resume", out, sizeof out);
    CHECK(st == 0, "dp2 resume exited %d:\n%s", st, out);
    check_same_final_at(&fx, "dp2b", "dp2", 4, "dp2 resumed at dp2");

    /* a dp2 checkpoint resumed by one process, and a one-process checkpoint resumed at dp2 */
    resume_one(&fx, "res1", "dp2b", "dp2 checkpoint resumed by one process");

    resume_mpi(&fx, "res2", "{\"dp\": 2}", 2, "one", "one-process checkpoint resumed at dp2");

    /* expert parallelism: ep2 on 2 ranks, dp2×ep2 on 4, and a dp2×ep2 checkpoint resumed by one process */
    run_mpi(&fx, "ep2", "{\"ep\": 2}", 2, "ep2 vs one process");
    run_mpi(&fx, "dpep", "{\"dp\": 2, \"ep\": 2}", 4, "dp2×ep2 vs one process");
    resume_one(&fx, "res3", "dpep", "dp2×ep2 checkpoint resumed by one process");

    /* pipeline parallelism: pp2 on 2 ranks, dp2×pp2 on 4 (micro-batches = pp), and a pp2 checkpoint resumed by one
       process */
    run_mpi(&fx, "pp2", "{\"pp\": 2}", 2, "pp2 vs one process");
    run_mpi(&fx, "dppp", "{\"dp\": 2, \"pp\": 2}", 4, "dp2×pp2 vs one process");
    resume_one(&fx, "res4", "pp2", "pp2 checkpoint resumed by one process");
    /* stages of uneven depth: pp3 of the 4 layers (2 + 1 + 1) */
    run_mpi(&fx, "pp3", "{\"pp\": 3}", 3, "pp3 (stages of 2, 1, 1 layers) vs one process");

    /* expert parallelism inside pipeline stages: ep2×pp2 on 4 ranks (each rank holds its stage's layers and its
       experts of them), its checkpoint (a model file per stage and EP rank) resumed by one process and at pp2, and a
       pp2 checkpoint resumed at ep2×pp2 */
    run_mpi(&fx, "eppp", "{\"ep\": 2, \"pp\": 2}", 4, "ep2×pp2 vs one process");
    resume_one(&fx, "res11", "eppp", "ep2×pp2 checkpoint resumed by one process");
    resume_mpi(&fx, "res12", "{\"pp\": 2}", 2, "eppp", "ep2×pp2 checkpoint resumed at pp2");
    resume_mpi(&fx, "res13", "{\"ep\": 2, \"pp\": 2}", 4, "pp2", "pp2 checkpoint resumed at ep2×pp2");

    /* every layout's files, a pp2 checkpoint (a model file per stage, two optimizer shards) resumed at dp4 (four),
       a dp2 checkpoint resumed at pp2, and a damaged or missing shard */
    check_layouts(&fx);
    resume_mpi(&fx, "res9", "{\"dp\": 4}", 4, "pp2", "pp2 checkpoint resumed at dp4");
    resume_mpi(&fx, "res10", "{\"pp\": 2}", 2, "dp2b", "dp2 checkpoint resumed at pp2");
    check_bad_shards(&fx);
    check_failed_save(&fx);

    /* tensor parallelism: tp2 on 2 ranks, tp2×pp2 on 4; a dp2×ep2 checkpoint (four optimizer shards) resumed at
       tp2 (each rank reads the entries it owns from whichever shards hold them), and a tp2 checkpoint resumed by one process */
    run_mpi(&fx, "tp2", "{\"tp\": 2}", 2, "tp2 vs one process");
    run_mpi(&fx, "tppp", "{\"tp\": 2, \"pp\": 2}", 4, "tp2×pp2 vs one process");
    resume_mpi(&fx, "res5", "{\"tp\": 2}", 2, "dpep", "dp2×ep2 checkpoint resumed at tp2");
    /* expert groups beside the TP groups: ep2×tp2 on 4 ranks (EP groups of every second rank), its checkpoint resumed
       by one process, and a tp2 checkpoint resumed at ep2×tp2 */
    run_mpi(&fx, "eptp", "{\"ep\": 2, \"tp\": 2}", 4, "ep2×tp2 vs one process");
    resume_one(&fx, "res14", "eptp", "ep2×tp2 checkpoint resumed by one process");
    resume_mpi(&fx, "res15", "{\"ep\": 2, \"tp\": 2}", 4, "tp2", "tp2 checkpoint resumed at ep2×tp2");
    resume_one(&fx, "res6", "tp2", "tp2 checkpoint resumed by one process");
    /* all three on 8 ranks: EP beside TP inside pipeline stages */
    run_mpi(&fx, "eptppp", "{\"ep\": 2, \"tp\": 2, \"pp\": 2}", 8, "ep2×tp2×pp2 vs one process");

    /* context parallelism: cp2 on 2 ranks, dp2×cp2 on 4, a cp2 checkpoint resumed by one process and a one-process
       checkpoint resumed at cp2; one sequence per data-parallel part, so the ranges of the ranks cut through pieces */
    char onecp[1400], onecp2[1400], cp2[1400], res7[1400], res8[1400];
    write_cfg_stages(&fx, "onecp", NULL, CP0, CP1, onecp, sizeof onecp);
    CHECK_OK(train(onecp, 0, 0, NULL, &r, &err), &err);
    write_cfg_stages(&fx, "cp2", "{\"cp\": 2}", CP0, CP1, cp2, sizeof cp2);
    st = k3c_mpi(2, cp2, "", out, sizeof out);
    CHECK(st == 0, "mpirun -np 2 k3c train (cp2) exited %d:\n%s", st, out);
    check_close(&fx, "cp2", "onecp", 2, "cp2 vs one process");
    check_close(&fx, "cp2", "onecp", 4, "cp2 vs one process");
    write_cfg_stages(&fx, "onecp2", NULL, CP1, ST0, onecp2, sizeof onecp2);
    CHECK_OK(train(onecp2, 0, 0, NULL, &r, &err), &err);
    static const char *const with[2][2] = {{"dpcp", "{\"dp\": 2, \"cp\": 2}"}, {"epcp", "{\"ep\": 2, \"cp\": 2}"}};
    for (int i = 0; i < 2; i++) { /* dp2×cp2 and ep2×cp2 on 4 ranks */
        char path[1400], what[64];
        write_cfg_stages(&fx, with[i][0], with[i][1], CP1, ST0, path, sizeof path);
        snprintf(what, sizeof what, "%s×cp2 vs one process", i ? "ep2" : "dp2");
        st = k3c_mpi(4, path, "", out, sizeof out);
        CHECK(st == 0, "mpirun -np 4 k3c train (%s) exited %d:\n%s", what, st, out);
        check_close(&fx, with[i][0], "onecp2", 2, what);
        check_close(&fx, with[i][0], "onecp2", 4, what);
    }
    { /* cp2×pp2 on 4 ranks: CP inside the pipeline stages, each of 3 micro-batches (whole document pieces of the
         step's sequences of 32) cut into 2 ranges, which cut through pieces */
        char path[1400];
        write_cfg(&fx, "cppp", "{\"cp\": 2, \"pp\": 2, \"micro_batches\": 3}", path, sizeof path);
        st = k3c_mpi(4, path, "", out, sizeof out);
        CHECK(st == 0, "mpirun -np 4 k3c train (cp2×pp2) exited %d:\n%s", st, out);
        check_close(&fx, "cppp", "one", 2, "cp2×pp2 vs one process");
        check_close(&fx, "cppp", "one", 4, "cp2×pp2 vs one process");
    }
    { /* cp2×tp2 on 4 ranks: a TP pair on each range, the KDA state of its heads passed along the ranges */
        char path[1400];
        write_cfg_stages(&fx, "cptp", "{\"cp\": 2, \"tp\": 2}", CP0, CP1, path, sizeof path);
        st = k3c_mpi(4, path, "", out, sizeof out);
        CHECK(st == 0, "mpirun -np 4 k3c train (cp2×tp2) exited %d:\n%s", st, out);
        check_close(&fx, "cptp", "onecp", 2, "cp2×tp2 vs one process");
        check_close(&fx, "cptp", "onecp", 4, "cp2×tp2 vs one process");
    }
    write_cfg_stages(&fx, "res7", NULL, CP0, CP1, res7, sizeof res7);
    copy_at_step2(&fx, "res7", "cp2");
    CHECK_OK(train(res7, 1, 0, NULL, &r, &err), &err);
    check_close(&fx, "res7", "onecp", 4, "cp2 checkpoint resumed by one process");
    write_cfg_stages(&fx, "res8", "{\"cp\": 2}", CP0, CP1, res8, sizeof res8);
    copy_at_step2(&fx, "res8", "onecp");
    st = k3c_mpi(2, res8, "--resume", out, sizeof out);
    CHECK(st == 0, "one-process checkpoint resumed at cp2 exited %d:\n%s", st, out);
    check_close(&fx, "res8", "onecp", 4, "one-process checkpoint resumed at cp2");

    /* impossible layouts: the world size, the experts, the layers, the heads, a sequence length cp does not divide */
    write_cfg(&fx, "bad", "{\"dp\": 2}", bad, sizeof bad);
    st = k3c_mpi(4, bad, "", out, sizeof out);
    CHECK(st != 0 && contains(out, "bad.json: parallel: dp×ep×tp×pp×cp = 2×1×1×1×1 = 2 ranks, but the run has 4"),
          "dp2 on 4 ranks: exit %d:\n%s", st, out);
    write_cfg(&fx, "bad", "{\"ep\": 3}", bad, sizeof bad);
    st = k3c_mpi(3, bad, "", out, sizeof out);
    CHECK(st != 0 && contains(out, "parallel.ep = 3 does not divide the model's 4 routed experts"), "ep3: exit %d:\n%s",
          st, out);
    write_cfg(&fx, "bad", "{\"pp\": 5}", bad, sizeof bad);
    st = k3c_mpi(5, bad, "", out, sizeof out);
    CHECK(st != 0 && contains(out, "parallel.pp = 5 is more stages than the model's 4 layers"), "pp5: exit %d:\n%s", st,
          out);
    write_cfg(&fx, "bad", "{\"tp\": 4}", bad, sizeof bad);
    st = k3c_mpi(4, bad, "", out, sizeof out);
    CHECK(st != 0 && contains(out, "parallel.tp = 4 does not divide the model's 2 KDA heads"), "tp4: exit %d:\n%s", st,
          out);
    write_cfg(&fx, "bad", "{\"cp\": 3}", bad, sizeof bad);
    st = k3c_mpi(3, bad, "", out, sizeof out);
    CHECK(st != 0 && contains(out, "bad.json: parallel.cp = 3 does not divide stage 0 (s32): seq_len 32"),
          "cp3: exit %d:\n%s", st, out);
    write_cfg(&fx, "bad", "{\"pp\": 2, \"micro_batches\": 64}", bad, sizeof bad);
    st = k3c_mpi(2, bad, "", out, sizeof out);
    CHECK(st != 0 && contains(out, "document pieces for 64 micro-batches") && contains(out, "seq_len"),
          "pp2 with more micro-batches than pieces: exit %d:\n%s", st, out);
    run_params long_docs = defaults("bad"); /* pieces of 128 tokens: one per step, too few for 2 ranks */
    long_docs.stage0 = "{\"name\": \"s128\", \"seq_len\": 128, \"steps\": 2, \"lr\": 0.001}";
    long_docs.stage1 = NULL;
    long_docs.extra = ", \"parallel\": {\"dp\": 2}";
    write_run(&fx, "bad", &long_docs, bad, sizeof bad);
    st = k3c_mpi(2, bad, "", out, sizeof out);
    CHECK(st != 0 && contains(out, "document pieces for 2 ranks") && contains(out, "seq_len"),
          "dp2 with one piece per step: exit %d:\n%s", st, out);
    err = (k3c_err){0};
    write_cfg(&fx, "bad", "{\"dp\": 2}", bad, sizeof bad);
    CHECK(train(bad, 0, 0, NULL, &r, &err) == K3C_ECONFIG && contains(err.msg, "(mpirun -np 2)"),
          "dp2 without mpirun: %s", err.msg);
    write_cfg(&fx, "bad", "{\"dp\": 0}", bad, sizeof bad);
    CHECK(train(bad, 0, 0, NULL, &r, &err) == K3C_ECONFIG && contains(err.msg, "parallel.dp: 0, must be 1..65536"),
          "dp 0: %s", err.msg);
    write_cfg(&fx, "bad", "{\"pp\": 1, \"micro_batches\": 0}", bad, sizeof bad);
    CHECK(train(bad, 0, 0, NULL, &r, &err) == K3C_ECONFIG && contains(err.msg, "parallel.micro_batches: 0, must be"),
          "micro_batches 0: %s", err.msg);
    write_cfg(&fx, "bad", "{\"force\": 1}", bad, sizeof bad);
    CHECK(train(bad, 0, 0, NULL, &r, &err) == K3C_ECONFIG && contains(err.msg, "parallel.force"), "force 1: %s",
          err.msg);
    write_cfg(&fx, "bad", "{\"dp\": 1, \"zero\": 1}", bad, sizeof bad);
    CHECK(train(bad, 0, 0, NULL, &r, &err) == K3C_ECONFIG && contains(err.msg, "parallel.zero: unknown key"),
          "unknown key: %s", err.msg);
    plan_block(&fx);
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ ? 1 : 0;
}
