/* exp.h — what the ablation runner's files share: the evaluations a grid asks for, their run on a checkpoint, and the
 * report writer. Spec: docs/EXPERIMENTS.md "Grids", "Report". */
#ifndef K3C_EXP_EXP_H
#define K3C_EXP_EXP_H

#include "k3c/exp.h"

#define K3C_ABLATE_MAX_LIST 8

/* The grid's "evals": MQAR at each number of pairs (queries = pairs / 2, at least 1), needles at each length × depth,
 * loss by position on filler text of max(factors) · train_len tokens in the buckets [f_{i-1}·L, f_i·L) (f_0 = 0).
 * Every document from the test split of `seed`. A count of 0 skips that evaluation. */
typedef struct {
    uint64_t seed;
    int64_t max_tokens;
    int n_pairs;
    int pairs[K3C_ABLATE_MAX_LIST];
    int64_t mqar_docs;
    int n_lengths, n_depths;
    int64_t lengths[K3C_ABLATE_MAX_LIST];
    double depths[K3C_ABLATE_MAX_LIST];
    int64_t needle_docs;
    int n_factors;
    int64_t factors[K3C_ABLATE_MAX_LIST];
    int64_t train_len, position_docs;
} k3c_ablate_eval_spec;

/* K3C_ECONFIG naming file and the field for a value the generators refuse. */
int k3c_ablate_eval_check(const k3c_ablate_eval_spec *s, const char *file, k3c_err *err);
/* The evaluations on the newest checkpoint of run_dir (metrics mqar_recall, mqar_recall_p<P>, needle_acc,
 * needle_acc_<len>, pos_loss_<f>L). */
int k3c_ablate_evaluate(const k3c_ablate_eval_spec *s, const char *run_dir, int kda_chunk, const void *backend,
                        k3c_metric_set *m, k3c_err *err);
/* The loss of the first step row of a metrics.jsonl (NAN when there is none). */
double k3c_ablate_first_loss(const char *metrics_jsonl);
/* mkdir -p. */
int k3c_exp_mkdirs(const char *path, k3c_err *err);
/* OUT/report.md of a finished grid. */
int k3c_ablate_report(const k3c_ablate_result *res, const char *grid_path, const k3c_ablate_eval_spec *s, k3c_err *err);

#endif
