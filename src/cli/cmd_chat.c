/* cmd_chat.c — `k3c chat`: a terminal conversation with a model. Each line read from stdin is a user turn; the reply
 * streams as it is generated, reasoning dimmed (or prefixed "reasoning: " when stdout is not a terminal), tool calls
 * printed as JSON. The request goes through the same validation, chat rendering and scheduler as `k3c serve`. */
#include "cli.h"
#include "base/check.h"
#include "base/json.h"
#include "k3c/serve.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int tty, in_reasoning, wrote;
} chat_out;

static void show_delta(void *ctx, const k3c_chat_delta *d) {
    chat_out *o = ctx;
    if (d->kind == K3C_CHAT_DELTA_REASONING && d->len) {
        if (!o->in_reasoning) fputs(o->tty ? "\033[2m" : "reasoning: ", stdout);
        o->in_reasoning = 1;
        fwrite(d->text, 1, d->len, stdout);
    } else if ((d->kind == K3C_CHAT_DELTA_CONTENT && d->len) || d->kind == K3C_CHAT_DELTA_CALL) {
        if (o->in_reasoning) fputs(o->tty ? "\033[0m\n" : "\n", stdout);
        o->in_reasoning = 0;
        if (d->kind == K3C_CHAT_DELTA_CONTENT) {
            fwrite(d->text, 1, d->len, stdout);
        } else {
            k3c_sbuf s;
            k3c_sbuf_init(&s);
            k3c_sbuf_append(&s, "{\"name\":", 8);
            k3c_sbuf_json_string(&s, d->name, strlen(d->name));
            k3c_sbuf_printf(&s, ",\"arguments\":%s}", d->arguments);
            printf("%stool_call: %s\n", o->wrote ? "\n" : "", s.buf ? s.buf : "");
            k3c_sbuf_free(&s);
        }
    } else {
        return;
    }
    o->wrote = 1;
    fflush(stdout);
}

/* The request body of one turn: the conversation so far plus the sampling options of the command line. */
static void request_body(k3c_sbuf *b, const k3c_sbuf *history, const char *tools, const char *opts) {
    k3c_sbuf_printf(b, "{\"messages\":[%s]%s%s%s}", history->buf ? history->buf : "", tools ? ",\"tools\":" : "",
                    tools ? tools : "", opts);
}

/* One user turn: validate + render + generate (k3c_chat_session_turn), show, remember. */
static int turn(k3c_chat_session *chat, k3c_sbuf *history, const char *tools, const char *opts, k3c_err *err) {
    k3c_sbuf body, reply;
    k3c_sbuf_init(&body);
    k3c_sbuf_init(&reply);
    request_body(&body, history, tools, opts);
    chat_out out = {isatty(STDOUT_FILENO), 0, 0};
    k3c_finish why = K3C_FINISH_STOP;
    int64_t n_gen = 0;
    int rc = body.ok ? k3c_chat_session_turn(chat, body.buf, body.len, show_delta, &out, &reply, &why, &n_gen, err)
                     : k3c_errf(err, K3C_ENOMEM, "out of memory");
    k3c_sbuf_free(&body);
    if (out.in_reasoning) fputs(out.tty ? "\033[0m" : "", stdout);
    if (!rc || out.wrote) printf("\n");
    if (!rc && why == K3C_FINISH_LENGTH) printf("[stopped after %lld tokens]\n", (long long)n_gen);
    fflush(stdout);
    if (!rc && !reply.ok) rc = k3c_errf(err, K3C_ENOMEM, "out of memory");
    if (!rc) {
        k3c_sbuf_append(history, ",", 1);
        k3c_sbuf_append(history, reply.buf, reply.len);
    }
    k3c_sbuf_free(&reply);
    return rc;
}

/* The JSON options every request carries, from the command line. */
static int chat_opts(int argc, char **argv, k3c_sbuf *o) {
    double temp, top_p;
    long long seed, max_tokens;
    if (!cli_opt_double(argc, argv, "--temperature", 0.6, &temp) ||
        !cli_opt_double(argc, argv, "--top-p", 0.95, &top_p) || !cli_opt_int(argc, argv, "--seed", 0, &seed) ||
        !cli_opt_int(argc, argv, "--max-tokens", 512, &max_tokens))
        return 0;
    k3c_sbuf_printf(o, ",\"temperature\":%.17g,\"top_p\":%.17g,\"seed\":%lld,\"max_tokens\":%lld", temp, top_p, seed,
                    max_tokens);
    /* --thinking / --no-thinking, else the chat options the checkpoint was fine-tuned with */
    int thinking = -1;
    k3c_err err = {0};
    const char *dir = cli_opt(argc, argv, "--model");
    if (dir && k3c_turn_chat_thinking(dir, &thinking, &err)) {
        cli_fail("chat", &err);
        return 0;
    }
    if (cli_flag(argc, argv, "--thinking")) thinking = 1;
    if (cli_flag(argc, argv, "--no-thinking")) thinking = 0;
    if (thinking >= 0) k3c_sbuf_printf(o, ",\"thinking\":%s", thinking ? "true" : "false");
    const char *stop = cli_opt(argc, argv, "--stop");
    if (stop) {
        k3c_sbuf_append(o, ",\"stop\":", 8);
        k3c_sbuf_json_string(o, stop, strlen(stop));
    }
    return 1;
}

/* --image FILE (repeatable): OpenAI image_url parts with data: URLs, a JSON fragment "{...},{...}," (empty when none). */
static int image_parts(int argc, char **argv, k3c_sbuf *out, k3c_err *err) {
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--image")) continue;
        const char *path = argv[++i];
        char *data = NULL;
        size_t n = 0;
        CHECK_RC(k3c_read_file(path, &data, &n, err));
        const char *mime = n >= 8 && !memcmp(data, "\x89PNG", 4)        ? "png"
                           : n >= 3 && !memcmp(data, "\xff\xd8\xff", 3) ? "jpeg"
                                                                        : NULL;
        char *b64 = mime ? malloc((n + 2) / 3 * 4 + 1) : NULL;
        int rc = !mime  ? k3c_errf(err, K3C_EFORMAT, "%s: not a PNG or JPEG file", path)
                 : !b64 ? k3c_errf(err, K3C_ENOMEM, "%s: out of memory", path)
                        : K3C_OK;
        if (!rc) {
            size_t nb = k3c_base64_encode((const unsigned char *)data, n, b64);
            k3c_sbuf_printf(out, "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/%s;base64,", mime);
            k3c_sbuf_append(out, b64, nb);
            k3c_sbuf_append(out, "\"}},", 4);
        }
        free(b64);
        free(data);
        if (rc) return rc;
    }
    return out->ok ? K3C_OK : k3c_errf(err, K3C_ENOMEM, "out of memory");
}

static int chat_loop(k3c_serve *sv, const char *system, const char *tools, const char *opts, const char *images,
                     k3c_err *err) {
    k3c_chat_session *chat;
    int rc = k3c_chat_session_open(sv, &chat, err);
    if (rc) return rc;
    k3c_sbuf history;
    k3c_sbuf_init(&history);
    k3c_sbuf_append(&history, "{\"role\":\"system\",\"content\":", 27);
    k3c_sbuf_json_string(&history, system, strlen(system));
    k3c_sbuf_append(&history, "}", 1);
    int tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty) fputs("> ", stdout);
        fflush(stdout);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        size_t mark = history.len;
        k3c_sbuf_append(&history, ",{\"role\":\"user\",\"content\":", 26);
        if (images) k3c_sbuf_printf(&history, "[%s{\"type\":\"text\",\"text\":", images); /* the first turn's */
        k3c_sbuf_json_string(&history, line, (size_t)n);
        k3c_sbuf_append(&history, images ? "}]}" : "}", images ? 3 : 1);
        if ((rc = turn(chat, &history, tools, opts, err))) {
            fprintf(stderr, "k3c chat: %s\n", err->msg); /* a bad turn is forgotten; the conversation goes on */
            history.len = mark;
            rc = 0;
        } else {
            images = NULL;
        }
    }
    free(line);
    k3c_sbuf_free(&history);
    k3c_chat_session_close(chat);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        printf(
            "usage: k3c chat --model DIR [--system TEXT] [--tools FILE.json] [--temperature 0.6] [--top-p 0.95]\n"
            "                [--seed 0] [--max-tokens 512] [--stop TEXT] [--thinking|--no-thinking] [--pattern cl100k|kimi]\n"
            "                [--image FILE ...] [--device cpu|cuda] [--gemm fp32|tf32|bf16] [--kernels bf16|fp16|fp32]\n"
            "Reads one user message per line from stdin (/exit ends) and streams the reply: reasoning dimmed\n"
            "(\"reasoning: \" when not on a terminal), tool calls as JSON. --tools: a JSON array of OpenAI tools.\n"
            "--image FILE (PNG or JPEG, repeatable): the images go with the first message, before its text; the\n"
            "model needs a vision tower (config.json vision_config, docs/VISION.md). Thinking defaults to what the\n"
            "checkpoint was fine-tuned with (trainer_state.json \"chat\", written by k3c sft / rl), else on.\n");
        return 0;
    }
    const char *dir = cli_opt(argc, argv, "--model"), *tools_path = cli_opt(argc, argv, "--tools");
    const char *system = cli_opt(argc, argv, "--system");
    if (!dir) return cli_usage_error("chat", "--model is required");
    const cli_device_opts dopt = cli_device_opts_get(argc, argv);
    if (cli_device_check("chat", &dopt)) return 2;
    k3c_sbuf opts;
    k3c_sbuf_init(&opts);
    if (!chat_opts(argc, argv, &opts)) return 2;
    k3c_err err = {0};
    char *tools = NULL;
    size_t tn;
    k3c_json *tj = NULL;
    int rc = tools_path ? k3c_json_parse_file(tools_path, &tj, &err) : 0;
    if (!rc && tj && tj->type != K3C_JSON_ARRAY)
        rc = k3c_errf(&err, K3C_EINVAL, "%s: expected a JSON array of tools", tools_path);
    k3c_json_free(tj);
    if (!rc && tools_path) rc = k3c_read_file(tools_path, &tools, &tn, &err);
    k3c_sbuf images;
    k3c_sbuf_init(&images);
    if (!rc) rc = image_parts(argc, argv, &images, &err);
    k3c_serve sv = {0};
    cli_device dev = {0};
    if (!rc) rc = k3c_serve_open(dir, 1, cli_opt(argc, argv, "--pattern"), &sv, &err);
    if (!rc) {
        rc = cli_device_open(&dopt, &dev, &err);
        if (!rc) rc = k3c_serve_use_backend(&sv, dev.backend, &err);
        if (!rc)
            rc = chat_loop(&sv, system ? system : "You are a helpful assistant.", tools, opts.buf,
                           images.len ? images.buf : NULL, &err);
        k3c_serve_close(&sv);
    }
    cli_device_release(&dev);
    free(tools);
    k3c_sbuf_free(&images);
    k3c_sbuf_free(&opts);
    return rc ? cli_fail("chat", &err) : 0;
}
