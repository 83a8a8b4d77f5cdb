#!/usr/bin/env python3
"""A GGUF's header alone, and a model of the same layout rebuilt from it.

A model too large to carry to a machine without network travels as its
header (metadata, tokenizer, tensor names, shapes, types and offsets: a few
MB) and is rebuilt there with random tensor contents of the same types,
which is all a speed measurement needs: the kernels' time does not depend
on the values.

  python3 hip/gguf-skeleton.py strip MODEL.gguf MODEL.skel      # here
  python3 hip/gguf-skeleton.py fill MODEL.skel MODEL-random.gguf  # there

`fill` writes the header byte for byte, then every tensor at its offset:
- quantized types: random blocks with finite scales (hip/synthetic-qwen35.py's
  RandomBlocks, weights below about 1 and centred on 0);
- F16 matrices: random values of magnitude 1/16..1/8; I16 (escha codes):
  random words, every bit string being a valid code;
- vectors: F32 1.0 (norms, escha's s_in / s_out), F16 1.0 (escha_rin), and
  0.02 for escha_rout, as the synthetic models have them; F32 matrices
  (small ones such as a convolution's kernel) 0.1.
A type it cannot fill stops it, naming the tensor; the output is written
through OUT.tmp, so a failure leaves no partial model.
"""

import argparse
import importlib.util
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("synthetic", os.path.join(HERE, "synthetic-qwen35.py"))
syn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(syn)


def strip(src, dst):
    _, _, _, end = syn.read_header(src)
    with open(src, "rb") as f:
        head = f.read(end)
    with open(dst + ".tmp", "wb") as out:
        out.write(head)
    os.replace(dst + ".tmp", dst)
    return end


def writer_for(pool, runs, name, ne, ttype):
    """How to write tensor `name`'s random contents (its type and size are
    known: tensor_nbytes)."""
    matrix = sum(d > 1 for d in ne) > 1
    if ttype == syn.F32:
        return syn.const_f32(0.1 if matrix else 1.0)
    if ttype == syn.F16:
        if matrix:
            return lambda out, n: pool.stream(pool.tame, n, out)
        return syn.const_f16(syn.f16_bits(0.02 if name.endswith(".escha_rout") else 1.0))
    if ttype == syn.I16:
        return lambda out, n: pool.stream(pool.raw, n, out)
    # tensor_nbytes knew the type: one of the quantized types with blocks
    if ttype not in runs:
        runs[ttype] = syn.RandomBlocks(pool, ttype)
    size = syn.BLOCKS[ttype][1]
    return lambda out, n: runs[ttype].rows(n // size, out, at=pool.pos_next())


def fill(skeleton, dst):
    _, align, tensors, end = syn.read_header(skeleton)
    pool = syn.Pool()
    runs = {}
    plan = []
    for name, ne, ttype, off in tensors:
        nbytes = syn.tensor_nbytes(ne, ttype)
        if nbytes is None:
            sys.exit("%s: tensor %s (%s, %s) is not whole blocks of a type this tool knows"
                     % (skeleton, name, syn.type_name(ttype), "x".join(map(str, ne))))
        plan.append((off, nbytes, name, writer_for(pool, runs, name, ne, ttype)))
    plan.sort(key=lambda p: p[0])
    for (off0, n0, name0, _), (off, _, name, _) in zip(plan, plan[1:]):
        if off < off0 + n0:
            sys.exit("%s: tensor %s at data offset %d overlaps %s" % (skeleton, name, off, name0))
    with open(skeleton, "rb") as f:
        head = f.read(end)
    try:
        with open(dst + ".tmp", "wb") as out:
            out.write(head)
            out.write(b"\0" * (-end % align))
            base = out.tell()
            for off, nbytes, name, write in plan:
                out.write(b"\0" * (base + off - out.tell()))
                write(out, nbytes)
            out.write(b"\0" * (-out.tell() % align))
        os.replace(dst + ".tmp", dst)
    finally:
        if os.path.exists(dst + ".tmp"):
            os.remove(dst + ".tmp")
    return len(plan)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["strip", "fill"])
    ap.add_argument("skeleton", metavar="IN", help="strip: the model; fill: its skeleton")
    ap.add_argument("output", metavar="OUT")
    a = ap.parse_args()
    if os.path.abspath(a.skeleton) == os.path.abspath(a.output):
        sys.exit("%s: the output would overwrite the input" % a.output)
    if a.command == "strip":
        n = strip(a.skeleton, a.output)
        print("%s: header of %s, %d bytes" % (a.output, a.skeleton, n))
    else:
        n = fill(a.skeleton, a.output)
        print("%s: %d tensors of %s's layout, random contents" % (a.output, n, a.skeleton))


if __name__ == "__main__":
    main()
