#!/usr/bin/env bash
# fuzz.sh — `make fuzz`: seeds build/fuzz/corpus/<name> (tools/fuzz_corpus.py), runs every libFuzzer target given for
# SECONDS each (-max_total_time), and prints the executions per target; exits 1 if a target crashed.
# usage: tools/fuzz.sh SECONDS build/fuzz/bin/fuzz_NAME...
set -u
secs=$1
shift
shared=${K3C_SHARED:-../shared}
[ -d "$shared/golden" ] || shared=/work/shared
python3 tools/fuzz_corpus.py "$shared" build/fuzz/corpus || exit 1
mkdir -p build/fuzz/crashes build/fuzz/logs
fail=0
for bin in "$@"; do
    name=$(basename "$bin")
    name=${name#fuzz_}
    mkdir -p "build/fuzz/corpus/$name"
    log=build/fuzz/logs/$name.log
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        "$bin" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="build/fuzz/crashes/$name-" "build/fuzz/corpus/$name" >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    if [ $rc -eq 0 ]; then
        printf '%-14s %10s executions in %ss\n' "$name" "${execs:-?}" "$secs"
    else
        printf '%-14s %10s executions, CRASH (rc %d): see %s and build/fuzz/crashes/%s-*\n' "$name" "${execs:-?}" $rc \
            "$log" "$name"
        fail=1
    fi
done
exit $fail
