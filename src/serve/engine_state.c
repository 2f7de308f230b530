/* engine_state.c — one sequence's decode state: the KDA recurrent state and short-conv tails per KDA layer, the MLA
 * latent cache per MLA layer, in the weights' backend memory; its size, and copies for prefix snapshots.
 * docs/ENGINE.md "Decode state". */
#include "base/check.h"
#include "serve/engine.h"

#include <string.h>

static int64_t kda_n(const k3c_eng_dims *d) { return d->n_kda * d->kda_floats; }
static size_t mla_bytes(const k3c_eng_dims *d, int64_t cap) {
    return sizeof(float) * (size_t)((int64_t)d->n_mla * cap * d->lat_w);
}

const k3c_backend_f32 *k3c_eng_backend(const k3c_eng_dims *d) { return d->be ? d->be : k3c_backend_cpu_f32(); }

size_t k3c_eng_state_bytes(const k3c_eng_dims *d, int64_t cap) {
    return sizeof(float) * (size_t)kda_n(d) + mla_bytes(d, cap);
}

int k3c_eng_state_init(k3c_eng_state *s, const k3c_eng_dims *d, int64_t cap, k3c_err *err) {
    const k3c_backend_f32 *be = k3c_eng_backend(d);
    memset(s, 0, sizeof *s);
    s->be = be;
    s->kda = be->alloc(sizeof(float) * (size_t)kda_n(d) + 64);
    s->mla = be->alloc(mla_bytes(d, cap) + 64);
    if (!s->kda || !s->mla) {
        k3c_eng_state_free(s);
        return k3c_errf(err, K3C_ENOMEM, "engine: decode state for %lld tokens (%zu bytes, %s memory)", (long long)cap,
                        k3c_eng_state_bytes(d, cap), be->name);
    }
    s->cap = cap;
    return K3C_OK;
}

void k3c_eng_state_free(k3c_eng_state *s) {
    if (s->be) {
        s->be->free(s->kda);
        s->be->free(s->mla);
    }
    memset(s, 0, sizeof *s);
}

int k3c_eng_state_copy(k3c_eng_state *dst, const k3c_eng_state *src, const k3c_eng_dims *d, k3c_err *err) {
    const k3c_backend_f32 *be = k3c_eng_backend(d);
    if (kda_n(d)) CHECK_RC(be->copy2d(1, kda_n(d), src->kda, kda_n(d), dst->kda, kda_n(d), 0, err));
    /* caches of different capacities: copy the tokens in use, layer by layer */
    for (int j = 0; j < d->n_mla && src->pos > 0; j++)
        CHECK_RC(be->copy2d(src->pos, d->lat_w, src->mla + (size_t)(j * src->cap * d->lat_w), d->lat_w,
                            dst->mla + (size_t)(j * dst->cap * d->lat_w), d->lat_w, 0, err));
    dst->pos = src->pos;
    return K3C_OK;
}

int k3c_eng_state_reset(k3c_eng_state *s, const k3c_eng_dims *d, k3c_err *err) {
    s->pos = 0; /* the cache needs no clearing: only tokens < pos are read */
    return kda_n(d) ? k3c_eng_backend(d)->zero(s->kda, kda_n(d), err) : K3C_OK;
}
