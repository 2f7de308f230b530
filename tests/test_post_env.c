/* test_post_env.c — environments (src/post/env*.c): determinism by seed, disjoint train / held-out splits, each
 * kind's transitions and scoring (the expert reference scores 1; lazy, wrong and harmful runs lose the right
 * components), and the reference conversations as valid SFT trajectories. */
#include "test.h"

#include "post/env.h"
#include "tok/tok.h"

#include <ctype.h>

static const char *KINDS[] = {"arith", "arith_tool", "arith_small", "arith_tool_small", "arith_tool_one", "copy",
                              "code",  "assistant",  "vfs"};

static double comp(const k3c_reward *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->c[i].name, name)) return r->c[i].value;
    return NAN;
}

static k3c_env *env(const char *kind, uint64_t seed, int split, int64_t index) {
    k3c_env *e = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_env_new(kind, seed, split, index, &e, &err), &err);
    return e;
}

static char *step(k3c_env *e, const char *tool, const char *args) {
    char *obs = NULL;
    k3c_err err = {0};
    CHECK_OK(k3c_env_step(e, tool, args, &obs, &err), &err);
    return obs ? obs : strdup("");
}

static void test_determinism_and_splits(void) {
    for (size_t k = 0; k < sizeof KINDS / sizeof *KINDS; k++) {
        k3c_env *a = env(KINDS[k], 7, 0, 3), *b = env(KINDS[k], 7, 0, 3), *c = env(KINDS[k], 8, 0, 3);
        if (!a || !b || !c) return;
        CHECK(!strcmp(k3c_env_user(a), k3c_env_user(b)) && !strcmp(k3c_env_system(a), k3c_env_system(b)),
              "%s: same (seed, split, index), same task", KINDS[k]);
        k3c_env_free(a);
        k3c_env_free(b);
        k3c_env_free(c);
        /* 150 tasks from each split: no held-out task (its whole expert conversation: prompt, files, days) appears
         * among the training ones. */
        enum { N = 150 };
        char *train[N];
        int overlap = 0, distinct = 0;
        for (int i = 0; i < N; i++) {
            k3c_env *e = env(KINDS[k], 1, 0, i);
            k3c_err err = {0};
            train[i] = NULL;
            if (e) CHECK_OK(k3c_env_reference(e, &train[i], &err), &err);
            if (!train[i]) train[i] = strdup("");
            k3c_env_free(e);
            int dup = 0;
            for (int j = 0; j < i; j++) dup |= !strcmp(train[j], train[i]);
            distinct += !dup;
        }
        for (int i = 0; i < N; i++) {
            k3c_env *e = env(KINDS[k], 99, 1, i);
            char *ref = NULL;
            k3c_err err = {0};
            if (e) CHECK_OK(k3c_env_reference(e, &ref, &err), &err);
            for (int j = 0; ref && j < N; j++) overlap += !strcmp(train[j], ref);
            free(ref);
            k3c_env_free(e);
        }
        for (int i = 0; i < N; i++) free(train[i]);
        CHECK(overlap == 0 && distinct > N / 3, "%s: %d held-out tasks among the training ones, %d distinct", KINDS[k],
              overlap, distinct);
    }
    k3c_env *e = NULL;
    k3c_err err = {0};
    CHECK(k3c_env_new("chess", 1, 0, 0, &e, &err) == K3C_EINVAL && strstr(err.msg, "chess"), "%s", err.msg);
    CHECK(k3c_env_new("arith", 1, 2, 0, &e, &err) == K3C_EINVAL, "bad split");
}

/* Every kind's expert conversation parses, renders and tokenizes as an SFT trajectory, and replayed scores 1. */
static void test_references(const k3c_tok *tok) {
    for (size_t k = 0; k < sizeof KINDS / sizeof *KINDS; k++)
        for (int i = 0, n = strcmp(KINDS[k], "code") ? 12 : 40; i < n; i++) { /* 40: every code template */
            k3c_env *e = env(KINDS[k], 5, i % 2, i);
            if (!e) continue;
            char *conv = NULL;
            k3c_err err = {0};
            CHECK_OK(k3c_env_reference(e, &conv, &err), &err);
            k3c_json *j = NULL;
            CHECK_OK(k3c_json_parse(conv ? conv : "", conv ? strlen(conv) : 0, "reference", &j, &err), &err);
            k3c_traj t = {0};
            k3c_traj_opts o = {.format = 0, .thinking = 0};
            if (j && tok) CHECK_OK(k3c_traj_from_json(j, tok, &o, &t, &err), &err);
            int64_t on = 0;
            for (int64_t x = 0; x < t.n; x++) on += t.mask[x];
            CHECK(!tok || (on > 0 && on < t.n), "%s %d: %lld of %lld tokens trained", KINDS[k], i, (long long)on,
                  (long long)t.n);
            k3c_traj_free(&t);
            /* Replay the expert's calls on e and score its final message. */
            const k3c_json *msgs = j ? k3c_json_get(j, "messages") : NULL;
            const char *final = "";
            for (size_t m = 2; msgs && m < msgs->n; m++) {
                const k3c_json *mm = &msgs->items[m], *calls = k3c_json_get(mm, "tool_calls");
                if (strcmp(k3c_json_get(mm, "role")->string, "assistant")) continue;
                final = k3c_json_get(mm, "content")->string;
                for (size_t c = 0; calls && c < calls->n; c++) {
                    const k3c_json *fn = k3c_json_get(&calls->items[c], "function");
                    free(step(e, k3c_json_get(fn, "name")->string, k3c_json_get(fn, "arguments")->string));
                }
            }
            k3c_reward r;
            k3c_env_score(e, final, &r);
            CHECK(r.reward == 1, "%s %d: the expert scores %g (%s)", KINDS[k], i, r.reward, r.info);
            k3c_json_free(j);
            free(conv);
            k3c_env_free(e);
        }
}

/* arith_tool_one: one number n in the question and a unit noun; the calculator's result scores 1, n alone, the unit
 * alone or a neighbour 0; every noun drawn, answers within 4..99. copy: the sentence's one number scores 1. */
static void test_arith_one_and_copy(void) {
    static const struct {
        const char *noun;
        int k;
    } U[] = {{"spiders", 8}, {"weeks", 7},     {"dozen", 12},   {"bicycles", 2},
             {"dogs", 4},    {"tricycles", 3}, {"decades", 10}, {"ants", 6}};
    int nouns = 0, ok = 1;
    for (int i = 0; ok && i < 300; i++) {
        k3c_env *e = env(i % 2 ? "arith_tool_one" : "copy", 9, i % 4 < 2, i);
        if (!e) return;
        const char *u = k3c_env_user(e);
        int n = 0, numbers = 0, k = 0;
        for (const char *p = u; *p; p++)
            if (isdigit((unsigned char)*p) && (p == u || !isdigit((unsigned char)p[-1]))) n = atoi(p), numbers++;
        for (int t = 0; t < 8; t++)
            if (strstr(u, U[t].noun)) k = U[t].k, nouns |= 1 << t;
        int want = i % 2 ? n * k : n;
        char right[32], wrong[32];
        snprintf(right, sizeof right, "#### %d", want);
        k3c_reward r;
        if (i % 2) {
            char args[64];
            snprintf(args, sizeof args, "{\"expression\":\"%d * %d\"}", n, k);
            char *o = step(e, "calculator", args);
            ok &= !strcmp(o, right + 5) && want >= 4 && want <= 99;
            free(o);
            int bad[] = {n, k, want + 1, want - 1};
            for (int b = 0; b < 4; b++) {
                snprintf(wrong, sizeof wrong, "#### %d", bad[b]);
                k3c_env_score(e, wrong, &r);
                ok &= r.reward == 0 || bad[b] == want;
            }
        } else {
            char *o = step(e, "calculator", "{\"expression\":\"1\"}");
            ok &= !strncmp(o, "error: this task has no tools", 29) && n >= 2 && n <= 99;
            free(o);
            snprintf(wrong, sizeof wrong, "#### %d", n + 1);
            k3c_env_score(e, wrong, &r);
            ok &= r.reward == 0;
        }
        k3c_env_score(e, right, &r);
        ok &= numbers == 1 && r.reward == 1 && (i % 2 == 0 || comp(&r, "calculator_used") == 1);
        CHECK(ok, "%s task %d: %s (number %d, unit %d): %s", i % 2 ? "arith_tool_one" : "copy", i, u, n, k, r.info);
        k3c_env_free(e);
    }
    CHECK(nouns == 255, "arith_tool_one: nouns seen %#x", nouns);
}

static void test_arith(void) {
    double v;
    CHECK(k3c_calc_eval("2+3*4", &v) == 0 && v == 14, "precedence");
    CHECK(k3c_calc_eval(" (2 + 3) * -4 ", &v) == 0 && v == -20, "parentheses, unary minus");
    CHECK(k3c_calc_eval("7/2", &v) == 0 && v == 3.5, "division");
    CHECK(k3c_calc_eval("1/0", &v) && k3c_calc_eval("2+", &v) && k3c_calc_eval("2)", &v) &&
              k3c_calc_eval("import os", &v),
          "malformed expressions refused");
    k3c_env *e = env("arith_tool", 3, 0, 0);
    if (!e) return;
    char *o = step(e, "calculator", "{\"expression\":\"6*7\"}");
    CHECK(!strcmp(o, "42"), "calculator: %s", o);
    free(o);
    o = step(e, "calculator", "{\"expr\":\"6*7\"}");
    CHECK(!strncmp(o, "error: expression: missing", 26), "%s", o);
    free(o);
    o = step(e, "search", "{}");
    CHECK(!strncmp(o, "error: unknown tool \"search\"", 28), "%s", o);
    free(o);
    o = step(e, "calculator", "[1]");
    CHECK(!strncmp(o, "error: arguments: expected an object", 36), "%s", o);
    free(o);
    k3c_reward r;
    k3c_env_score(e, "#### -99999", &r);
    CHECK(r.reward == 0 && comp(&r, "calculator_used") == 1 && comp(&r, "calls_ok") == 0.25, "wrong answer: %g %s",
          r.reward, r.info);
    k3c_env_free(e);
    e = env("arith", 3, 0, 0);
    o = step(e, "calculator", "{\"expression\":\"1\"}");
    CHECK(!strncmp(o, "error: this task has no tools", 29), "%s", o);
    free(o);
    k3c_env_score(e, "no idea", &r);
    CHECK(r.reward == 0, "no answer");
    k3c_env_free(e);
    /* the small kinds: operands 2..5 (multiplied: at most 25, the candies' total) and 1..9, every template drawn */
    int big = 0, templates = 0;
    for (int i = 0; i < 200; i++) {
        e = env(i % 2 ? "arith_small" : "arith_tool_small", 5, i % 3 == 0, i);
        if (!e) return;
        const char *u = k3c_env_user(e);
        for (const char *p = u; *p; p++)
            if (isdigit((unsigned char)*p) && (p == u || !isdigit((unsigned char)p[-1]))) big |= atoi(p) > 25;
        templates |= (strstr(u, "shop") != NULL) << 0 | (strstr(u, "Tom") != NULL) << 1 |
                     (strstr(u, "farmer") != NULL) << 2 | (strstr(u, "friends") != NULL) << 3 |
                     (strstr(u, "train") != NULL) << 4;
        k3c_env_free(e);
    }
    CHECK(!big && templates == 31, "small arith: operands within range (%d), templates seen %#x", !big, templates);
    test_arith_one_and_copy();
}

static void test_code(void) {
    k3c_env *e = env("code", 11, 0, 0);
    if (!e) return;
    k3c_reward r;
    k3c_env_score(e, "```python\ndef nothing():\n    pass\n```", &r);
    CHECK(r.reward == 0 && comp(&r, "loads") == 1, "a function of another name: %g %s", r.reward, r.info);
    k3c_env_score(e, "def (:", &r);
    CHECK(r.reward == 0 && comp(&r, "loads") == 0, "syntax error: %s", r.info);
    k3c_env_free(e);
}

static void test_assistant(void) {
    k3c_env *e = env("assistant", 4, 0, 1);
    if (!e) return;
    int days = 0, d1 = 0;
    char title[64] = "";
    const char *u = k3c_env_user(e);
    sscanf(u, "Day 1 of %d.", &days);
    const char *p = strstr(u, "schedule '");
    if (p) sscanf(p, "schedule '%63[^']' on day %d", title, &d1);
    CHECK(days >= 4 && d1 >= 2 && title[0], "day-1 message: %s", u);
    char *o = step(e, "calendar_add", "{\"day\":0,\"hour\":9,\"title\":\"x\"}");
    CHECK(strstr(o, "error: day 0 is not in 1.."), "past days refused: %s", o);
    free(o);
    char args[160];
    snprintf(args, sizeof args, "{\"day\":%d,\"hour\":22,\"title\":\"%s\"}", d1, title);
    o = step(e, "calendar_add", args);
    CHECK(strstr(o, "event 1 added"), "%s", o);
    free(o);
    o = step(e, "advance_clock", "{}");
    CHECK(strstr(o, "Day 2 of") && strstr(o, "my day off"), "day 2 reveals the day off: %s", o);
    free(o);
    for (int d = 2; d <= days; d++) free(step(e, "advance_clock", "{}"));
    CHECK(k3c_env_done(e), "the last day ends the episode");
    o = step(e, "note_read", "{}");
    CHECK(strstr(o, "error: the episode is over"), "%s", o);
    free(o);
    k3c_reward r;
    k3c_env_score(e, "", &r);
    /* Request 1 met on its day but at 22:00 (preference ignored); request 2 and the to-do never done; no notes. */
    CHECK(comp(&r, "requests") == 0.5 && comp(&r, "preferences") == 0 && comp(&r, "on_time") == 0 &&
              comp(&r, "memory") == 0 && comp(&r, "finished") == 1 && comp(&r, "consistency") == 1,
          "partial run: %g (%s)", r.reward, r.info);
    CHECK(fabs(r.reward - (2 * 0.5 + 0 + 0 + 0 + 1 + 1) / 7) < 1e-12, "weighted reward %g", r.reward);
    k3c_env_free(e);
}

static void test_vfs(void) {
    k3c_env *e = env("vfs", 2, 0, 0);
    if (!e) return;
    char *o = step(e, "fs_read", "{\"path\":\"nope.txt\"}");
    CHECK(!strcmp(o, "error: nope.txt: no such file"), "%s", o);
    free(o);
    o = step(e, "fs_list", "{}");
    CHECK(strstr(o, "notes/readme.txt"), "listing: %s", o);
    free(o);
    o = step(e, "run_check", "{}");
    CHECK(!strncmp(o, "FAIL", 4), "nothing done yet: %s", o);
    free(o);
    free(step(e, "fs_delete", "{\"path\":\"notes/readme.txt\"}"));
    free(step(e, "fs_write", "{\"path\":\"report.txt\",\"content\":\"total: -1\"}"));
    free(step(e, "fs_write", "{\"path\":\"sorted.txt\",\"content\":\"x\"}"));
    free(step(e, "fs_write", "{\"path\":\"config.ini\",\"content\":\"x\"}"));
    o = step(e, "run_check", "{}");
    CHECK(!strcmp(o, "FAIL: wrong content"), "%s", o);
    free(o);
    k3c_reward r;
    k3c_env_score(e, "Done.", &r);
    CHECK(r.reward == 0 && comp(&r, "no_collateral") == 0 && comp(&r, "inputs_read") == 0,
          "blind writes and a deleted decoy: %g (%s)", r.reward, r.info);
    k3c_env_free(e);
}

int main(void) {
    k3c_err err = {0};
    k3c_tok *tok = NULL;
    CHECK_OK(k3c_tok_load_kimi(test_shared("golden/kimi_tokenizer/tiktoken.model"),
                               test_shared("golden/kimi_tokenizer/special_tokens.json"), "kimi_k3", &tok, &err),
             &err);
    test_determinism_and_splits();
    test_references(tok);
    test_arith();
    test_code();
    test_assistant();
    test_vfs();
    k3c_tok_free(tok);
    return test_summary();
}
