/* engine_state.c — one sequence's decode state: the KDA recurrent state and short-conv tails per KDA layer, the MLA
 * latent cache per MLA layer; its size, and copies for prefix snapshots. docs/ENGINE.md "Decode state". */
#include "serve/engine.h"

#include <string.h>

static size_t kda_bytes(const k3c_eng_dims *d) { return sizeof(float) * (size_t)(d->n_kda * d->kda_floats); }
static size_t mla_bytes(const k3c_eng_dims *d, int64_t cap) {
    return sizeof(float) * (size_t)((int64_t)d->n_mla * cap * d->lat_w);
}

size_t k3c_eng_state_bytes(const k3c_eng_dims *d, int64_t cap) { return kda_bytes(d) + mla_bytes(d, cap); }

int k3c_eng_state_init(k3c_eng_state *s, const k3c_eng_dims *d, int64_t cap, k3c_err *err) {
    memset(s, 0, sizeof *s);
    s->kda = k3c_aligned_alloc(kda_bytes(d) + 64);
    s->mla = k3c_aligned_alloc(mla_bytes(d, cap) + 64);
    if (!s->kda || !s->mla) {
        k3c_eng_state_free(s);
        return k3c_errf(err, K3C_ENOMEM, "engine: decode state for %lld tokens (%zu bytes)", (long long)cap,
                        k3c_eng_state_bytes(d, cap));
    }
    s->cap = cap;
    return K3C_OK;
}

void k3c_eng_state_free(k3c_eng_state *s) {
    k3c_aligned_free(s->kda);
    k3c_aligned_free(s->mla);
    memset(s, 0, sizeof *s);
}

void k3c_eng_state_copy(k3c_eng_state *dst, const k3c_eng_state *src, const k3c_eng_dims *d) {
    memcpy(dst->kda, src->kda, kda_bytes(d));
    for (int j = 0; j < d->n_mla; j++) /* caches of different capacities: copy the tokens in use, layer by layer */
        memcpy(dst->mla + (size_t)(j * dst->cap * d->lat_w), src->mla + (size_t)(j * src->cap * d->lat_w),
               sizeof(float) * (size_t)(src->pos * d->lat_w));
    dst->pos = src->pos;
}

void k3c_eng_state_reset(k3c_eng_state *s, const k3c_eng_dims *d) {
    memset(s->kda, 0, kda_bytes(d)); /* the cache needs no clearing: only tokens < pos are read */
    s->pos = 0;
}
