#!/usr/bin/env python3
"""Shape-exact synthetic Qwen3.5-family GGUFs for speed measurements.

Writes a model with the exact tensor shapes of Qwen3.8-27B (dense, arch
qwen35) or Qwen3.6-35B-A3B (MoE, arch qwen35moe), optionally with fewer
layers (keeping the 3 DeltaNet : 1 attention pattern), in one of two forms:

  f16    every matrix F16 (the twin that llama-quantize turns into Q4_K_M,
         IQ2_XXS, ...)
  escha  the projections the real checkpoints code (dense: all 400; MoE:
         the routed experts) as Escha-W2 codes with random code words (every
         bit string is a valid code), unit rin, rout 0.02, s_in/s_out 1;
         every other matrix Q8_0 with random blocks (as the exports' int8)

and, with --imatrix, a uniform importance matrix for the f16 twin (the
IQ2 types refuse to quantize without one). Values are random, so only
speed means anything. Pure Python, no numpy: runs anywhere python3 does.

--mtp (dense) adds the MTP head as llama.cpp's converter writes it: one more
block (block_count + 1, nextn_predict_layers 1), a full-attention decoder
layer plus nextn.eh_proj / enorm / hnorm / shared_head_norm, every matrix
F16 (the export ships the head fp16 and escha quantize keeps it so).
--agree makes trunk and head predict the same token at every step, the best
case of speculative decoding: every token embedding has 1000 at dim 0 over
small values elsewhere, the output norm and the head's norm keep dim 0 only,
eh_proj is the constant 16 (each of its outputs is 16x the sum of two
normalised vectors dominated by their positive dim 0), and every other
matrix is small; so the final hidden state's dim 0 is positive on both
paths, and both pick the one token whose output row is positive at dim 0
(the last; the others have 0 there).

  python3 hip/synthetic-qwen35.py --model dense27b --layers 16 --weights escha -o d-escha.gguf
  python3 hip/synthetic-qwen35.py --model dense27b --layers 16 --weights f16 -o d-f16.gguf --imatrix d.imatrix
  llama-quantize --imatrix d.imatrix d-f16.gguf d-iq2xxs.gguf IQ2_XXS
"""

import argparse
import os
import struct
import sys

MODELS = {
    # hidden, layers, heads, kv heads, head dim, k heads, v heads, state, ffn, experts, used, expert ffn, shared ffn
    "dense27b": dict(arch="qwen35", n_embd=5120, n_layer=64, n_head=24, n_head_kv=4, head_dim=256,
                     ssm_k_heads=16, ssm_v_heads=48, ssm_state=128, n_ff=17408, n_vocab=248320),
    "moe35b": dict(arch="qwen35moe", n_embd=2048, n_layer=40, n_head=16, n_head_kv=2, head_dim=256,
                   ssm_k_heads=16, ssm_v_heads=32, ssm_state=128, n_expert=256, n_expert_used=8,
                   n_ff_exp=512, n_ff_shexp=512, n_vocab=248320),
}

# ggml types
F32, F16, Q8_0, I16 = 0, 1, 8, 25
ALIGN = 32

# GGUF value types
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9


Q8_0_PER = 1 << 16  # blocks in the pool's Q8_0 run
ROUT = 0.02  # every coded projection's rout unless --rout says otherwise


class Pool:
    """Random bytes reused as tensor contents (the file is disk-bound, not
    generator-bound). F16 words get their top exponent bit cleared, so every
    value is finite with |v| < 2."""

    def __init__(self, size=1 << 26):
        raw = bytearray(os.urandom(size))
        self.raw = bytes(raw)
        clear = bytes(b & 0xBF for b in range(256))
        raw[1::2] = raw[1::2].translate(clear)
        self.f16 = bytes(raw)
        # Tame values for logit checks: random sign and mantissa, exponent
        # fixed at 2^-4, so 0.0625 <= |v| < 0.125.
        tame = bytes((b & 0x83) | (0x0B << 2) for b in range(256))
        raw[1::2] = bytes(self.raw[1::2]).translate(tame)
        self.tame = bytes(raw)
        # Q8_0 blocks (f16 scale 2^-7, random int8 values), made once.
        self.q8_0 = RandomBlocks(self, Q8_0, count=Q8_0_PER)
        self.pos = 0

    def stream(self, src, n, out):
        start = (self.pos * 4099) % (len(src) // 2) * 2  # even: f16 words stay aligned
        self.pos += 1
        while n > 0:
            chunk = src[start:start + n]
            out.write(chunk)
            n -= len(chunk)
            start = 0

    def pos_next(self):
        """A start that differs from one tensor to the next."""
        self.pos += 1
        return self.pos * 4099


# Quantized types a --like twin may hold: ggml type -> (weights a block,
# bytes a block, offsets of its f16 scales, the value written there). Any
# bytes are a valid block once the scales are finite; the scales keep the
# weights below about 1, and the types with a minimum get one that centres
# their weights on 0 on average (all-positive weights would add up).
BLOCKS = {
    2: (32, 18, (0,), 1 / 128),                 # Q4_0
    3: (32, 20, (0, 2), (1 / 128, -7.5 / 128)),  # Q4_1
    6: (32, 22, (0,), 1 / 128),                 # Q5_0
    7: (32, 24, (0, 2), (1 / 128, -15.5 / 128)),  # Q5_1
    Q8_0: (32, 34, (0,), 1 / 128),
    10: (256, 84, (80, 82), (1 / 128, 1.5 / 128)),  # Q2_K
    11: (256, 110, (108,), 1 / 1024),           # Q3_K
    12: (256, 144, (0, 2), (1 / 2048, 7.5 / 2048)),  # Q4_K
    13: (256, 176, (0, 2), (1 / 4096, 15.5 / 4096)),  # Q5_K
    14: (256, 210, (208,), 1 / 4096),           # Q6_K
    16: (256, 66, (0,), 1 / 256),               # IQ2_XXS
    17: (256, 74, (0,), 1 / 256),               # IQ2_XS
    18: (256, 98, (0,), 1 / 256),               # IQ3_XXS
    20: (32, 18, (0,), 1 / 128),                # IQ4_NL
    21: (256, 110, (0,), 1 / 256),              # IQ3_S
    22: (256, 82, (0,), 1 / 256),               # IQ2_S
    23: (256, 136, (0,), 1 / 4096),             # IQ4_XS
}
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
              20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 25: "I16", 29: "IQ1_M", 30: "BF16"}


def type_name(t):
    return TYPE_NAMES.get(t, "type %d" % t)


class RandomBlocks:
    """A run of random blocks of one type, made once, streamed like the
    pool's Q8_0 run."""

    def __init__(self, pool, ttype, scale=1.0, count=1 << 14):
        per, size, offs, vals = BLOCKS[ttype]
        vals = [v * scale for v in (vals if isinstance(vals, tuple) else (vals,))]
        b = bytearray(pool.raw[:size * count])
        for off, v in zip(offs, vals):
            word = struct.pack("<H", f16_bits(v))
            b[off::size] = word[:1] * count
            b[off + 1::size] = word[1:] * count
        self.size, self.count, self.data = size, count, memoryview(bytes(b))

    def rows(self, n_blocks, out, at=0):
        at %= self.count
        while n_blocks > 0:
            k = min(n_blocks, self.count - at)
            out.write(self.data[self.size * at:self.size * (at + k)])
            n_blocks -= k
            at = 0


def single_block(ttype, v0):
    """One block of `ttype` whose first weight is `v0` (>= 0) and every
    other weight 0: the first block of a --agree row."""
    z = bytearray(BLOCKS[ttype][1] if ttype != F16 else 0)
    if ttype == Q8_0:
        z[0:2] = struct.pack("<H", f16_bits(v0 / 127 if v0 else 1 / 128))
        z[2] = 127 if v0 else 0
    elif ttype == 12:  # Q4_K: d, dmin, 12 scale bytes (sub-block 0: scale 1, min 0), 4-bit weights
        z[0:2] = struct.pack("<H", f16_bits(v0 / 15 if v0 else 1 / 2048))
        z[4] = 1
        z[16] = 15 if v0 else 0
    elif ttype == 13:  # Q5_K: the same, and the weight's fifth bit in qh
        z[0:2] = struct.pack("<H", f16_bits(v0 / 31 if v0 else 1 / 4096))
        z[4] = 1
        z[16] = 1 if v0 else 0
        z[48] = 15 if v0 else 0
    elif ttype == 14:  # Q6_K: weights 0..15 under int8 scale 0 (others 0); q - 32, q from ql and qh
        z[128:128 + 16] = b"\x02" * 16  # q = 32: 0
        if v0:
            z[0] = 15
            z[128] = 3
        z[192] = 1
        z[208:210] = struct.pack("<H", f16_bits(v0 / 31 if v0 else 1 / 4096))
    else:
        return None
    return bytes(z)


def constant_block(ttype, v):
    """One block of `ttype` whose every weight is `v` (> 0), or None."""
    z = bytearray(BLOCKS[ttype][1])
    if ttype == Q8_0:
        z[0:2] = struct.pack("<H", f16_bits(v / 127))
        z[2:34] = b"\x7f" * 32
    elif ttype in (12, 13):  # Q4_K / Q5_K: every sub-block scale 1 (the 6-bit fields), min 0, top weight
        top = 15 if ttype == 12 else 31
        z[0:2] = struct.pack("<H", f16_bits(v / top))
        z[4:8] = b"\x01" * 4
        z[12:16] = b"\x01" * 4
        z[16:] = b"\xff" * (len(z) - 16)
    elif ttype == 14:  # Q6_K: every int8 scale 1, q = 63
        z[0:192] = b"\xff" * 192
        z[192:208] = b"\x01" * 16
        z[208:210] = struct.pack("<H", f16_bits(v / 31))
    else:
        return None
    return bytes(z)


def read_header(path):
    """The header of the GGUF at `path`: (general.file_type or None,
    general.alignment, [(name, ne, ggml type, data offset) of every tensor],
    the header's length in bytes, before its padding to the alignment).
    Exits naming the file and the byte where it is not a GGUF header."""
    try:
        f = open(path, "rb")
    except OSError as e:
        sys.exit("%s: %s" % (path, e.strerror))
    with f:
        size = os.fstat(f.fileno()).st_size

        def bad(what):
            sys.exit("%s: not a readable GGUF header (%s at byte %d)" % (path, what, f.tell()))

        def rd(fmt):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) != n:
                bad("the header ends early")
            return struct.unpack(fmt, b)

        def rs():
            n = rd("<Q")[0]
            if n > size - f.tell():
                bad("a string of %d bytes past the end of the file" % n)
            try:
                return f.read(n).decode()
            except UnicodeDecodeError:
                bad("a string that is not UTF-8")

        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

        def skip(vt):
            if vt == T_STR:
                rs()
            elif vt == T_ARR:
                sub, n = rd("<IQ")
                if sub in (T_STR, T_ARR):
                    for _ in range(n):
                        skip(sub)
                elif sub in sizes:
                    f.seek(sizes[sub] * n, 1)
                else:
                    bad("an array of value type %d" % sub)
            elif vt in sizes:
                f.seek(sizes[vt], 1)
            else:
                bad("value type %d" % vt)

        if f.read(4) != b"GGUF":
            sys.exit("%s: not a GGUF file" % path)
        ver, n_t, n_kv = rd("<IQQ")
        if ver not in (2, 3):
            sys.exit("%s: GGUF version %d (this reader knows 2 and 3)" % (path, ver))
        file_type, align = None, ALIGN
        for _ in range(n_kv):
            key = rs()
            vt = rd("<I")[0]
            if key == "general.file_type" and vt == T_U32:
                file_type = rd("<I")[0]
            elif key == "general.alignment":
                align = rd("<I")[0] if vt == T_U32 else bad("general.alignment of value type %d, not u32" % vt)
                if align == 0 or align & (align - 1):
                    bad("general.alignment %d, not a power of two" % align)
            else:
                skip(vt)
        tensors = []
        for _ in range(n_t):
            name = rs()
            nd = rd("<I")[0]
            ne = list(rd("<%dQ" % nd))
            ttype, off = rd("<IQ")
            tensors.append((name, ne, ttype, off))
        return file_type, align, tensors, f.tell()


def tensor_types(path):
    """(name -> ggml type of every tensor, general.file_type) of the GGUF at
    `path`."""
    file_type, _, tensors, _ = read_header(path)
    return {name: ttype for name, _, ttype, _ in tensors}, file_type


def tensor_nbytes(ne, ttype):
    """Bytes of a tensor of shape `ne` and ggml type `ttype`, or None for a
    type this writer does not know or rows that are not whole blocks."""
    n = 1
    for d in ne:
        n *= d
    if ttype == F32:
        return 4 * n
    if ttype in (F16, I16):
        return 2 * n
    if ttype not in BLOCKS or ne[0] % BLOCKS[ttype][0] != 0:
        return None
    return n // BLOCKS[ttype][0] * BLOCKS[ttype][1]


class Gguf:
    def __init__(self):
        self.kv = []
        self.tensors = []  # (name, ne, type, nbytes, writer)

    def add(self, key, vtype, val, sub=None):
        self.kv.append((key, vtype, val, sub))

    def tensor(self, name, ne, ttype, writer):
        nbytes = tensor_nbytes(ne, ttype)
        assert nbytes is not None, name
        self.tensors.append((name, list(ne), ttype, nbytes, writer))

    @staticmethod
    def _str(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def _val(self, vtype, val, sub):
        if vtype == T_U32:
            return struct.pack("<I", val)
        if vtype == T_I32:
            return struct.pack("<i", val)
        if vtype == T_F32:
            return struct.pack("<f", val)
        if vtype == T_BOOL:
            return struct.pack("<B", 1 if val else 0)
        if vtype == T_STR:
            return self._str(val)
        if vtype == T_ARR:
            head = struct.pack("<IQ", sub, len(val))
            if sub == T_STR:
                return head + b"".join(self._str(v) for v in val)
            fmt = {T_U32: "I", T_I32: "i", T_F32: "f"}[sub]
            return head + struct.pack("<%d%s" % (len(val), fmt), *val)
        raise ValueError(vtype)

    def write(self, path):
        with open(path, "wb") as out:
            out.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
            for key, vtype, val, sub in self.kv:
                out.write(self._str(key) + struct.pack("<I", vtype) + self._val(vtype, val, sub))
            placed = []  # (data offset, bytes, name, writer): each tensor's aligned place
            off = 0
            for name, ne, ttype, nbytes, writer in self.tensors:
                out.write(self._str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
                          + struct.pack("<IQ", ttype, off))
                placed.append((off, nbytes, name, writer))
                off += (nbytes + ALIGN - 1) // ALIGN * ALIGN
            write_data(out, ALIGN, placed)


def write_data(out, align, tensors):
    """A GGUF's data section after its header (already in `out`): the
    padding to `align`, then each of `tensors` [(data offset, bytes, name,
    writer(out, bytes))], sorted by offset, at its offset, zeros between, and
    the padding after the last."""
    out.write(b"\0" * (-out.tell() % align))
    base = out.tell()
    for off, nbytes, name, writer in tensors:
        out.write(b"\0" * (base + off - out.tell()))
        writer(out, nbytes)
        assert out.tell() == base + off + nbytes, name
    out.write(b"\0" * (-out.tell() % align))


def is_matrix(ne):
    """More than one dimension above 1: a matrix (or stack of them), not a
    vector, whatever its rank."""
    return sum(d > 1 for d in ne) > 1


def const_f16(bits):
    return lambda out, n: out.write(struct.pack("<H", bits) * (n // 2))


def const_f32(v):
    return lambda out, n: out.write(struct.pack("<f", v) * (n // 4))


def f16_bits(v):
    return struct.unpack("<H", struct.pack("<e", v))[0]


def one_hot_f32(out, n):
    out.write(struct.pack("<f", 1.0) + b"\0" * (n - 4))


def build(model, n_layer, weights, imatrix_path, out_path, rout=ROUT, plain="q8_0", mtp=False, agree=False, like=None,
          mtp_coded=False):
    """`like`: for weights "like", the GGUF whose tensor types to take."""
    m = dict(MODELS[model])
    rout_bits = f16_bits(rout)
    arch = m["arch"]
    moe = "n_expert" in m
    E = m.get("n_expert", 1)
    H, hd = m["n_embd"], m["head_dim"]
    key_dim = m["ssm_k_heads"] * m["ssm_state"]
    value_dim = m["ssm_v_heads"] * m["ssm_state"]
    pool = Pool()
    g = Gguf()
    imat = []  # (weight name, n_per_row, n_mat)
    ref_types, ref_ftype = tensor_types(like) if like else ({}, None)
    runs = {}  # ggml type -> RandomBlocks
    # --agree: an eighth of the weights' size, so that over 64 layers no
    # layer outweighs dim 0 (the escha model's are small through rout).
    block_scale = 1 / 8 if agree else 1.0

    def ref_type(name):
        """The reference's type of `name`; random blocks of it must be
        writable."""
        if name not in ref_types:
            sys.exit("%s: no tensor %s (make it from a twin with the same layers and options)" % (like, name))
        t = ref_types[name]
        if t not in BLOCKS and t not in (F32, F16):
            sys.exit("%s: tensor %s is %s, which this writer cannot fill with random blocks" % (like, name, type_name(t)))
        return t

    def like_matrix(name, ne):
        """A matrix of the reference's type: random blocks (F16: values of
        magnitude 1/16..1/8)."""
        t = ref_type(name)
        if t == F16:
            g.tensor(name, ne, F16, lambda out, n: pool.stream(pool.tame, n, out))
        elif t == F32:
            sys.exit("%s: matrix %s is F32; a twin's matrices are F16 or quantized" % (like, name))
        else:
            if t not in runs:
                runs[t] = RandomBlocks(pool, t, block_scale)
            g.tensor(name, ne, t, lambda out, n: runs[t].rows(n // BLOCKS[t][1], out, at=pool.pos_next()))

    g.add("general.architecture", T_STR, arch)
    g.add("general.name", T_STR, "synthetic %s, %d of %d layers, %s" % (model, n_layer, m["n_layer"], weights))
    g.add("general.file_type", T_U32, {"f16": 1, "escha": 7, "like": ref_ftype or 0}[weights])
    g.add(arch + ".block_count", T_U32, n_layer + (1 if mtp else 0))
    if mtp:
        g.add(arch + ".nextn_predict_layers", T_U32, 1)
    g.add(arch + ".context_length", T_U32, 262144)
    g.add(arch + ".embedding_length", T_U32, H)
    g.add(arch + ".feed_forward_length", T_U32, m.get("n_ff", 0))
    g.add(arch + ".attention.head_count", T_U32, m["n_head"])
    g.add(arch + ".attention.head_count_kv", T_U32, m["n_head_kv"])
    g.add(arch + ".attention.key_length", T_U32, hd)
    g.add(arch + ".attention.value_length", T_U32, hd)
    g.add(arch + ".attention.layer_norm_rms_epsilon", T_F32, 1e-6)
    g.add(arch + ".rope.dimension_count", T_U32, hd // 4)
    g.add(arch + ".rope.freq_base", T_F32, 1e7)
    g.add(arch + ".rope.dimension_sections", T_ARR, [11, 11, 10, 0], T_I32)
    g.add(arch + ".full_attention_interval", T_U32, 4)
    g.add(arch + ".ssm.conv_kernel", T_U32, 4)
    g.add(arch + ".ssm.state_size", T_U32, m["ssm_state"])
    g.add(arch + ".ssm.group_count", T_U32, m["ssm_k_heads"])
    g.add(arch + ".ssm.time_step_rank", T_U32, m["ssm_v_heads"])
    g.add(arch + ".ssm.inner_size", T_U32, value_dim)
    if moe:
        g.add(arch + ".expert_count", T_U32, E)
        g.add(arch + ".expert_used_count", T_U32, m["n_expert_used"])
        g.add(arch + ".expert_feed_forward_length", T_U32, m["n_ff_exp"])
        g.add(arch + ".expert_shared_feed_forward_length", T_U32, m["n_ff_shexp"])
    if weights == "escha":
        g.add("escha.format_version", T_U32, 2)
        g.add("escha.codebook", T_U32, 1)
    # A synthetic SentencePiece-style vocabulary: control tokens, 256 byte
    # tokens, fillers (llama-bench feeds random token ids).
    nv = m["n_vocab"]
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    toks += ["t%d" % i for i in range(nv - len(toks))]
    g.add("tokenizer.ggml.model", T_STR, "llama")
    g.add("tokenizer.ggml.tokens", T_ARR, toks, T_STR)
    g.add("tokenizer.ggml.scores", T_ARR, [0.0] * nv, T_F32)
    g.add("tokenizer.ggml.token_type", T_ARR, [2, 3, 3] + [6] * 256 + [1] * (nv - 259), T_I32)
    g.add("tokenizer.ggml.bos_token_id", T_U32, 1)
    g.add("tokenizer.ggml.eos_token_id", T_U32, 2)

    def vec(name, n, value=1.0):
        g.tensor(name, [n], F32, const_f32(value))

    twin_values = pool.tame if agree else pool.f16

    def dense_matrix(name, ne):
        """A non-coded matrix: F16 in the twin, Q8_0 in the escha model (with
        `like`, the reference's type)."""
        if like:
            like_matrix(name, ne)
        elif weights == "f16":
            g.tensor(name, ne, F16, lambda out, n: pool.stream(twin_values, n, out))
            if not name.startswith(("token_embd", "output")):
                imat.append((name, ne[0], ne[2] if len(ne) > 2 else 1))
        elif plain == "f16":
            g.tensor(name, ne, F16, lambda out, n: pool.stream(pool.tame, n, out))
        else:
            g.tensor(name, ne, Q8_0, lambda out, n: pool.q8_0.rows(n // 34, out))

    def coded(stem, ic, oc, k, n_exp=0):
        """A projection the real checkpoints code (ic -> oc, K bits)."""
        ne = [ic, oc] + ([n_exp] if n_exp else [])
        if weights == "like":
            like_matrix(stem + ".weight", ne)
            return
        if weights == "f16":
            g.tensor(stem + ".weight", ne, F16, lambda out, n: pool.stream(twin_values, n, out))
            imat.append((stem + ".weight", ic, n_exp or 1))
            return
        e = [n_exp] if n_exp else []
        g.tensor(stem + ".escha_code", [16 * k, oc // 16, ic // 16] + e, I16, lambda out, n: pool.stream(pool.raw, n, out))
        g.tensor(stem + ".escha_rin", [ic] + e, F16, const_f16(0x3C00))   # 1.0
        g.tensor(stem + ".escha_rout", [oc] + e, F16, const_f16(rout_bits))
        g.tensor(stem + ".escha_s_in", [ic] + e, F32, const_f32(1.0))
        g.tensor(stem + ".escha_s_out", [oc] + e, F32, const_f32(1.0))

    def head_matrix(name, ne):
        """An MTP-head matrix: F16 in both models, as the export ships it
        (with `like`: the reference's type, as llama-quantize gives the head;
        for an escha model that is like with like, the head not being
        coded)."""
        if like:
            like_matrix(name, ne)
            return
        g.tensor(name, ne, F16, lambda out, n: pool.stream(pool.tame if agree or weights == "escha" else pool.f16, n, out))
        if weights == "f16":
            imat.append((name, ne[0], 1))

    def row_type(name):
        return ref_type(name) if like else F16 if weights == "f16" else Q8_0

    def crafted_rows(name, first):
        """--agree rows of token_embd / output: weight 0 of row r is
        first(r, rows), the rest small (F16) or random blocks."""
        t = row_type(name)
        if t != F16 and single_block(t, 1.0) is None:
            sys.exit("%s: --agree writes %s's first weight exactly, which %s cannot hold here (F16, Q8_0, Q4_K, Q5_K "
                     "or Q6_K can)" % (like, name, type_name(t)))
        per, size = (1, 2) if t == F16 else BLOCKS[t][:2]
        if t != F16 and t not in runs:
            runs[t] = RandomBlocks(pool, t, block_scale)

        def write(out, n):
            rows = n // (H // per * size)
            firsts = {}
            for r in range(rows):
                v = first(r, rows)
                if t == F16:
                    out.write(struct.pack("<H", f16_bits(v)))
                    pool.stream(pool.tame, 2 * (H - 1), out)
                else:
                    if v not in firsts:
                        firsts[v] = single_block(t, v)
                    out.write(firsts[v])
                    runs[t].rows(H // per - 1, out, at=r * 4099)

        g.tensor(name, [H, nv], t, write)

    if agree:
        # Every token embedding: 1000 at dim 0 over small values. The output
        # matrix: dim 0 is 0 in every row but the last token's, where it is
        # the largest value: with the norms keeping dim 0 only, that token
        # wins on both paths (no ties to break).
        crafted_rows("token_embd.weight", lambda r, rows: 1000.0)
        g.tensor("output_norm.weight", [H], F32, one_hot_f32)
        crafted_rows("output.weight", lambda r, rows: 1.0 if r == rows - 1 else 0.0)
    else:
        dense_matrix("token_embd.weight", [H, nv])
        vec("output_norm.weight", H)
        dense_matrix("output.weight", [H, nv])
    n_q = m["n_head"] * hd
    n_kv = m["n_head_kv"] * hd
    def trunk_linear(stem, ic, oc, k):
        """An attention or DeltaNet projection: coded in the dense export, int8
        (Q8_0 here) in the MoE one, which codes only the routed experts."""
        if moe:
            dense_matrix(stem + ".weight", [ic, oc])
        else:
            coded(stem, ic, oc, k)

    for il in range(n_layer):
        b = "blk.%d." % il
        vec(b + "attn_norm.weight", H)
        vec(b + "post_attention_norm.weight", H)
        if (il + 1) % 4 == 0:  # full attention
            trunk_linear(b + "attn_q", H, 2 * n_q, 2)  # query + gate
            trunk_linear(b + "attn_k", H, n_kv, 2)
            trunk_linear(b + "attn_v", H, n_kv, 2)
            trunk_linear(b + "attn_output", n_q, H, 2)
            vec(b + "attn_q_norm.weight", hd)
            vec(b + "attn_k_norm.weight", hd)
        else:  # gated DeltaNet
            trunk_linear(b + "attn_qkv", H, 2 * key_dim + value_dim, 2)
            trunk_linear(b + "attn_gate", H, value_dim, 2)
            g.tensor(b + "ssm_conv1d.weight", [4, 2 * key_dim + value_dim], F32, const_f32(0.1))
            vec(b + "ssm_dt.bias", m["ssm_v_heads"], 0.0)
            vec(b + "ssm_a", m["ssm_v_heads"], -1.0)
            dense_matrix(b + "ssm_beta.weight", [H, m["ssm_v_heads"]])
            dense_matrix(b + "ssm_alpha.weight", [H, m["ssm_v_heads"]])
            vec(b + "ssm_norm.weight", m["ssm_state"])
            trunk_linear(b + "ssm_out", value_dim, H, 2)
        if not moe:
            coded(b + "ffn_gate", H, m["n_ff"], 2)
            coded(b + "ffn_up", H, m["n_ff"], 3)
            coded(b + "ffn_down", m["n_ff"], H, 3)
        else:
            dense_matrix(b + "ffn_gate_inp.weight", [H, E])
            coded(b + "ffn_gate_up_exps", H, 2 * m["n_ff_exp"], 2, E)
            coded(b + "ffn_down_exps", m["n_ff_exp"], H, 3, E)
            vec(b + "ffn_gate_inp_shexp.weight", H, 0.01)
            dense_matrix(b + "ffn_gate_shexp.weight", [H, m["n_ff_shexp"]])
            dense_matrix(b + "ffn_up_shexp.weight", [H, m["n_ff_shexp"]])
            dense_matrix(b + "ffn_down_shexp.weight", [m["n_ff_shexp"], H])

    if mtp:
        b = "blk.%d." % n_layer
        vec(b + "attn_norm.weight", H)
        vec(b + "post_attention_norm.weight", H)
        def head_linear(stem, ic, oc, k):
            """A head projection: f16 (head_matrix), or coded as `escha
            quantize` codes it when a pattern asks (K as the trunk's)."""
            if mtp_coded and weights == "escha":
                coded(stem, ic, oc, k)
            else:
                head_matrix(stem + ".weight", [ic, oc])

        head_linear(b + "attn_q", H, 2 * n_q, 2)
        head_linear(b + "attn_k", H, n_kv, 2)
        head_linear(b + "attn_v", H, n_kv, 2)
        head_linear(b + "attn_output", n_q, H, 2)
        vec(b + "attn_q_norm.weight", hd)
        vec(b + "attn_k_norm.weight", hd)
        head_linear(b + "ffn_gate", H, m["n_ff"], 2)
        head_linear(b + "ffn_up", H, m["n_ff"], 3)
        head_linear(b + "ffn_down", m["n_ff"], H, 3)
        if agree:
            t = ref_type(b + "nextn.eh_proj.weight") if like else F16
            blk = None if t == F16 else constant_block(t, 16.0)
            if t == F16:
                g.tensor(b + "nextn.eh_proj.weight", [2 * H, H], F16, const_f16(f16_bits(16.0)))
            elif blk is None:
                sys.exit("%s: --agree needs nextn.eh_proj constant (16), which %s cannot hold here (F16, Q8_0, Q4_K, "
                         "Q5_K or Q6_K can)" % (like, type_name(t)))
            else:
                g.tensor(b + "nextn.eh_proj.weight", [2 * H, H], t, lambda out, n: out.write(blk * (n // len(blk))))
        else:
            head_matrix(b + "nextn.eh_proj.weight", [2 * H, H])
        vec(b + "nextn.enorm.weight", H)
        vec(b + "nextn.hnorm.weight", H)
        if agree:
            g.tensor(b + "nextn.shared_head_norm.weight", [H], F32, one_hot_f32)
        else:
            vec(b + "nextn.shared_head_norm.weight", H)

    g.write(out_path)

    if imatrix_path:
        im = Gguf()
        im.add("general.type", T_STR, "imatrix")
        im.add("imatrix.datasets", T_ARR, ["uniform (synthetic)"], T_STR)
        im.add("imatrix.chunk_count", T_U32, 1)
        im.add("imatrix.chunk_size", T_U32, 512)
        for name, n_per_row, n_mat in imat:
            im.tensor(name + ".in_sum2", [n_per_row, n_mat], F32, const_f32(1.0))
            im.tensor(name + ".counts", [1, n_mat], F32, const_f32(1.0))
        im.write(imatrix_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--layers", type=int, default=0, help="layers to write (multiple of 4; default: all)")
    ap.add_argument("--weights", choices=["f16", "escha", "like"], required=True,
                    help="like: every tensor in the type --like has it (llama-quantize's choice on a --shrink twin "
                         "with the same layers and options), random blocks; a quantized twin without its f16 file")
    ap.add_argument("--like", help="the GGUF whose tensor types to take: every tensor (--weights like), or with "
                                   "--weights escha every matrix not coded (like with like against that quantization)")
    ap.add_argument("--imatrix", help="also write a uniform importance matrix for the f16 twin")
    ap.add_argument("--shrink", type=int, default=1, help="divide every width by this (a quick functional check)")
    ap.add_argument("--rout", type=float, default=ROUT,
                    help="every coded projection's rout (default %g; larger makes the layers matter to the logits)" % ROUT)
    ap.add_argument("--plain", choices=["q8_0", "f16"], default="q8_0",
                    help="the escha model's non-coded matrices: Q8_0 as the exports (default), or F16 with values "
                         "of magnitude 1/16..1/8, for logit comparisons (llama.cpp quantizes the activations in front "
                         "of Q8_0 weights, which turns rounding differences into flipped values)")
    ap.add_argument("--mtp", action="store_true", help="add the MTP head (dense only)")
    ap.add_argument("--mtp-coded", action="store_true",
                    help="the escha model's MTP head projections coded too (escha quantize with a pattern for them)")
    ap.add_argument("--agree", action="store_true",
                    help="trunk and MTP head predict the same token at every step (the best case of drafting)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    if a.weights == "like" and not a.like or a.like and a.weights == "f16":
        sys.exit("--like goes with --weights like (every tensor) or escha (every matrix escha does not code)")
    if a.mtp and "n_expert" in MODELS[a.model]:
        sys.exit("--mtp: the 35B-A3B export ships no usable MTP head (it has no routed experts for it)")
    n_layer = a.layers or MODELS[a.model]["n_layer"]
    if n_layer % 4 != 0:
        sys.exit("--layers must be a multiple of 4 (one attention layer per four)")
    if a.shrink != 1:
        m = MODELS[a.model]
        for k in ("n_embd", "n_ff", "n_ff_exp", "n_ff_shexp"):
            if k in m:
                m[k] //= a.shrink
        m["n_vocab"] = 4096
    build(a.model, n_layer, a.weights, a.imatrix, a.output, a.rout, a.plain, a.mtp, a.agree, a.like, a.mtp_coded)


if __name__ == "__main__":
    main()
