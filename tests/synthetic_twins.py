#!/usr/bin/env python3
"""The synthetic models' quantized blocks (hip/synthetic-qwen35.py), read
back by upstream's gguf-py: its dequantizers and its GGUF reader are an
independent implementation of every block layout and of the file format.

  PYTHONPATH=<pinned llama.cpp>/gguf-py python tests/synthetic_twins.py LLAMA_QUANTIZE WORKDIR

Checks:
- --agree's crafted first blocks hold exactly one nonzero weight, the one
  asked for, and the constant blocks of eh_proj hold it in every weight;
- random blocks of every type the writer fills are finite, below the
  writer's stated size, and centred on 0 (the types with a minimum too);
- a --weights like twin of a model llama-quantize made (Q4_K_M, MTP head,
  --agree) has every tensor in the same type and of the same size, and
  gguf-py reads it;
- a model rebuilt from its header (hip/gguf-skeleton.py) has that header,
  every tensor where gguf-py finds it and finite contents, and a type the
  tool cannot fill stops it, naming the tensor.
"""

import importlib.util
import os
import struct
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("synthetic", os.path.join(HERE, "..", "hip", "synthetic-qwen35.py"))
syn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(syn)

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def weights(ttype, blocks):
    data = np.frombuffer(blocks, dtype=np.uint8).reshape(1, -1)
    return quants.dequantize(data, GGMLQuantizationType(ttype)).reshape(-1).astype(np.float64)


F16_REL = 2.0 ** -10  # a value through an f16 scale


def centred(w):
    """The weights' mean within 15% of their mean magnitude: centred on 0
    (weights all of one sign would be 100%)."""
    return abs(w.mean()) <= 0.15 * np.abs(w).mean()

for t in (syn.Q8_0, 12, 13, 14):
    name = syn.type_name(t)
    for v in (1000.0, 1.0, 0.0):
        w = weights(t, syn.single_block(t, v))
        check(abs(w[0] - v) <= v * F16_REL and not w[1:].any(),
              "%s single block %g: weight 0 is %g, %d other weights nonzero" % (name, v, w[0], np.count_nonzero(w[1:])))
    w = weights(t, syn.constant_block(t, 16.0))
    check(np.all(w == w[0]) and abs(w[0] - 16.0) <= 16.0 * F16_REL,
          "%s constant block 16: weights %g..%g" % (name, w.min(), w.max()))

pool = syn.Pool(size=1 << 22)
for t in sorted(syn.BLOCKS):
    for scale in (1.0, 1 / 8):
        run = syn.RandomBlocks(pool, t, scale, count=1024)
        w = weights(t, bytes(run.data))
        big = np.abs(w).max()
        # Q4_0's and IQ4_NL's grids lean negative (-8..7, -127..113): 12% and
        # 11% of mean |w| for uniform codes; weights without a centred minimum
        # would be 100%.
        check(np.isfinite(w).all() and big <= 2.0 * scale and centred(w),
              "%s random blocks x%g: max |w| %.3g, mean %.3g of mean |w| %.3g"
              % (syn.type_name(t), scale, big, w.mean(), np.abs(w).mean()))

quantize, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
s = os.path.join(HERE, "..", "hip", "synthetic-qwen35.py")
small = ["--model", "dense27b", "--layers", "4", "--shrink", "4", "--mtp", "--agree"]
f16, ref, like = (os.path.join(work, n) for n in ("f16.gguf", "q4km.gguf", "like.gguf"))
subprocess.run([sys.executable, s, *small, "--weights", "f16", "-o", f16], check=True)
subprocess.run([quantize, f16, ref, "Q4_K_M", "2"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.run([sys.executable, s, *small, "--weights", "like", "--like", ref, "-o", like], check=True)
a = {t.name: (t.tensor_type, t.n_bytes, list(t.shape)) for t in GGUFReader(ref).tensors}
b = {t.name: (t.tensor_type, t.n_bytes, list(t.shape)) for t in GGUFReader(like).tensors}
check(a.keys() == b.keys(), "like twin: the reference's %d tensors, %d written" % (len(a), len(b)))
diff = [n for n in a if n in b and a[n] != b[n]]
check(not diff, "like twin: type, size and shape of every tensor as llama-quantize's (%d differ%s)"
      % (len(diff), ": " + ", ".join(diff[:4]) if diff else ""))

# hip/gguf-skeleton.py: a model rebuilt from its header has the header byte
# for byte, every tensor where upstream's reader finds it holding contents
# of its kind (so a tensor written at the wrong place shows), and what the
# tool cannot read or fill stops it, naming the file or tensor, with no
# output.
sk = os.path.join(HERE, "..", "hip", "gguf-skeleton.py")
esc = os.path.join(work, "escha.gguf")
subprocess.run([sys.executable, s, "--model", "dense27b", "--layers", "4", "--shrink", "4", "--weights", "escha",
                "-o", esc], check=True)
# and tensors whose sizes are not multiples of the alignment, so that each
# one's padding matters
odd = os.path.join(work, "odd.gguf")
g = syn.Gguf()
g.add("general.architecture", syn.T_STR, "none")
g.tensor("a.weight", [3], syn.F32, syn.const_f32(1.0))
g.tensor("b.weight", [32, 1], syn.Q8_0, lambda out, n: pool.q8_0.rows(1, out))
g.tensor("c.escha_rout", [5], syn.F16, syn.const_f16(syn.f16_bits(syn.ROUT)))
g.tensor("d.weight", [16, 2], syn.F16, lambda out, n: pool.stream(pool.tame, n, out))
g.write(odd)
for src in (ref, esc, odd):
    skel, filled = src + ".skel", src + ".filled.gguf"
    subprocess.run([sys.executable, sk, "strip", src, skel], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, sk, "fill", skel, filled], check=True, stdout=subprocess.DEVNULL)
    _, align, _, end = syn.read_header(src)
    rb = GGUFReader(filled)
    head = open(skel, "rb").read()
    with open(src, "rb") as fa, open(filled, "rb") as fb:
        check(len(head) == end and fa.read(end) == head and fb.read(end) == head
              and rb.data_offset == end + (-end % align),
              "skeleton of %s: its header byte for byte (%d bytes), in the rebuilt model too, data from byte %d"
              % (os.path.basename(src), len(head), rb.data_offset))
    check(os.path.getsize(filled) == os.path.getsize(src), "rebuilt %s: %d bytes, the model's %d"
          % (os.path.basename(src), os.path.getsize(filled), os.path.getsize(src)))
    check(len(rb.tensors) == len(GGUFReader(src).tensors), "gguf-py reads the rebuilt %s: %d tensors"
          % (os.path.basename(src), len(rb.tensors)))
    bad = []
    for t in rb.tensors:
        tt = GGMLQuantizationType(t.tensor_type)
        shape = [int(d) for d in t.shape]
        if tt == GGMLQuantizationType.I16:  # escha codes: random words
            v = np.asarray(t.data).reshape(-1)
            ok = len(np.unique(v)) > min(v.size, 4096) // 2
        elif tt in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            v = np.asarray(t.data, dtype=np.float64).reshape(-1)
            if not syn.is_matrix(shape):
                ok = np.all(v == (np.float64(np.float16(syn.ROUT)) if t.name.endswith("escha_rout") else 1.0))
            elif tt == GGMLQuantizationType.F32:
                ok = np.all(v == np.float64(np.float32(0.1)))
            else:
                ok = np.isfinite(v).all() and np.abs(v).max() < 0.125 and np.abs(v).min() >= 0.0625
        else:
            v = weights(t.tensor_type, bytes(t.data))
            ok = np.isfinite(v).all() and 0 < np.abs(v).max() <= 2.0
            # centred on 0, where there are weights enough for the mean to say so
            ok = ok and (v.size < 4096 or centred(v))
        if not ok:
            bad.append(t.name)
    check(not bad, "rebuilt %s: each tensor's contents of its kind (%d wrong%s)"
          % (os.path.basename(src), len(bad), ": " + ", ".join(bad[:4]) if bad else ""))
    os.remove(filled)
out = os.path.join(work, "bad.gguf")


def fails_cleanly(skel, words, what):
    """fill of `skel` stops with a message holding every one of `words`,
    leaving no output."""
    for f in (out, out + ".tmp"):
        if os.path.exists(f):
            os.remove(f)
    r = subprocess.run([sys.executable, sk, "fill", skel, out], capture_output=True, text=True)
    check(r.returncode != 0 and all(w in r.stderr for w in words) and "Traceback" not in r.stderr
          and not os.path.exists(out) and not os.path.exists(out + ".tmp"),
          "fill of %s: stops (%s), no output" % (what, r.stderr.strip()))


# A tensor of a type the tool has no blocks for (IQ1_S): the skeleton's
# first tensor retyped (its info is the last place its length-prefixed name
# occurs: tensor infos end the header).
raw = bytearray(open(esc + ".skel", "rb").read())
first = GGUFReader(esc).tensors[0]
key = struct.pack("<Q", len(first.name)) + first.name.encode()
at = raw.rfind(key) + len(key) + 4 + 8 * len(first.shape)
raw[at:at + 4] = (19).to_bytes(4, "little")
open(esc + ".bad.skel", "wb").write(bytes(raw))
fails_cleanly(esc + ".bad.skel", (first.name, "IQ1_S"), "a skeleton with an IQ1_S tensor")
fails_cleanly(os.path.join(HERE, "synthetic_twins.py"), ("not a GGUF file",), "a file that is no GGUF")
g = syn.Gguf()
g.add("general.alignment", syn.T_U32, 0)
g.tensor("a.weight", [4], syn.F32, syn.const_f32(1.0))
g.write(odd + ".align0")
fails_cleanly(odd + ".align0", ("align0", "alignment 0"), "a header whose general.alignment is 0")
fails_cleanly(odd + ".skel" + ".gone", ("gone", "No such file"), "a file that is not there")

for f in (f16, ref, like, esc, odd, ref + ".skel", esc + ".skel", odd + ".skel", esc + ".bad.skel", odd + ".align0"):
    os.remove(f)

if failures:
    sys.exit("%d synthetic-twin checks failed" % len(failures))
print("synthetic twins: all checks passed")
