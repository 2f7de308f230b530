/* schema.c — the JSON-schema subset tool-call arguments are checked against (type, required, properties,
 * additionalProperties: false, enum, items); a format-validity verifier component (TRAINING.md §5.2). */
#include "post/post.h"

#include <math.h>
#include <string.h>

static int json_equal(const k3c_json *a, const k3c_json *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case K3C_JSON_NULL: return 1;
    case K3C_JSON_BOOL: return a->boolean == b->boolean;
    case K3C_JSON_NUMBER: return a->number == b->number;
    case K3C_JSON_STRING: return a->len == b->len && !memcmp(a->string, b->string, a->len);
    case K3C_JSON_ARRAY:
        if (a->n != b->n) return 0;
        for (size_t i = 0; i < a->n; i++)
            if (!json_equal(&a->items[i], &b->items[i])) return 0;
        return 1;
    case K3C_JSON_OBJECT:
        if (a->n != b->n) return 0;
        for (size_t i = 0; i < a->n; i++) {
            const k3c_json *o = k3c_json_get(b, a->keys[i]);
            if (!o || !json_equal(&a->items[i], o)) return 0;
        }
        return 1;
    }
    return 0;
}

static int type_matches(const char *t, const k3c_json *v) {
    if (!strcmp(t, "string")) return v->type == K3C_JSON_STRING;
    if (!strcmp(t, "number")) return v->type == K3C_JSON_NUMBER;
    if (!strcmp(t, "integer")) return v->type == K3C_JSON_NUMBER && v->number == floor(v->number);
    if (!strcmp(t, "boolean")) return v->type == K3C_JSON_BOOL;
    if (!strcmp(t, "null")) return v->type == K3C_JSON_NULL;
    if (!strcmp(t, "object")) return v->type == K3C_JSON_OBJECT;
    if (!strcmp(t, "array")) return v->type == K3C_JSON_ARRAY;
    return 1; /* an unknown type name constrains nothing */
}

static int check_at(const k3c_json *s, const k3c_json *v, const char *path, k3c_err *err);

static int check_type(const k3c_json *t, const k3c_json *v, const char *path, k3c_err *err) {
    if (!t) return K3C_OK;
    if (t->type == K3C_JSON_STRING) {
        if (type_matches(t->string, v)) return K3C_OK;
        return k3c_errf(err, K3C_EINVAL, "%s: expected %s, got %s", path, t->string, k3c_json_type_name(v));
    }
    if (t->type == K3C_JSON_ARRAY) {
        for (size_t i = 0; i < t->n; i++)
            if (t->items[i].type == K3C_JSON_STRING && type_matches(t->items[i].string, v)) return K3C_OK;
        return k3c_errf(err, K3C_EINVAL, "%s: %s matches none of the allowed types", path, k3c_json_type_name(v));
    }
    return K3C_OK;
}

static int check_object(const k3c_json *s, const k3c_json *v, const char *path, k3c_err *err) {
    const k3c_json *props = k3c_json_get(s, "properties"), *req = k3c_json_get(s, "required");
    const k3c_json *extra = k3c_json_get(s, "additionalProperties");
    char sub[512];
    if (req && req->type == K3C_JSON_ARRAY)
        for (size_t i = 0; i < req->n; i++)
            if (req->items[i].type == K3C_JSON_STRING && !k3c_json_get(v, req->items[i].string))
                return k3c_errf(err, K3C_EINVAL, "%s: missing required property \"%s\"", path, req->items[i].string);
    for (size_t i = 0; i < v->n; i++) {
        const k3c_json *ps = props && props->type == K3C_JSON_OBJECT ? k3c_json_get(props, v->keys[i]) : NULL;
        snprintf(sub, sizeof sub, "%s.%s", path, v->keys[i]);
        if (!ps) {
            if (extra && extra->type == K3C_JSON_BOOL && !extra->boolean)
                return k3c_errf(err, K3C_EINVAL, "%s: property not allowed", sub);
            continue;
        }
        int rc = check_at(ps, &v->items[i], sub, err);
        if (rc) return rc;
    }
    return K3C_OK;
}

static int check_at(const k3c_json *s, const k3c_json *v, const char *path, k3c_err *err) {
    if (!s || s->type != K3C_JSON_OBJECT) return K3C_OK;
    int rc = check_type(k3c_json_get(s, "type"), v, path, err);
    if (rc) return rc;
    const k3c_json *en = k3c_json_get(s, "enum");
    if (en && en->type == K3C_JSON_ARRAY) {
        size_t i = 0;
        while (i < en->n && !json_equal(&en->items[i], v)) i++;
        if (i == en->n) {
            k3c_sbuf b;
            k3c_sbuf_init(&b);
            k3c_sbuf_json_value(&b, en, 0);
            rc = k3c_errf(err, K3C_EINVAL, "%s: expected one of %.300s", path, b.buf ? b.buf : "[]");
            k3c_sbuf_free(&b);
            return rc;
        }
    }
    if (v->type == K3C_JSON_OBJECT) return check_object(s, v, path, err);
    const k3c_json *items = k3c_json_get(s, "items");
    if (v->type == K3C_JSON_ARRAY && items) {
        char sub[512];
        for (size_t i = 0; i < v->n; i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            if ((rc = check_at(items, &v->items[i], sub, err))) return rc;
        }
    }
    return K3C_OK;
}

int k3c_json_schema_check(const k3c_json *schema, const k3c_json *v, k3c_err *err) {
    return check_at(schema, v, "$", err);
}
