/* prompt.c — image tokens in the chat format: the K3 image prompt (<|media_begin|>image WxH<|media_content|> + N ×
 * <|media_pad|> + <|media_end|>), the placeholder positions the image embeddings replace, and next-token targets with
 * no loss on image tokens. Spec: docs/VISION.md "Prompt and merge"; ../shared/spec/TRAINING.md §5.3 (masks), §6.4. */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MEDIA_BEGIN "<|media_begin|>"
#define MEDIA_CONTENT "<|media_content|>"
#define MEDIA_PAD "<|media_pad|>"
#define MEDIA_END "<|media_end|>"

int k3c_vision_image_prompt(int W, int H, int64_t n_tokens, char **out, size_t *len, k3c_err *err) {
    *out = NULL;
    if (W <= 0 || H <= 0 || n_tokens <= 0 || n_tokens > (1 << 24))
        return k3c_errf(err, K3C_EINVAL, "image prompt: bad size %dx%d or token count %lld", W, H, (long long)n_tokens);
    char head[96];
    int nh = snprintf(head, sizeof head, MEDIA_BEGIN "image %dx%d" MEDIA_CONTENT, W, H);
    const size_t np = strlen(MEDIA_PAD), n = (size_t)nh + (size_t)n_tokens * np + strlen(MEDIA_END);
    char *s = malloc(n + 1), *p = s;
    if (!s) return k3c_errf(err, K3C_ENOMEM, "image prompt: out of memory");
    memcpy(p, head, (size_t)nh), p += nh;
    for (int64_t i = 0; i < n_tokens; i++) memcpy(p, MEDIA_PAD, np), p += np;
    memcpy(p, MEDIA_END, strlen(MEDIA_END) + 1);
    *out = s;
    if (len) *len = n;
    return K3C_OK;
}

int k3c_vision_image_ids(const k3c_tok *tok, int W, int H, int64_t n_tokens, k3c_tok_ids *out, k3c_err *err) {
    static const char *const need[4] = {MEDIA_BEGIN, MEDIA_CONTENT, MEDIA_PAD, MEDIA_END};
    for (int i = 0; i < 4; i++)
        if (k3c_tok_special_id(tok, need[i]) < 0)
            return k3c_errf(err, K3C_ECONFIG, "image prompt: the tokenizer has no special token %s", need[i]);
    char *s = NULL;
    size_t n = 0;
    int rc = k3c_vision_image_prompt(W, H, n_tokens, &s, &n, err);
    if (!rc) rc = k3c_tok_encode(tok, s, n, K3C_TOK_ALLOW_SPECIAL, out, err);
    free(s);
    return rc;
}

int64_t k3c_vision_pad_positions(const int32_t *ids, int64_t T, int32_t pad_id, int32_t *pos) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++)
        if (ids[t] == pad_id) {
            if (pos) pos[n] = (int32_t)t;
            n++;
        }
    return n;
}

int k3c_vision_targets(const int32_t *ids, int64_t T, const int32_t *cu, int n_docs, int32_t pad_id, int32_t *targets,
                       k3c_err *err) {
    const int32_t one[2] = {0, (int32_t)T};
    if (!cu) cu = one, n_docs = 1;
    if (n_docs < 1 || cu[0] != 0 || cu[n_docs] != T)
        return k3c_errf(err, K3C_EINVAL, "vision targets: cu_seqlens must run from 0 to T = %lld", (long long)T);
    for (int d = 0; d < n_docs; d++) {
        if (cu[d + 1] < cu[d]) return k3c_errf(err, K3C_EINVAL, "vision targets: cu_seqlens decrease at %d", d);
        for (int64_t t = cu[d]; t < cu[d + 1]; t++) {
            const int last = t + 1 >= cu[d + 1];
            /* an image token neither predicts nor is predicted */
            targets[t] = last || ids[t] == pad_id || ids[t + 1] == pad_id ? -1 : ids[t + 1];
        }
    }
    return K3C_OK;
}
