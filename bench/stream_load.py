#!/usr/bin/env python3
"""stream_load.py — the streaming client of bench/serve_load.sh: CONNECTIONS threads each send streamed chat
completions back to back for SECONDS and time every server-sent event, giving what wrk cannot: time to first token
(request sent → first delta of content, reasoning or a tool call) and inter-token latency (gap between consecutive
deltas), p50 / p99.
Standard library only (it runs on machines without wrk). Usage:
  stream_load.py URL MODEL SECONDS CONNECTIONS MAX_TOKENS [PROMPT]   → a table on stdout, JSON with --json FILE."""
import http.client, json, sys, threading, time, urllib.parse


def pct(xs, q):
    """the q-quantile of xs by nearest rank (None when empty)"""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.5) - 1))]


def one_request(host, port, body, rec):
    """one streamed chat completion; appends its TTFT and gaps to rec, returns (ok, content deltas, error text)"""
    c = http.client.HTTPConnection(host, port, timeout=120)
    t0 = time.perf_counter()
    try:
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return False, 0, f"HTTP {r.status}: {r.read(300)!r}"
        last, n, err = None, 0, None
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                err = str(ev["error"])[:300]
                continue
            for ch in ev.get("choices", []):
                d = ch.get("delta", {})
                if d.get("content") or d.get("reasoning_content") or d.get("tool_calls"):
                    now = time.perf_counter()
                    if last is None:
                        rec["ttft"].append(now - t0)
                    else:
                        rec["itl"].append(now - last)
                    last, n = now, n + 1
        return err is None, n, err
    except Exception as e:  # a dropped connection or a malformed event is an error of this request
        return False, 0, repr(e)[:300]
    finally:
        c.close()


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    if out:
        args.remove(out)
    if len(args) < 5:
        sys.exit(__doc__)
    url, model, secs, conns, max_tokens = args[0], args[1], float(args[2]), int(args[3]), int(args[4])
    prompt = args[5] if len(args) > 5 else "What is the weather in Paris?"
    u = urllib.parse.urlparse(url)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0.8, "stream": True})
    rec = {"ttft": [], "itl": []}
    stats = {"ok": 0, "err": 0, "deltas": 0, "errors": []}
    lock = threading.Lock()
    deadline = time.perf_counter() + secs

    def worker():
        mine = {"ttft": [], "itl": []}
        while time.perf_counter() < deadline:
            ok, n, e = one_request(u.hostname, u.port, body, mine)
            with lock:
                stats["ok" if ok else "err"] += 1
                stats["deltas"] += n
                if e and len(stats["errors"]) < 5:
                    stats["errors"].append(e)
        with lock:
            rec["ttft"] += mine["ttft"]
            rec["itl"] += mine["itl"]

    t0 = time.perf_counter()
    th = [threading.Thread(target=worker) for _ in range(conns)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    ms = lambda x: None if x is None else round(1e3 * x, 2)
    res = {"connections": conns, "seconds": round(wall, 2), "requests": stats["ok"] + stats["err"],
           "errors": stats["err"], "requests_per_s": round((stats["ok"] + stats["err"]) / wall, 2),
           "content_deltas_per_s": round(stats["deltas"] / wall, 1),
           "ttft_ms_p50": ms(pct(rec["ttft"], 0.5)), "ttft_ms_p99": ms(pct(rec["ttft"], 0.99)),
           "itl_ms_p50": ms(pct(rec["itl"], 0.5)), "itl_ms_p99": ms(pct(rec["itl"], 0.99)),
           "first_errors": stats["errors"]}
    for k in ("requests", "errors", "requests_per_s", "content_deltas_per_s", "ttft_ms_p50", "ttft_ms_p99",
              "itl_ms_p50", "itl_ms_p99"):
        print(f"| {k:<28} | {res[k]} |")
    for e in stats["errors"]:
        print("error:", e)
    if out:
        json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
