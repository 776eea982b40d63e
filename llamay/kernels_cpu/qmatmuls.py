"""Several matmuls that read the same x in one native call (q, k, v; gate,
up): y_i = x @ W_i.T, all the weights' rows split over the threads together, so a decode
step hands work to the threads once per group instead of once per matrix (the small
projections of a decode step cost more in handoff than in reading their weight). In
llamacpp numerics x is also quantised once per activation type the weights' dots read
(Q8_0, Q8_1, Q8_K) instead of once per matrix (plain weights there). A role
whose type differs per layer (a `MixedQTensor`: Gemma's Q4_K_M files) goes in as all its
stacks, each told its entry for this layer or -1 (held by another stack): no `lax.switch`,
in either numerics.

Reference: each product alone (`qmatmul.qmatmul_native`, whose reference is the f32 dot
over `dequantize_jnp`): the same kernels per row, so the outputs are the same numbers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kernels_cpu.build import targets
from llamay.kernels_cpu.qmatmul import K_TYPES, Q8_TYPES, applies, ggml_static_kernel
from llamay.quant import MixedQTensor, QTensor

#: The weight types one llamacpp-numerics call takes (the i-quants go alone).
GGML_TYPES = Q8_TYPES | K_TYPES


def takes(x: jax.Array, w, numerics: str, layer=None) -> bool:
    """Whether `qmatmuls_native` takes this QTensor (`qmatmul.applies`; in llamacpp
    numerics a Q8_TYPES / K_TYPES weight whose kernel does not depend on the step's real
    row count: `qmatmul.ggml_static_kernel`)."""
    if not applies(x, w, numerics, layer):
        return False
    if numerics == "exact":
        return True
    return (
        w.ggml_type in GGML_TYPES
        and ggml_static_kernel(x, w.ggml_type, w.data.shape[-2]) is not None
    )


def qmatmuls_native(
    x: jax.Array, ws: tuple, layers: tuple | None = None, variant: str = "native",
    numerics: str = "exact",
) -> tuple[jax.Array, ...] | None:  # fmt: skip
    """(x @ W_i.T for each W_i) by one native call, or None when a kernel does not take
    every weight (`takes`) or the kernels are not
    built. Each W_i is a QTensor [rows_i, cols], or with layers[i] (an int32 scalar) a
    stack [L, rows_i, cols] read in place at that layer, or one layer of a `MixedQTensor`
    (scalar `which`/`index`: each of its stacks goes in, the one holding the layer reads
    it, the others are skipped; no `lax.switch`). Exact numerics: `LlamayQmmExactMulti`;
    llamacpp: `LlamayQmmGgmlMulti`."""
    layers = (None,) * len(ws) if layers is None else tuple(layers)
    stacks = []  # (QTensor, layer or None, result index)
    for r, (w, i) in enumerate(zip(ws, layers, strict=True)):
        if isinstance(w, MixedQTensor):
            if w.index.ndim != 0 or i is not None:
                return None
            for s, st in enumerate(w.stacks):
                stacks.append((st, jnp.where(w.which == s, w.index, -1).astype(jnp.int32), r))
        elif isinstance(w, QTensor):
            stacks.append((w, i, r))
        else:
            return None
    if not ws or not all(takes(x, w, numerics, i) for w, i, _ in stacks):
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    lead, k = x.shape[:-1], x.shape[-1]
    m = math.prod(lead)
    rows = [w.shape[-2] for w in ws]
    operands = []
    for w, i, _ in stacks:
        operands += [w.data, jnp.zeros((), jnp.int32) if i is None else jnp.asarray(i, jnp.int32)]
    attrs = dict(
        ggml_types=np.asarray([int(w.ggml_type) for w, _, _ in stacks], np.int32),
        results=np.asarray([r for _, _, r in stacks], np.int32),
    )
    if numerics == "exact":
        target = "LlamayQmmExactMulti"
    else:
        target = "LlamayQmmGgmlMulti"
        attrs["kernels"] = np.asarray(
            [ggml_static_kernel(x, w.ggml_type, w.data.shape[-2])[2] for w, _, _ in stacks],
            np.int32,
        )
    out = tuple(jax.ShapeDtypeStruct((m, n), jnp.float32) for n in rows)
    call = jax.ffi.ffi_call(prefix + target, out, vmap_method="sequential")
    ys = call(x.astype(jnp.float32).reshape(m, k), *operands, **attrs)
    return tuple(y.reshape(*lead, n) for y, n in zip(ys, rows, strict=True))
