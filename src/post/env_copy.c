/* env_copy.c — `copy`: repeat the one number of a short sentence as "#### N", scored by the exact-answer verifier: the
 * reading skill the demo's tiny model lacks, taught before its tool task (docs/POST.md "Demo", "Environments"). */
#include "post/env.h"

#include <stdlib.h>

typedef struct {
    char truth[16];
} copy_state;

static int init_copy(k3c_env *e, k3c_err *err) {
    static const char *const VERBS[] = {"sees", "has", "buys", "counts", "paints", "finds"};
    static const char *const THINGS[] = {"spiders", "weeks", "apples", "bicycles", "dogs", "books", "ants", "cups"};
    copy_state *s = calloc(1, sizeof *s);
    if (!s) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    e->st = s;
    int64_t n;
    do {
        e->user.len = 0;
        n = k3c_env_randint(e, 2, 99);
        if (k3c_env_randint(e, 0, 1)) k3c_sbuf_printf(&e->user, "%s", "Here is a sentence. ");
        k3c_sbuf_printf(&e->user, "%s %s %lld %s.", k3c_env_names[k3c_env_randint(e, 0, 7)],
                        VERBS[k3c_env_randint(e, 0, 5)], (long long)n, THINGS[k3c_env_randint(e, 0, 7)]);
    } while (e->user.ok &&
             !k3c_env_in_split(k3c_env_hash(e->user.buf, e->user.len, 14695981039346656037ull), e->split));
    snprintf(s->truth, sizeof s->truth, "%lld", (long long)n);
    k3c_sbuf_printf(&e->system, "%s", "Repeat the number in the sentence. Give it on the last line as '#### N'.");
    return K3C_OK;
}

static void score(k3c_env *e, const char *final, k3c_reward *out) {
    k3c_verify_answer(final, ((copy_state *)e->st)->truth, out);
}

static void free_state(k3c_env *e) { free(e->st); }

static int reference(k3c_env *e, k3c_sbuf *m, k3c_err *err) {
    k3c_sbuf_printf(m, "[{\"role\":\"assistant\",\"content\":\"#### %s\"}]", ((copy_state *)e->st)->truth);
    return K3C_OK;
}

const k3c_env_kind k3c_env_copy = {"copy", init_copy, NULL, score, free_state, reference};
