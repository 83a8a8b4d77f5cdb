#!/usr/bin/env python3
"""Convert an Escha HF checkpoint directory to GGUF (docs/FORMAT.md §7 -> §8).

    python3 examples/convert_escha_hf_to_gguf.py ESCHA_HF_DIR --outfile OUT.gguf [upstream options]

It runs llama.cpp's own converter (the pinned tree's convert_hf_to_gguf.py and
its model classes: tokenizer, metadata, norms, DeltaNet V-head order) with one
change: the class picked for the checkpoint's architecture is extended so that
- every coded linear's escha leaves are copied verbatim (I16 code, F16
  rin/rout, F32 s_in/s_out; a f16 bias widened to F32) under the layer's usual
  GGUF stem, after the checks of §7 (missing or unknown leaves, escha_config
  against the code, codebook id, non-finite scales);
- int8 rows with an f16 scale per row (weight_int8 + weight_scale) become
  Q8_0 with that scale in every 32-block, which is exact;
- where upstream reorders DeltaNet V heads, coded tensors are reordered by
  whole 128-channel blocks (8 tiles) with their scale vectors, which is exact;
- fused expert gate_up stays fused (ffn_gate_up_exps);
- the MTP head is read from the main shards (`mtp.*`, as HF releases carry
  it) or from the export's `mtp/` folder (config.json + *.safetensors, keys
  `mtp.*`) and handed to upstream's class, which writes it as the nextn
  block (its norms, names and `nextn_predict_layers` as upstream writes
  them); upstream's `--no-mtp` drops it. A checkpoint without a head, or an
  MoE head without routed experts (which llama.cpp's qwen35moe MTP block
  needs), converts without one, and the output says so.
Everything else (norms, A_log, conv1d, routers, embeddings in f16) takes
upstream's path unchanged.

The upstream tree: $ESCHA_LLAMA_CPP_DIR if set, else the pinned tree that
`cargo build` extracts (target/release/llama.cpp-convert). Python needs
upstream's requirements (torch, numpy, transformers, sentencepiece, protobuf).
Options after the directory are upstream's (--outfile, --outtype f16|bf16|f32,
...), plus --escha-no-bias (write escha.apply_bias = false, the behaviour of
runtimes that ignore the export's biases).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def upstream_tree() -> Path:
    tree = Path(os.environ.get("ESCHA_LLAMA_CPP_DIR") or REPO / "target" / "release" / "llama.cpp-convert")
    if not (tree / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"no llama.cpp converter at {tree}: run `cargo build --release` first "
                 "(it extracts the pinned tree), or set ESCHA_LLAMA_CPP_DIR to a llama.cpp checkout")
    return tree


TREE = upstream_tree()
sys.path[:0] = [str(TREE), str(TREE / "gguf-py")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import convert_hf_to_gguf as upstream  # noqa: E402
import gguf  # noqa: E402
from conversion import LazyTorchTensor, ModelBase, ModelType, get_model_class  # noqa: E402

logger = logging.getLogger("escha")

LEAVES = ("escha_code", "escha_rin", "escha_rout", "escha_s_in", "escha_s_out", "escha_config")
REQUIRED = ("escha_code", "escha_rin", "escha_rout")
INT8 = ("weight_int8", "weight_scale")


class EschaError(ValueError):
    pass


def eager(gen) -> np.ndarray:
    t = LazyTorchTensor.to_eager(gen())
    return t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def block_permutation(perm: np.ndarray, what: str) -> np.ndarray:
    """The 128-channel block permutation equal to a channel permutation, or an error."""
    if perm.size % 128:
        raise EschaError(f"{what}: {perm.size} channels are not whole 128-blocks")
    blocks = perm.reshape(-1, 128)
    starts = blocks[:, 0]
    if np.any(starts % 128) or np.any(blocks != starts[:, None] + np.arange(128)):
        raise EschaError(f"{what}: the V-head order moves channels within a 128-block; "
                         "a coded tensor can only be reordered by whole blocks (head_v_dim must be a multiple of 128)")
    return starts // 128


class EschaMixin:
    """Placed before an upstream model class: escha leaves and int8 rows."""

    hparams: dict
    model_tensors: dict
    gguf_writer: gguf.GGUFWriter
    escha_apply_bias = True

    # ---- which tensors are ours ------------------------------------------

    _checkpoint_names: dict[str, str] = {}

    @classmethod
    def filter_tensors(cls, item):
        kept = super().filter_tensors(item)
        if kept is not None:
            EschaMixin._checkpoint_names[kept[0]] = item[0]
        return kept

    def index_tensors(self, remote_hf_model_id=None):
        tensors = super().index_tensors(remote_hf_model_id=remote_hf_model_id)
        mtp_dir = Path(self.dir_model) / "mtp"
        if remote_hf_model_id is None and mtp_dir.is_dir():
            for part in sorted(mtp_dir.glob("*.safetensors")):
                logger.info(f"escha: indexing the MTP folder's {part.name}")
                with gguf.utility.SafetensorsLocal(part) as st:
                    for name in st.keys():
                        if not name.startswith("mtp."):
                            raise EschaError(f"{part}: tensor {name} in the MTP folder is not an mtp.* tensor")
                        gen = (lambda d=st[name]: LazyTorchTensor.from_local_tensor(d)) if self.lazy else \
                            (lambda d=st[name]: LazyTorchTensor.to_eager(LazyTorchTensor.from_local_tensor(d)))
                        if (kept := self.filter_tensors((name, gen))) is not None:
                            if kept[0] in tensors:
                                raise EschaError(f"{name} ({part}) is also in the main shards")
                            tensors[kept[0]] = kept[1]
        return self.keep_usable_mtp(tensors)

    def keep_usable_mtp(self, tensors: dict) -> dict:
        """Upstream counts the MTP layers from the tensors it indexed and
        expects at least one; without a (usable) head, convert without one."""
        cls = type(self)
        if not getattr(cls, "supports_mtp_export", False) or cls.no_mtp:
            return tensors
        trunk = cls._original_block_count
        head = [n for n in tensors if (b := self.block_of(n)) is not None and b >= trunk]
        hp = {**self.hparams, **self.hparams.get("text_config", {})}
        if not head:
            logger.info(f"escha: {self.dir_model} has no MTP head (no mtp.* tensors, no mtp/ folder): the GGUF has none")
        elif hp.get("num_experts") and not any(".mlp.experts." in n for n in head):
            logger.warning(f"escha: the checkpoint's MTP head ({len(head)} tensors) has no routed experts, which "
                           "llama.cpp's MoE MTP block needs: dropped, the GGUF has no MTP head")
            for n in head:
                del tensors[n]
        else:
            logger.info(f"escha: MTP head of {len(head)} tensors as block {trunk} (nextn)")
            return tensors
        cls.no_mtp = True  # read by upstream's __init__ next: no nextn block, block_count of the trunk
        return tensors

    @staticmethod
    def block_of(name: str) -> int | None:
        parts = name.split(".")
        for i, p in enumerate(parts[:-1]):
            if p == "layers" and parts[i + 1].isdecimal():
                return int(parts[i + 1])
        return None

    def checkpoint_name(self, name: str) -> str:
        """`name` as the checkpoint spells it (upstream drops e.g. `language_model.`)."""
        for leaf in ("", ".escha_code", ".weight_int8"):
            if (orig := self._checkpoint_names.get(name + leaf)) is not None:
                return orig.removesuffix(leaf) if leaf else orig
        return name

    def dequant_model(self):
        qc = self.hparams.get("quantization_config") or {}
        method = qc.get("quant_method")
        if method not in ("escha", "eschamoe"):
            raise EschaError(f"{self.dir_model}: not an Escha checkpoint (quantization_config.quant_method = {method!r}); "
                             "use llama.cpp's convert_hf_to_gguf.py")
        coded: dict[str, dict] = {}
        int8: dict[str, dict] = {}
        for name in list(self.model_tensors):
            stem, _, leaf = name.rpartition(".")
            if leaf.startswith("escha_"):
                if leaf not in LEAVES:
                    raise EschaError(f"{self.checkpoint_name(name)}: unknown escha leaf {leaf!r} (a newer format feature? refusing to guess)")
                coded.setdefault(stem, {})[leaf] = self.model_tensors.pop(name)
            elif leaf in INT8:
                int8.setdefault(stem, {})[leaf] = self.model_tensors.pop(name)
        for stem, leaves in coded.items():
            for req in REQUIRED:
                if req not in leaves:
                    raise EschaError(f"{self.checkpoint_name(stem)}: required leaf {req} is missing")
            if stem + ".bias" in self.model_tensors:
                leaves["bias"] = self.model_tensors.pop(stem + ".bias")
        for stem, leaves in int8.items():
            for req in INT8:
                if req not in leaves:
                    raise EschaError(f"{self.checkpoint_name(stem)}: {req} is missing (int8 rows need weight_int8 and weight_scale)")
        ignore = set(qc.get("ignore") or [])
        for stem in coded:
            if stem in ignore or stem + ".weight" in ignore:
                raise EschaError(f"{self.checkpoint_name(stem)}: coded, but quantization_config.ignore lists it")
        if not coded:
            raise EschaError(f"{self.dir_model}: quant_method {method!r} but no escha_code leaf")
        if (method == "eschamoe") != any(l["escha_code"]().ndim == 4 for l in coded.values()):
            raise EschaError(f"quant_method {method!r} disagrees with the codes (expert-stacked codes mean eschamoe)")
        for stem in sorted(coded):
            self.write_coded(stem, coded[stem])
        for stem in sorted(int8):
            self.write_int8(stem, int8[stem])

    def set_gguf_parameters(self):
        super().set_gguf_parameters()
        self.gguf_writer.add_uint32("escha.format_version", 2)
        self.gguf_writer.add_uint32("escha.codebook", 1)
        self.gguf_writer.add_bool("escha.apply_bias", self.escha_apply_bias)

    # ---- names and the V-head order ----------------------------------------

    def gguf_stem(self, stem: str) -> str:
        bid = next((int(p) for p in stem.split(".") if p.isdecimal()), None)
        if stem.endswith("mlp.experts.gate_up_proj"):
            return self.format_tensor_name(gguf.MODEL_TENSOR.FFN_GATE_UP_EXP, bid, "")
        if stem.endswith(("mlp.experts.down_proj", "mlp.experts.gate_proj", "mlp.experts.up_proj")):
            key = {"down": gguf.MODEL_TENSOR.FFN_DOWN_EXP, "gate": gguf.MODEL_TENSOR.FFN_GATE_EXP,
                   "up": gguf.MODEL_TENSOR.FFN_UP_EXP}[stem.rpartition(".")[2].removesuffix("_proj")]
            return self.format_tensor_name(key, bid, "")
        return self.map_tensor_name(stem + ".weight").removesuffix(".weight")

    def v_head_order(self, stem: str) -> tuple[str, np.ndarray] | None:
        """('out' | 'in', channel permutation) where upstream reorders V heads."""
        reorder = getattr(self, "_reorder_v_heads", None)
        nk = self.hparams.get("linear_num_key_heads", 0)
        nv = self.hparams.get("linear_num_value_heads", 0)
        if reorder is None or not nk or not nv or nk == nv or "linear_attn." not in stem:
            return None
        hk, hv = self.hparams["linear_key_head_dim"], self.hparams["linear_value_head_dim"]

        def perm(n_heads_dim: int, head_dim: int) -> np.ndarray:
            idx = torch.arange(n_heads_dim, dtype=torch.long).unsqueeze(-1)
            return reorder(idx, 0, nk, nv // nk, head_dim).squeeze(-1).numpy()

        if stem.endswith(".in_proj_qkv"):
            qk = 2 * nk * hk
            return "out", np.concatenate([np.arange(qk), qk + perm(nv * hv, hv)])
        if stem.endswith(".in_proj_z"):
            return "out", perm(nv * hv, hv)
        if stem.endswith((".in_proj_a", ".in_proj_b")):
            return "out", perm(nv, 1)
        if stem.endswith(".out_proj"):
            return "in", perm(nv * hv, hv)
        return None

    # ---- coded linears ---------------------------------------------------

    def write_coded(self, stem: str, leaves: dict):
        shown = self.checkpoint_name(stem)
        code = eager(leaves["escha_code"])
        if code.dtype != np.int16:
            raise EschaError(f"{shown}.escha_code: dtype {code.dtype}, escha codes are int16")
        if code.ndim not in (3, 4):
            raise EschaError(f"{shown}.escha_code: rank {code.ndim}, expected [IC/16, OC/16, 16K] or [E, IC/16, OC/16, 16K]")
        if code.shape[-1] not in (32, 48):
            raise EschaError(f"{shown}.escha_code: last dim {code.shape[-1]} is not 16*K with K = 2 or 3")
        k, ic, oc = code.shape[-1] // 16, code.shape[-3] * 16, code.shape[-2] * 16
        e = code.shape[0] if code.ndim == 4 else None
        for what, n in (("IC", ic), ("OC", oc)):
            if n % 128:
                raise EschaError(f"{shown}.escha_code: {what} = {n}: dimensions must be multiples of 128")
        lead = () if e is None else (e,)
        want = {"escha_rin": (np.float16, lead + (ic,)), "escha_rout": (np.float16, lead + (oc,)),
                "escha_s_in": (np.float32, lead + (ic,)), "escha_s_out": (np.float32, lead + (oc,)),
                "bias": (np.float16, lead + (oc,))}
        vec = {}
        for leaf, (dtype, shape) in want.items():
            if leaf not in leaves:
                continue
            v = eager(leaves[leaf])
            if v.dtype != dtype:
                raise EschaError(f"{shown}.{leaf}: dtype {v.dtype}, expected {np.dtype(dtype).name}")
            if v.shape != shape:
                raise EschaError(f"{shown}.{leaf}: shape {list(v.shape)}, expected {list(shape)}")
            bad = np.flatnonzero(~np.isfinite(v.astype(np.float32)))
            if bad.size and leaf != "bias":
                raise EschaError(f"{shown}.{leaf}: non-finite value {v.reshape(-1)[bad[0]]} at index {bad[0]}")
            vec[leaf] = v
        if "escha_config" in leaves:
            self.check_config(shown, eager(leaves["escha_config"]), k, ic, oc, e)

        if (order := self.v_head_order(stem)) is not None:
            side, perm = order
            blocks = block_permutation(perm, shown)
            tiles = (blocks[:, None] * 8 + np.arange(8)).reshape(-1)
            code = np.take(code, tiles, axis=-2 if side == "out" else -3)
            for leaf in (("escha_rout", "escha_s_out", "bias") if side == "out" else ("escha_rin", "escha_s_in")):
                if leaf in vec:
                    vec[leaf] = np.take(vec[leaf], perm, axis=-1)

        g = self.gguf_stem(stem)
        self.gguf_writer.add_tensor(f"{g}.escha_code", np.ascontiguousarray(code))
        for leaf, v in vec.items():
            name = f"{g}.bias" if leaf == "bias" else f"{g}.{leaf}"
            self.gguf_writer.add_tensor(name, np.ascontiguousarray(v.astype(np.float32) if leaf == "bias" else v))
        logger.info(f"{g}.escha_code: K={k} IC={ic} OC={oc}" + (f" E={e}" if e else "") +
                    (" (V heads reordered)" if order else ""))

    @staticmethod
    def check_config(shown: str, cfg: np.ndarray, k: int, ic: int, oc: int, e: int | None):
        cfg = cfg.reshape(-1).astype(np.int64)
        if e is None:
            want = [("tile edge", 16), ("K", k), ("entry 2", 2), ("codebook", 1), ("IC", ic), ("OC", oc)]
        else:
            want = [("tile edge", 16), ("K", k), ("entry 2", 2), ("codebook", 1), ("E", e),
                    ("in_f", ic), ("out_f", oc), ("in_p", ic), ("out_p", oc)]
        if cfg.size != len(want):
            raise EschaError(f"{shown}.escha_config: {cfg.size} entries, expected {len(want)} for a "
                             f"{'dense' if e is None else 'expert'} code")
        for i, ((what, v), got) in enumerate(zip(want, cfg)):
            if what == "codebook" and got != 1:
                raise EschaError(f"{shown}.escha_config: codebook id {got}; only 1 (cbA) is known")
            if got != v:
                raise EschaError(f"{shown}.escha_config[{i}] ({what}) = {got} disagrees with the code ({v})")

    # ---- int8 rows -> Q8_0 -------------------------------------------------

    def write_int8(self, stem: str, leaves: dict):
        shown = self.checkpoint_name(stem)
        w, s = eager(leaves["weight_int8"]), eager(leaves["weight_scale"])
        if w.dtype != np.int8 or w.ndim != 2:
            raise EschaError(f"{shown}.weight_int8: {w.dtype} rank {w.ndim}, expected int8 [N, IC]")
        s = s.reshape(-1) if s.ndim == 2 and s.shape[1] == 1 else s
        if s.dtype != np.float16 or s.shape != (w.shape[0],):
            raise EschaError(f"{shown}.weight_scale: {s.dtype} {list(s.shape)}, expected float16 [{w.shape[0]}]")
        if w.shape[1] % 32:
            raise EschaError(f"{shown}.weight_int8: IC = {w.shape[1]} is not a multiple of 32 (Q8_0 blocks)")
        if (order := self.v_head_order(stem)) is not None:
            side, perm = order
            if side == "out":
                w, s = w[perm], s[perm]
            else:
                w = w[:, perm]
        n, ic = w.shape
        q = np.empty((n, ic // 32, 34), dtype=np.uint8)
        q[:, :, :2] = s.view(np.uint8).reshape(n, 1, 2)
        q[:, :, 2:] = w.view(np.uint8).reshape(n, ic // 32, 32)
        name = self.map_tensor_name(stem + ".weight")
        self.gguf_writer.add_tensor(name, q.reshape(n, ic // 32 * 34), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        logger.info(f"{name}: int8 rows -> Q8_0 [{n}, {ic}]" + (" (V heads reordered)" if order else ""))


def escha_class(base: type[ModelBase]) -> type[ModelBase]:
    return type(f"Escha{base.__name__}", (EschaMixin, base), {"model_arch": base.model_arch})


def main():
    argv = sys.argv[1:]
    if "--escha-no-bias" in argv:
        argv.remove("--escha-no-bias")
        EschaMixin.escha_apply_bias = False
    # Upstream picks the class by architecture; hand it ours instead.
    pick = get_model_class

    def escha_get_model_class(name: str, mmproj: bool = False):
        cls = pick(name, mmproj)
        return cls if mmproj else escha_class(cls)

    upstream.get_model_class = escha_get_model_class
    sys.argv = [sys.argv[0]] + argv
    try:
        upstream.main()
    except EschaError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
