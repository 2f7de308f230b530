/* fuzz_xtml_parse.c — libFuzzer target for the chat output parser (src/tok/xtml.h): the first byte picks the format,
 * in_think and a split point; the rest is parsed one-shot and streamed in two pieces, and both must give the same
 * result. */
#include "tok/xtml.h"

#include "fuzz.h"

static void on_delta(void *ctx, const k3c_chat_delta *d) {
    (void)ctx;
    (void)d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    k3c_chat_parse_opts o = {.format = data[0] & 1 ? K3C_CHAT_K2 : K3C_CHAT_XTML, .in_think = (data[0] >> 1) & 1};
    const char *s = (const char *)data + 1;
    size_t len = n - 1, cut = len ? (data[0] >> 2) % (len + 1) : 0;
    k3c_chat_result r;
    k3c_err err = {0};
    k3c_sbuf a, b;
    k3c_sbuf_init(&a);
    k3c_sbuf_init(&b);
    int rc1 = k3c_chat_parse(&o, s, len, &r, &err);
    if (rc1 == K3C_OK) {
        k3c_chat_result_json(&a, &r);
        k3c_chat_result_free(&r);
    }
    k3c_chat_parser *p = NULL;
    if (k3c_chat_parser_new(&o, on_delta, NULL, &p, &err) != K3C_OK) abort();
    int rc2 = k3c_chat_parser_feed(p, s, cut, &err);
    if (rc2 == K3C_OK) rc2 = k3c_chat_parser_feed(p, s + cut, len - cut, &err);
    if (rc2 == K3C_OK) rc2 = k3c_chat_parser_finish(p, &err);
    if (rc2 == K3C_OK) k3c_chat_result_json(&b, k3c_chat_parser_result(p));
    k3c_chat_parser_free(p);
    if (rc1 != rc2 || a.len != b.len || (a.len && memcmp(a.buf, b.buf, a.len) != 0)) {
        fprintf(stderr, "one-shot (%d) and streamed (%d, cut %zu) differ:\n%.*s\n%.*s\n", rc1, rc2, cut, (int)a.len,
                a.buf ? a.buf : "", (int)b.len, b.buf ? b.buf : "");
        abort();
    }
    k3c_sbuf_free(&a);
    k3c_sbuf_free(&b);
    return 0;
}
