/* cli.h — the k3c command table and small argument helpers shared by the command files (src/cli/cmd_*.c).
 * Only cli/ prints to the user and chooses exit codes. */
#ifndef K3C_CLI_H
#define K3C_CLI_H

#include "base/base.h"

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name; returns the process exit code */
} k3c_command;

/* Returns 1 if argv contains -h or --help. */
int cli_wants_help(int argc, char **argv);
/* Value of "--name VALUE" or "--name=VALUE"; NULL if absent. */
const char *cli_opt(int argc, char **argv, const char *name);
int cli_flag(int argc, char **argv, const char *name);
/* Parses an integer / double option with a default; on a bad number prints an error and returns 0. */
int cli_opt_int(int argc, char **argv, const char *name, long long def, long long *out);
int cli_opt_double(int argc, char **argv, const char *name, double def, double *out);
/* --kda 64|16|recurrent (default 64) → the KDA chunk (0 = the token recurrence); 0 when the value is none of these. */
int cli_kda_chunk(int argc, char **argv, int *chunk);
/* The i-th positional argument (not an option or an option's value); options taking values are listed in
 * value_opts (NULL-terminated). */
const char *cli_positional(int argc, char **argv, int i, const char *const *value_opts);
/* Prints "k3c <cmd>: <message>" to stderr and returns exit code 1 (2 for usage errors). */
int cli_fail(const char *cmd, const k3c_err *err);
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reads a trainer's metrics.jsonl and draws loss / validation loss, lr and load balance against step into png
 * (gnuplot, atomically; src/cli/plot.c). K3C_ENOTFOUND when gnuplot is not installed. */
int cli_plot_metrics(const char *jsonl, const char *png, k3c_err *err);
/* One panel per key of the metrics lines (1 to 8 keys) against step (the post-training runs). */
int cli_plot_panels(const char *jsonl, const char *png, const char *const *keys, int n, k3c_err *err);

/* Metrics files overlaid, one panel per key (1 to 4), one line per file coloured by its group (an arm). */
int cli_plot_overlay(const char *png, const char *const *jsonl, const char *const *label, const int *group, int n,
                     const char *const *keys, int n_keys, k3c_err *err);

/* --device cpu|cuda (src/cli/device.c): open the named backend (NULL or "cpu": the CPU, backend stays NULL), move
 * models onto it, and release it after every model and arena on it is freed. */
typedef struct {
    void *handle;        /* the k3c_device */
    const struct k3c_backend_f32 *backend; /* its table (k3c_device_backend), NULL for the CPU */
} cli_device;
/* --device cpu|cuda, --gemm fp32|tf32|bf16 (the CUDA GEMM mode) and --kernels bf16|fp16|fp32 (the CUDA KDA and
 * attention kernels) as given (NULL when absent). */
typedef struct {
    const char *name, *gemm, *kernels;
} cli_device_opts;
cli_device_opts cli_device_opts_get(int argc, char **argv);
/* 0, or prints a usage error and returns 2 */
int cli_device_check(const char *cmd, const cli_device_opts *o);
/* Opens --device (CUDA: the GPU numbered by the rank on its node under mpirun, cli_local_rank; else GPU 0). */
int cli_device_open(const cli_device_opts *o, cli_device *d, k3c_err *err);
/* This process's rank among the ranks of its node (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID), 0 without mpirun. */
int cli_local_rank(void);
int cli_device_use(const cli_device *d, k3c_model *m, k3c_err *err);
void cli_device_release(cli_device *d);

/* One line per command, defined next to each command's implementation. */
int cmd_inspect(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_check_kda(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_golden_check(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_xtml(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_vision(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_env(int argc, char **argv);
int cmd_rl(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_ablate(int argc, char **argv);

#endif
