/* bias_balance.c — DeepSeek-V3's auxiliary-loss-free balancing of the router bias (a sign step of the load error per
 * expert), a baseline arm for quantile balancing. Spec: docs/TRAINING.md §1.6 (balancing), docs/MODEL.md §7. */
#include "ops/moe.h"
#include "ops/quantile_balance.h"

#include <math.h>
#include <string.h>

void k3c_bias_update(const int64_t *loads, int64_t n, double gamma, float *b) {
    int64_t total = 0;
    for (int64_t j = 0; j < n; j++) total += loads[j];
    for (int64_t j = 0; j < n; j++) {
        const int64_t d = total - n * loads[j]; /* n·(mean − load_j) */
        b[j] = (float)((double)b[j] + (d > 0 ? gamma : d < 0 ? -gamma : 0.0));
    }
}

static size_t align64(size_t b) { return (b + 63) / 64 * 64; }

size_t k3c_bias_balance_workspace(int64_t m, int64_t n, int64_t k) {
    const size_t mk = (size_t)(m > 0 ? m : 0) * (size_t)(k > 0 ? k : 0);
    return align64(sizeof(int32_t) * mk) + align64(sizeof(float) * mk) + sizeof(int64_t) * (size_t)(n > 0 ? n : 1);
}

int k3c_bias_balance(const float *logits, int64_t m, int64_t n, int64_t k, double gamma, float *b, void *ws,
                     k3c_err *err) {
    if (m < 0 || n < 2 || k < 1 || k >= n || k > K3C_ROUTER_MAX_TOPK)
        return k3c_errf(err, K3C_EINVAL, "bias_balance: bad sizes m = %lld, n = %lld, k = %lld (need 1 <= k < n)",
                        (long long)m, (long long)n, (long long)k);
    if (!(gamma > 0) || !isfinite(gamma))
        return k3c_errf(err, K3C_EINVAL, "bias_balance: gamma %g, must be finite and > 0", gamma);
    if (m == 0) return K3C_OK;
    if (!ws) return k3c_errf(err, K3C_EINVAL, "bias_balance: the workspace is required");
    const size_t mk = (size_t)m * (size_t)k;
    int32_t *ids = ws;
    float *w = (float *)((char *)ws + align64(sizeof(int32_t) * mk));
    int64_t *loads = (int64_t *)((char *)w + align64(sizeof(float) * mk));
    k3c_router_sizes rs = {m, n, k, 0, 1.0};
    int rc = k3c_router_fwd_f32(&rs, logits, b, ids, w, NULL, err);
    if (rc) {
        k3c_err_wrap(err, "bias_balance");
        return rc;
    }
    memset(loads, 0, sizeof(int64_t) * (size_t)n);
    for (size_t i = 0; i < mk; i++) loads[ids[i]]++;
    for (int64_t j = 0; j < n; j++)
        if (!isfinite((double)b[j] + gamma))
            return k3c_errf(err, K3C_ENUMERIC, "bias_balance: bias[%lld] + gamma is not finite", (long long)j);
    k3c_bias_update(loads, n, gamma, b);
    return K3C_OK;
}
