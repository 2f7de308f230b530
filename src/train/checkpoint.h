/* checkpoint.h — training checkpoints: <out>/step_NNNNNNNN/ holds the model in Hugging Face layout (config.json,
 * model.safetensors, tokenizer), optimizer.safetensors, trainer_state.json and checksums.json (one FNV-1a 64 per
 * file, base/base.h); <out>/latest names the newest complete one. Written to a temporary directory and renamed, so a run killed mid-checkpoint leaves the previous one loadable. */
#ifndef K3C_TRAIN_CHECKPOINT_H
#define K3C_TRAIN_CHECKPOINT_H

#include "model/model.h"

typedef struct {
    const k3c_model *model; /* float32 model (the router biases inside are the QB state) */
    const float *optim_state;
    size_t optim_numel;
    const char *trainer_state; /* JSON text */
    const char *vocab;         /* tokenizer file to copy (its .specials.json too, when present); NULL = none */
    const char *pattern;       /* its pre-tokeniser ("cl100k" / "kimi"), written to k3c_tokenizer.json */
} k3c_train_ckpt;

/* Writes the checkpoint of `step` under out_dir, updates out_dir/latest, keeps the newest `keep` checkpoints. */
int k3c_train_ckpt_save(const char *out_dir, int64_t step, const k3c_train_ckpt *ck, int keep, k3c_err *err);
/* Path of the newest complete checkpoint (from out_dir/latest); K3C_ENOTFOUND when there is none. */
int k3c_train_ckpt_latest(const char *out_dir, char *path, size_t n, k3c_err *err);
/* Removes the .tmp_step_* directories a run killed while writing a checkpoint leaves behind. */
void k3c_train_ckpt_clean(const char *out_dir);
/* The steps --resume may start from, best first: the one out_dir/latest names, then every older step_* directory,
 * newest first (fallbacks when a newer one fails its checksums). Returns how many (0: no checkpoint yet), or an error. */
int k3c_train_ckpt_candidates(const char *out_dir, int64_t *steps, int cap, k3c_err *err);
/* Reads optimizer.safetensors (must hold exactly numel floats) and trainer_state.json (malloc'd text). */
int k3c_train_ckpt_load_state(const char *dir, float *optim_state, size_t numel, char **trainer_state, k3c_err *err);

#endif
