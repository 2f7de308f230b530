/* cmd_xtml.c — `k3c xtml render|parse --in FILE.jsonl`: chat prompts (K3's XTML, Kimi Linear's K2 envelope) rendered
 * from OpenAI-style messages, and model output parsed back into reasoning / content / tool calls, one JSON line each. */
#include "cli.h"

#include "base/json.h"
#include "k3c/tok.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: k3c xtml render --in FILE.jsonl\n"
        "       k3c xtml parse --in FILE.jsonl [--in-think | --in-response] [--strict]\n\n"
        "render  reads objects {\"id\", \"messages\", \"tools\", \"options\"} (one per line) and prints, per line,\n"
        "        {\"id\":..., \"rendered\": PROMPT, \"segments\": [[TEXT, MARKUP], ...]} or {\"id\":..., \"error\": "
        "MSG}.\n"
        "        options: format (\"xtml\" for K3, default; \"k2\" for Kimi Linear), add_generation_prompt,\n"
        "        thinking, thinking_effort (low|high|max), tool_choice, response_format, response_schema,\n"
        "        image_prompts, default_system (k2). MARKUP runs are control tokens: tokenize each run on its own.\n"
        "parse   reads {\"id\", \"assistant_output\", \"parse_options\"} (parse_options: format, in_think,\n"
        "        in_response, strict) and prints {\"id\":..., \"parsed\": {\"reasoning\", \"content\", "
        "\"tool_calls\":\n"
        "        [{\"name\", \"index\", \"arguments\"}], \"finished\"}} or {\"id\":..., \"error\": MSG}. The output\n"
        "        starts in the channel the prompt opened: --in-think (think), --in-response (response), neither\n"
        "        (outside any: text is content), unless the line's parse_options say; output that breaks the\n"
        "        markup is read past (recovered) unless --strict. A call cut off is returned with finished false.\n"
        "--in -  reads standard input. Errors are reported per line (malformed JSON with its line number); the\n"
        "        exit status is 1 if any line failed.\n");
}

static int render_line(const k3c_json *obj, k3c_sbuf *o, k3c_err *err) {
    const k3c_json *messages = k3c_json_get(obj, "messages");
    if (!messages) return k3c_errf(err, K3C_EINVAL, "missing \"messages\"");
    k3c_chat_prompt p;
    int rc = k3c_chat_render(messages, k3c_json_get(obj, "tools"), k3c_json_get(obj, "options"), &p, err);
    if (rc) return rc;
    k3c_sbuf_append(o, ",\"rendered\":", 12);
    k3c_sbuf_json_string(o, p.text, p.len);
    k3c_sbuf_append(o, ",\"segments\":[", 13);
    for (size_t i = 0; i < p.nseg; i++) {
        k3c_sbuf_append(o, i ? ",[" : "[", i ? 2 : 1);
        k3c_sbuf_json_string(o, p.text + p.segs[i].off, p.segs[i].len);
        k3c_sbuf_append(o, p.segs[i].markup ? ",true]" : ",false]", p.segs[i].markup ? 6 : 7);
    }
    k3c_sbuf_append(o, "]", 1);
    k3c_chat_prompt_free(&p);
    return K3C_OK;
}

/* `dflt`: the command line's start channel and strictness, for what the line's parse_options leave out. */
static int parse_line(const k3c_json *obj, const k3c_chat_parse_opts *dflt, k3c_sbuf *o, k3c_err *err) {
    const k3c_json *out = k3c_json_get(obj, "assistant_output");
    if (!out || out->type != K3C_JSON_STRING)
        return k3c_errf(err, K3C_EINVAL, "\"assistant_output\": missing or not a string");
    const k3c_json *pj = k3c_json_get(obj, "parse_options");
    k3c_chat_parse_opts po;
    int rc = k3c_chat_parse_opts_from_json(pj, &po, err);
    if (rc) return rc;
    if (!k3c_json_get(pj, "in_think") && !k3c_json_get(pj, "in_response")) {
        po.in_think = dflt->in_think;
        po.in_response = dflt->in_response;
    }
    if (!k3c_json_get(pj, "strict")) po.strict = dflt->strict;
    k3c_chat_result r;
    if ((rc = k3c_chat_parse(&po, out->string, out->len, &r, err))) return rc;
    k3c_sbuf_append(o, ",\"parsed\":", 10);
    k3c_chat_result_json(o, &r);
    k3c_chat_result_free(&r);
    return K3C_OK;
}

int cmd_xtml(int argc, char **argv) {
    const char *sub = argc > 1 ? argv[1] : NULL;
    if (!sub || cli_wants_help(argc, argv)) {
        usage(sub ? stdout : stderr);
        return sub ? 0 : 2;
    }
    int render = !strcmp(sub, "render");
    if (!render && strcmp(sub, "parse")) return cli_usage_error("xtml", "unknown subcommand '%s'", sub);
    const char *in = cli_opt(argc - 1, argv + 1, "--in");
    if (!in) return cli_usage_error("xtml", "needs --in FILE.jsonl");
    k3c_chat_parse_opts dflt = {K3C_CHAT_XTML, cli_flag(argc, argv, "--in-think"),
                                cli_flag(argc, argv, "--in-response"), cli_flag(argc, argv, "--strict")};
    if (dflt.in_think && dflt.in_response)
        return cli_usage_error("xtml", "--in-think and --in-response exclude each other");
    k3c_err err = {0};
    char *data = NULL;
    size_t n = 0;
    if (!strcmp(in, "-")) {
        k3c_sbuf s;
        k3c_sbuf_init(&s);
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, stdin)) > 0) k3c_sbuf_append(&s, buf, k);
        if (!s.ok) return cli_fail("xtml", &err);
        data = s.buf;
        n = s.len;
    } else if (k3c_read_file(in, &data, &n, &err)) {
        return cli_fail("xtml", &err);
    }
    int failed = 0;
    size_t lineno = 0;
    k3c_sbuf o;
    k3c_sbuf_init(&o);
    for (size_t at = 0; at < n;) {
        const char *line = data + at, *nl = memchr(line, '\n', n - at);
        size_t len = nl ? (size_t)(nl - line) : n - at;
        at += len + 1;
        lineno++;
        size_t k = 0;
        while (k < len && strchr(" \t\r", line[k])) k++;
        if (k == len) continue;
        char name[4200];
        snprintf(name, sizeof name, "%s:%zu", in, lineno);
        k3c_json *obj = NULL;
        const k3c_json *id = NULL;
        o.len = 0;
        int rc = k3c_json_parse(line, len, name, &obj, &err);
        if (!rc && obj->type != K3C_JSON_OBJECT) rc = k3c_errf(&err, K3C_EINVAL, "%s: expected a JSON object", name);
        if (!rc) id = k3c_json_get(obj, "id");
        k3c_sbuf_append(&o, "{\"id\":", 6);
        if (id)
            k3c_sbuf_json_value(&o, id, 0);
        else
            k3c_sbuf_append(&o, "null", 4);
        size_t mark = o.len;
        if (!rc) rc = render ? render_line(obj, &o, &err) : parse_line(obj, &dflt, &o, &err);
        if (rc) {
            o.len = mark;
            k3c_sbuf_append(&o, ",\"error\":", 9);
            k3c_sbuf_json_string(&o, err.msg, strlen(err.msg));
            failed = 1;
        }
        k3c_sbuf_append(&o, "}\n", 2);
        if (o.ok) fwrite(o.buf, 1, o.len, stdout);
        k3c_json_free(obj);
    }
    k3c_sbuf_free(&o);
    free(data);
    return failed;
}
