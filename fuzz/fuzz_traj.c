/* fuzz_traj.c — libFuzzer target for the SFT trajectory path (k3c_traj_load_jsonl + k3c_traj_pack, src/post/traj.c):
 * byte 0 picks the format (even: XTML with the kimi_k3 specials, odd: K2 with kimi_k2), the rest is one .jsonl file.
 * The Kimi tokenizer comes from golden/kimi_tokenizer under $K3C_SHARED (default ../shared). */
#include "k3c.h"
#include "tok/tok.h"

#include "fuzz.h"

static k3c_tok *tokenizer(int k2) {
    static k3c_tok *tok[2];
    if (tok[k2]) return tok[k2];
    const char *shared = getenv("K3C_SHARED") ? getenv("K3C_SHARED") : "../shared";
    char model[512], specials[512];
    snprintf(model, sizeof model, "%s/golden/kimi_tokenizer/tiktoken.model", shared);
    snprintf(specials, sizeof specials, "%s/golden/kimi_tokenizer/special_tokens.json", shared);
    k3c_err err = {0};
    if (k3c_tok_load_kimi(model, specials, k2 ? "kimi_k2" : "kimi_k3", &tok[k2], &err)) {
        fprintf(stderr, "fuzz_traj: %s\n", err.msg);
        abort();
    }
    return tok[k2];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    const int k2 = data[0] & 1;
    const char *in = fuzz_file("traj.jsonl", data + 1, n - 1);
    k3c_traj_opts o = {.format = k2, .thinking = (data[0] >> 1) & 1, .max_tokens = 4096};
    k3c_traj_set set = {0};
    k3c_err err = {0};
    if (!k3c_traj_load_jsonl(in, tokenizer(k2), &o, &set, &err) && set.n) {
        k3c_packed p = {0};
        size_t next = 0;
        for (int i = 0; i < 3 && !k3c_traj_pack(set.items, set.n, &next, 4096, &p, &err); i++) {}
        k3c_packed_free(&p);
    }
    k3c_traj_set_free(&set);
    return 0;
}
