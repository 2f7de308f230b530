/* test_post_sandbox.c — the verifier sandbox (src/post/sandbox.c): escape attempts fail (socket, writes and reads
 * outside its directory, fork bomb, memory bomb, infinite loop, sleeping past the timeout, oversized files) and the
 * protections the kernel allowed are reported. */
#include "test.h"

#include <sys/stat.h>

static k3c_sandbox_limits limits(void) {
    k3c_sandbox_limits l = {.cpu_s = 2, .wall_s = 10, .mem_bytes = 512 << 20, .fsize_bytes = 1 << 20, .nproc = 16};
    return l;
}

static k3c_sandbox_result py(const char *code, const k3c_sandbox_limits *l) {
    const char *argv[] = {"/usr/bin/python3", "-I", "main.py", NULL};
    k3c_sandbox_file f = {"main.py", code};
    k3c_sandbox_result r;
    k3c_err err = {0};
    int rc = k3c_sandbox_run(l, argv, &f, 1, NULL, &r, &err);
    CHECK(rc == K3C_OK, "%s", err.msg);
    if (rc) r = (k3c_sandbox_result){0};
    if (!r.out) r.out = calloc(1, 1);
    return r;
}

static unsigned active;

static void test_basics(void) {
    k3c_sandbox_limits l = limits();
    k3c_sandbox_result r = py("import os\nprint('hi', os.getcwd())\nopen('w.txt','w').write('ok')\n"
                              "print(open('w.txt').read())\n",
                              &l);
    CHECK(r.exited && r.exit_code == 0 && !strncmp(r.out, "hi /", 4) && strstr(r.out, "\nok\n"),
          "hello + write inside: exit %d, %s", r.exit_code, r.out);
    char dir[4096] = "";
    sscanf(r.out, "hi %4095s", dir);
    struct stat sb;
    CHECK(dir[0] && stat(dir, &sb) != 0, "the private directory %s is removed afterwards", dir);
    active = r.protections;
    char names[256];
    k3c_sandbox_protections_str(active, names, sizeof names);
    printf("sandbox protections active: %s\n", names);
    CHECK((active & (K3C_SBX_TMPDIR | K3C_SBX_RLIMITS | K3C_SBX_TIMEOUT)) == 7, "base protections always on");
    k3c_sandbox_result_free(&r);

    const char *argv[] = {"/nonexistent/prog", NULL};
    k3c_err err = {0};
    CHECK(k3c_sandbox_run(&l, argv, NULL, 0, NULL, &r, &err) == K3C_EIO && strstr(err.msg, "/nonexistent/prog"),
          "exec failure is a host error: %s", err.msg);
    k3c_sandbox_file bad = {"../x", "y"};
    argv[0] = "/bin/true";
    CHECK(k3c_sandbox_run(&l, argv, &bad, 1, NULL, &r, &err) == K3C_EINVAL, "file names stay inside: %s", err.msg);
    /* stdin */
    const char *cat[] = {"/bin/cat", NULL};
    CHECK_OK(k3c_sandbox_run(&l, cat, NULL, 0, "abc\n", &r, &err), &err);
    CHECK(r.out && !strcmp(r.out, "abc\n"), "stdin: %s", r.out ? r.out : "");
    k3c_sandbox_result_free(&r);
}

static void test_network(void) {
    k3c_sandbox_limits l = limits();
    k3c_sandbox_result r = py("import socket\n"
                              "try:\n"
                              "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
                              "    s.settimeout(2)\n"
                              "    s.connect(('1.1.1.1', 80))\n"
                              "    print('CONNECTED')\n"
                              "except OSError as e:\n"
                              "    print('BLOCKED', e.errno)\n",
                              &l);
    CHECK(strstr(r.out, "BLOCKED") && !strstr(r.out, "CONNECTED"), "socket: %s", r.out);
    CHECK(active & (K3C_SBX_SECCOMP | K3C_SBX_NETNS), "no network protection active");
    k3c_sandbox_result_free(&r);
}

static void test_files(void) {
    char dir[2200], secret[2300], outside[300], code[8192];
    char cwd[1024];
    snprintf(dir, sizeof dir, "%s/build/tmp/test_post_sandbox.%d", getcwd(cwd, sizeof cwd) ? cwd : ".", (int)getpid());
    snprintf(code, sizeof code, "mkdir -p %s && chmod 755 %s", dir, dir);
    CHECK(system(code) == 0, "mkdir");
    snprintf(secret, sizeof secret, "%s/secret.txt", dir);
    snprintf(outside, sizeof outside, "/tmp/k3c_sandbox_escape_%d", (int)getpid());
    FILE *f = fopen(secret, "w");
    fputs("TOPSECRET", f);
    fclose(f);
    chmod(secret, 0644);
    snprintf(code, sizeof code,
             "for p in ['%s', '%s/escape.txt']:\n"
             "    try:\n"
             "        open(p, 'w').write('x')\n"
             "        print('WROTE', p)\n"
             "    except OSError as e:\n"
             "        print('DENIED write', e.errno)\n"
             "try:\n"
             "    print('READ', open('%s').read())\n"
             "except OSError as e:\n"
             "    print('DENIED read', e.errno)\n"
             "try:\n"
             "    open('big.bin', 'wb').write(b'0' * (4 << 20))\n"
             "    print('BIG')\n"
             "except OSError as e:\n"
             "    print('DENIED big', e.errno)\n",
             outside, dir, secret);
    k3c_sandbox_limits l = limits();
    k3c_sandbox_result r = py(code, &l);
    struct stat sb;
    char esc[2300];
    snprintf(esc, sizeof esc, "%s/escape.txt", dir);
    int wrote_tmp = stat(outside, &sb) == 0, wrote_dir = stat(esc, &sb) == 0;
    if (active & K3C_SBX_LANDLOCK) {
        CHECK(!wrote_tmp && !wrote_dir && !strstr(r.out, "WROTE"), "writes outside the directory: %s", r.out);
        CHECK(strstr(r.out, "DENIED read") && !strstr(r.out, "TOPSECRET"), "reading the parent's file: %s", r.out);
    } else {
        printf("note: Landlock unavailable; writes/reads outside the directory are limited only by uid %s\n",
               active & K3C_SBX_UID_DROP ? "nobody" : "(unchanged)");
        CHECK(!wrote_dir, "the parent's directory (not world-writable) stays untouched");
    }
    CHECK(!strstr(r.out, "BIG"), "file size limit: %s (signal %d)", r.out, r.signal);
    unlink(outside);
    snprintf(code, sizeof code, "rm -rf %s", dir);
    CHECK(system(code) == 0, "cleanup");
    k3c_sandbox_result_free(&r);
}

static void test_bombs(void) {
    k3c_sandbox_limits l = limits();
    k3c_sandbox_result r = py("import os, sys, time\n"
                              "n = 0\n"
                              "for i in range(100000):\n"
                              "    try:\n"
                              "        pid = os.fork()\n"
                              "    except OSError:\n"
                              "        break\n"
                              "    if pid == 0:\n"
                              "        os.close(1); os.close(2); time.sleep(60); os._exit(0)\n"
                              "    n += 1\n"
                              "print('forked', n)\n",
                              &l);
    int n = -1;
    const char *at = strstr(r.out, "forked ");
    if (at) n = atoi(at + 7);
    CHECK(n >= 0 && n < l.nproc, "fork bomb: %d forks with nproc %lld: %s", n, (long long)l.nproc, r.out);
    CHECK(r.wall_s < 8, "fork bomb returned after %.1f s", r.wall_s);
    k3c_sandbox_result_free(&r);

    r = py("try:\n    x = bytearray(2 << 30)\n    print('ALLOCATED')\nexcept MemoryError:\n    print('MEMERR')\n", &l);
    CHECK(strstr(r.out, "MEMERR") && !strstr(r.out, "ALLOCATED"), "memory bomb: %s", r.out);
    k3c_sandbox_result_free(&r);
    r = py("a = []\nwhile True:\n    a.append(b'x' * (16 << 20))\n", &l);
    CHECK(!(r.exited && r.exit_code == 0) && r.wall_s < 8, "growing memory ends in failure: exit %d sig %d",
          r.exit_code, r.signal);
    k3c_sandbox_result_free(&r);

    l.cpu_s = 1;
    r = py("while True:\n    pass\n", &l);
    CHECK(!r.exited && r.signal && r.wall_s < 5, "infinite loop: signal %d after %.2f s", r.signal, r.wall_s);
    k3c_sandbox_result_free(&r);
    l.wall_s = 1;
    r = py("import time\ntime.sleep(60)\n", &l);
    CHECK(r.timed_out && !r.exited && r.wall_s < 3, "sleeping past the wall clock: timed_out %d after %.2f s",
          r.timed_out, r.wall_s);
    k3c_sandbox_result_free(&r);
    l.wall_s = 10;
    l.max_output = 100;
    r = py("print('y' * 100000)\n", &l);
    CHECK(r.out_len == 100 && r.truncated && r.exited && r.exit_code == 0, "output capped: %zu bytes", r.out_len);
    k3c_sandbox_result_free(&r);
}

int main(void) {
    test_basics();
    test_network();
    test_files();
    test_bombs();
    return test_summary();
}
