#!/usr/bin/env bash
# run_tests.sh BUILD TEST... — runs each test program, echoes its output, sums the "N passed, N failed" lines.
set -u
build=$1; shift
export K3C_K3C_BIN=${K3C_K3C_BIN:-$build/k3c}
tp=0; tf=0
for t in "$@"; do
    name=$(basename "$t")
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out" | sed "s/^/[$name] /"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "[$name] crashed or printed no summary (exit $rc)"; tf=$((tf + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    tp=$((tp + p)); tf=$((tf + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "[$name] exited $rc"; tf=$((tf + 1)); fi
done
echo "$tp passed, $tf failed"
[ "$tf" -eq 0 ]
