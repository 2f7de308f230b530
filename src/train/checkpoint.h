/* checkpoint.h — training checkpoints: <out>/step_NNNNNNNN/ holds the model in Hugging Face layout (config.json,
 * model.safetensors or model-0000k-of-0000N.safetensors + model.safetensors.index.json, tokenizer), the optimizer state,
 * trainer_state.json and checksums.json (one FNV-1a 64 per file, base/base.h); <out>/latest names the newest complete
 * one. Written to a temporary directory and renamed, so a run killed mid-checkpoint leaves the previous one loadable.
 * Spec: docs/PARALLEL.md "Checkpoints".
 *
 * The optimizer state: one process writes optimizer.safetensors (one tensor "state", the single-process layout); a
 * parallel run writes every rank's ZeRO-1 shard to optimizer-0000r-of-0000N.safetensors, one tensor per table entry it
 * owns (named by the entry; a stacked routed-expert entry one tensor per expert it holds, under the expert's name,
 * its state blocks — Muon's momentum, or AdamW's m then v — of that expert), and optimizer.safetensors.index.json maps
 * every tensor to its file, so a reader at any layout and expert residency takes the entries it owns from whichever
 * files hold them. */
#ifndef K3C_TRAIN_CHECKPOINT_H
#define K3C_TRAIN_CHECKPOINT_H

#include "parallel/comm.h"
#include "model/model.h"
#include "ops/optim.h"

typedef struct {
    const k3c_model *model;    /* float32 model (the router biases inside are the QB state) */
    const float *optim_state;  /* host memory: the whole state (comm NULL), else the state of the entries of `mine`,
                                  in table order */
    size_t optim_numel;        /* floats there */
    const char *trainer_state; /* JSON text */
    const char *vocab;         /* tokenizer file to copy (its .specials.json too, when present); NULL = none */
    const char *pattern;       /* its pre-tokeniser ("cl100k" / "kimi"), written to k3c_tokenizer.json */
    /* A sharded checkpoint: every rank of comm (the world) calls k3c_train_ckpt_save; NULL = one process. */
    k3c_comm *comm;
    const k3c_optim *opt;         /* the single-process optimizer layout of `table` (entry i's state floats) */
    const uint8_t *mine;          /* [table->n] 1: the entries whose optimizer state this rank writes */
    const k3c_param_table *table; /* what mine, opt, optim_state and w_host lay out: the model's (NULL), or, with
                                     tensor parallelism, the whole tensors' (k3c_tp_gather_entry) */
    const float *w_host;          /* NULL: the weights from the model; else (host memory) entries [w0, w1) of `table`
                                     from entry w0's offset */
    int w0, w1;                   /* the entries whose weights this rank writes (w0 == w1: none) */
    int w_experts_only;  /* 1: of those only the stacked routed-expert entries (an EP rank other than the first) */
    int w_part, w_parts; /* its weight file: model.safetensors when w_parts is 1, else model-<part+1>-of-<parts> */
    int failed;          /* an error of this rank's before the save (err holds it): every rank fails the save alike */
} k3c_train_ckpt;

/* Writes the checkpoint of `step` under out_dir, updates out_dir/latest, keeps the newest `keep` checkpoints. With
 * ck->comm every rank writes its files into the one temporary directory; the status is agreed over comm before rank 0
 * writes the indices and checksums.json and renames it, so every rank returns the same success or failure. */
int k3c_train_ckpt_save(const char *out_dir, int64_t step, const k3c_train_ckpt *ck, int keep, k3c_err *err);
/* Path of the newest complete checkpoint (from out_dir/latest); K3C_ENOTFOUND when there is none. */
int k3c_train_ckpt_latest(const char *out_dir, char *path, size_t n, k3c_err *err);
/* Removes the .tmp_step_* directories a run killed while writing a checkpoint leaves behind. */
void k3c_train_ckpt_clean(const char *out_dir);
/* The steps --resume may start from, best first: the one out_dir/latest names, then every older step_* directory,
 * newest first (fallbacks when a newer one fails its checksums). Returns how many (0: no checkpoint yet), or an error. */
int k3c_train_ckpt_candidates(const char *out_dir, int64_t *steps, int cap, k3c_err *err);
/* The optimizer state of the table entries of `mine` ([t->n]; NULL: all) of t under optimizer layout o (state gets
 * their floats in table order, each entry's as o lays it out) from either layout, whatever layout or expert residency
 * wrote it (a stacked entry: the experts t holds; a tensor-parallel share: its part of the whole entry's); trainer_state non-NULL: also trainer_state.json (malloc'd text).
 * Errors name the file and the tensor. Checksums are verified by the model's reader (k3c_ckpt_open), not here. */
int k3c_train_ckpt_load_state(const char *dir, const k3c_param_table *t, const k3c_optim *o, const uint8_t *mine,
                              float *state, char **trainer_state, k3c_err *err);

#endif
