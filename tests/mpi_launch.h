/* mpi_launch.h — how a test program checks itself on several MPI ranks: run as a plain program, it launches itself
 * under `mpirun -np N` (oversubscribed: CI has 2 cores; --allow-run-as-root as root; one OpenMP thread per rank), each
 * rank runs the checks and prints "rank R: N passed, N failed", and the launcher adds those to its own counts.
 * Include after test.h. */
#ifndef K3C_TEST_MPI_LAUNCH_H
#define K3C_TEST_MPI_LAUNCH_H

#include "parallel/comm.h"

/* The closing line of one rank (the launcher parses it; "N passed, N failed" alone is the launcher's). */
static inline void test_rank_summary(int rank) {
    printf("rank %d: %d passed, %d failed\n", rank, test_passed_, test_failed_);
    fflush(stdout);
}

/* The mpirun prefix for np ranks: oversubscribed, as root where needed, one thread per rank, no single-copy transport
 * (containers forbid the ptrace it needs); under the sanitizers (make test-asan) OpenMPI's own allocations, kept
 * until exit, are suppressed (tests/lsan_mpi.supp; full stacks so the suppressions see MPI's frames). */
static inline void test_mpirun_prefix(int np, char *buf, size_t n) {
    char cwd[2048];
    const char *asan = getenv("ASAN_OPTIONS");
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
    snprintf(buf, n,
             "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
             "ASAN_OPTIONS='%s%sfast_unwind_on_malloc=0' LSAN_OPTIONS='suppressions=%s/tests/lsan_mpi.supp:"
             "print_suppressions=0' mpirun --oversubscribe %s -np %d",
             asan ? asan : "", asan ? ":" : "", cwd, geteuid() == 0 ? "--allow-run-as-root" : "", np);
}

/* Runs `prog args` on np ranks, output (stdout and stderr) into out[n]; returns mpirun's exit status (-1: not run). */
static inline int test_mpirun_capture(int np, const char *prog, const char *args, char *out, size_t n) {
    char pre[4096], cmd[8192];
    test_mpirun_prefix(np, pre, sizeof pre);
    snprintf(cmd, sizeof cmd, "%s '%s' %s 2>&1", pre, prog, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t len = fread(out, 1, n - 1, p);
    out[len] = 0;
    while (fgetc(p) != EOF) {} /* the rest is dropped */
    return pclose(p);
}

/* Runs `self args` on np ranks; echoes the output (prefixed "  np=N | ") and adds every rank's counts. Fails when
 * mpirun is missing, a rank reports no summary, or mpirun exits non-zero. */
static inline void test_mpirun(const char *self, int np, const char *args) {
    char pre[4096], cmd[8192];
    test_mpirun_prefix(np, pre, sizeof pre);
    snprintf(cmd, sizeof cmd, "%s '%s' %s 2>&1", pre, self, args);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "cannot run %s", cmd);
    if (!p) return;
    char line[4096];
    int ranks = 0;
    while (fgets(line, sizeof line, p)) {
        int r, ok, bad;
        if (sscanf(line, "rank %d: %d passed, %d failed", &r, &ok, &bad) == 3) {
            test_passed_ += ok;
            test_failed_ += bad;
            ranks++;
        }
        printf("  np=%d | %s", np, line);
    }
    int st = pclose(p);
    CHECK(ranks == np, "np=%d: %d of %d ranks reported", np, ranks, np);
    CHECK(st == 0, "np=%d: mpirun exited with status %d", np, st);
}

/* The main of a test that checks itself on the self communicator and then on 2, 4, … up to max_np MPI ranks (doubling):
 * run_all(comm) holds the checks (a launched rank runs them on the MPI world and prints its summary). */
static inline int test_mpi_main_ranks(const char *self, void (*run_all)(k3c_comm *c), int max_np) {
    k3c_err err = {0};
    k3c_comm *c = NULL;
    int launched = k3c_comm_mpi_launched();
    CHECK_OK(launched ? k3c_comm_mpi_world(&c, &err) : k3c_comm_self(&c, &err), &err);
    if (c) {
        run_all(c);
        if (launched) test_rank_summary(c->rank);
        k3c_comm_free(c);
    }
    if (launched) {
        k3c_comm_mpi_finalize();
        return test_failed_ ? 1 : 0;
    }
    CHECK(k3c_comm_mpi_available(), "this build has no MPI (libopenmpi-dev is a dependency: tools/setup.sh)");
    for (int np = 2; k3c_comm_mpi_available() && np <= max_np; np *= 2) test_mpirun(self, np, "");
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ ? 1 : 0;
}

/* The same on 2 and 4 MPI ranks. */
static inline int test_mpi_main(const char *self, void (*run_all)(k3c_comm *c)) {
    return test_mpi_main_ranks(self, run_all, 4);
}

#endif
