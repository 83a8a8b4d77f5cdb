#!/usr/bin/env python3
"""A GGUF's header alone, and a model of the same layout rebuilt from it.

A model too large to carry to a machine without network travels as its
header (metadata, tokenizer, tensor names, shapes, types and offsets: a few
MB) and is rebuilt there with random tensor contents of the same types,
which is all a speed measurement needs: the kernels' time does not depend
on the values.

  python3 hip/gguf-skeleton.py strip MODEL.gguf MODEL.skel        # here
  python3 hip/gguf-skeleton.py fill MODEL.skel MODEL-random.gguf  # there

`fill` writes the header byte for byte, then every tensor at its offset:
- quantized types: random blocks with finite scales (hip/synthetic-qwen35.py's
  RandomBlocks, weights below about 1 and centred on 0);
- F16 matrices: random values of magnitude 1/16..1/8; I16 (escha codes):
  random words, every bit string being a valid code;
- vectors: F32 1.0 (norms, escha's s_in / s_out), F16 1.0 (escha_rin), and
  escha_rout as the synthetic models have it (0.02);
- F32 matrices (small ones such as a DeltaNet convolution's kernel): 0.1, as
  the synthetic models write that kernel.
What it cannot read or fill stops it with a message naming the file and
the tensor; the output is written through OUT.tmp, so a failure leaves no
partial file.
"""

import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("synthetic", os.path.join(HERE, "synthetic-qwen35.py"))
syn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(syn)


def write_through_tmp(dst, write):
    """write(out) into dst.tmp, then renamed to dst; no dst.tmp is left
    whatever happens."""
    try:
        with open(dst + ".tmp", "wb") as out:
            write(out)
        os.replace(dst + ".tmp", dst)
    finally:
        if os.path.exists(dst + ".tmp"):
            os.remove(dst + ".tmp")


def header_bytes(path):
    """The header of the GGUF at `path` (syn.read_header checks it) and
    what read_header read from it."""
    parsed = syn.read_header(path)
    with open(path, "rb") as f:
        return f.read(parsed[3]), parsed


def strip(src, dst):
    head, _ = header_bytes(src)
    write_through_tmp(dst, lambda out: out.write(head))
    return len(head)


def writer_for(pool, blocks_of_type, name, ne, ttype):
    """How to write tensor `name`'s random contents (its type and size are
    known: syn.tensor_nbytes)."""
    if ttype == syn.F32:
        return syn.const_f32(0.1 if syn.is_matrix(ne) else 1.0)
    if ttype == syn.F16:
        if syn.is_matrix(ne):
            return lambda out, n: pool.stream(pool.tame, n, out)
        return syn.const_f16(syn.f16_bits(syn.ROUT if name.endswith(".escha_rout") else 1.0))
    if ttype == syn.I16:
        return lambda out, n: pool.stream(pool.raw, n, out)
    # a quantized type with blocks (the only others tensor_nbytes knows)
    if ttype not in blocks_of_type:
        blocks_of_type[ttype] = syn.RandomBlocks(pool, ttype)
    size = syn.BLOCKS[ttype][1]
    return lambda out, n: blocks_of_type[ttype].rows(n // size, out, at=pool.pos_next())


def fill(skeleton, dst):
    head, (_, align, tensors, _) = header_bytes(skeleton)
    pool = syn.Pool()
    blocks_of_type = {}
    plan = []
    for name, ne, ttype, off in tensors:
        nbytes = syn.tensor_nbytes(ne, ttype)
        if nbytes is None:
            sys.exit("%s: tensor %s (%s, %s) is not whole blocks of a type this tool knows"
                     % (skeleton, name, syn.type_name(ttype), "x".join(map(str, ne))))
        if off % align:
            sys.exit("%s: tensor %s at data offset %d, not a multiple of the alignment %d" % (skeleton, name, off, align))
        plan.append((off, nbytes, name, writer_for(pool, blocks_of_type, name, ne, ttype)))
    plan.sort(key=lambda p: p[0])
    for (off0, n0, name0, _), (off, _, name, _) in zip(plan, plan[1:]):
        if off < off0 + n0:
            sys.exit("%s: tensor %s at data offset %d overlaps %s" % (skeleton, name, off, name0))

    def write(out):
        out.write(head)
        syn.write_data(out, align, plan)

    write_through_tmp(dst, write)
    return len(plan)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["strip", "fill"])
    ap.add_argument("src", metavar="IN", help="strip: the model; fill: its skeleton")
    ap.add_argument("dst", metavar="OUT")
    a = ap.parse_args()
    if os.path.abspath(a.src) == os.path.abspath(a.dst):
        sys.exit("%s: the output would overwrite the input" % a.dst)
    if a.command == "strip":
        n = strip(a.src, a.dst)
        print("%s: header of %s, %d bytes" % (a.dst, a.src, n))
    else:
        n = fill(a.src, a.dst)
        print("%s: %d tensors of %s's layout, random contents" % (a.dst, n, a.src))


if __name__ == "__main__":
    main()
