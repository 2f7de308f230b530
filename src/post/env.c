/* env.c — environments: the public k3c_env API (create by kind, seed, split and index; prompt; tool steps; score) over
 * the per-kind tables, deterministic task draws and the train / held-out partition. docs/POST.md "Environments". */
#include "post/env.h"

#include <stdlib.h>
#include <string.h>

static const k3c_env_kind *const KINDS[] = {&k3c_env_arith,
                                            &k3c_env_arith_tool,
                                            &k3c_env_arith_small,
                                            &k3c_env_arith_tool_small,
                                            &k3c_env_arith_tool_one,
                                            &k3c_env_copy,
                                            &k3c_env_code,
                                            &k3c_env_assistant,
                                            &k3c_env_vfs};

uint64_t k3c_env_hash(const char *s, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull; /* FNV-1a */
    return h;
}

int k3c_env_in_split(uint64_t key, int split) {
    key ^= key >> 29;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 32;
    return (key % 5 == 0) == (split == 1);
}

int64_t k3c_env_randint(k3c_env *e, int64_t lo, int64_t hi) {
    return lo + (int64_t)(k3c_rng_u64(&e->rng) % (uint64_t)(hi - lo + 1));
}

int k3c_env_arg_int(const k3c_json *args, const char *key, int required, int64_t *out, k3c_err *err) {
    const k3c_json *v = k3c_json_get(args, key);
    if (!v) return required ? k3c_errf(err, K3C_EINVAL, "%s: missing", key) : K3C_OK;
    if (v->type != K3C_JSON_NUMBER || !v->is_integer)
        return k3c_errf(err, K3C_EINVAL, "%s: expected an integer, got %s", key, k3c_json_type_name(v));
    *out = v->integer;
    return K3C_OK;
}

int k3c_env_arg_str(const k3c_json *args, const char *key, int required, const char **out, k3c_err *err) {
    const k3c_json *v = k3c_json_get(args, key);
    if (!v) return required ? k3c_errf(err, K3C_EINVAL, "%s: missing", key) : K3C_OK;
    if (v->type != K3C_JSON_STRING)
        return k3c_errf(err, K3C_EINVAL, "%s: expected a string, got %s", key, k3c_json_type_name(v));
    *out = v->string;
    return K3C_OK;
}

void k3c_env_tool(k3c_sbuf *tools, const char *name, const char *desc, const char *props, const char *required) {
    k3c_sbuf_append(tools, tools->len ? "," : "[", 1);
    k3c_sbuf_printf(tools,
                    "{\"type\":\"function\",\"function\":{\"name\":\"%s\",\"description\":\"%s\",\"parameters\":{"
                    "\"type\":\"object\",\"properties\":%s,\"required\":%s,\"additionalProperties\":false}}}",
                    name, desc, props, required);
}

int k3c_env_new(const char *kind, uint64_t seed, int split, int64_t index, k3c_env **out, k3c_err *err) {
    *out = NULL;
    const k3c_env_kind *k = NULL;
    for (size_t i = 0; i < sizeof KINDS / sizeof *KINDS; i++)
        if (!strcmp(KINDS[i]->name, kind)) k = KINDS[i];
    if (!k)
        return k3c_errf(err, K3C_EINVAL,
                        "environment \"%s\": unknown (expected arith, arith_tool, arith_small, arith_tool_small, "
                        "arith_tool_one, copy, code, assistant or vfs)",
                        kind);
    if (split != 0 && split != 1) return k3c_errf(err, K3C_EINVAL, "environment split: 0 (train) or 1 (held-out)");
    k3c_env *e = calloc(1, sizeof *e);
    if (!e) return k3c_errf(err, K3C_ENOMEM, "out of memory");
    e->kind = k;
    e->seed = seed;
    e->split = split;
    e->index = index;
    /* One counter-based stream per (seed, split, index): a task never depends on which others were drawn. */
    e->rng.seed = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)index * 0xD1B54A32D192ED03ull ^ (uint64_t)split << 61;
    k3c_sbuf_init(&e->system);
    k3c_sbuf_init(&e->user);
    k3c_sbuf_init(&e->tools);
    int rc = k->init(e, err);
    if (!rc && (!e->system.ok || !e->user.ok || !e->tools.ok)) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (rc) {
        k3c_env_free(e);
        return rc;
    }
    if (e->tools.len) k3c_sbuf_printf(&e->tools, "%s", "]");
    *out = e;
    return K3C_OK;
}

void k3c_env_free(k3c_env *e) {
    if (!e) return;
    if (e->kind->free) e->kind->free(e);
    k3c_sbuf_free(&e->system);
    k3c_sbuf_free(&e->user);
    k3c_sbuf_free(&e->tools);
    free(e);
}

const char *k3c_env_system(const k3c_env *e) { return e->system.buf ? e->system.buf : ""; }
const char *k3c_env_user(const k3c_env *e) { return e->user.buf ? e->user.buf : ""; }
const char *k3c_env_tools(const k3c_env *e) { return e->tools.len ? e->tools.buf : NULL; }
int k3c_env_done(const k3c_env *e) { return e->done; }

char *k3c_env_messages(const k3c_env *e) {
    k3c_sbuf b;
    k3c_sbuf_init(&b);
    k3c_sbuf_printf(&b, "%s", "[{\"role\":\"system\",\"content\":");
    k3c_sbuf_json_string(&b, k3c_env_system(e), e->system.len);
    k3c_sbuf_printf(&b, "%s", "},{\"role\":\"user\",\"content\":");
    k3c_sbuf_json_string(&b, k3c_env_user(e), e->user.len);
    k3c_sbuf_printf(&b, "%s", "}]");
    if (!b.ok) {
        k3c_sbuf_free(&b);
        return NULL;
    }
    return b.buf;
}

int k3c_env_step(k3c_env *e, const char *tool, const char *args_json, char **obs, k3c_err *err) {
    *obs = NULL;
    k3c_sbuf o;
    k3c_sbuf_init(&o);
    k3c_json *args = NULL;
    k3c_err e2 = {0};
    e->calls++;
    int rc = e->done ? k3c_errf(&e2, K3C_EINVAL, "the episode is over") : K3C_OK;
    if (!rc)
        rc = k3c_json_parse(args_json ? args_json : "{}", args_json ? strlen(args_json) : 2, "arguments", &args, &e2);
    if (!rc && args->type != K3C_JSON_OBJECT) rc = k3c_errf(&e2, K3C_EINVAL, "arguments: expected an object");
    if (!rc && !e->kind->step) rc = k3c_errf(&e2, K3C_EINVAL, "this task has no tools");
    if (!rc) rc = e->kind->step(e, tool, args, &o, &e2);
    k3c_json_free(args);
    /* A model's mistake is an observation it can read and recover from, not a failure of the rollout. */
    if (rc) {
        e->bad_calls++;
        o.len = 0;
        k3c_sbuf_printf(&o, "error: %s", e2.msg);
    }
    if (!o.ok) {
        k3c_sbuf_free(&o);
        return k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    k3c_sbuf_printf(&o, "%s", "");
    *obs = o.buf;
    return K3C_OK;
}

void k3c_env_score(k3c_env *e, const char *final, k3c_reward *out) {
    *out = (k3c_reward){0};
    e->kind->score(e, final ? final : "", out);
}

int k3c_env_reference(k3c_env *e, char **conversation, k3c_err *err) {
    *conversation = NULL;
    if (!e->kind->reference)
        return k3c_errf(err, K3C_EUNSUPPORTED, "environment %s: no reference solution", e->kind->name);
    k3c_sbuf turns;
    k3c_sbuf_init(&turns);
    int rc = e->kind->reference(e, &turns, err);
    char *head = rc ? NULL : k3c_env_messages(e);
    if (!rc && (!head || !turns.ok || turns.len < 2)) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) {
        /* The prompt's two messages, then the expert's turns: splice the arrays. */
        k3c_sbuf all;
        k3c_sbuf_init(&all);
        k3c_sbuf_printf(&all, "%s", "{\"messages\":");
        k3c_sbuf_append(&all, head, strlen(head) - 1);
        k3c_sbuf_printf(&all, "%s", ",");
        k3c_sbuf_append(&all, turns.buf + 1, turns.len - 1);
        if (e->tools.len) {
            k3c_sbuf_printf(&all, "%s", ",\"tools\":");
            k3c_sbuf_append(&all, e->tools.buf, e->tools.len);
        }
        k3c_sbuf_printf(&all, "%s", "}");
        if (all.ok)
            *conversation = all.buf;
        else
            rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    }
    free(head);
    k3c_sbuf_free(&turns);
    return rc;
}
