/* env_code.c — small programming tasks (Python string / list functions) with a parameter in the specification,
 * hidden unit tests computed by a C reference, checked in the sandbox. docs/POST.md "Environments". */
#include "post/env.h"

#include <stdlib.h>
#include <string.h>

enum { N_TEMPLATES = 10, N_CASES = 5, MAX_XS = 8 };

typedef struct {
    int t;
    char name[32];
    int64_t k;
    char ch;
    char cases[4096]; /* [[expr, repr], ...] */
    char solution[512];
} code_state;

static const char *NAMES[N_TEMPLATES][3] = {
    {"reverse_string", "flip", "backwards"},      {"count_letter", "letter_count", "occurrences"},
    {"add_to_all", "shift_all", "plus_each"},     {"keep_greater", "above", "filter_big"},
    {"sum_evens", "even_total", "add_evens"},     {"capitalize_words", "title_words", "cap_each"},
    {"dedupe", "unique_in_order", "no_repeats"},  {"is_palindrome", "reads_same", "mirror_check"},
    {"running_sum", "prefix_sums", "cumulative"}, {"stretch", "repeat_chars", "echo_chars"}};

static void spec(const code_state *s, k3c_sbuf *b) {
    const char *n = s->name;
    switch (s->t) {
    case 0: k3c_sbuf_printf(b, "%s(s): return the string s reversed.", n); break;
    case 1: k3c_sbuf_printf(b, "%s(s): return how many times the letter '%c' occurs in s.", n, s->ch); break;
    case 2:
        k3c_sbuf_printf(b, "%s(xs): return a new list with %lld added to every element of xs.", n, (long long)s->k);
        break;
    case 3:
        k3c_sbuf_printf(b, "%s(xs): return the elements of xs greater than %lld, in order.", n, (long long)s->k);
        break;
    case 4: k3c_sbuf_printf(b, "%s(xs): return the sum of the even numbers in xs.", n); break;
    case 5:
        k3c_sbuf_printf(b, "%s(s): return s with the first letter of every space-separated word upper-cased.", n);
        break;
    case 6:
        k3c_sbuf_printf(b, "%s(xs): return xs without repeated values, keeping first occurrences in order.", n);
        break;
    case 7: k3c_sbuf_printf(b, "%s(s): return True if s reads the same backwards, else False.", n); break;
    case 8: k3c_sbuf_printf(b, "%s(xs): return the list of running sums of xs.", n); break;
    default: k3c_sbuf_printf(b, "%s(s): return s with every character repeated %lld times.", n, (long long)s->k); break;
    }
}

static void solution(code_state *s) {
    const char *n = s->name;
    char *o = s->solution;
    size_t m = sizeof s->solution;
    switch (s->t) {
    case 0: snprintf(o, m, "def %s(s):\n    return s[::-1]\n", n); break;
    case 1: snprintf(o, m, "def %s(s):\n    return s.count('%c')\n", n, s->ch); break;
    case 2: snprintf(o, m, "def %s(xs):\n    return [x + %lld for x in xs]\n", n, (long long)s->k); break;
    case 3: snprintf(o, m, "def %s(xs):\n    return [x for x in xs if x > %lld]\n", n, (long long)s->k); break;
    case 4: snprintf(o, m, "def %s(xs):\n    return sum(x for x in xs if x %% 2 == 0)\n", n); break;
    case 5: snprintf(o, m, "def %s(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n", n); break;
    case 6:
        snprintf(o, m,
                 "def %s(xs):\n    out = []\n    for x in xs:\n        if x not in out:\n            out.append(x)\n"
                 "    return out\n",
                 n);
        break;
    case 7: snprintf(o, m, "def %s(s):\n    return s == s[::-1]\n", n); break;
    case 8:
        snprintf(o, m,
                 "def %s(xs):\n    out, t = [], 0\n    for x in xs:\n        t += x\n        out.append(t)\n"
                 "    return out\n",
                 n);
        break;
    default: snprintf(o, m, "def %s(s):\n    return ''.join(c * %lld for c in s)\n", n, (long long)s->k); break;
    }
}

/* ---------------------------------------------------------------- inputs and expected values (Python reprs) */

static void rand_str(k3c_env *e, char *s, int palin) {
    int n = (int)k3c_env_randint(e, 0, 9);
    const char *alpha = "abcdeio xyz";
    for (int i = 0; i < n; i++) s[i] = alpha[k3c_env_randint(e, 0, 10)];
    s[n] = 0;
    if (palin && n)
        for (int i = 0; i < n / 2; i++) s[n - 1 - i] = s[i];
    for (int i = 0; i < n; i++) /* no leading / doubled spaces: the capitalisation spec is about single spaces */
        if (s[i] == ' ' && (i == 0 || i == n - 1 || s[i - 1] == ' ')) s[i] = 'o';
}

static void list_repr(k3c_sbuf *b, const int64_t *x, int n) {
    k3c_sbuf_printf(b, "%s", "[");
    for (int i = 0; i < n; i++) k3c_sbuf_printf(b, "%s%lld", i ? ", " : "", (long long)x[i]);
    k3c_sbuf_printf(b, "%s", "]");
}

/* Python's repr of a str of [a-z ] characters. */
static void str_repr(k3c_sbuf *b, const char *s) { k3c_sbuf_printf(b, "'%s'", s); }

static void one_case(k3c_env *e, code_state *st, k3c_sbuf *c) {
    char s[16], r[160];
    int64_t xs[MAX_XS], ys[MAX_XS];
    int n = (int)k3c_env_randint(e, 0, MAX_XS), ny = 0;
    for (int i = 0; i < n; i++) xs[i] = k3c_env_randint(e, -9, 20);
    int is_str = st->t == 0 || st->t == 1 || st->t == 5 || st->t == 7 || st->t == 9;
    rand_str(e, s, st->t == 7 && k3c_env_randint(e, 0, 1));
    k3c_sbuf ex, want;
    k3c_sbuf_init(&ex);
    k3c_sbuf_init(&want);
    k3c_sbuf_printf(&ex, "%s(", st->name);
    if (is_str)
        str_repr(&ex, s);
    else
        list_repr(&ex, xs, n);
    k3c_sbuf_printf(&ex, "%s", ")");
    int64_t acc = 0;
    size_t L = strlen(s);
    switch (st->t) {
    case 0:
        for (size_t i = 0; i < L; i++) r[i] = s[L - 1 - i];
        r[L] = 0;
        str_repr(&want, r);
        break;
    case 1:
        for (size_t i = 0; i < L; i++) acc += s[i] == st->ch;
        k3c_sbuf_printf(&want, "%lld", (long long)acc);
        break;
    case 2:
        for (int i = 0; i < n; i++) ys[ny++] = xs[i] + st->k;
        list_repr(&want, ys, ny);
        break;
    case 3:
        for (int i = 0; i < n; i++)
            if (xs[i] > st->k) ys[ny++] = xs[i];
        list_repr(&want, ys, ny);
        break;
    case 4:
        for (int i = 0; i < n; i++) acc += xs[i] % 2 == 0 ? xs[i] : 0;
        k3c_sbuf_printf(&want, "%lld", (long long)acc);
        break;
    case 5:
        for (size_t i = 0; i <= L; i++)
            r[i] = (i == 0 || s[i - 1] == ' ') && s[i] >= 'a' && s[i] <= 'z' ? s[i] - 32 : s[i];
        str_repr(&want, r);
        break;
    case 6:
        for (int i = 0; i < n; i++) {
            int dup = 0;
            for (int j = 0; j < ny; j++) dup |= ys[j] == xs[i];
            if (!dup) ys[ny++] = xs[i];
        }
        list_repr(&want, ys, ny);
        break;
    case 7: {
        int p = 1;
        for (size_t i = 0; i < L; i++) p &= s[i] == s[L - 1 - i];
        k3c_sbuf_append(&want, p ? "True" : "False", p ? 4 : 5);
        break;
    }
    case 8:
        for (int i = 0; i < n; i++) ys[ny++] = acc += xs[i];
        list_repr(&want, ys, ny);
        break;
    default: {
        size_t k = 0;
        for (size_t i = 0; i < L; i++)
            for (int64_t j = 0; j < st->k; j++) r[k++] = s[i];
        r[k] = 0;
        str_repr(&want, r);
        break;
    }
    }
    k3c_sbuf_append(c, c->len > 1 ? ",[" : "[", c->len > 1 ? 2 : 1);
    k3c_sbuf_json_string(c, ex.buf, ex.len);
    k3c_sbuf_printf(c, "%s", ",");
    k3c_sbuf_json_string(c, want.buf, want.len);
    k3c_sbuf_printf(c, "%s", "]");
    k3c_sbuf_free(&ex);
    k3c_sbuf_free(&want);
}

static int init(k3c_env *e, k3c_err *err) {
    code_state *st = calloc(1, sizeof *st);
    if (!st) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    e->st = st;
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    do {
        st->t = (int)k3c_env_randint(e, 0, N_TEMPLATES - 1);
        snprintf(st->name, sizeof st->name, "%s", NAMES[st->t][k3c_env_randint(e, 0, 2)]);
        st->k = k3c_env_randint(e, st->t == 9 ? 2 : 1, st->t == 9 ? 3 : 9);
        st->ch = "aeioxyz"[k3c_env_randint(e, 0, 6)];
        b.len = 0;
        spec(st, &b);
    } while (!k3c_env_in_split(k3c_env_hash(b.buf, b.len, 14695981039346656037ull), e->split));
    k3c_sbuf_printf(&e->system, "%s", "Write the Python function asked for. Reply with the code only.");
    k3c_sbuf_printf(&e->user, "%s", "Write a Python function ");
    k3c_sbuf_append(&e->user, b.buf, b.len);
    k3c_sbuf_free(&b);
    k3c_sbuf c;
    k3c_sbuf_init(&c);
    k3c_sbuf_printf(&c, "%s", "[");
    for (int i = 0; i < N_CASES; i++) one_case(e, st, &c);
    k3c_sbuf_printf(&c, "%s", "]");
    int rc = c.ok && c.len < sizeof st->cases ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "code task: cases too long");
    if (!rc) memcpy(st->cases, c.buf, c.len + 1);
    k3c_sbuf_free(&c);
    solution(st);
    return rc;
}

/* The code of a reply: inside the first ``` fence (a language tag line skipped) when there is one, else all of it. */
static char *extract_code(const char *s) {
    const char *a = strstr(s, "```");
    if (!a) return strdup(s);
    a += 3;
    const char *nl = strchr(a, '\n');
    a = nl ? nl + 1 : a;
    const char *b = strstr(a, "```");
    size_t n = b ? (size_t)(b - a) : strlen(a);
    char *o = malloc(n + 1);
    if (o) {
        memcpy(o, a, n);
        o[n] = 0;
    }
    return o;
}

static void score(k3c_env *e, const char *final, k3c_reward *out) {
    code_state *st = e->st;
    k3c_sandbox_limits l = {.cpu_s = 2, .wall_s = 5, .mem_bytes = 512 << 20, .fsize_bytes = 1 << 20, .nproc = 8};
    char *code = extract_code(final);
    k3c_err err = {0};
    if (!code || k3c_verify_code(code, st->cases, &l, e->seed ^ (uint64_t)e->index, out, &err)) {
        *out = (k3c_reward){0};
        k3c_reward_add(out, "tests", 0, 1);
        snprintf(out->info, sizeof out->info, "not run: %.200s", code ? err.msg : "out of memory");
    }
    free(code);
}

static int reference(k3c_env *e, k3c_sbuf *m, k3c_err *err) {
    code_state *st = e->st;
    k3c_sbuf_printf(m, "%s", "[{\"role\":\"assistant\",\"content\":");
    k3c_sbuf_json_string(m, st->solution, strlen(st->solution));
    k3c_sbuf_printf(m, "%s", "}]");
    return K3C_OK;
}

static void free_state(k3c_env *e) { free(e->st); }

const k3c_env_kind k3c_env_code = {"code", init, NULL, score, free_state, reference};
