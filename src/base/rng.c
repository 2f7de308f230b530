/* rng.c — counter-based Philox-4x32-10 (Salmon et al., SC'11): value i of a stream is a pure function of (seed, i),
 * so parallel initialisation is reproducible and a checkpoint stores only (seed, counter). */
#include "base/base.h"

#include <math.h>

void k3c_philox(uint64_t seed, uint64_t counter, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static double u53(const uint32_t w[2]) {
    uint64_t x = ((uint64_t)w[0] << 32 | w[1]) >> 11;
    return (double)x * (1.0 / 9007199254740992.0);
}

uint64_t k3c_rng_u64(k3c_rng *r) {
    uint32_t o[4];
    k3c_philox(r->seed, r->counter++, o);
    return (uint64_t)o[0] << 32 | o[1];
}

double k3c_rng_uniform(k3c_rng *r) { return k3c_uniform_at(r->seed, r->counter++); }
double k3c_rng_normal(k3c_rng *r) { return k3c_normal_at(r->seed, r->counter++); }

double k3c_uniform_at(uint64_t seed, uint64_t i) {
    uint32_t o[4];
    k3c_philox(seed, i, o);
    return u53(o);
}

double k3c_normal_at(uint64_t seed, uint64_t i) {
    uint32_t o[4];
    k3c_philox(seed, i, o);
    double u1 = 1.0 - u53(o), u2 = u53(o + 2); /* u1 in (0, 1] */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t k3c_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
