#!/usr/bin/env bash
# serve_load.sh — load benchmark of `k3c serve`: starts the server on 127.0.0.1 with a model, runs
# wrk with 16 connections (16 concurrent streamed chat requests, each bounded to MAX_TOKENS new tokens) for SECONDS,
# and prints errors, p50/p99 latency, requests/s, the engine's batch (sequences per decode step, mean and max) and the
# server's resident memory at start, middle and end.
# usage: [SLOTS=N] [MAX_TOKENS=16] bench/serve_load.sh [MODEL_DIR] [SECONDS=60] [CONNECTIONS=16]
# SLOTS (--slots: sequences the engine decodes together) defaults to CONNECTIONS; K3C_BIN picks another k3c binary
# (e.g. an older build to compare); KEEP_WRK=FILE keeps wrk's full output; SERVE_ARGS adds options of `k3c serve`
# (e.g. "--device cuda"). CLIENT=py (the default where wrk is missing) drives the load with bench/stream_load.py
# instead, which also times each streamed token: time to first token and inter-token latency, p50 / p99.
# Without MODEL_DIR it builds the tiny servable model of the tests (build/tests/test_serve_units leaves it in
# build/tmp/serve_units.<pid>). Not part of `make test`.
set -u
cd "$(dirname "$0")/.."
model=${1:-}
secs=${2:-60}
conns=${3:-16}
max_tokens=${MAX_TOKENS:-16}
slots=${SLOTS:-$conns}
if [ -z "$model" ]; then
    make -s build/tests/test_serve_units k3c >/dev/null || exit 1
    build/tests/test_serve_units >/dev/null || { echo "serve_load: building the test model failed"; exit 1; }
    model=$(ls -dt build/tmp/serve_units.* | head -n 1)
fi
client=${CLIENT:-wrk}
command -v wrk >/dev/null || client=py
tmp=$(mktemp -d)
keep=${KEEP_WRK:-}
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
"${K3C_BIN:-./k3c}" serve --model "$model" --host 127.0.0.1 --port 0 --slots "$slots" --queue 256 --max-tokens-cap 64 \
    --name bench ${SERVE_ARGS:-} >"$tmp/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
    port=$(grep -o '127.0.0.1:[0-9]*' "$tmp/server.log" | head -n 1 | cut -d: -f2)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
done
[ -n "${port:-}" ] || { echo "serve_load: server did not start:"; cat "$tmp/server.log"; exit 1; }
rss() { awk '/VmRSS/ {print $2}' /proc/$pid/status; }
cat >"$tmp/chat.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"What is the weather in Paris?"}],'
        .. '"max_tokens":$max_tokens,"temperature":0.8,"stream":true,"stream_options":{"include_usage":true}}'
LUA
# warm-up, then memory at the start of the measured run
url="http://127.0.0.1:$port/v1/chat/completions"
load() { # load SECONDS [wrk options...]: the chosen client for SECONDS, its report in $tmp/wrk.txt
    local s=$1
    shift
    if [ "$client" = py ]; then
        python3 bench/stream_load.py "$url" bench "$s" "$conns" "$max_tokens" --json "$tmp/stream.json" >"$tmp/wrk.txt" 2>&1
    else
        wrk "$@" -c"$conns" -d"${s}s" --timeout 60s -s "$tmp/chat.lua" "$url" >"$tmp/wrk.txt" 2>&1
    fi
}
load 3 -t1
rss0=$(rss)
( sleep $((secs / 2)); rss >"$tmp/rss_mid" ) &
mid=$!
load "$secs" -t2 --latency
rss1=$(rss)
[ -n "$keep" ] && cp "$tmp/wrk.txt" "$keep"
wait $mid
metrics=$(curl -s "http://127.0.0.1:$port/metrics")
kill -TERM $pid; wait $pid; rc=$?
reqs=$(awk '/requests in/ {print $1}' "$tmp/wrk.txt")
rps=$(awk '/Requests\/sec/ {print $2}' "$tmp/wrk.txt")
p50=$(awk '$1 == "50%" {print $2}' "$tmp/wrk.txt")
p99=$(awk '$1 == "99%" {print $2}' "$tmp/wrk.txt")
non2xx=$(awk '/Non-2xx/ {print $NF}' "$tmp/wrk.txt")
sockerr=$(awk -F'[ ,]+' '/Socket errors/ {print $4 + $6 + $8 + $10}' "$tmp/wrk.txt")
if [ "$client" = py ]; then # the same measures from the streaming client's report
    js() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$tmp/stream.json" "$1"; }
    reqs=$(js requests) rps=$(js requests_per_s) non2xx=$(js errors) sockerr=0 p50="-" p99="-"
fi
gen=$(echo "$metrics" | awk '/^k3c_generation_tokens_total/ {print $2}')
steps=$(echo "$metrics" | awk '/^k3c_engine_steps_total/ {print $2}')
seqs=$(echo "$metrics" | awk '/^k3c_engine_step_sequences_total/ {print $2}')
bmax=$(echo "$metrics" | awk '/^k3c_engine_batch_max/ {print $2}')
batch=$(awk -v a="${seqs:-0}" -v b="${steps:-0}" 'BEGIN {printf (b > 0 ? "%.1f" : "?"), (b > 0 ? a / b : 0)}')
# the server's own view (arrival to last byte), from its histogram: the upper bound of the bucket holding p50 / p99
hq() { echo "$metrics" | awk -v q="$1" -F'[{}" ]+' '/^k3c_request_duration_seconds_bucket\{endpoint="\/v1\/chat\/completions"/ {
    n++; le[n] = $5; c[n] = $NF } END { for (i = 1; i <= n; i++) if (c[i] >= q * c[n]) { print le[i] "s"; exit } }'; }
ok=$(echo "$metrics" | awk '/^k3c_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\}/ {print $2}')
echo "k3c serve load: $conns concurrent streamed chat requests (max_tokens $max_tokens, $slots slots), ${secs}s, model $model"
printf '| %-28s | %s |\n' "requests ($client)" "${reqs:-?}" "requests/s" "${rps:-?}" "latency p50 / p99" "${p50:-?} / ${p99:-?}" \
    "server-side p50 / p99 (bucket)" "$(hq 0.5) / $(hq 0.99)" "errors (non-2xx + socket)" "$(( ${non2xx:-0} + ${sockerr:-0} ))" "chat 200s (server /metrics)" "${ok:-?}" \
    "generated tokens" "${gen:-?}" "sequences per step mean / max" "$batch / ${bmax:-?}" "RSS start / mid / end (KiB)" "$rss0 / $(cat "$tmp/rss_mid") / $rss1" \
    "server exit after SIGTERM" "$rc"
if [ "$client" = py ]; then grep -E '^\| (ttft|itl|content)|^error' "$tmp/wrk.txt"; fi
