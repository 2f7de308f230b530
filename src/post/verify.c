/* verify.c — verifiers as pure functions of (response, ground truth) returning a reward and its components: exact
 * answer (normalised numbers and strings), format validity (XTML parses, tool arguments match the tool's schema) and
 * code run against unit tests in the sandbox. TRAINING.md §5.2. */
#include "post/post.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void k3c_reward_add(k3c_reward *r, const char *name, double value, double weight) {
    if (r->n >= K3C_REWARD_MAX_COMPONENTS) return;
    k3c_reward_component *c = &r->c[r->n++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->value = value;
    c->weight = weight;
    double num = 0, den = 0;
    for (int i = 0; i < r->n; i++) {
        num += r->c[i].weight * r->c[i].value;
        den += r->c[i].weight;
    }
    r->reward = den > 0 ? num / den : 0;
}

/* ---------------------------------------------------------------- exact answer */

/* A number: optional sign, digits with optional thousands commas, optional fraction; "a/b" as a ratio. */
static int parse_number(const char *s, size_t n, double *out) {
    char buf[128];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < sizeof buf; i++)
        if (s[i] != ',' && s[i] != '$' && s[i] != ' ') buf[k++] = s[i];
    while (k && (buf[k - 1] == '.' || buf[k - 1] == '%')) k--;
    buf[k] = 0;
    if (!k) return 0;
    char *end;
    double a = strtod(buf, &end);
    if (end == buf) return 0;
    if (*end == '/') {
        char *e2;
        double b = strtod(end + 1, &e2);
        if (e2 == end + 1 || *e2 || b == 0) return 0;
        a /= b;
        end = e2;
    }
    if (*end || !isfinite(a)) return 0;
    *out = a;
    return 1;
}

/* Lower case, surrounding blanks and final punctuation removed, inner whitespace runs collapsed to one space. */
static size_t normalise(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    int space = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (isspace(c)) {
            space = k > 0;
            continue;
        }
        if (space && k + 2 < cap) out[k++] = ' ';
        space = 0;
        out[k++] = (char)tolower(c);
    }
    while (k && strchr(".!?;:", out[k - 1])) k--;
    out[k] = 0;
    return k;
}

/* The final answer: the text after the last "####" (GSM8K / verl convention), else after the last "answer:", else the
 * whole response; its first line. */
static void extract(const char *r, const char **a, size_t *n) {
    const char *at = NULL;
    for (const char *p = strstr(r, "####"); p; p = strstr(p + 1, "####")) at = p + 4;
    if (!at) {
        for (const char *p = r; *p; p++)
            if (!strncasecmp(p, "answer:", 7)) at = p + 7;
    }
    if (!at) at = r;
    while (*at == ' ' || *at == '\t' || *at == '\n') at++;
    const char *e = strchr(at, '\n');
    *a = at;
    *n = e ? (size_t)(e - at) : strlen(at);
}

void k3c_verify_answer(const char *response, const char *truth, k3c_reward *out) {
    *out = (k3c_reward){0};
    const char *a;
    size_t n;
    extract(response ? response : "", &a, &n);
    double x, y;
    int ok;
    if (parse_number(truth, strlen(truth), &y)) {
        ok = parse_number(a, n, &x) && fabs(x - y) <= 1e-9 * fmax(1.0, fabs(y));
        snprintf(out->info, sizeof out->info, "answer \"%.*s\" vs %s", (int)(n < 80 ? n : 80), a, truth);
    } else {
        char na[512], nt[512];
        normalise(a, n, na, sizeof na);
        normalise(truth, strlen(truth), nt, sizeof nt);
        ok = !strcmp(na, nt);
        snprintf(out->info, sizeof out->info, "answer \"%.80s\" vs \"%.80s\"", na, nt);
    }
    k3c_reward_add(out, "answer", ok, 1);
}

/* ---------------------------------------------------------------- format validity */

static const k3c_json *tool_schema(const k3c_json *tools, const char *name, int *found) {
    *found = 0;
    for (size_t i = 0; tools && tools->type == K3C_JSON_ARRAY && i < tools->n; i++) {
        const k3c_json *t = &tools->items[i], *fn = k3c_json_get(t, "function");
        if (!fn) fn = t;
        const k3c_json *nm = k3c_json_get(fn, "name");
        if (nm && nm->type == K3C_JSON_STRING && !strcmp(nm->string, name)) {
            *found = 1;
            return k3c_json_get(fn, "parameters");
        }
    }
    return NULL;
}

int k3c_verify_format_parsed(const k3c_chat_result *res, const k3c_json *tools, k3c_reward *out) {
    int good = 0;
    out->info[0] = 0;
    for (size_t i = 0; i < res->ncalls; i++) {
        const k3c_chat_tool_call *c = &res->calls[i];
        k3c_err e = {0};
        k3c_json *args = NULL;
        int found, ok = 0;
        const k3c_json *schema = tool_schema(tools, c->name, &found);
        if (!found)
            k3c_errf(&e, K3C_EINVAL, "call %zu: unknown tool \"%s\"", i + 1, c->name);
        else if (k3c_json_parse(c->arguments, strlen(c->arguments), "arguments", &args, &e) == K3C_OK) {
            if (args->type != K3C_JSON_OBJECT)
                k3c_errf(&e, K3C_EINVAL, "call %zu (%s): arguments are not an object", i + 1, c->name);
            else if (k3c_json_schema_check(schema, args, &e) == K3C_OK)
                ok = 1;
            else
                k3c_err_wrap(&e, "call %zu (%s): ", i + 1, c->name);
        }
        k3c_json_free(args);
        good += ok;
        if (!ok && !out->info[0]) snprintf(out->info, sizeof out->info, "%.255s", e.msg);
    }
    k3c_reward_add(out, "xtml", res->finished, 1);
    k3c_reward_add(out, "tool_args", res->ncalls ? (double)good / res->ncalls : 1.0, 1);
    if (!res->finished && !out->info[0]) snprintf(out->info, sizeof out->info, "the message was not closed");
    return res->finished && good == (int)res->ncalls;
}

int k3c_verify_format(const char *output, size_t n, const char *tools_json, int in_think, k3c_reward *out,
                      k3c_err *err) {
    *out = (k3c_reward){0};
    k3c_json *tools = NULL;
    if (tools_json && k3c_json_parse(tools_json, strlen(tools_json), "tools", &tools, err)) return err->code;
    k3c_chat_parse_opts po = {K3C_CHAT_XTML, in_think, !in_think, 1}; /* strict: malformed output scores 0 */
    k3c_chat_result res;
    k3c_err e = {0};
    if (k3c_chat_parse(&po, output, n, &res, &e)) {
        k3c_reward_add(out, "xtml", 0, 1);
        k3c_reward_add(out, "tool_args", 0, 1);
        snprintf(out->info, sizeof out->info, "%.255s", e.msg);
    } else {
        k3c_verify_format_parsed(&res, tools, out);
        k3c_chat_result_free(&res);
    }
    k3c_json_free(tools);
    return K3C_OK;
}

/* ---------------------------------------------------------------- code against unit tests */

/* The harness reads a nonce from stdin before the solution is imported, so the solution's own prints cannot pose as
 * results (a solution that inspects the interpreter could still find it: the sandbox bounds the damage, not the
 * cheating). Each case is (expression, expected repr). */
static const char *HARNESS = "import sys, json\n"
                             "nonce = sys.stdin.readline().strip()\n"
                             "out = sys.stdout\n"
                             "cases = json.load(open('cases.json'))\n"
                             "try:\n"
                             "    ns = {}\n"
                             "    exec(compile(open('solution.py').read(), 'solution.py', 'exec'), ns)\n"
                             "    out.write('K3C %s LOADED\\n' % nonce)\n"
                             "except BaseException as e:\n"
                             "    out.write('K3C %s NOLOAD %s\\n' % (nonce, type(e).__name__))\n"
                             "    sys.exit(0)\n"
                             "for i, (expr, want) in enumerate(cases):\n"
                             "    try:\n"
                             "        got = repr(eval(expr, ns))\n"
                             "    except BaseException as e:\n"
                             "        got = 'raised ' + type(e).__name__\n"
                             "    out.write('K3C %s %d %s\\n' % (nonce, i, 'PASS' if got == want else 'FAIL'))\n"
                             "    out.flush()\n";

int k3c_verify_code(const char *solution, const char *cases_json, const k3c_sandbox_limits *l, uint64_t nonce_seed,
                    k3c_reward *out, k3c_err *err) {
    *out = (k3c_reward){0};
    k3c_json *cases = NULL;
    int rc = k3c_json_parse(cases_json, strlen(cases_json), "cases", &cases, err);
    if (rc) return rc;
    size_t ncases = cases->type == K3C_JSON_ARRAY ? cases->n : 0;
    for (size_t i = 0; i < ncases; i++) {
        const k3c_json *c = &cases->items[i];
        if (c->type != K3C_JSON_ARRAY || c->n != 2 || c->items[0].type != K3C_JSON_STRING ||
            c->items[1].type != K3C_JSON_STRING)
            ncases = 0;
    }
    k3c_json_free(cases);
    if (!ncases)
        return k3c_errf(err, K3C_EINVAL, "cases: expected a non-empty array of [expression, expected repr] strings");
    char nonce[40];
    snprintf(nonce, sizeof nonce, "%016llx%08x", (unsigned long long)(nonce_seed * 0x9E3779B97F4A7C15ull + 1),
             (unsigned)(k3c_uniform_at(nonce_seed, 7) * 4294967295.0));
    k3c_sandbox_file files[] = {{"harness.py", HARNESS}, {"solution.py", solution}, {"cases.json", cases_json}};
    const char *argv[] = {"/usr/bin/python3", "-I", "harness.py", NULL};
    char in[64];
    snprintf(in, sizeof in, "%s\n", nonce);
    k3c_sandbox_result r;
    if ((rc = k3c_sandbox_run(l, argv, files, 3, in, &r, err))) return rc;
    char tag[64];
    int tl = snprintf(tag, sizeof tag, "K3C %s ", nonce);
    size_t pass = 0;
    int loaded = 0;
    unsigned char *seen = calloc(ncases, 1);
    for (const char *p = r.out; seen && (p = strstr(p, tag)); p += tl) {
        const char *v = p + tl;
        if (!strncmp(v, "LOADED", 6)) loaded = 1;
        char *e;
        long i = strtol(v, &e, 10);
        if (e != v && i >= 0 && (size_t)i < ncases && !strncmp(e, " PASS", 5) && !seen[i]++) pass++;
    }
    free(seen);
    k3c_reward_add(out, "loads", loaded, 0);
    k3c_reward_add(out, "tests", (double)pass / ncases, 1);
    snprintf(out->info, sizeof out->info, "%zu/%zu tests%s%s", pass, ncases, r.timed_out ? ", timed out" : "",
             loaded ? "" : ", solution did not load");
    k3c_sandbox_result_free(&r);
    return K3C_OK;
}
