/* fuzz_json.c — libFuzzer target for the JSON reader (src/base/json.h): k3c_json_parse on arbitrary bytes, and a parsed
 * value written back compactly must parse again to the same text. */
#include "base/json.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    k3c_json *v = NULL;
    k3c_err err = {0};
    if (k3c_json_parse((const char *)data, n, "fuzz", &v, &err) != K3C_OK) return 0;
    k3c_sbuf a, b;
    k3c_sbuf_init(&a);
    k3c_sbuf_init(&b);
    k3c_sbuf_json_value(&a, v, 0);
    k3c_json *w = NULL;
    if (k3c_json_parse(a.buf, a.len, "fuzz (written back)", &w, &err) != K3C_OK) abort();
    k3c_sbuf_json_value(&b, w, 0);
    if (a.len != b.len || memcmp(a.buf, b.buf, a.len) != 0) abort();
    k3c_sbuf_free(&a);
    k3c_sbuf_free(&b);
    k3c_json_free(w);
    k3c_json_free(v);
    return 0;
}
