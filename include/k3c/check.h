/* k3c/check.h — the public API of `k3c golden-check` and `k3c check-kda`: a model's logits, loss and gradients, and
 * the KDA core, against golden files written by other code. shared/golden/README.md. */
#ifndef K3C_CHECK_H
#define K3C_CHECK_H

#include "k3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- a model against a golden file */
typedef struct {
    char name[192];
    double rel_err; /* ‖ours − ref‖ / ‖ref‖ (0 when ref is exactly zero) */
    double abs_err; /* max |ours − ref| (the measure for all-zero references) */
    double ref_norm;
} k3c_golden_row;

/* What k3c_golden_check measured. The caller provides rows[max_rows] for the gradients. */
typedef struct {
    int64_t B, T;                    /* the golden's input_ids: B documents of T tokens */
    int has_logits;                  /* the golden has "logits": */
    double logits_rel;               /*   ‖ours − ref‖ / ‖ref‖ (INFINITY: unreadable or another size) */
    int has_loss;                    /* the golden has "loss": */
    double loss, loss_ref, loss_rel; /*   ours, the golden's, |ours − ref| / |ref| */
    k3c_golden_row *rows;            /* one per grad.* tensor (e_score_correction_bias excepted) */
    int max_rows, n_rows;
} k3c_golden_report;

/* m's gradients against the golden's grad.<name> tensors (checkpoint names or transformers' internal Kimi-Linear
 * names). */
int k3c_golden_grads_f32(const k3c_model *m, const k3c_safetensors *golden, k3c_golden_row *rows, int max_rows,
                         int *n_rows, k3c_err *err);
int k3c_golden_grads_f64(const k3c_model *m, const k3c_safetensors *golden, k3c_golden_row *rows, int max_rows,
                         int *n_rows, k3c_err *err);
/* Forward + backward of m (opened with gradients) on the golden file's input_ids, then logits, loss and every gradient
 * against it. The outputs are compared before the gradients: has_logits / has_loss hold even when the gradient
 * comparison fails. */
int k3c_golden_check_f32(k3c_model *m, const char *golden_path, k3c_golden_report *r, k3c_err *err);
int k3c_golden_check_f64(k3c_model *m, const char *golden_path, k3c_golden_report *r, k3c_err *err);

/* ---------------------------------------------------------------- the KDA core */
enum { K3C_KDA_CHECK_TENSORS = 8, K3C_KDA_CHECK_RUNS = 5 };
extern const char *const k3c_kda_check_tensor[K3C_KDA_CHECK_TENSORS]; /* "o", "ht", "dq", "dk", "dv", "dg", ... */

/* One implementation of the core: the token recurrence, or chunked (16 / 64) with pairwise or factored tiles. */
typedef struct {
    const char *name; /* "recurrent", "c16 pair", "c64 pair", "c16 fact", "c64 fact" */
    int chunk;        /* 0 = recurrence */
    double bound;     /* gate_lower_bound: 0 = pairwise tiles, -5 = factored */
    int ran;          /* 0: not selected, or some g is below the bound the factored tiles need */
    int status;       /* non-zero: this implementation failed (why says how); the others still ran */
    k3c_err why;
    double rel[K3C_KDA_CHECK_TENSORS]; /* ||x - ref|| / ||ref|| per k3c_kda_check_tensor; -1 = no reference */
} k3c_kda_check_run;

typedef struct {
    int64_t T, H, dk, dv; /* T = B · T_doc tokens */
    int n_docs;           /* B */
} k3c_kda_check_dims;

typedef struct {
    k3c_kda_check_dims dims;
    double g_min; /* smallest gate in the file (or 0) */
    k3c_kda_check_run run[K3C_KDA_CHECK_RUNS];
} k3c_kda_check;

/* Runs the float64 CPU KDA forward and backward on path (laid out like shared/golden/kda_fp64_small.safetensors: q k v
 * g beta [h0] do [dht] with shapes [B,T,H,d], [B,T,H], [B,H,dk,dv]; references o ht dq dk dv dg dbeta dh0) for every
 * implementation (only = -1) or the one with chunk `only` (0, 16, 64). Errors: the file cannot be read. */
int k3c_kda_golden_check(const char *path, int only, k3c_kda_check *out, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
