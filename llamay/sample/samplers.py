"""Samplers as data, applied on device in one jitted function.

`Sampler` is the host-side description of one request's sampling (validated);
`SamplingParams` is the per-slot array form the step function takes, so a new
request's settings never recompile anything. The chain follows llama.cpp's
default order: top-k → top-p → min-p → temperature → draw; temperature 0 is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from llamay.errors import RequestError


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None

    def __post_init__(self):
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= 0, "top_k must be >= 0 (0 disables it)"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
        ]
        for ok, msg in checks:
            if not ok:
                raise RequestError(f"invalid sampling parameters: {msg}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampler(temperature=0.0)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SamplingParams:
    temperature: jax.Array  # [B] f32
    top_k: jax.Array  # [B] i32
    top_p: jax.Array  # [B] f32
    min_p: jax.Array  # [B] f32

    @staticmethod
    def stack(samplers: list[Sampler]) -> SamplingParams:
        return SamplingParams(
            jnp.asarray(np.array([s.temperature for s in samplers], np.float32)),
            jnp.asarray(np.array([s.top_k for s in samplers], np.int32)),
            jnp.asarray(np.array([s.top_p for s in samplers], np.float32)),
            jnp.asarray(np.array([s.min_p for s in samplers], np.float32)),
        )


def seed_keys(samplers: list[Sampler]) -> jax.Array:
    """One PRNG key per slot; an unseeded sampler draws its seed from the OS."""
    seeds = [
        s.seed if s.seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        for s in samplers
    ]
    return jnp.stack([jax.random.key_data(jax.random.key(sd)) for sd in seeds])


def _filter_sorted(sorted_logits: jax.Array, p: SamplingParams) -> jax.Array:
    """Mask (to -inf) the sorted candidates that top-k, top-p and min-p drop."""
    V = sorted_logits.shape[-1]
    rank = jnp.arange(V)[None, :]
    k = p.top_k[:, None]
    x = jnp.where((k <= 0) | (rank < k), sorted_logits, -jnp.inf)
    probs = jax.nn.softmax(x, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the better candidates
    x = jnp.where((before < p.top_p[:, None]) | (rank == 0), x, -jnp.inf)
    floor = x[:, :1] + jnp.log(jnp.maximum(p.min_p[:, None], 1e-30))
    return jnp.where((p.min_p[:, None] <= 0) | (x >= floor), x, -jnp.inf)


def sample(logits: jax.Array, p: SamplingParams, keys: jax.Array):
    """Draw one token per row from logits [B, V]. Returns (tokens [B] int32, new keys)."""
    logits = logits.astype(jnp.float32)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    x = _filter_sorted(sorted_logits, p)
    temp = jnp.maximum(p.temperature, 1e-6)[:, None]
    split = jax.vmap(lambda k: jax.random.split(jax.random.wrap_key_data(k)))(keys)
    draw_keys, next_keys = split[:, 0], split[:, 1]
    pick = jax.vmap(jax.random.categorical)(draw_keys, x / temp)
    drawn = jnp.take_along_axis(order, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)
    tokens = jnp.where(p.temperature <= 0, greedy, drawn)
    return tokens, jax.vmap(jax.random.key_data)(next_keys)
