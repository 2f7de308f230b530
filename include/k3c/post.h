/* k3c/post.h — the public API of post-training: trajectories and loss masks, verifiers, the
 * sandbox, RL math, environments, rollouts, SFT and RL runs. docs/POST.md. */
#ifndef K3C_POST_H
#define K3C_POST_H

#include "k3c.h"
#include "k3c/serve.h"
#include "k3c/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- post-training (docs/POST.md; TRAINING.md §3, §5)
 * Trajectories: JSONL conversations rendered through XTML (or the K2 envelope) to token ids with a loss mask that is 1
 * exactly on what the model writes (assistant reasoning, content, tool-call markup, end markers). */
typedef struct {
    int32_t *ids;
    uint8_t *mask; /* 1 = the model wrote this token (train on it), 0 = prompt / system / user / tool / observation */
    int64_t n;
    int64_t line; /* the JSONL line it came from (0 = not from a file) */
} k3c_traj;
void k3c_traj_free(k3c_traj *t);

typedef struct {
    int format;         /* k3c_chat_format: 0 = XTML (K3), 1 = K2 envelope (Kimi Linear) */
    int thinking;       /* XTML think channel on assistant turns (the line's own "options" may override) */
    int64_t max_tokens; /* a longer trajectory is a bad line (0 = no limit) */
} k3c_traj_opts;

typedef struct {
    k3c_traj *items;
    size_t n, cap;
    int64_t lines, bad; /* non-blank lines read, lines refused */
    char *report;       /* one "FILE:LINE: FIELD: REASON" line per refused line (NUL-terminated, may be NULL) */
    size_t report_len;
} k3c_traj_set;

/* Reads a JSONL file of conversations, one object per line: {"messages": [...], "tools": [...]?, "options": {...}?,
 * "id"?, "meta"?}. Messages are OpenAI-style (system / user / assistant with content, reasoning_content and
 * tool_calls / tool with tool_call_id) plus {"role": "state", "content": ...} snapshots (rendered as a system message
 * named "state", masked). A malformed line is reported in out->report (file, line, field, reason) and skipped, never
 * trained on; only an unreadable file or no usable line at all is an error. */
int k3c_traj_load_jsonl(const char *path, const k3c_tok *tok, const k3c_traj_opts *o, k3c_traj_set *out, k3c_err *err);
void k3c_traj_set_free(k3c_traj_set *s);

/* A packed SFT batch: whole trajectories laid end to end, each a document (cu_seqlens resets every sequence mixer),
 * targets[t] = ids[t+1] where the next token is in the same trajectory and masked 1, else -1. Feed it to the model
 * as a k3c_model_batch. */
typedef struct {
    int64_t T, cap;
    int n_docs, cap_docs;
    int32_t *ids, *targets, *cu_seqlens;
    int64_t n_counted; /* targets that are not -1 */
} k3c_packed;
/* Packs trajectories t[*next], t[*next+1], ... while they fit in seq_len tokens (at least one, which must fit:
 * K3C_EINVAL naming it otherwise), advancing *next (wrapping to 0 at the end). */
int k3c_traj_pack(const k3c_traj *t, size_t n, size_t *next, int64_t seq_len, k3c_packed *out, k3c_err *err);
void k3c_packed_free(k3c_packed *p);

/* Sandbox: untrusted code (a verifier's unit tests) in a separate process with a private temporary directory (removed
 * afterwards), rlimits (CPU seconds, address space, file size, process count, open files), a wall-clock timeout that
 * kills the whole process group, no network (a new network namespace; seccomp refuses sockets), writes and reads
 * confined to its directory plus the read-only system (Landlock), as user nobody when started as root (the kernel
 * exempts root from the process limit). Whatever the kernel refuses is left out and reported in `protections`. */
enum {
    K3C_SBX_TMPDIR = 1,
    K3C_SBX_RLIMITS = 2,
    K3C_SBX_TIMEOUT = 4,
    K3C_SBX_NETNS = 8,
    K3C_SBX_USERNS = 16,
    K3C_SBX_UID_DROP = 32,
    K3C_SBX_SECCOMP = 64,
    K3C_SBX_LANDLOCK = 128,
};
typedef struct {
    double cpu_s, wall_s; /* RLIMIT_CPU (whole seconds, at least 1) and the wall-clock timeout */
    int64_t mem_bytes;    /* RLIMIT_AS */
    int64_t fsize_bytes;  /* RLIMIT_FSIZE */
    int64_t nproc;        /* RLIMIT_NPROC */
    size_t max_output;    /* stdout + stderr bytes kept (0 = 64 KiB); the rest is drained and `truncated` set */
    char tmp_root[1024];  /* where the private directory is made ("" = /tmp) */
} k3c_sandbox_limits;
typedef struct {
    const char *name; /* a plain file name inside the sandbox directory */
    const char *content;
} k3c_sandbox_file;
typedef struct {
    int exited, exit_code, signal, timed_out, truncated;
    char *out; /* stdout and stderr interleaved, NUL-terminated */
    size_t out_len;
    double wall_s;
    unsigned protections; /* K3C_SBX_* actually in force */
} k3c_sandbox_result;
/* Runs argv (argv[0] an absolute path) in a fresh directory holding `files`, with stdin_text (NULL = empty, at most
 * 60,000 bytes) on standard input. Errors are about the host (directory, fork, exec); the program's own failure is
 * in the result. */
int k3c_sandbox_run(const k3c_sandbox_limits *l, const char *const argv[], const k3c_sandbox_file *files, int nfiles,
                    const char *stdin_text, k3c_sandbox_result *r, k3c_err *err);
void k3c_sandbox_result_free(k3c_sandbox_result *r);
/* "tmpdir rlimits timeout netns ..." */
void k3c_sandbox_protections_str(unsigned protections, char *buf, size_t n);

/* Verifiers: pure functions of (response, ground truth) giving a reward in [0, 1] = the weighted mean of named
 * components (TRAINING.md §5.2). */
#define K3C_REWARD_MAX_COMPONENTS 8
typedef struct {
    char name[24];
    double value, weight;
} k3c_reward_component;
typedef struct {
    double reward;
    int n;
    k3c_reward_component c[K3C_REWARD_MAX_COMPONENTS];
    char info[256]; /* why, in words ("3/5 tests", "call 1 (get_weather): $.units: expected one of [...]") */
} k3c_reward;
/* Appends a component and recomputes reward. */
void k3c_reward_add(k3c_reward *r, const char *name, double value, double weight);
/* Exact answer: the text after the last "####" (else after the last "answer:", else all of it), first line; numbers
 * compare by value ("1,234", "$5", "3.50", "1/2"; relative 1e-9), other strings after lower-casing, collapsing
 * whitespace and dropping final punctuation. Component "answer". */
void k3c_verify_answer(const char *response, const char *truth, k3c_reward *out);
/* Format validity of model output in XTML (what follows the generation prompt; in_think: the prompt opened the think
 * channel): "xtml" = it parses and the message is closed; "tool_args" = the fraction of tool calls naming a declared
 * tool whose arguments are an object matching its JSON schema (type, required, properties, additionalProperties,
 * enum, items); 1 when there are no calls. tools_json: the OpenAI tools array (NULL: none declared). Errors only for
 * malformed tools_json. */
int k3c_verify_format(const char *output, size_t n, const char *tools_json, int in_think, k3c_reward *out,
                      k3c_err *err);
/* Python `solution` run in the sandbox against cases_json = [[expression, expected repr], ...]: component "tests" =
 * fraction passed ("loads", weight 0: the solution executed). Results are read only from lines tagged with a nonce
 * (from nonce_seed) the harness reads before the solution runs. */
int k3c_verify_code(const char *solution, const char *cases_json, const k3c_sandbox_limits *l, uint64_t nonce_seed,
                    k3c_reward *out, k3c_err *err);

/* RL objectives (TRAINING.md §3): group-relative advantages and the clipped surrogate, on host arrays. */
#define K3C_RL_EPS_STD 1e-6 /* added to the group std (verl) */
/* Advantages of n_groups groups of G rewards (group-major): r − mean, divided by (std + 1e-6) when std_norm (GRPO;
 * std unbiased as torch.std in verl / TRL: [1, 0, 1, 0] → ±0.866) or not (Dr. GRPO). A group whose rewards are all
 * equal gets advantage 0 and keep[g] = 0 (dropped, DAPO dynamic sampling); a group of one: mean 0, std 1 (verl).
 * keep may be NULL. Returns the number of zero-variance groups. */
int k3c_rl_advantages(const double *rewards, int n_groups, int G, int std_norm, double *adv, uint8_t *keep);
/* DAPO dynamic sampling over one draw of n_groups groups of G rewards: appends to sel the indices of the groups whose
 * rewards are not all equal, in order, while *n_sel < want (*n_sel counts what earlier draws kept); returns the number
 * of flat groups in this draw (all of them counted, also those after the batch was full). */
int k3c_rl_select_groups(const double *rewards, int n_groups, int G, int want, int *sel, int *n_sel);
/* Unbiased pass@k of one task from n samples of which c are correct: 1 − C(n−c, k) / C(n, k) (k <= n). */
double k3c_rl_pass_at_k(int n, int c, int k);
/* DAPO overlong shaping added to a reward: 0 up to max_len − buffer, then linear down to −factor at max_len. */
double k3c_rl_overlong_penalty(int64_t len, int64_t max_len, int64_t buffer, double factor);
/* log p(y) and the entropy of softmax(logits[V]) in float64. */
void k3c_logp_entropy(const float *logits, int64_t V, int32_t y, double *logp, double *entropy);

typedef enum {
    K3C_RL_TOKEN_MEAN = 0, /* DAPO: Σ m l / Σ m over the batch */
    K3C_RL_SEQ_MEAN = 1,   /* GRPO: mean over sequences of each sequence's token mean */
    K3C_RL_CONST_NORM = 2, /* Dr. GRPO: Σ m l / (B · max_len) */
} k3c_rl_agg;
typedef struct {
    double eps_low, eps_high; /* clip(ρ, 1 − eps_low, 1 + eps_high); DAPO clip-higher: 0.2, 0.28 */
    double beta;              /* k3 KL to the reference (0 = none) */
    int agg;                  /* k3c_rl_agg */
    int64_t max_len;          /* K3C_RL_CONST_NORM's L_max */
    double tis_cap;           /* truncated importance sampling: weight min(π_old / π_rollout, tis_cap); 0 = off */
} k3c_rl_loss_opts;
/* B sequences of tokens laid end to end: sequence i is [off[i], off[i+1]). Per token: log-probs of the sampled token
 * under the policy being trained, the rollout policy (π_old) and the frozen reference (NULL when beta = 0); mask 1 on
 * sampled tokens (0 on prompt and observation tokens). adv: one advantage per sequence. */
typedef struct {
    int B;
    const int64_t *off;
    const double *logp, *logp_old, *logp_ref;
    const uint8_t *mask;
    const double *adv;
    const double *logp_rollout; /* the rollout engine's log-probs of the sampled tokens (needed when tis_cap > 0) */
} k3c_rl_tokens;
typedef struct {
    double loss;
    double kl;                  /* mean k3 estimate over masked tokens (also when beta = 0, if logp_ref given) */
    double clip_low, clip_high; /* fractions of masked tokens where the lower / upper clip took the gradient away */
    double ratio_mean;
    int64_t n_tokens;            /* masked tokens */
    double tis_mean, tis_capped; /* mean TIS weight, fraction of masked tokens at the cap (tis_cap > 0) */
} k3c_rl_loss_stats;
/* L = agg over tokens of −w·min(ρA, clip(ρ)A) + β·(e^{ref−logp} − (ref−logp) − 1), ρ = e^{logp − logp_old},
 * w = min(e^{logp_old − logp_rollout}, tis_cap) (verl's TIS, a constant of the gradient; w = 1 when tis_cap = 0), and
 * dlogp[k] = ∂L/∂logp[k] (NULL: not needed; 0 off the mask). The gradient w.r.t. token k's logits is
 * dlogp[k]·(onehot(y) − softmax): a cross-entropy backward with per-token weight −dlogp[k]. */
int k3c_rl_loss(const k3c_rl_tokens *t, const k3c_rl_loss_opts *o, double *dlogp, k3c_rl_loss_stats *s, k3c_err *err);

/* Environments (docs/POST.md "Environments"): tasks generated in C, deterministic by (seed, split, index), with
 * disjoint train (split 0) and held-out (split 1) sets. Kinds: "arith" (multi-step word problems, answer verifier),
 * "arith_tool" (the same with a calculator tool), "code" (Python string / list functions checked by unit tests in the
 * sandbox), "assistant" (simulated days with calendar, to-dos, notes and a clock; preferences revealed over time;
 * scored on the final state and milestones), "vfs" (goals in a virtual file system with list / read / write / delete
 * / run_check tools; scored on the artifact and key intermediate steps). */
typedef struct k3c_env k3c_env;
int k3c_env_new(const char *kind, uint64_t seed, int split, int64_t index, k3c_env **out, k3c_err *err);
void k3c_env_free(k3c_env *e);
const char *k3c_env_system(const k3c_env *e);
const char *k3c_env_user(const k3c_env *e);
const char *k3c_env_tools(const k3c_env *e); /* the OpenAI tools JSON array, NULL when the task has none */
/* [{"role":"system",...},{"role":"user",...}] as JSON text (malloc'd; NULL when out of memory). */
char *k3c_env_messages(const k3c_env *e);
/* Executes one tool call; *obs (malloc'd) is what the environment answers, "error: ..." for an unknown tool, bad
 * arguments or a call after the end (counted as a bad call, never an error of the rollout). */
int k3c_env_step(k3c_env *e, const char *tool, const char *args_json, char **obs, k3c_err *err);
int k3c_env_done(const k3c_env *e); /* the environment ended the episode (e.g. the last simulated day passed) */
/* Scores the episode from its state and the model's final answer text. */
void k3c_env_score(k3c_env *e, const char *final_answer, k3c_reward *out);
/* An expert solution as one SFT conversation {"messages": [system, user, expert turns...], "tools": [...]} (JSON
 * text, malloc'd), the format k3c_traj_load_jsonl reads. Does not change e. */
int k3c_env_reference(k3c_env *e, char **conversation, k3c_err *err);

/* SFT (`k3c sft --config RUN.json`): fine-tunes a k3c or Hugging Face checkpoint on JSONL trajectories with the loss on
 * the model's own tokens; checkpoints, resume, metrics and options as `k3c train` (k3c_train_opts). */
typedef struct {
    char path[1024];
    char init[1024];      /* checkpoint dir: config.json + safetensors (+ tokenizer unless `tokenizer` is given) */
    char tokenizer[1024]; /* "" = the init dir's tokenizer */
    char pattern[16];     /* "" = the tokenizer's own */
    char data[1024], val_data[1024], out_dir[1024];
    int format, thinking; /* k3c_traj_opts */
    int64_t seq_len, steps, warmup, log_every, eval_every, eval_batches, checkpoint_every, keep_checkpoints;
    double lr, min_lr_ratio;
    int schedule; /* "cosine" (default), "linear", "constant" */
    char matrix_optimizer[16];
    double weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    int kda_chunk, threads;
} k3c_sft_config;
/* Strict: unknown keys, a missing init / data / out_dir / steps, negative numbers are errors naming file and field;
 * relative paths are relative to the config file. */
int k3c_sft_config_load(const char *path, k3c_sft_config *c, k3c_err *err);
typedef struct {
    int64_t steps, n_traj, bad_lines;
    double first_loss, last_loss, last_val_loss, tokens_per_s, wall_s;
} k3c_sft_result;
int k3c_sft_run(const k3c_sft_config *c, const k3c_train_opts *o, k3c_sft_result *r, k3c_err *err);

/* Rollouts (RL): multi-turn episodes of a policy in an environment, in XTML. */
typedef struct {
    /* Appends at most max_new sampled ids to seq[0..n) (seq has room for n + max_new), stopping after `stop`;
     * *got = ids appended. */
    int (*generate)(void *ctx, int32_t *seq, int64_t n, int64_t max_new, int32_t stop, int64_t *got, k3c_err *err);
    void *ctx;
} k3c_policy;
/* The model sampling with k3c_generate (free with k3c_policy_free). */
int k3c_policy_from_model(k3c_model *m, const k3c_sampler *s, k3c_policy *out, k3c_err *err);
void k3c_policy_free(k3c_policy *p);
typedef struct {
    int max_turns;            /* assistant turns */
    int64_t max_tokens;       /* the whole episode (prompt + turns + observations) */
    int64_t max_new_per_turn; /* ids sampled per turn */
    int thinking;             /* XTML think channel in the generation prompts */
} k3c_rollout_opts;
typedef struct {
    int32_t *ids;  /* the episode as the model saw it: sampled ids exactly as sampled */
    uint8_t *mask; /* 1 on sampled ids, 0 on the prompt, tool results (observations) and generation prompts */
    float *logp;   /* the sampler's log-probability of each sampled id under the model's raw distribution
                      (k3c_rollout_batch on the engine); 0 elsewhere and from k3c_rollout's policy */
    int64_t n, cap, n_prompt;
    int32_t eos;
    int turns, tool_calls, format_ok_turns, format_valid, truncated;
    k3c_reward reward; /* the environment's score of the final state and answer */
    char info[256];    /* the first format problem, if any */
} k3c_episode;
/* Runs one episode: renders the environment's prompt (+ tools) with the generation prompt, then per turn samples up
 * to max_new_per_turn ids (stop: <|end_of_msg|>), parses them (XTML), and when the turn closed with tool calls, steps
 * the environment with each call and appends the tool messages and the next generation prompt with mask 0. It ends
 * on an answer without calls, an unparsable or unclosed turn, max_turns or max_tokens (truncated = 1), then scores. */
int k3c_rollout(k3c_env *env, const k3c_tok *tok, const k3c_policy *pol, const k3c_rollout_opts *o, k3c_episode *ep,
                k3c_err *err);
/* n episodes at once, envs[i] sampled with samplers[i], each exactly as k3c_rollout would run it: a float32 CPU model
 * decodes them together on one inference engine (continuous batching; a turn that ends with tool calls is answered
 * and the episode resubmitted, resuming from the engine's prefix snapshots) and records each sampled id's logprob;
 * on another backend they run one after another through k3c_generate. On failure no episode is left allocated. */
int k3c_rollout_batch(k3c_model *m, k3c_env *const *envs, const k3c_sampler *samplers, int n, const k3c_tok *tok,
                      const k3c_rollout_opts *o, int threads, k3c_episode *eps, k3c_err *err);
void k3c_episode_free(k3c_episode *ep);

/* RL (`k3c rl --config RUN.json`): per step, group_size rollouts of each of prompts_per_step training tasks of
 * environment `env` decoded together (k3c_rollout_batch), verifier rewards (+ DAPO overlong penalty), group-relative
 * advantages with zero-variance groups dropped, ppo_epochs clipped policy-gradient updates against π_old (+ the k3 KL
 * to the frozen init when beta > 0), each one weighted backward per sequence (k3c_model_batch.weight = −∂L/∂logp);
 * held-out evaluation with greedy decoding. */
typedef struct {
    char path[1024], init[1024], out_dir[1024], env[32];
    int64_t steps, prompts_per_step, group_size, max_tokens, max_new;
    int max_turns, thinking, std_norm; /* std_norm: "advantage": "grpo" (1, default) or "dr_grpo" (0) */
    int format_gate; /* "format_gate" (default true): an episode whose output is not valid XTML scores 0 */
    double temperature, top_p, lr, grad_clip, overlong_penalty;
    int64_t overlong_buffer, eval_every, eval_episodes, checkpoint_every, keep_checkpoints;
    k3c_rl_loss_opts loss; /* "loss_agg": token_mean (default) | seq_mean | const; eps_low, eps_high; beta >= 0 */
    int matrix_optimizer;  /* 0 muon, 1 adamw (default) */
    uint64_t seed;
    int kda_chunk, threads;
    int64_t ppo_epochs;   /* policy updates per batch of rollouts (1 = on-policy) */
    int dynamic_sampling; /* DAPO: draw batches of prompts_per_step prompts until prompts_per_step groups have reward
                             variance, at most max_draws batches per step (default off: one batch, flat groups dropped) */
    int64_t max_draws;
    int64_t pass_k, pass_n, pass_tasks; /* at each evaluation: greedy pass@1 and unbiased pass@k from pass_n samples
                                           (temperature) of the first pass_tasks training tasks; pass_k 0 = off */
} k3c_rl_config;
int k3c_rl_config_load(const char *path, k3c_rl_config *c, k3c_err *err);
typedef struct {
    int64_t steps, episodes;
    double first_eval_reward, last_eval_reward, last_eval_format, last_train_reward, wall_s;
    double pass1[2],
        pass_k[2]; /* greedy pass@1 and pass@k on the training tasks, first and last evaluation (NaN: off) */
} k3c_rl_result;
int k3c_rl_run(const k3c_rl_config *c, const k3c_train_opts *o, k3c_rl_result *r, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
