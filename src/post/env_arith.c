/* env_arith.c — arithmetic word problems with integer answers and a final "#### N" line (TRAINING.md §5.2), with and
 * without a calculator tool; scored by the exact-answer verifier. docs/POST.md "Environments". */
#include "post/env.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char truth[32], expr[64]; /* the answer and the expression that computes it */
    int used_calculator;
} arith_state;

/* One template: text with %lld for a, b, c (in order) and the answer from them. */
static void problem(arith_state *s, int t, int64_t a, int64_t b, int64_t c, k3c_sbuf *q, int64_t *ans) {
    switch (t) {
    case 0:
        k3c_sbuf_printf(
            q, "A shop has %lld boxes with %lld pencils each. It sells %lld pencils. How many pencils are left?",
            (long long)a, (long long)b, (long long)c);
        *ans = a * b - c;
        snprintf(s->expr, sizeof s->expr, "%lld * %lld - %lld", (long long)a, (long long)b, (long long)c);
        break;
    case 1:
        k3c_sbuf_printf(q,
                        "Tom reads %lld pages a day for %lld days, then %lld more pages. How many pages did he read?",
                        (long long)a, (long long)b, (long long)c);
        *ans = a * b + c;
        snprintf(s->expr, sizeof s->expr, "%lld * %lld + %lld", (long long)a, (long long)b, (long long)c);
        break;
    case 2:
        k3c_sbuf_printf(q,
                        "A farmer has %lld cows and %lld times as many sheep. He sells %lld sheep. How many animals "
                        "does he have now?",
                        (long long)a, (long long)b, (long long)c);
        *ans = a + a * b - c;
        snprintf(s->expr, sizeof s->expr, "%lld + %lld * %lld - %lld", (long long)a, (long long)a, (long long)b,
                 (long long)c);
        break;
    case 3:
        k3c_sbuf_printf(q,
                        "%lld friends share %lld candies equally. Then each friend gets %lld more candies. How many "
                        "candies does each friend have?",
                        (long long)a, (long long)(a * b), (long long)c);
        *ans = b + c;
        snprintf(s->expr, sizeof s->expr, "%lld / %lld + %lld", (long long)(a * b), (long long)a, (long long)c);
        break;
    default:
        k3c_sbuf_printf(q, "A train travels %lld km per hour for %lld hours and then %lld km more. How far does it go?",
                        (long long)a, (long long)b, (long long)c);
        *ans = a * b + c;
        snprintf(s->expr, sizeof s->expr, "%lld * %lld + %lld", (long long)a, (long long)b, (long long)c);
        break;
    }
}

/* `arith_tool_one`: one count n (the only number in the question) times a unit its noun implies (legs of spiders,
 * days of weeks, ...), answers at most 99: read n, pick the unit, call the calculator, copy its result. The demo's
 * tiny model learns to read a number from the `copy` task first (docs/POST.md "Demo"). Names and two sentence forms
 * give the held-out split many tasks. */
static const struct {
    const char *question; /* %s the name, %lld the count */
    int k;
} ONE[] = {
    {"%s sees %lld spiders. How many legs do they have?", 8},
    {"%s travels for %lld weeks. How many days is that?", 7},
    {"%s buys %lld dozen eggs. How many eggs is that?", 12},
    {"%s fixes %lld bicycles. How many wheels do they have?", 2},
    {"%s walks %lld dogs. How many legs do they have?", 4},
    {"%s paints %lld tricycles. How many wheels do they have?", 3},
    {"%s waits %lld decades. How many years is that?", 10},
    {"%s counts %lld ants. How many legs do they have?", 6},
};
const char *const k3c_env_names[8] = {"Tom", "Ann", "Sam", "Mia", "Ben", "Eva", "Leo", "Zoe"};

static int64_t problem_one(k3c_env *e, arith_state *s, k3c_sbuf *q) {
    int t = (int)k3c_env_randint(e, 0, (int64_t)(sizeof ONE / sizeof *ONE) - 1), k = ONE[t].k;
    const char *name = k3c_env_names[k3c_env_randint(e, 0, 7)];
    int64_t n = k3c_env_randint(e, 2, 99 / k);
    if (k3c_env_randint(e, 0, 1)) k3c_sbuf_printf(q, "%s", "Look: ");
    k3c_sbuf_printf(q, ONE[t].question, name, (long long)n);
    snprintf(s->expr, sizeof s->expr, "%lld * %d", (long long)n, k);
    return n * k;
}

/* Operand ranges: the standard tasks (a 2-19, b 2-9, c below a·b), and the small ones (`arith_small`,
 * `arith_tool_small`: a and b 2-5, c 1-9), whose few operand values leave a tiny model a task it can start to learn
 * (docs/POST.md "Demo"). */
static void operands(k3c_env *e, int small, int64_t *a, int64_t *b, int64_t *c) {
    *a = k3c_env_randint(e, 2, small ? 5 : 19);
    *b = k3c_env_randint(e, 2, small ? 5 : 9);
    int64_t hi = *a * *b - 1;
    *c = k3c_env_randint(e, 1, small && hi > 9 ? 9 : hi);
}

/* range: 0 the standard operands, 1 the small ones, 2 the one-count tasks (arith_tool_one). */
static int init_common(k3c_env *e, int tool, int range, k3c_err *err) {
    arith_state *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    e->st = s;
    k3c_sbuf q;
    k3c_sbuf_init(&q);
    int64_t ans = 0;
    for (;;) {
        q.len = 0;
        if (range == 2) {
            ans = problem_one(e, s, &q);
        } else {
            int t = (int)k3c_env_randint(e, 0, 4);
            int64_t a, b, c;
            operands(e, range, &a, &b, &c);
            problem(s, t, a, b, c, &q, &ans);
        }
        if (k3c_env_in_split(k3c_env_hash(q.buf, q.len, 14695981039346656037ull), e->split)) break;
    }
    snprintf(s->truth, sizeof s->truth, "%lld", (long long)ans);
    k3c_sbuf_printf(&e->system, "Solve the problem. Give the final answer on the last line as '#### N'.%s",
                    tool ? " Use the calculator tool for arithmetic." : "");
    k3c_sbuf_append(&e->user, q.buf, q.len);
    k3c_sbuf_free(&q);
    if (tool)
        k3c_env_tool(&e->tools, "calculator", "Evaluate an integer arithmetic expression with + - * / and parentheses",
                     "{\"expression\":{\"type\":\"string\"}}", "[\"expression\"]");
    return K3C_OK;
}

static int init_plain(k3c_env *e, k3c_err *err) { return init_common(e, 0, 0, err); }
static int init_tool(k3c_env *e, k3c_err *err) { return init_common(e, 1, 0, err); }
static int init_plain_small(k3c_env *e, k3c_err *err) { return init_common(e, 0, 1, err); }
static int init_tool_small(k3c_env *e, k3c_err *err) { return init_common(e, 1, 1, err); }
static int init_tool_one(k3c_env *e, k3c_err *err) { return init_common(e, 1, 2, err); }

/* ---------------------------------------------------------------- the calculator: recursive descent */

typedef struct {
    const char *p;
    int bad;
} calc;

static double expr(calc *c);
static void blanks(calc *c) {
    while (*c->p == ' ') c->p++;
}
static double atom(calc *c) {
    blanks(c);
    if (*c->p == '(') {
        c->p++;
        double v = expr(c);
        blanks(c);
        if (*c->p != ')')
            c->bad = 1;
        else
            c->p++;
        return v;
    }
    if (*c->p == '-') {
        c->p++;
        return -atom(c);
    }
    if (!isdigit((unsigned char)*c->p)) {
        c->bad = 1;
        return 0;
    }
    double v = 0;
    while (isdigit((unsigned char)*c->p)) v = v * 10 + (*c->p++ - '0');
    return v;
}
static double term(calc *c) {
    double v = atom(c);
    for (;;) {
        blanks(c);
        char op = *c->p;
        if (op != '*' && op != '/') return v;
        c->p++;
        double r = atom(c);
        if (op == '/' && r == 0) c->bad = 1;
        v = op == '*' ? v * r : r ? v / r : 0;
    }
}
static double expr(calc *c) {
    double v = term(c);
    for (;;) {
        blanks(c);
        char op = *c->p;
        if (op != '+' && op != '-') return v;
        c->p++;
        double r = term(c);
        v = op == '+' ? v + r : v - r;
    }
}

int k3c_calc_eval(const char *s, double *out) {
    calc c = {s, 0};
    double v = expr(&c);
    blanks(&c);
    if (c.bad || *c.p || !isfinite(v)) return K3C_EINVAL;
    *out = v;
    return K3C_OK;
}

static int step_tool(k3c_env *e, const char *tool, const k3c_json *args, k3c_sbuf *obs, k3c_err *err) {
    if (strcmp(tool, "calculator"))
        return k3c_errf(err, K3C_EINVAL, "unknown tool \"%s\" (available: calculator)", tool);
    const char *x = NULL;
    int rc = k3c_env_arg_str(args, "expression", 1, &x, err);
    if (rc) return rc;
    double v;
    if (k3c_calc_eval(x, &v)) return k3c_errf(err, K3C_EINVAL, "cannot evaluate \"%.100s\"", x);
    ((arith_state *)e->st)->used_calculator = 1;
    k3c_sbuf_printf(obs, "%.10g", v);
    return K3C_OK;
}

static void score(k3c_env *e, const char *final, k3c_reward *out) {
    arith_state *s = e->st;
    k3c_verify_answer(final, s->truth, out);
    if (e->tools.len) {
        k3c_reward_add(out, "calculator_used", s->used_calculator, 0);
        k3c_reward_add(out, "calls_ok", e->calls ? 1.0 - (double)e->bad_calls / e->calls : 1.0, 0);
    }
}

static void free_state(k3c_env *e) { free(e->st); }

/* The expert: the expression and its value (plain), or the expression handed to the calculator (tool). */
static int reference(k3c_env *e, k3c_sbuf *m, k3c_err *err) {
    arith_state *s = e->st;
    char ans[160];
    if (!e->tools.len) {
        snprintf(ans, sizeof ans, "%s = %s\n#### %s", s->expr, s->truth, s->truth);
        k3c_sbuf_printf(m, "%s", "[{\"role\":\"assistant\",\"content\":");
        k3c_sbuf_json_string(m, ans, strlen(ans));
        k3c_sbuf_printf(m, "%s", "}]");
        return K3C_OK;
    }
    k3c_sbuf args;
    k3c_sbuf_init(&args);
    k3c_sbuf_printf(&args, "%s", "{\"expression\":");
    k3c_sbuf_json_string(&args, s->expr, strlen(s->expr));
    k3c_sbuf_printf(&args, "%s", "}");
    k3c_sbuf_printf(m, "%s",
                    "[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\",\"function\":{"
                    "\"name\":\"calculator\",\"arguments\":");
    k3c_sbuf_json_string(m, args.buf, args.len);
    k3c_sbuf_printf(m, "}}]},{\"role\":\"tool\",\"content\":\"%s\"},{\"role\":\"assistant\",\"content\":\"#### %s\"}]",
                    s->truth, s->truth);
    k3c_sbuf_free(&args);
    return K3C_OK;
}

const k3c_env_kind k3c_env_arith = {"arith", init_plain, NULL, score, free_state, reference};
const k3c_env_kind k3c_env_arith_tool = {"arith_tool", init_tool, step_tool, score, free_state, reference};
const k3c_env_kind k3c_env_arith_small = {"arith_small", init_plain_small, NULL, score, free_state, reference};
const k3c_env_kind k3c_env_arith_tool_small = {"arith_tool_small", init_tool_small, step_tool, score,
                                               free_state,         reference};
const k3c_env_kind k3c_env_arith_tool_one = {"arith_tool_one", init_tool_one, step_tool, score, free_state, reference};
