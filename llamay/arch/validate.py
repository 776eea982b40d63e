"""A model's hyperparameters checked before anything is built from them.

GGUF metadata is untrusted input: `block_count = 2**31 - 1` must not make the binder
build two billion tensor names, `head_count = 0` must not divide by zero, and an
`embedding_length` the tensors do not have must not fail later inside JAX. Three steps,
each raising `ModelFormatError` naming the key (and the tensor):

1. `hyperparameter`: every count read through `hparam` is an integer within `INT_RANGES`
   (every float key a finite number within `FLOAT_RANGES`) — bounds far beyond any
   published model, far below what would exhaust memory;
2. `check_config`: the counts agree with each other (heads divide evenly, rope fits the
   head, experts);
3. `check_tensors`: the counts agree with the tensors present — as many layers as
   `block_count` says, every bound tensor of a type llamay computes with, and of the
   shape the hyperparameters give.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from llamay.errors import ModelFormatError, UnsupportedTensorTypeError

# key (after "{arch}.") -> inclusive integer range.
INT_RANGES: dict[str, tuple[int, int]] = {
    "block_count": (1, 4096),
    "context_length": (1, 1 << 24),
    "embedding_length": (1, 1 << 17),
    "feed_forward_length": (0, 1 << 20),
    "vocab_size": (1, 1 << 24),
    "attention.head_count": (1, 1 << 12),
    "attention.head_count_kv": (1, 1 << 12),
    "attention.key_length": (1, 1 << 14),
    "attention.value_length": (1, 1 << 14),
    "attention.sliding_window": (0, 1 << 24),
    "rope.dimension_count": (0, 1 << 14),
    "rope.scaling.original_context_length": (1, 1 << 24),
    "expert_count": (1, 1 << 12),
    "expert_used_count": (1, 1 << 12),
    "expert_feed_forward_length": (0, 1 << 20),
    "pooling_type": (0, 16),
}
# key -> (lowest, highest, whether the lowest itself is allowed).
FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "attention.layer_norm_rms_epsilon": (0.0, 1.0, True),
    "attention.layer_norm_epsilon": (0.0, 1.0, True),
    "rope.freq_base": (0.0, 1e12, False),
    "rope.freq_base_swa": (0.0, 1e12, False),
    "rope.scaling.factor": (0.0, 1e6, False),
    "rope.scaling.attn_factor": (0.0, 1e6, False),
    "rope.scaling.yarn_beta_fast": (0.0, 1e6, True),
    "rope.scaling.yarn_beta_slow": (0.0, 1e6, True),
    "attn_logit_softcapping": (0.0, 1e6, True),
    "final_logit_softcapping": (0.0, 1e6, True),
}


def hyperparameter(arch: str, key: str, value: Any) -> Any:
    """`value` of `{arch}.{key}` if it is within range (keys without a range as they are)."""
    if key in INT_RANGES:
        lo, hi = INT_RANGES[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelFormatError(
                f"GGUF metadata {arch}.{key} is {_show(value)}: an integer is needed"
            )
        if not lo <= value <= hi:
            raise ModelFormatError(f"GGUF metadata {arch}.{key} is {value}, outside {lo}..{hi}")
    elif key in FLOAT_RANGES:
        lo, hi, lo_ok = FLOAT_RANGES[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelFormatError(
                f"GGUF metadata {arch}.{key} is {_show(value)}: a number is needed"
            )
        if not (math.isfinite(value) and (lo <= value if lo_ok else lo < value) and value <= hi):
            low = f"{'>=' if lo_ok else '>'} {lo}"
            raise ModelFormatError(
                f"GGUF metadata {arch}.{key} is {value}: a finite number {low} and <= {hi} "
                "is needed"
            )
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def check_config(cfg) -> None:
    """The counts of a `Config` agree with each other."""
    a = cfg.arch
    if cfg.n_heads % cfg.n_kv_heads:
        raise ModelFormatError(
            f"GGUF metadata {a}.attention.head_count {cfg.n_heads} is not a multiple of "
            f"{a}.attention.head_count_kv {cfg.n_kv_heads}"
        )
    rope = cfg.rope
    if rope is not None and (rope.n_rot > cfg.head_dim or rope.n_rot % 2):
        raise ModelFormatError(
            f"GGUF metadata {a}.rope.dimension_count {rope.n_rot} must be even and at most "
            f"the head size {cfg.head_dim}"
        )
    if cfg.n_experts_used > cfg.n_experts:
        raise ModelFormatError(
            f"GGUF metadata {a}.expert_used_count {cfg.n_experts_used} exceeds "
            f"{a}.expert_count {cfg.n_experts}"
        )


def head_dim(arch: str, d_model: int, n_heads: int) -> int:
    """The head size when the file gives no `attention.key_length`: n_embd / n_head,
    which must divide evenly (a smaller embedding than heads would be a size of 0)."""
    if d_model % n_heads:
        raise ModelFormatError(
            f"GGUF metadata {arch}.embedding_length {d_model} is not a multiple of "
            f"{arch}.attention.head_count {n_heads} (and {arch}.attention.key_length is absent)"
        )
    return d_model // n_heads


# -- against the tensors -------------------------------------------------------------------

_ATTN = "embedding_length, attention.head_count, attention.key_length"
_KV = "embedding_length, attention.head_count_kv, attention.key_length"
_FFN = "embedding_length, feed_forward_length"
_EXPERTS = "embedding_length, expert_feed_forward_length, expert_count"

# role -> (expected ggml-order shape from the config, None: any size; the keys it comes from).
_Shape = Callable[[Any], tuple]
_SHAPES: dict[str, tuple[_Shape, str]] = {
    "tok_embd": (lambda c: (c.d_model, c.vocab), "embedding_length, vocab_size"),
    "output": (lambda c: (c.d_model, c.vocab), "embedding_length, vocab_size"),
    "pos_embd": (lambda c: (c.d_model, None), "embedding_length"),
    "token_types": (lambda c: (c.d_model, None), "embedding_length"),
    "wq": (lambda c: (c.d_model, c.n_heads * c.head_dim), _ATTN),
    "wk": (lambda c: (c.d_model, c.n_kv_heads * c.head_dim), _KV),
    "wv": (lambda c: (c.d_model, c.n_kv_heads * c.head_dim), _KV),
    "wo": (lambda c: (c.n_heads * c.head_dim, c.d_model), _ATTN),
    "wqkv": (
        lambda c: (c.d_model, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim),
        _ATTN + ", attention.head_count_kv",
    ),
    "wq_b": (lambda c: (c.n_heads * c.head_dim,), _ATTN),
    "wk_b": (lambda c: (c.n_kv_heads * c.head_dim,), _KV),
    "wv_b": (lambda c: (c.n_kv_heads * c.head_dim,), _KV),
    "wo_b": (lambda c: (c.d_model,), "embedding_length"),
    "w_gate": (lambda c: (c.d_model, c.ffn or None), _FFN),
    "w_up": (lambda c: (c.d_model, None), _FFN),
    "w_down": (lambda c: (c.ffn or None, c.d_model), _FFN),
    "w_down_b": (lambda c: (c.d_model,), "embedding_length"),
    "router": (lambda c: (c.d_model, c.n_experts), "embedding_length, expert_count"),
    "w_gate_exps": (lambda c: (c.d_model, c.expert_ffn or None, c.n_experts), _EXPERTS),
    "w_up_exps": (lambda c: (c.d_model, c.expert_ffn or None, c.n_experts), _EXPERTS),
    "w_down_exps": (lambda c: (c.expert_ffn or None, c.d_model, c.n_experts), _EXPERTS),
    "rope_freqs": (lambda c: (c.rope.n_rot // 2,) if c.rope else (None,), "rope.dimension_count"),
}
_NORMS = (
    "output_norm",
    "attn_norm",
    "ffn_norm",
    "post_attention_norm",
    "post_ffw_norm",
    "embd_norm",
    "attn_out_norm",
    "layer_out_norm",
)
for _role in _NORMS:
    _SHAPES[_role] = (lambda c: (c.d_model,), "embedding_length")
    _SHAPES[_role + "_b"] = (lambda c: (c.d_model,), "embedding_length")
# q/k norms: per head (head size) or over the whole projection (olmo2).
_QK_NORMS = {
    "q_norm": (lambda c: {c.head_dim, c.n_heads * c.head_dim}, _ATTN),
    "k_norm": (lambda c: {c.head_dim, c.n_kv_heads * c.head_dim}, _KV),
}


def check_tensors(cfg, arch, tensors: Mapping[str, Any], path: str = "") -> None:
    """The config agrees with the tensors the architecture binds: `block_count` layers
    are present (checked by counting names, before any per-layer name is built), each
    bound tensor's type is one llamay computes with and its shape is the config's."""
    where = f"{path}: " if path else ""
    layered = [s for s in arch.tensors if "{i}" in s.name and not s.optional]
    for spec in layered:
        pattern = re.compile(re.escape(spec.name).replace(r"\{i\}", r"(\d+)") + r"\Z")
        present = {int(m.group(1)) for n in tensors if (m := pattern.match(n))}
        missing = next(
            (i for i in range(min(cfg.n_layers, len(present) + 1)) if i not in present), None
        )
        if missing is not None:
            raise ModelFormatError(
                f"{where}GGUF metadata {cfg.arch}.block_count is {cfg.n_layers}, but the file "
                f"has {len(present)} layers of {spec.name!r} (no {spec.name.format(i=missing)!r})"
            )
    from llamay.quant.layouts import layout_of

    for spec in arch.tensors:
        names = (
            [spec.name.format(i=i) for i in range(cfg.n_layers)] if spec.per_layer else [spec.name]
        )
        for name in names:
            info = tensors.get(name)
            if info is None:
                continue  # bind says which required tensor is missing
            try:
                layout_of(info.ggml_type)
            except UnsupportedTensorTypeError as e:
                raise UnsupportedTensorTypeError(f"{where}tensor {name!r}: {e}") from None
            _check_shape(cfg, spec.role, name, tuple(info.ne), where)


def _check_shape(cfg, role: str, name: str, ne: tuple, where: str) -> None:
    a = cfg.arch
    if role in _QK_NORMS:
        sizes, keys = _QK_NORMS[role]
        if len(ne) != 1 or ne[0] not in sizes(cfg):
            raise ModelFormatError(
                f"{where}tensor {name!r} has shape {list(ne)}, but GGUF metadata {keys} "
                f"(of {a}) give a size among {sorted(sizes(cfg))}"
            )
        return
    if role not in _SHAPES:
        return
    shape, keys = _SHAPES[role]
    want = shape(cfg)
    if len(ne) != len(want) or any(
        w is not None and w != n for w, n in zip(want, ne, strict=False)
    ):
        shown = [("*" if w is None else w) for w in want]
        raise ModelFormatError(
            f"{where}tensor {name!r} has shape {list(ne)} (ggml order), but GGUF metadata "
            f"{keys} (of {a}) give {shown}"
        )
