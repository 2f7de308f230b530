/* base.h — internal to k3c (not part of the public include/k3c.h): the base services every part shares — bf16/f16
 * conversion, aligned blocks, the counter-based rng, monotonic time, the progress bar and whole-file reads / writes. */
#ifndef K3C_BASE_BASE_H
#define K3C_BASE_BASE_H

#include "k3c.h"
#include "k3c/post.h"
#include "k3c/serve.h"
#include "k3c/train.h"
#include "k3c/vision.h"
#include "k3c/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- dtype conversion */
float k3c_bf16_to_f32(uint16_t h);
uint16_t k3c_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float k3c_f16_to_f32(uint16_t h);
uint16_t k3c_f32_to_f16(float f);
/* Converts n elements of any floating dtype (F64 F32 BF16 F16) to float / double. */
int k3c_convert_to_f32(k3c_dtype t, const void *src, float *dst, size_t n);
int k3c_convert_to_f64(k3c_dtype t, const void *src, double *dst, size_t n);

/* ---------------------------------------------------------------- aligned blocks */
void *k3c_aligned_alloc(size_t bytes); /* 64-aligned, zeroed; free with k3c_aligned_free */
void k3c_aligned_free(void *p);

/* ---------------------------------------------------------------- rng
 * Counter-based (Philox-4x32-10): value i of stream `seed` is a pure function of (seed, i), so initialisation is
 * reproducible regardless of thread count and a checkpoint only needs (seed, counter). */
typedef struct {
    uint64_t seed;
    uint64_t counter;
} k3c_rng;

void k3c_philox(uint64_t seed, uint64_t counter, uint32_t out[4]);
/* splitmix64's finaliser: independent sub-seeds (data splits, streams, task draws) from one seed */
uint64_t k3c_mix64(uint64_t x);
uint64_t k3c_rng_u64(k3c_rng *r);
double k3c_rng_uniform(k3c_rng *r);               /* [0, 1) with 53 random bits */
double k3c_rng_normal(k3c_rng *r);                /* standard normal (Box-Muller on two uniforms) */
double k3c_uniform_at(uint64_t seed, uint64_t i); /* stateless: the i-th uniform of stream seed */
double k3c_normal_at(uint64_t seed, uint64_t i);

/* ---------------------------------------------------------------- time, progress, files */
double k3c_now(void); /* monotonic seconds */

/* A one-line progress bar: "label [#####.....] 12/100 45.0 tok/s ETA 0:02:13 | extra". Silent unless `out` is a
 * terminal (or force is set); the last state is always available through k3c_progress_line. */
typedef struct {
    char label[32];
    int64_t total, done;
    double t0, last_draw;
    double units;          /* items counted for the rate (e.g. tokens) */
    const char *unit_name; /* e.g. "tok" */
    int enabled;
    FILE *out;
} k3c_progress;
void k3c_progress_init(k3c_progress *p, const char *label, int64_t total, const char *unit_name, FILE *out, int force);
void k3c_progress_update(k3c_progress *p, int64_t done, double units, const char *extra);
void k3c_progress_finish(k3c_progress *p, const char *extra);
int k3c_progress_line(const k3c_progress *p, const char *extra, char *buf, size_t n);

/* ---------------------------------------------------------------- checked sizes, available memory
 * Sizes derived from files (configs, headers) are computed with overflow checks, and a command compares what it is about
 * to allocate with what the machine has, so a hostile or mistyped file fails fast with a message instead of an OOM kill. */
static inline int k3c_mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline int k3c_add_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }
/* Bytes available to new allocations: MemAvailable of /proc/meminfo, else free physical pages (sysconf). */
uint64_t k3c_mem_available(void);
/* K3C_ENOMEM "<what> needs X GiB of memory but the machine has Y GiB available" when bytes > k3c_mem_available(). */
int k3c_mem_check(uint64_t bytes, const char *what, k3c_err *err);

/* ---------------------------------------------------------------- checksums
 * FNV-1a 64 (token shards, checkpoint files). A k3c checkpoint directory carries checksums.json: {"algorithm":
 * "fnv1a64", "files": {"model.safetensors": "<16 hex digits>", ...}}, written last (before the directory is renamed into
 * place) and verified by every reader of the directory. */
#define K3C_FNV1A64_INIT 0xcbf29ce484222325ull
#define K3C_CHECKSUMS_FILE "checksums.json"
/* FNV-1a 64 over p[0..n), continuing from h (start with K3C_FNV1A64_INIT). */
uint64_t k3c_fnv1a64(const void *p, size_t n, uint64_t h);
int k3c_file_fnv1a64(const char *path, uint64_t *h, k3c_err *err);
/* Writes dir/checksums.json (atomically) with the checksum of each of dir/files[0..n). */
int k3c_checksums_write(const char *dir, const char *const *files, int n, k3c_err *err);
/* Verifies every file dir/checksums.json lists; a mismatch is K3C_EFORMAT naming the file and saying "checksum".
 * Without checksums.json (a checkpoint not written by k3c) there is nothing to verify: K3C_OK, *n_files = -1. */
int k3c_checksums_verify(const char *dir, int *n_files, k3c_err *err);

/* Atomic file writes: write to "<path>.tmp.<pid>", fsync, rename over path, fsync the directory. */
int k3c_write_file_atomic(const char *path, const void *data, size_t n, k3c_err *err);
/* Reads a whole file (NUL-terminated for convenience); free with free(). */
int k3c_read_file(const char *path, char **data, size_t *n, k3c_err *err);

#ifdef __cplusplus
}
#endif
#endif
