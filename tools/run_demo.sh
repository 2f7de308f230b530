#!/usr/bin/env bash
# run_demo.sh — `make run`: build a real English corpus from Debian packages (the Python 3.11 manual and the Jargon
# File), train a BPE tokenizer, prepare token shards, train the tiny K3 model (configs/k3_tiny.json, configs/demo_run.json)
# for about ten minutes on the CPU, then generate a sample and print the summary. Everything goes under runs/demo/.
# With --data-only it stops once the tokenizer and the shards are ready (tools/kill_resume.sh uses them).
set -euo pipefail
cd "$(dirname "$0")/.."
K3C=./k3c
OUT=runs/demo
PY_INFO=/usr/share/info/python3.11.info.gz
JARGON=/usr/share/doc/jargon-text/jargon.txt.gz
for f in "$PY_INFO" "$JARGON"; do
    [ -r "$f" ] || { echo "run_demo: $f missing (packages python3.11-doc, jargon-text; run tools/setup.sh)"; exit 1; }
done
rm -rf "$OUT" && mkdir -p "$OUT/corpus/python" "$OUT/corpus/jargon"
t0=$(date +%s)

echo "== corpus: Python 3.11 manual (one document per Info node) + the Jargon File"
# Info nodes are the documents; the tag table, the indexes and the top menu are machine-made lists, not prose.
zcat "$PY_INFO" | awk -v dir="$OUT/corpus/python" 'BEGIN { RS = "\037" }
    NR > 1 && length($0) > 200 && length($0) < 150000 && $0 !~ /^\nTag Table:/ && $0 !~ /Node: [A-Za-z ]*Index,/ {
    f = sprintf("%s/%05d.txt", dir, NR); printf "%s", $0 > f; close(f) }'
zcat "$JARGON" > "$OUT/corpus/jargon/jargon.txt"
du -sh "$OUT/corpus" | sed 's/^/corpus size: /'

echo "== tokenizer: byte-level BPE, 4083 ranks + 13 specials = 4096 ids"
cat "$OUT"/corpus/python/*.txt "$OUT/corpus/jargon/jargon.txt" > "$OUT/corpus.txt"
$K3C tokenizer train --input "$OUT/corpus.txt" --vocab-size 4083 --pattern cl100k --out "$OUT/tokenizer.tiktoken"
rm -f "$OUT/corpus.txt"

echo "== token shards"
$K3C data prepare --vocab "$OUT/tokenizer.tiktoken" --pattern cl100k --input "$OUT/corpus/python" --doc-split file \
    --source python_docs --val-fraction 0.02 --out "$OUT/data/python_docs"
$K3C data prepare --vocab "$OUT/tokenizer.tiktoken" --pattern cl100k --input "$OUT/corpus/jargon" --doc-split blank \
    --source jargon --val-fraction 0.02 --out "$OUT/data/jargon"

[ "${1:-}" = --data-only ] && { echo "== data ready in $OUT (--data-only)"; exit 0; }

echo "== training (configs/demo_run.json: 16,384 tokens per step; context 256 -> 1K -> 4K, then annealing)"
$K3C train --config configs/demo_run.json | tee "$OUT/train_summary.txt"

latest="$OUT/train/$(cat "$OUT/train/latest")"
echo "== sample from $latest"
$K3C generate --model "$latest" --prompt "The Python interpreter" --max-new 80 --temperature 0.8 --top-p 0.95 --seed 7 \
    | tee "$OUT/sample.txt"
echo
echo "== done in $(( $(date +%s) - t0 )) s; metrics: $OUT/train/metrics.jsonl, plot: $OUT/train/metrics.png"
grep '^summary:' "$OUT/train_summary.txt"
