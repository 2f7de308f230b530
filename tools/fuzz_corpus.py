#!/usr/bin/env python3
"""fuzz_corpus.py — assembles the seed corpora of the fuzz/ targets under OUT/<name> from the golden data (SHARED) and
the repo's configs: small files copied, large safetensors cut down to a few tensors, JSONL files split into lines."""
import glob, json, os, struct, sys

shared, out = sys.argv[1], sys.argv[2]
golden = os.path.join(shared, "golden")


def put(name, i, data):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed%03d" % i), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def small_safetensors(path, max_tensors=6, max_bytes=4096):
    """The first tensors (by offset) whose data fit in max_bytes, re-laid out as a valid file (metadata kept)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        base = 8 + n
        keep, blob = {}, b""
        items = sorted(((k, v) for k, v in head.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
        for k, v in items:
            a, b = v["data_offsets"]
            if len(keep) >= max_tensors or len(blob) + (b - a) > max_bytes:
                continue
            f.seek(base + a)
            keep[k] = dict(v, data_offsets=[len(blob), len(blob) + b - a])
            blob += f.read(b - a)
        if "__metadata__" in head:
            keep["__metadata__"] = head["__metadata__"]
    h = json.dumps(keep, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


jsons = sorted(glob.glob(os.path.join(golden, "**", "*.json"), recursive=True)) + sorted(glob.glob("configs/*.json"))
for i, p in enumerate(jsons):
    put("json", i, open(p, "rb").read())
configs = [p for p in jsons if os.path.basename(p).endswith("config.json") or "/configs/k3" in "/" + p]
for i, p in enumerate(configs):
    put("config", i, open(p, "rb").read())
for i, p in enumerate(sorted(glob.glob("configs/*run*.json"))):
    put("run_config", i, open(p, "rb").read())
for i, p in enumerate(sorted(glob.glob(os.path.join(golden, "**", "*.safetensors"), recursive=True))):
    put("safetensors", i, small_safetensors(p))
with open(os.path.join(golden, "kimi_tokenizer", "tiktoken.model"), "rb") as f:
    lines = f.read().split(b"\n")
put("tiktoken", 0, b"\0" + b"\n".join(lines[:300]) + b"\n")
put("tiktoken", 1, b"\1" + b"\n".join(lines[:256] + [lines[1000], lines[5000]]) + b"\n")
examples = [json.loads(l) for l in open(os.path.join(golden, "xtml", "examples.jsonl")) if l.strip()]
for i, e in enumerate(examples):
    put("xtml_render", i, json.dumps({k: e.get(k) for k in ("messages", "tools", "options")}))
    put("xtml_parse", i, b"\2" + e["rendered"].encode())
outputs = ["reasoning<|close|>think<|sep|>Hello<|close|>message<|sep|><|end_of_msg|>",
           '<|open|>tool_call name="f" index="1"<|sep|><|open|>arg name="x"<|sep|>3<|close|>arg<|sep|><|close|>tool_call<|sep|>',
           "<think>a</think>b<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
           '{"a":1}<|tool_call_end|><|tool_calls_section_end|><|im_end|>']
for i, o in enumerate(outputs):
    put("xtml_parse", 100 + i, (b"\0" if i < 2 else b"\1") + o.encode())
# SFT trajectories (fuzz_traj): first byte = format (0 XTML, 1 K2, 2 XTML with thinking), then JSONL conversations
for i, e in enumerate(examples):
    line = json.dumps({k: e.get(k) for k in ("messages", "tools") if e.get(k) is not None})
    put("traj", i, bytes([i % 3]) + (line + "\n" + line + "\n").encode())
lines = [json.dumps({"text": e["rendered"]}) for e in examples[:4]]
put("jsonl", 0, "\n".join(lines) + "\n")
put("jsonl", 1, '{"text": "hello world"}\n\n{"text": "caf\\u00e9 \\ud83d\\ude00", "id": 2}\n')
# request bodies of the server (fuzz_http_request): first byte = endpoint (0 chat, 1 completion, 2 tokenize,
# 3 detokenize) + 4 for the K2 format
for i, e in enumerate(examples):
    body = {"model": "tiny", "messages": e["messages"], "max_tokens": 16, "stream": True, "temperature": 0.7}
    if e.get("tools"):
        body["tools"] = e["tools"]
    put("http_request", i, bytes([4 * (i % 2)]) + json.dumps(body).encode())
requests = [(1, {"prompt": "Hello world", "max_tokens": 8, "stop": ["\n", "END"], "seed": 3, "logprobs": 2}),
            (1, {"prompt": [1, 2, 3], "top_k": 40, "min_p": 0.1, "presence_penalty": 0.5}),
            (2, {"prompt": "Hello <|open|>", "add_special": True}), (3, {"tokens": [72, 101, 108, 108, 111]})]
for i, (k, body) in enumerate(requests):
    put("http_request", 100 + i, bytes([k]) + json.dumps(body).encode())
print("corpora in %s: %s" % (out, ", ".join("%s %d" % (d, len(os.listdir(os.path.join(out, d)))) for d in sorted(os.listdir(out)))))
