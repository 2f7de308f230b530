/* cmd_serve.c — `k3c serve`: the OpenAI-compatible HTTP server (src/serve/server.h, docs/SERVING.md). Listens at once,
 * loads the model (/health says 503 meanwhile), serves until SIGINT / SIGTERM, then stops gracefully. */
#include "cli.h"
#include "k3c/serve.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The connection flags: limits, polling threads and time limits. */
static int serve_conn_options(int argc, char **argv, k3c_server_opts *o) {
    long long conns, per_ip, threads;
    if (!cli_opt_int(argc, argv, "--max-conns", o->max_connections, &conns) ||
        !cli_opt_int(argc, argv, "--max-conns-per-ip", o->max_conns_per_ip, &per_ip) ||
        !cli_opt_int(argc, argv, "--threads", o->threads, &threads) ||
        !cli_opt_double(argc, argv, "--request-timeout", o->request_timeout, &o->request_timeout) ||
        !cli_opt_double(argc, argv, "--gen-timeout", o->max_gen_s, &o->max_gen_s) ||
        !cli_opt_double(argc, argv, "--queue-timeout", o->max_queue_s, &o->max_queue_s))
        return 0;
    if (conns < 1 || conns > 1000000 || per_ip < 1 || per_ip > conns || threads < 1 || threads > 256 ||
        !(o->request_timeout >= 1 && o->request_timeout <= 86400) || !(o->max_gen_s >= 0) || !(o->max_queue_s >= 0)) {
        cli_usage_error("serve", "need 1 <= max-conns <= 1000000, 1 <= max-conns-per-ip <= max-conns, 1 <= threads "
                                 "<= 256, 1 <= request-timeout <= 86400, gen-timeout >= 0, queue-timeout >= 0");
        return 0;
    }
    o->max_connections = (int)conns;
    o->max_conns_per_ip = (int)per_ip;
    o->threads = (int)threads;
    return 1;
}

static int serve_options(int argc, char **argv, k3c_server_opts *o) {
    long long port, slots, queue, cap, body, img;
    k3c_server_opts_default(o);
    if (!cli_opt_int(argc, argv, "--port", o->port, &port) || !cli_opt_int(argc, argv, "--slots", o->slots, &slots) ||
        !cli_opt_int(argc, argv, "--queue", o->queue_max, &queue) ||
        !cli_opt_int(argc, argv, "--max-tokens-cap", o->max_tokens_cap, &cap) ||
        !cli_opt_int(argc, argv, "--max-body", (long long)o->max_body, &body) ||
        !cli_opt_int(argc, argv, "--max-image-bytes", (long long)o->max_image_bytes, &img) ||
        !serve_conn_options(argc, argv, o))
        return 0;
    if (port < 0 || port > 65535 || slots < 1 || slots > 256 || queue < 0 || cap < 1 || body < 64 || img < 1) {
        cli_usage_error("serve", "need 0 <= port <= 65535, 1 <= slots <= 256, queue >= 0, max-tokens-cap >= 1, "
                                 "max-body >= 64, max-image-bytes >= 1");
        return 0;
    }
    o->port = (int)port;
    o->slots = (int)slots;
    o->queue_max = (int)queue;
    o->max_tokens_cap = cap;
    o->max_body = (size_t)body;
    o->max_image_bytes = (size_t)img;
    if (cli_opt(argc, argv, "--host")) o->host = cli_opt(argc, argv, "--host");
    o->api_key = cli_opt(argc, argv, "--api-key");
    if (!o->api_key) o->api_key = getenv("K3C_API_KEY");
    return 1;
}

int cmd_serve(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf("usage: k3c serve --model DIR [--port 8000] [--host 127.0.0.1] [--slots 1] [--queue 64]\n"
               "                 [--api-key KEY] [--max-tokens-cap 1024] [--max-body 4194304] [--name NAME]\n"
               "                 [--pattern cl100k|kimi] [--device cpu|cuda] [--gemm "
               "fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n"
               "                 [--max-image-bytes 2097152] [--max-conns 4096] [--max-conns-per-ip 64] [--threads 4]\n"
               "                 [--request-timeout 30] [--gen-timeout 600] [--queue-timeout 60]\n"
               "An OpenAI-compatible HTTP server: GET /v1/models, POST /v1/chat/completions (messages, tools,\n"
               "stream), POST /v1/completions, POST /tokenize, POST /detokenize, GET /health (503 while loading),\n"
               "GET /metrics (Prometheus). --slots N: sequences decoded together by the inference engine\n"
               "(continuous batching; --device cuda runs it on the GPU). --port 0 picks a free port (printed).\n"
               "Connections: --threads polling threads serve them all (idle ones hold no thread); a request must\n"
               "arrive whole within --request-timeout seconds of connecting or of the previous answer, else the\n"
               "connection is closed; an address's connections beyond --max-conns-per-ip are answered 503 with\n"
               "Retry-After (beyond twice it, refused). A generation may run --gen-timeout seconds (504) and wait\n"
               "--queue-timeout seconds for a slot (503); 0 = no limit.\n"
               "The API key may also come from K3C_API_KEY; /health and /metrics need none. SIGINT / SIGTERM stop\n"
               "it gracefully. Requests default to the chat options the checkpoint was fine-tuned with\n"
               "(trainer_state.json \"chat\", written by k3c sft / rl). docs/SERVING.md.\n");
        return 0;
    }
    const char *dir = cli_opt(argc, argv, "--model");
    k3c_server_opts o;
    if (!dir) return cli_usage_error("serve", "--model is required");
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("serve", &dopt)) return 2;
    if (!serve_options(argc, argv, &o)) return 2;
    int thinking = -1; /* the checkpoint's chat options are the requests' defaults */
    k3c_err cerr = {0};
    if (k3c_turn_chat_thinking(dir, &thinking, &cerr)) return cli_fail("serve", &cerr);
    o.thinking_off = thinking == 0;
    /* the model's name: --name, else the directory's last component */
    char model_name[256], path[1024];
    snprintf(path, sizeof path, "%s", dir);
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = 0;
    const char *slash = strrchr(path, '/'), *name = cli_opt(argc, argv, "--name");
    snprintf(model_name, sizeof model_name, "%.255s", name ? name : slash && slash[1] ? slash + 1 : path);
    o.model_name = model_name;
    /* signals go to sigwait below: block them before any thread starts, so every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* every connection is a descriptor: take what the hard limit allows (the server checks it is enough) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    k3c_err err = {0};
    cli_device dev = {0}; /* opened before listening: a device this build lacks is refused up front */
    if (cli_device_open(&dopt, &dev, &err)) return cli_fail("serve", &err);
    k3c_server *srv;
    if (k3c_server_start(&o, &srv, &err)) {
        cli_device_release(&dev);
        return cli_fail("serve", &err);
    }
    printf("k3c serve: listening on http://%s:%d (model '%s' loading from %s)\n", o.host, k3c_server_port(srv),
           model_name, dir);
    fflush(stdout);
    k3c_serve sv;
    int rc = k3c_serve_open(dir, 1, cli_opt(argc, argv, "--pattern"), &sv, &err);
    if (!rc) {
        rc = k3c_serve_use_backend(&sv, dev.backend, &err);
        if (!rc) rc = k3c_server_ready(srv, &sv, &err);
        if (rc) k3c_serve_close(&sv);
    }
    if (rc) {
        k3c_server_stop(srv);
        cli_device_release(&dev);
        return cli_fail("serve", &err);
    }
    printf("k3c serve: ready (%d slot%s, at most %lld new tokens per request)\n", o.slots, o.slots > 1 ? "s" : "",
           (long long)o.max_tokens_cap);
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    printf("k3c serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    fflush(stdout);
    k3c_server_stop(srv);
    k3c_serve_close(&sv);
    cli_device_release(&dev);
    printf("k3c serve: stopped\n");
    return 0;
}
