/* sandbox.c — runs untrusted code (a verifier's unit tests) in a separate process: private temp dir, rlimits, wall-clock
 * timeout, no network (net namespace + seccomp), writes confined to its dir (Landlock), reports what is active. POST.md. */
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOBODY 65534

/* ---------------------------------------------------------------- prepared in the parent
 * The filter and the ruleset are built before fork: between fork and exec the child of a threaded process may only
 * make system calls, not allocate. */

typedef struct {
    struct sock_filter *bpf;
    unsigned short nbpf;
    int landlock_fd; /* -1: Landlock unavailable */
} prep;

static int deny(scmp_filter_ctx c, int sys) { return seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), sys, 0); }

/* Default allow, deny the calls an escape needs: sockets (network), namespaces and mounts, tracing, keyrings, BPF,
 * leaving the process group (the timeout kills the group), privilege changes. */
static int build_seccomp(prep *p, k3c_err *err) {
    scmp_filter_ctx c = seccomp_init(SCMP_ACT_ALLOW);
    if (!c) return k3c_errf(err, K3C_ENOMEM, "sandbox: seccomp_init failed");
    int calls[] = {SCMP_SYS(socket),
                   SCMP_SYS(socketpair),
                   SCMP_SYS(connect),
                   SCMP_SYS(bind),
                   SCMP_SYS(listen),
                   SCMP_SYS(accept),
                   SCMP_SYS(accept4),
                   SCMP_SYS(ptrace),
                   SCMP_SYS(mount),
                   SCMP_SYS(umount2),
                   SCMP_SYS(unshare),
                   SCMP_SYS(setns),
                   SCMP_SYS(chroot),
                   SCMP_SYS(pivot_root),
                   SCMP_SYS(keyctl),
                   SCMP_SYS(add_key),
                   SCMP_SYS(request_key),
                   SCMP_SYS(bpf),
                   SCMP_SYS(perf_event_open),
                   SCMP_SYS(setsid),
                   SCMP_SYS(setpgid),
                   SCMP_SYS(setuid),
                   SCMP_SYS(setgid),
                   SCMP_SYS(setreuid),
                   SCMP_SYS(setresuid),
                   SCMP_SYS(process_vm_readv),
                   SCMP_SYS(process_vm_writev),
                   SCMP_SYS(init_module),
                   SCMP_SYS(finit_module),
                   SCMP_SYS(kexec_load),
                   SCMP_SYS(reboot),
                   SCMP_SYS(personality),
                   SCMP_SYS(userfaultfd),
                   SCMP_SYS(io_uring_setup)};
    int rc = 0;
    for (size_t i = 0; i < sizeof calls / sizeof *calls && !rc; i++) rc = deny(c, calls[i]);
    /* A new user namespace via clone(CLONE_NEWUSER) would regain capabilities inside it. */
    if (!rc)
        rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS,
                                      CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS));
    if (!rc) rc = seccomp_rule_add(c, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    int fds[2] = {-1, -1};
    if (!rc && pipe(fds)) rc = -errno;
    if (!rc) rc = seccomp_export_bpf(c, fds[1]);
    if (fds[1] >= 0) close(fds[1]);
    seccomp_release(c);
    if (rc) {
        if (fds[0] >= 0) close(fds[0]);
        return k3c_errf(err, K3C_EUNSUPPORTED, "sandbox: building the seccomp filter failed (%d)", rc);
    }
    size_t cap = 4096 * sizeof(struct sock_filter);
    p->bpf = malloc(cap);
    ssize_t n = p->bpf ? read(fds[0], p->bpf, cap) : -1;
    close(fds[0]);
    if (n <= 0 || n % sizeof(struct sock_filter)) return k3c_errf(err, K3C_EUNSUPPORTED, "sandbox: no seccomp program");
    p->nbpf = (unsigned short)(n / sizeof(struct sock_filter));
    return K3C_OK;
}

static void landlock_allow(int rs, const char *path, uint64_t access) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return;
    struct landlock_path_beneath_attr a = {.allowed_access = access, .parent_fd = fd};
    syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH, &a, 0);
    close(fd);
}

/* Everything under dir; read + execute of the system (interpreter, libraries, /etc, /dev/null); nothing else: the
 * parent's files (the workspace, home directories, /tmp) are neither readable nor writable. */
static void build_landlock(prep *p, const char *dir) {
    p->landlock_fd = -1;
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 1) return;
    uint64_t all = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1; /* ABI 1 rights */
    if (abi >= 2) all |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3) all |= 1ULL << 14; /* LANDLOCK_ACCESS_FS_TRUNCATE (ABI 3; not in every header) */
    struct landlock_ruleset_attr ra = {.handled_access_fs = all};
    int rs = (int)syscall(SYS_landlock_create_ruleset, &ra, sizeof ra, 0);
    if (rs < 0) return;
    uint64_t rx = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
    const char *sys[] = {"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"};
    for (size_t i = 0; i < sizeof sys / sizeof *sys; i++) landlock_allow(rs, sys[i], rx);
    landlock_allow(rs, "/dev/null", LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE);
    landlock_allow(rs, "/dev/urandom", LANDLOCK_ACCESS_FS_READ_FILE);
    landlock_allow(rs, dir, all);
    p->landlock_fd = rs;
}

/* ---------------------------------------------------------------- the child */

static void child_fail(int st, int code) {
    int v = -code;
    if (write(st, &v, sizeof v) < 0) {}
    _exit(127);
}

static void set_limit(int res, rlim_t v) {
    struct rlimit r = {v, v};
    setrlimit(res, &r);
}

/* Runs in the forked child: only system calls from here to execve. st: the status pipe (CLOEXEC) that receives the
 * active protections, or an errno on failure. */
static void child(const char *dir, char *const argv[], char *const envp[], const k3c_sandbox_limits *l, const prep *p,
                  int in_fd, int out_fd, int st) {
    unsigned active = K3C_SBX_TMPDIR | K3C_SBX_RLIMITS | K3C_SBX_TIMEOUT;
    setpgid(0, 0);
    int root = geteuid() == 0;
    if (!root && unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0) active |= K3C_SBX_NETNS | K3C_SBX_USERNS;
    if (root && unshare(CLONE_NEWNET) == 0) active |= K3C_SBX_NETNS;
    if (chdir(dir)) child_fail(st, errno);
    /* As root the process limit would not apply (the kernel exempts uid 0): run as nobody. */
    if (root) {
        if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) child_fail(st, errno);
        active |= K3C_SBX_UID_DROP;
    }
    set_limit(RLIMIT_CPU, (rlim_t)(l->cpu_s > 0 ? l->cpu_s : 1));
    set_limit(RLIMIT_AS, (rlim_t)l->mem_bytes);
    set_limit(RLIMIT_FSIZE, (rlim_t)l->fsize_bytes);
    set_limit(RLIMIT_NPROC, (rlim_t)l->nproc);
    set_limit(RLIMIT_NOFILE, 64);
    set_limit(RLIMIT_CORE, 0);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0) child_fail(st, errno);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) child_fail(st, errno);
    if (p->landlock_fd >= 0 && syscall(SYS_landlock_restrict_self, p->landlock_fd, 0) == 0) active |= K3C_SBX_LANDLOCK;
    struct sock_fprog prog = {.len = p->nbpf, .filter = p->bpf};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0) active |= K3C_SBX_SECCOMP;
    if (write(st, &active, sizeof active) < 0) _exit(127);
    for (int fd = 3; fd < 1024; fd++)
        if (fd != st) close(fd);
    execve(argv[0], argv, envp);
    child_fail(st, errno);
}

/* ---------------------------------------------------------------- the parent */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static int write_files(const char *dir, const k3c_sandbox_file *files, int nfiles, k3c_err *err) {
    for (int i = 0; i < nfiles; i++) {
        if (strchr(files[i].name, '/') || !strcmp(files[i].name, "..") || !files[i].name[0])
            return k3c_errf(err, K3C_EINVAL, "sandbox: file name \"%s\": a plain name inside the directory",
                            files[i].name);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        FILE *f = fopen(path, "wb");
        if (!f) return k3c_errf(err, K3C_EIO, "sandbox: %s: %s", path, strerror(errno));
        size_t n = strlen(files[i].content);
        int ok = fwrite(files[i].content, 1, n, f) == n;
        ok &= fclose(f) == 0;
        if (!ok) return k3c_errf(err, K3C_EIO, "sandbox: writing %s failed", path);
        if (geteuid() == 0 && chown(path, NOBODY, NOBODY))
            return k3c_errf(err, K3C_EIO, "sandbox: chown %s: %s", path, strerror(errno));
    }
    return K3C_OK;
}

/* Collects output (up to max_output bytes, the rest drained) until the child closes it or the deadline passes. */
static void collect(int fd, pid_t pid, double deadline, const k3c_sandbox_limits *l, k3c_sandbox_result *r) {
    size_t cap = l->max_output ? l->max_output : 65536;
    r->out = malloc(cap + 1);
    r->out_len = 0;
    char sink[4096];
    for (;;) {
        double left = deadline - k3c_now();
        if (left <= 0) {
            r->timed_out = 1;
            kill(-pid, SIGKILL);
            break;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        size_t room = r->out ? cap - r->out_len : 0;
        ssize_t n = room ? read(fd, r->out + r->out_len, room) : read(fd, sink, sizeof sink);
        if (n <= 0) break;
        if (room)
            r->out_len += (size_t)n;
        else
            r->truncated = 1;
    }
    if (r->out) r->out[r->out_len] = 0;
}

int k3c_sandbox_run(const k3c_sandbox_limits *l, const char *const argv[], const k3c_sandbox_file *files, int nfiles,
                    const char *stdin_text, k3c_sandbox_result *r, k3c_err *err) {
    *r = (k3c_sandbox_result){0};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/k3c-sbx-XXXXXX", l->tmp_root[0] ? l->tmp_root : "/tmp");
    if (!mkdtemp(dir)) return k3c_errf(err, K3C_EIO, "sandbox: mkdtemp %s: %s", dir, strerror(errno));
    prep p = {0};
    int rc = build_seccomp(&p, err);
    build_landlock(&p, dir);
    if (!rc && geteuid() == 0 && chown(dir, NOBODY, NOBODY)) rc = k3c_errf(err, K3C_EIO, "sandbox: chown %s", dir);
    if (!rc) rc = write_files(dir, files, nfiles, err);
    int io[2] = {-1, -1}, in[2] = {-1, -1}, st[2] = {-1, -1};
    if (!rc && (pipe2(io, O_CLOEXEC) || pipe2(in, O_CLOEXEC) || pipe2(st, O_CLOEXEC)))
        rc = k3c_errf(err, K3C_EIO, "sandbox: pipe: %s", strerror(errno));
    size_t nin = stdin_text ? strlen(stdin_text) : 0;
    if (!rc && nin > 60000) rc = k3c_errf(err, K3C_EINVAL, "sandbox: stdin text over 60000 bytes");
    char *envp[] = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1", "PYTHONHASHSEED=0", NULL, NULL};
    char home[4200];
    snprintf(home, sizeof home, "HOME=%s", dir);
    envp[4] = home;
    double t0 = k3c_now();
    pid_t pid = -1;
    if (!rc) {
        if (nin && write(in[1], stdin_text, nin) != (ssize_t)nin) rc = k3c_errf(err, K3C_EIO, "sandbox: stdin");
        close(in[1]);
        in[1] = -1;
    }
    if (!rc && (pid = fork()) < 0) rc = k3c_errf(err, K3C_EIO, "sandbox: fork: %s", strerror(errno));
    if (!rc && pid == 0) child(dir, (char *const *)argv, envp, l, &p, in[0], io[1], st[1]);
    int parent_closes[] = {io[1], st[1], in[0]};
    for (int i = 0; i < 3; i++)
        if (parent_closes[i] >= 0) close(parent_closes[i]);
    if (!rc) {
        setpgid(pid, pid); /* both sides set it, so the group exists before the first kill */
        collect(io[0], pid, t0 + (l->wall_s > 0 ? l->wall_s : 10), l, r);
        int status = 0;
        waitpid(pid, &status, 0);
        kill(-pid, SIGKILL); /* strays (forked children) die with the group */
        r->wall_s = k3c_now() - t0;
        /* The protections, then a negative errno if the child failed before or at execve. */
        int v[2] = {0, 0};
        size_t got = 0;
        for (ssize_t n; got < sizeof v && (n = read(st[0], (char *)v + got, sizeof v - got)) > 0;) got += (size_t)n;
        int failed = got >= sizeof(int) && v[got / sizeof(int) - 1] < 0;
        if (failed) {
            rc =
                k3c_errf(err, K3C_EIO, "sandbox: starting %s failed: %s", argv[0], strerror(-v[got / sizeof(int) - 1]));
        } else {
            r->protections = got >= sizeof(int) ? (unsigned)v[0] : 0;
            r->exited = WIFEXITED(status);
            r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            r->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        }
    }
    if (io[0] >= 0) close(io[0]);
    if (st[0] >= 0) close(st[0]);
    if (p.landlock_fd >= 0) close(p.landlock_fd);
    free(p.bpf);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc) k3c_sandbox_result_free(r);
    return rc;
}

void k3c_sandbox_result_free(k3c_sandbox_result *r) {
    if (!r) return;
    free(r->out);
    r->out = NULL;
    r->out_len = 0;
}

void k3c_sandbox_protections_str(unsigned p, char *buf, size_t n) {
    static const char *names[] = {"tmpdir", "rlimits", "timeout", "netns", "userns", "uid-drop", "seccomp", "landlock"};
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < 8; i++)
        if (p & (1u << i)) at += snprintf(buf + at, at < n ? n - at : 0, "%s%s", at ? " " : "", names[i]);
}
