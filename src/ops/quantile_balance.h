/* quantile_balance.h — Quantile Balancing of the MoE router bias (exact order-statistic rule and the separable histogram estimator)
 * and expert-load telemetry. Spec: docs/MODEL.md §7.1–§7.4 (K3 report Eq. 13–14, App. C, App. D). */
#ifndef K3C_OPS_QUANTILE_BALANCE_H
#define K3C_OPS_QUANTILE_BALANCE_H

#include "base/base.h"

/* Inputs, for one MoE layer and one optimizer step (the whole global batch, §7.2 item 5):
 *   s     [m, n]  unbiased sigmoid scores (fp32)
 *   alpha [m]     cutoffs: the (k+1)-th largest BIASED score s_i + b per token (k3c_router_fwd's `cutoff`)
 *   mask  [m]     NULL, or nonzero for tokens that count (padding excluded, §7.2 item 7)
 * New bias (§7.2): b̃_j = −[(q+1)-th largest of μ_{:,j} = s_ij − α_i] = (q+1)-th smallest of r_ij = α_i − s_ij, then
 * b ← b̃ − mean(b̃). Requires 1 ≤ k < n. A step with no counted token leaves b unchanged.
 *
 * Non-integer q = m·k/n: the exact rule uses q = ⌊m·k/n⌋ (integer arithmetic). Why: the threshold has to be an order
 * statistic of μ_{:,j} (the spec's (q+1)-th largest, Alg. 1's 0-based index q), and index ⌊q⌋ sets every expert to
 * admit exactly ⌊q⌋ tokens strictly above it at the current cutoffs — the largest equal count that does not exceed the
 * target. The fewer than n routes this leaves over are placed by the per-token top-k itself; because every expert is
 * treated alike, the rounding moves mostly the common offset, which the mean-centring removes. Interpolating between
 * order statistics (torch.quantile in pablo-reyes8) is the deviation §7.3 rejects. With integer q (m a multiple of
 * n/k, the usual case) all readings coincide. The histogram estimator reads out at the continuous quantile
 * q = m·k/n (App. D), which agrees within one bin width. */
typedef enum { K3C_QB_EXACT = 0, K3C_QB_HISTOGRAM = 1 } k3c_qb_mode;
#define K3C_QB_BINS 1000

/* b ← b − mean(b) (accumulated in double). */
void k3c_qb_centre(float *b, int64_t n);

/* ---------------------------------------------------------------- exact (§7.2)
 * b_raw [n] ← b̃ (not centred). ws: k3c_qb_exact_workspace bytes, or NULL to allocate internally.
 * Returns the number of counted tokens (≥ 0; 0 leaves b_raw untouched) or a negative k3c_status (K3C_ENUMERIC for a
 * non-finite score or cutoff of a counted token). */
size_t k3c_qb_exact_workspace(int64_t m, int64_t n);
int64_t k3c_qb_exact(const float *s, const float *alpha, const uint8_t *mask, int64_t m, int64_t n, int64_t k,
                     float *b_raw, void *ws, k3c_err *err);

/* ---------------------------------------------------------------- histogram (§7.3, App. D)
 * Separable: begin (range from the current bias: [b_min − 1, b_max + 1], width (b_max − b_min + 2)/bins), then add any
 * number of micro-batches (each token adds one count per expert into its r_ij bin), then — after an integer all-reduce
 * of the n·bins counts across data-parallel ranks, if any — one read-out. The counted-token total is recovered from
 * the counts (every token lands once per expert), so the counts buffer is the only thing to reduce. Every rank calls
 * begin with the same (replicated) bias, so the bin edges agree without communication. */
typedef struct {
    int64_t n, bins;
    double lo, width;
    int64_t *counts; /* [n, bins], caller-owned */
} k3c_qb_hist;

/* Zeroes counts (n·bins int64) and sets the range from b [n]. K3C_ENUMERIC for a non-finite bias. */
int k3c_qb_hist_begin(k3c_qb_hist *h, const float *b, int64_t n, int64_t bins, int64_t *counts, k3c_err *err);
/* Adds m tokens of one micro-batch. Values outside the range (impossible for s ∈ (0,1) up to rounding) go to the edge
 * bins. K3C_ENUMERIC for a non-finite score or cutoff of a counted token. */
int k3c_qb_hist_add(const k3c_qb_hist *h, const float *s, const float *alpha, const uint8_t *mask, int64_t m,
                    k3c_err *err);
/* b_raw [n] ← per expert the r value where the ascending cumulative count reaches q = tokens·k/n, interpolated inside
 * the bin: b̃_j = lo + (bin_j + clip((q − c_j)/h_j, 0, 1))·width, bin_j the first bin whose cumulative count ≥ ⌈q⌉.
 * Not centred. Returns the counted tokens (0 leaves b_raw untouched) or a negative status. */
int64_t k3c_qb_hist_readout(const k3c_qb_hist *h, int64_t k, float *b_raw, k3c_err *err);

/* ---------------------------------------------------------------- one-call update
 * b [n]: in the bias that routed this batch (the histogram range needs it), out the new centred bias (unchanged when no
 * token counts). ws: k3c_qb_workspace bytes or NULL (allocated internally). Returns the counted tokens or a status. */
size_t k3c_qb_workspace(int mode, int64_t m, int64_t n);
int64_t k3c_qb_update(int mode, const float *s, const float *alpha, const uint8_t *mask, int64_t m, int64_t n,
                      int64_t k, float *b, void *ws, k3c_err *err);

/* ---------------------------------------------------------------- auxiliary-loss-free bias (DeepSeek-V3)
 * A baseline arm for quantile balancing (docs/TRAINING.md §1.6): after each step, with load_j the routes expert j got
 * in this step's batch and mean = Σ_j load_j / n,  b_j ← b_j + γ·sign(mean − load_j)  (no centring: DeepSeek-V3's
 * rule). The sign is decided in integers (n·load_j against Σ load), so equal loads never move by rounding.
 * k3c_bias_update: from the loads [n]. k3c_bias_balance: the loads of the routes the router's own selection rule
 * (k3c_router_fwd_f32, ties to the lower index) gives for logits [m, n] with the bias b that routed them, so it equals
 * the forward's routes exactly, and from statistics gathered over data-parallel ranks as well; ws:
 * k3c_bias_balance_workspace bytes. K3C_ENUMERIC (b untouched) for a non-finite logit, bias or γ-step; needs 1 ≤ k < n
 * and γ > 0. m = 0 leaves b unchanged. */
void k3c_bias_update(const int64_t *loads, int64_t n, double gamma, float *b);
size_t k3c_bias_balance_workspace(int64_t m, int64_t n, int64_t k);
int k3c_bias_balance(const float *logits, int64_t m, int64_t n, int64_t k, double gamma, float *b, void *ws,
                     k3c_err *err);

/* ---------------------------------------------------------------- load telemetry
 * loads [n] ← routes per expert from topk_ids [m, k] (id −1 = dropped slot, skipped; mask as above). Statistics over
 * the n experts: mean = routes/n, max/mean, min/mean, coefficient of variation = population std / mean (0 when no
 * routes). K3C_EINVAL for an id outside [−1, n). */
typedef struct {
    int64_t routes, max, min;
    double mean, max_over_mean, min_over_mean, cv;
} k3c_load_stats;

int k3c_moe_load_stats(const int32_t *topk_ids, const uint8_t *mask, int64_t m, int64_t k, int64_t n, int64_t *loads,
                       k3c_load_stats *st, k3c_err *err);

#endif
