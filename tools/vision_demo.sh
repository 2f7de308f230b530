#!/usr/bin/env bash
# vision_demo.sh — `make vision-demo`: a tiny K3 text model and a tiny vision tower trained together, from scratch, on
# Fashion-MNIST (Debian dataset-fashion-mnist) to answer "<image>What is this?" with the class name; prints the
# held-out accuracy against chance (10%) and the CPU time. docs/VISION.md "Demo".
# Knobs (environment): K3C (binary), OUT (work dir), NTRAIN, NTEST, STEPS, BATCH, THREADS, SEED.
set -euo pipefail
cd "$(dirname "$0")/.."
K3C=${K3C:-./k3c}
SRC=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
OUT=${OUT:-build/vision_demo}
NTRAIN=${NTRAIN:-6000} NTEST=${NTEST:-500} STEPS=${STEPS:-400} BATCH=${BATCH:-32} THREADS=${THREADS:-2} SEED=${SEED:-1}
[ -f "$SRC/train-images-idx3-ubyte.gz" ] || { echo "vision-demo: $SRC has no Fashion-MNIST (apt-get install dataset-fashion-mnist)"; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT/img" "$OUT/model"

# 1. the images as PNG files (28x28 gray) and JSONL samples: train from the training split, test from the test split
python3 - "$SRC" "$OUT" "$NTRAIN" "$NTEST" <<'PY'
import gzip, json, struct, sys, zlib
src, out, ntrain, ntest = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
def png(w, h, rows):
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    raw = b"".join(b"\0" + r for r in rows)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
for split, n in (("train", ntrain), ("t10k", ntest)):
    img = gzip.open(f"{src}/{split}-images-idx3-ubyte.gz").read()
    lab = gzip.open(f"{src}/{split}-labels-idx1-ubyte.gz").read()
    count, h, w = struct.unpack(">III", img[4:16])
    name = "train" if split == "train" else "test"
    with open(f"{out}/{name}.jsonl", "w") as f:
        for i in range(min(n, count)):
            px = img[16 + i * h * w: 16 + (i + 1) * h * w]
            p = f"img/{name}_{i:05d}.png"
            open(f"{out}/{p}", "wb").write(png(w, h, [px[r * w:(r + 1) * w] for r in range(h)]))
            f.write(json.dumps({"text": "<image>What is this?", "images": [p], "answer": " " + names[lab[8 + i]]}) + "\n")
with open(f"{out}/corpus.txt", "w") as f:
    f.write(("What is this? " + " ".join(names) + "\n") * 50)
PY

# 2. a byte-level BPE tokenizer with K3's specials (media tokens included) and the model config
"$K3C" tokenizer train --input "$OUT/corpus.txt" --vocab-size 300 --out "$OUT/model/tiktoken.model" >/dev/null
echo '{"pattern": "kimi"}' > "$OUT/model/k3c_tokenizer.json"
python3 - "$OUT/model" <<'PY'
import json, sys
d = sys.argv[1]
ranks = sum(1 for _ in open(f"{d}/tiktoken.model"))
sp = json.load(open(f"{d}/tiktoken.model.specials.json"))
vocab = max([ranks] + [int(v) for v in sp.values()]) + 1
c = json.load(open("configs/k3_test_tiny.json"))
t = c["text_config"]
t.update(vocab_size=vocab, hidden_size=32, intermediate_size=64)
c["media_placeholder_token_id"] = int(sp["<|media_pad|>"])
c["vision_config"] = {"patch_size": 14, "vt_hidden_size": 32, "vt_intermediate_size": 64, "vt_num_attention_heads": 2,
    "vt_num_hidden_layers": 2, "qkv_hidden_size": 32, "mm_hidden_size": 32, "text_hidden_size": 32,
    "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool", "mm_projector_type": "patchmergerv2", "mlp_type": "mlp2",
    "activation_func": "gelu_pytorch_tanh", "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05,
    "norm_type": "rmsnorm", "pos_emb_type": "divided_fixed", "init_pos_emb_height": 8, "init_pos_emb_width": 8,
    "init_pos_emb_time": 1, "pos_emb_interpolation_mode": "bilinear", "attn_bias": False, "linear_bias": False,
    "patch_embed_proj_bias": False}
json.dump(c, open(f"{d}/config.json", "w"), indent=1)
PY

# 3. train the model and the tower together, then score the held-out split
"$K3C" vision train --model "$OUT/model" --data "$OUT/train.jsonl" --eval "$OUT/test.jsonl" --steps "$STEPS" \
    --batch "$BATCH" --threads "$THREADS" --seed "$SEED" --log-every 25 | tee "$OUT/result.txt"
