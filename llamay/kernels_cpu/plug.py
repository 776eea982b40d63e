"""The plug point the dispatcher (`llamay.kernels`) asks at trace time: `available`,
`matmul`, `paged_attention`, `ggml_attention`, `ggml_swiglu`, `ggml_rms_norm`,
`ggml_rope`, `logprob_argmax`, `argmax`, `top_k` (the package docstring says what each returns)."""

from __future__ import annotations

import jax

from llamay.kernels_cpu.attention import paged_attention_native
from llamay.kernels_cpu.build import targets
from llamay.kernels_cpu.ggml_attention import ggml_attention_native, ggml_flash_attention_native
from llamay.kernels_cpu.ggml_elementwise import rms_norm_native, rope_native, swiglu_native
from llamay.kernels_cpu.logprobs import argmax_native, logprob_argmax_native, top_k_native
from llamay.kernels_cpu.qmatmul import applies, qmatmul_native
from llamay.kernels_cpu.qmatmuls import qmatmuls_native, takes
from llamay.quant import MixedQTensor


def available() -> bool:
    """Whether the native kernels are built and registered (building them on first use;
    False under LLAMAY_CPU_KERNELS=xla or when they cannot be built: logged once)."""
    return targets() is not None


def matmul(x: jax.Array, w, numerics: str, batched: bool | None = None) -> jax.Array | None:
    """x @ W.T by a native kernel, or None when none applies (the caller uses XLA): a
    GGUF-block `QTensor` [rows, cols] of a type the kernels take, on the CPU backend, with
    the kernels built (`build.targets`). `batched` as `llamay.quant.qtensor.ggml_matmul`'s."""
    if jax.default_backend() != "cpu":
        return None
    if targets() is None:  # not built: the XLA path (logged once)
        return None
    if isinstance(w, MixedQTensor) and w.index.ndim == 0:
        # One layer of stacks closed over by the layer scan: each stack is read in place
        # at `index` (slicing it first would make XLA copy the layer out).
        if not all(applies(x, s, numerics, w.index) for s in w.stacks):
            return None
        if len(w.stacks) == 1:
            return qmatmul_native(x, w.stacks[0], numerics, layer=w.index, batched=batched)
        # every stack into one call, the one holding this layer reads it (no switch)
        ys = qmatmuls_native(x, (w,), numerics=numerics)
        if ys is not None:
            return ys[0]
        branches = [
            lambda x, s=s: qmatmul_native(x, s, numerics, layer=w.index, batched=batched)
            for s in w.stacks
        ]
        return jax.lax.switch(w.which, branches, x)
    return qmatmul_native(x, w, numerics, batched=batched)


def matmuls(x: jax.Array, ws, numerics: str) -> tuple[jax.Array | None, ...] | None:
    """x @ W.T for the weights in `ws` that the kernels take, by one native call
    (`qmatmuls`: the rows of all split over the threads at once), None in the place of
    each other one (the caller runs `matmul` on those); None when fewer than two are
    taken. Taken (`qmatmuls.takes`), on CPU: a GGUF-block `QTensor` [rows, cols] or one
    layer of a one-stack `MixedQTensor` (read in place); a MixedQTensor's layer (its types
    differ per layer) takes every stack into the call, the one holding the layer reading
    it. In llamacpp numerics x is quantised once per activation type."""
    if jax.default_backend() != "cpu" or targets() is None:
        return None
    taken = []  # (position, matrix, layer)
    for i, w in enumerate(ws):
        layer = None
        if isinstance(w, MixedQTensor):
            if w.index.ndim != 0:
                continue
            if len(w.stacks) == 1:
                w, layer = w.stacks[0], w.index
            elif not all(takes(x, s, numerics, w.index) for s in w.stacks):
                continue
        if isinstance(w, MixedQTensor) or takes(x, w, numerics, layer):
            taken.append((i, w, layer))
    if len(taken) < 2:
        return None
    ys = qmatmuls_native(
        x, tuple(w for _, w, _ in taken), tuple(i for _, _, i in taken), numerics=numerics
    )
    if ys is None:
        return None
    out: list[jax.Array | None] = [None] * len(ws)
    for (i, _, _), y in zip(taken, ys, strict=True):
        out[i] = y
    return tuple(out)


def paged_attention(q, k_pages, v_pages, page_table, q_pos, layer=None, **kw) -> jax.Array | None:
    """Attention through page tables by the native kernel (`attention.paged_attention_native`:
    exact numerics, causal, f32/f16/bf16 or q8_0/q5_1/q5_0/q4_1/q4_0 pools), read in place,
    for any number of query tokens per row (decode steps, verify and prefill chunks); None
    when it does not apply (llamacpp numerics, another pool type, not on CPU) or is not
    built."""
    if jax.default_backend() != "cpu":
        return None
    return paged_attention_native(q, k_pages, v_pages, page_table, q_pos, layer, **kw)


def ggml_attention(q, k, v, q_pos, page_table=None, layer=None, **kw) -> jax.Array | None:
    """numerics="llamacpp" attention by the native kernel (`ggml_attention.
    ggml_attention_native`: bit for bit `llamay.kernels.ggml_attention.attention`), over a
    dense cache (page_table None) or pages read in place; None when it does not apply
    (softcaps, f32 or quantised caches, not on CPU) or is not built."""
    if jax.default_backend() != "cpu":
        return None
    return ggml_attention_native(q, k, v, q_pos, page_table, layer, **kw)


def ggml_flash_attention(q, k, v, q_pos, page_table=None, layer=None, **kw) -> jax.Array | None:
    """numerics="llamacpp" attention with llama.cpp's flash attention by the native kernel
    (`ggml_attention.ggml_flash_attention_native`: bit for bit `llamay.kernels.
    ggml_attention.flash_attention`); None when it does not apply (softcaps, a cache not
    f16, not on CPU) or is not built."""
    if jax.default_backend() != "cpu":
        return None
    return ggml_flash_attention_native(q, k, v, q_pos, page_table, layer, **kw)


def ggml_swiglu(g, u) -> jax.Array | None:
    """numerics="llamacpp" SwiGLU natively (bit for bit `llamay.arch.ggml_ops.swiglu`), or
    None (not on CPU, not built, not f32)."""
    return swiglu_native(g, u) if jax.default_backend() == "cpu" else None


def ggml_rms_norm(x, w, eps: float) -> jax.Array | None:
    """numerics="llamacpp" RMS norm natively (bit for bit `llamay.arch.ggml_ops.rms_norm`),
    or None (not on CPU, not built, a weight not of the row's length)."""
    return rms_norm_native(x, w, eps) if jax.default_backend() == "cpu" else None


def ggml_rope(x, cos, sin, kind: str) -> jax.Array | None:
    """numerics="llamacpp" RoPE natively (bit for bit `llamay.arch.ggml_ops.apply_rope`),
    or None (not on CPU, not built, other shapes)."""
    return rope_native(x, cos, sin, kind) if jax.default_backend() == "cpu" else None


def logprob_argmax(logits, picks) -> tuple[jax.Array, jax.Array] | None:
    """(log_softmax(logits) at picks [..., J], first argmax) natively, as
    `llamay.kernels.logprobs.logprob_argmax_reference` computes them, or None (not on
    CPU, not built, not f32 logits with int32 picks [..., J])."""
    return logprob_argmax_native(logits, picks) if jax.default_backend() == "cpu" else None


def argmax(x) -> jax.Array | None:
    """Each row's first argmax natively, as `llamay.kernels.logprobs.argmax_reference`
    computes it, or None (not on CPU, not built, not f32)."""
    return argmax_native(x) if jax.default_backend() == "cpu" else None


def top_k(x, k: int) -> tuple[jax.Array, jax.Array] | None:
    """`jax.lax.top_k(x, k)` natively (the same values and ids), or None (not on CPU,
    not built, not f32)."""
    return top_k_native(x, k) if jax.default_backend() == "cpu" else None
