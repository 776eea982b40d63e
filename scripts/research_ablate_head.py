"""Research example: ablate one attention head, or swap an MLP, and compare logits.

    .venv/bin/python scripts/research_ablate_head.py [MODEL] [--layer L] [--head H]
        [--prompt TEXT]

MODEL is a .gguf path or a store name (default gemma3:270m).

How it works. An architecture is data plus pure functions (`llamay.arch.Architecture`:
`config`, `tensors`, `embed`, `block`, `head`), and the step functions run whatever
Architecture the config carries. The decoder families share one block,
`llamay.arch.decoder.block`, whose two sub-layers are keyword arguments:

- `attn(cfg, lw, h, positions, k_cache, v_cache, layer) -> (o, k_cache, v_cache)`, where
  `o` [B, T, n_heads, head_dim] are the per-head outputs *before* the output projection;
- `mlp(cfg, lw, h, layer) -> [B, T, d_model]`.

`layer` is the traced layer index (the blocks run under `lax.scan`), so a variant that
touches one layer selects it with `jnp.where`/a mask rather than a Python `if`. A
variant is `dataclasses.replace(m.arch, block=functools.partial(decoder.block, ...))`
(or any function with the block's signature), and `m.with_architecture(variant)` runs it
over the same weights and tokenizer; each variant compiles once.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

import llamay
from llamay.arch import decoder


def ablate_head(layer_index: int, head: int):
    """An `attn` sub-layer: the family's attention with one head of one layer zeroed."""

    def attn(cfg, lw, h, positions, k_cache, v_cache, layer):
        o, k_cache, v_cache = decoder.self_attention(cfg, lw, h, positions, k_cache, v_cache, layer)
        hit = (layer == layer_index) & (jnp.arange(cfg.n_heads) == head)  # [n_heads]
        return jnp.where(hit[:, None], 0.0, o), k_cache, v_cache

    return attn


def swap_activation(layer_index: int, act: str):
    """An `mlp` sub-layer: one layer's MLP with another activation (e.g. GeGLU → SwiGLU)."""

    def mlp(cfg, lw, h, layer):
        usual = decoder.mlp(cfg, lw, h, layer)
        swapped = decoder.mlp(dataclasses.replace(cfg, act=act), lw, h, layer)
        return jnp.where(layer == layer_index, swapped, usual)

    return mlp


def variant(m: llamay.Model, **sub_layers) -> llamay.Model:
    """`m` with the decoder block's sub-layers replaced (attn=..., mlp=...)."""
    block = functools.partial(decoder.block, **sub_layers)
    return m.with_architecture(dataclasses.replace(m.arch, block=block))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(name: str, m: llamay.Model, base: np.ndarray, other: np.ndarray) -> dict:
    """How a variant's next-token distributions differ from the base model's."""
    lp, lq = log_softmax(base), log_softmax(other)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)  # KL(base ‖ variant) per position
    flips = int((base.argmax(-1) != other.argmax(-1)).sum())
    last = [m.detokenize([int(i)]) for i in np.argsort(-other[-1])[:5]]
    print(
        f"{name:>28}: max |Δlogit| {np.abs(other - base).max():7.3f}  "
        f"mean KL {kl.mean():.4f}  top-1 changed at {flips}/{len(base)} positions  "
        f"next: {last}"
    )
    return {"max_abs": float(np.abs(other - base).max()), "kl": float(kl.mean()), "flips": flips}


def first_changed_layer(m: llamay.Model, other: llamay.Model, ids) -> int | None:
    """The first block whose output differs (a sanity check: the ablated layer)."""
    diff = np.abs(m.hidden_states(ids) - other.hidden_states(ids)).max(axis=(1, 2))
    changed = np.flatnonzero(diff > 0)
    return int(changed[0]) if changed.size else None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="gemma3:270m")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--prompt", default="The capital of France is")
    args = p.parse_args(argv)

    m = llamay.load(args.model)
    ids = m.tokenize(args.prompt)
    base = m.logits(ids)
    print(f"{m!r}: {len(ids)} tokens; base next: {m.detokenize([int(base[-1].argmax())])!r}")

    ablated = variant(m, attn=ablate_head(args.layer, args.head))
    other_act = "silu" if m.config.act == "gelu" else "gelu"
    swapped = variant(m, mlp=swap_activation(args.layer, other_act))
    results = {
        "ablate_head": compare(
            f"layer {args.layer} head {args.head} off", m, base, ablated.logits(ids)
        ),
        "swap_mlp": compare(f"layer {args.layer} MLP {other_act}", m, base, swapped.logits(ids)),
        "first_changed_layer": first_changed_layer(m, ablated, ids),
    }
    print(f"hidden states first differ after block {results['first_changed_layer']}")
    return results


if __name__ == "__main__":
    main()
