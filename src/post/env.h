/* env.h — internal to the library: the environment struct behind k3c.h's k3c_env (one table of functions per kind,
 * deterministic task generation from (seed, split, index)) and helpers the kinds share. Spec: docs/POST.md. */
#ifndef K3C_POST_ENV_H
#define K3C_POST_ENV_H

#include "post/post.h"

typedef struct k3c_env_kind {
    const char *name;
    /* Generates the task from e->rng (drawing until in_split accepts its key) and fills system, user, tools. */
    int (*init)(k3c_env *e, k3c_err *err);
    /* One tool call: the observation text into obs; sets e->done when the episode is over. K3C_EINVAL (with a message
     * the model sees as the observation) for an unknown tool or bad arguments. */
    int (*step)(k3c_env *e, const char *tool, const k3c_json *args, k3c_sbuf *obs, k3c_err *err);
    void (*score)(k3c_env *e, const char *final, k3c_reward *out);
    void (*free)(k3c_env *e);
    /* An expert solution as an OpenAI-style conversation (the assistant turns, tool calls and tool results after the
     * prompt), for SFT data; NULL when the kind has none. */
    int (*reference)(k3c_env *e, k3c_sbuf *messages_json, k3c_err *err);
} k3c_env_kind;

struct k3c_env {
    const k3c_env_kind *kind;
    uint64_t seed;
    int split; /* 0 train, 1 held-out */
    int64_t index;
    k3c_rng rng;
    k3c_sbuf system, user, tools; /* tools: the OpenAI tools JSON array, or empty */
    int done, calls, bad_calls;
    void *st; /* the kind's state */
};

/* Whether a task whose canonical key hashes to `key` belongs to `split`: one in five keys is held out, so the two
 * splits never share a task. */
int k3c_env_in_split(uint64_t key, int split);
uint64_t k3c_env_hash(const char *s, size_t n, uint64_t h);
int64_t k3c_env_randint(k3c_env *e, int64_t lo, int64_t hi); /* uniform in [lo, hi] */

/* Typed tool arguments; errors "ARG: missing" / "ARG: expected an integer". */
int k3c_env_arg_int(const k3c_json *args, const char *key, int required, int64_t *out, k3c_err *err);
int k3c_env_arg_str(const k3c_json *args, const char *key, int required, const char **out, k3c_err *err);
/* Appends one OpenAI function tool; props is the JSON text of "properties", required a JSON array text. */
void k3c_env_tool(k3c_sbuf *tools, const char *name, const char *desc, const char *props, const char *required);

/* The calculator tool: + - * / and parentheses over integers (double result); K3C_EINVAL when malformed. */
int k3c_calc_eval(const char *s, double *out);

extern const k3c_env_kind k3c_env_arith, k3c_env_arith_tool, k3c_env_arith_small, k3c_env_arith_tool_small,
    k3c_env_arith_tool_one, k3c_env_copy, k3c_env_code, k3c_env_assistant, k3c_env_vfs;
/* First names the arith_tool_one and copy tasks draw from. */
extern const char *const k3c_env_names[8];

#endif
