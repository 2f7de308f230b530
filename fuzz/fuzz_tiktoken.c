/* fuzz_tiktoken.c — libFuzzer target for the tiktoken vocabulary reader (k3c_tok_parse, src/tok/tok.h): the first byte
 * picks the pattern and the gaps flag, the rest is the rank file; an accepted vocabulary must encode the file's own
 * text and decode it back byte-exactly. */
#include "tok/tok.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    k3c_tok_pattern pat = data[0] & 1 ? K3C_TOK_PATTERN_CL100K : K3C_TOK_PATTERN_KIMI;
    int flags = data[0] & 2 ? K3C_TOK_LOAD_ALLOW_GAPS : 0;
    k3c_tok *t = NULL;
    k3c_err err = {0};
    if (k3c_tok_parse((const char *)data + 1, n - 1, "fuzz", pat, flags, &t, &err) != K3C_OK) return 0;
    k3c_tok_ids ids = {0};
    if (k3c_tok_encode(t, data + 1, n - 1, 0, &ids, &err) != K3C_OK) abort();
    char *back = NULL;
    size_t len = 0;
    if (k3c_tok_decode(t, ids.ids, ids.n, &back, &len, &err) != K3C_OK) abort();
    if (len != n - 1 || memcmp(back, data + 1, len) != 0) abort();
    free(back);
    k3c_tok_ids_free(&ids);
    k3c_tok_free(t);
    return 0;
}
