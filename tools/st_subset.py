#!/usr/bin/env python3
"""st_subset.py — copies the named tensors of a safetensors file into a new one (the GPU machine gets a golden's ids
and logits without its gradients). Usage: st_subset.py IN OUT NAME... (names absent from IN are skipped)."""
import json, struct, sys

src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(src, 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    head = json.loads(f.read(n))
    base = 8 + n
    out, blobs, off = {}, [], 0
    for k in names:
        if k not in head:
            continue
        a, b = head[k]['data_offsets']
        f.seek(base + a)
        blobs.append(f.read(b - a))
        out[k] = {'dtype': head[k]['dtype'], 'shape': head[k]['shape'], 'data_offsets': [off, off + b - a]}
        off += b - a
h = json.dumps(out).encode()
h += b' ' * (-len(h) % 8)
with open(dst + '.tmp', 'wb') as f:
    f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))
import os
os.replace(dst + '.tmp', dst)
