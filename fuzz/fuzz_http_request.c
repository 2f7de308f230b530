/* fuzz_http_request.c — libFuzzer target for the server's request path (src/serve/request.h): the first byte picks the
 * endpoint and the chat format, the rest is the JSON body. Either an error with a 4xx/5xx status, a message and a body
 * that is valid JSON, or a request whose prompt ids are in the vocabulary and whose budget fits the context. */
#include "serve/response.h"
#include "tok/tok.h"
#include "tok/xtml.h"

#include "fuzz.h"

/* A small BPE with the chat markers, trained once. */
static k3c_tok *tokenizer(void) {
    static k3c_tok *t;
    if (t) return t;
    const char *text = "Hello world! message role=\"user\" think response tools call argument key=\"city\" "
                       "{\"city\": \"Paris\"} café 東京 get_weather You are a helpful assistant. Hello world!";
    size_t n = strlen(text);
    k3c_tok_train_opts o = {.vocab_size = 300,
                            .pattern = K3C_TOK_PATTERN_KIMI,
                            .specials = k3c_chat_specials,
                            .n_specials = K3C_CHAT_N_SPECIALS};
    k3c_err err = {0};
    if (k3c_tok_train(&text, &n, 1, &o, &t, &err)) abort();
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    k3c_api_kind kind = (k3c_api_kind)(data[0] & 3);
    k3c_api_limits lim = {tokenizer(),
                          (data[0] >> 2) & 1 ? K3C_CHAT_K2 : K3C_CHAT_XTML,
                          "tiny",
                          0,
                          512,
                          64,
                          NULL,
                          K3C_API_MAX_IMAGES,
                          K3C_API_MAX_IMAGE_BYTES,
                          K3C_API_MAX_IMAGE_PIXELS,
                          0};
    lim.n_vocab = k3c_tok_n_vocab(lim.tok) - ((data[0] >> 3) & 1); /* sometimes a model vocabulary one smaller */
    k3c_api_req q;
    k3c_api_error e;
    int rc = k3c_api_parse(kind, (const char *)data + 1, n - 1, &lim, &q, &e);
    if (rc) {
        if (rc != e.status || rc < 400 || rc > 599 || !e.message[0] || !e.type) abort();
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        k3c_api_error_json(&s, &e);
        k3c_json *j = NULL;
        if (!s.ok || k3c_json_parse(s.buf, s.len, "error", &j, NULL)) abort(); /* the body is always valid JSON */
        k3c_json_free(j);
        k3c_sbuf_free(&s);
    } else {
        for (size_t i = 0; i < q.prompt.n; i++)
            if (q.prompt.ids[i] < 0 || (kind != K3C_API_TOKENIZE && q.prompt.ids[i] >= lim.n_vocab)) abort();
        if (kind == K3C_API_CHAT || kind == K3C_API_COMPLETION) {
            if (q.prompt.n < 1 || q.gen.max_new < 1 || q.gen.max_new > lim.max_tokens_cap ||
                (int64_t)q.prompt.n + q.gen.max_new > lim.max_context || q.nstop > 4)
                abort();
            for (int i = 0; i < q.nstop; i++)
                if (!q.stop[i][0]) abort();
        }
        if (kind == K3C_API_DETOKENIZE && !q.text) abort();
    }
    k3c_api_req_free(&q);
    return 0;
}
