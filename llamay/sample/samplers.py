"""Samplers as data: llama.cpp's sampler set, parameter names and default order.

`Sampler` is the host-side description of one request's sampling (validated);
`SamplingParams` is the per-slot array form the step function takes, so a new
request's settings never recompile anything; `SamplerState` is what sampling
carries from step to step per slot (PRNG key, a ring of recent token ids for the
penalties and DRY, mirostat's mu, the last step's log-probabilities). The device
side lives in `llamay.sample.chain`.

What is static (compiled in) is only the *plan*: the sampler order (or mirostat
mode) and the number of log-probabilities returned; slots of one batch share it.

Deviations from llama.cpp, named: the token history is a per-slot ring; `repeat_last_n`
/ `dry_penalty_last_n` are llama.cpp's (-1: the context size, 0: off, N: the last N
tokens) when the ring holds the context (`SamplerState.init(..., history=n_ctx)`: a
sequence never holds more tokens than the context); a smaller ring (default `HISTORY`)
caps every window at its length. DRY sequence breakers spread over
several tokens are matched only when `SamplingParams.stack` is given the tokenizer's
`encode` (otherwise just the tokens containing a whole breaker break sequences); the
random draw uses JAX's PRNG, not mt19937, so seeded runs are reproducible within
llamay but do not repeat llama.cpp's draws.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np

from llamay.errors import RequestError

HISTORY = 512  # recent token ids kept per slot unless the engine passes its context size

# llama.cpp's `--samplers` names, in its default order.
STAGES = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
DEFAULT_ORDER = STAGES
_ALIASES = {  # llama.cpp's other names of its samplers
    "typical_p": "typ_p",
    "typical": "typ_p",
    "typical-p": "typ_p",
    "typ-p": "typ_p",
    "typ": "typ_p",
    "temp": "temperature",
    "top-k": "top_k",
    "top-p": "top_p",
    "nucleus": "top_p",
    "min-p": "min_p",
    "top-n-sigma": "top_n_sigma",
}
#: llama.cpp's one-letter names of the samplers (`--sampling-seq`, a string `samplers`).
LETTERS = {
    "e": "penalties",
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
}


def stage_name(name: str) -> str | None:
    """The stage a sampler name (or one of llama.cpp's other names) is, or None."""
    n = _ALIASES.get(name.strip(), name.strip())
    return n if n in STAGES else None


DRY_BREAKERS = ("\n", ":", '"', "*")


def parse_order(order: str | Sequence[str]) -> tuple[str, ...]:
    """A sampler order from names ("top_k;top_p;temperature" or a list); unknown names fail."""
    names = order.split(";") if isinstance(order, str) else list(order)
    out = []
    for n in names:
        n = _ALIASES.get(n.strip(), n.strip())
        if n not in STAGES:
            raise RequestError(f"unknown sampler {n!r} in the sampler order; known: {STAGES}")
        out.append(n)
    return tuple(out)


_F32_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "dynatemp_range",
    "dynatemp_exponent",
    "typical_p",
    "top_n_sigma",
    "xtc_probability",
    "xtc_threshold",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "dry_multiplier",
    "dry_base",
    "mirostat_tau",
    "mirostat_eta",
)
_I32_FIELDS = ("top_k", "min_keep", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n")
#: The int32 range the step packs integer fields into (the HTTP edge checks the same).
INT32_RANGE = (-(2**31), 2**31 - 1)


def _integer(name: str, v) -> int:
    """`v` as an int32 (an integral float too, as JSON clients send), else RequestError."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int | np.integer) or not INT32_RANGE[0] <= v <= INT32_RANGE[1]:
        raise RequestError(
            f"invalid sampling parameters: {name} must be an integer in "
            f"[-2**31, 2**31 - 1], not {v!r}"
        )
    return int(v)


def _check_numbers(s: Sampler) -> None:
    """Every numeric field a number the step's int32 / float32 arrays can hold: a bad
    value fails its request here, naming the field, not later inside a batch's arrays."""
    for f in (*_I32_FIELDS, "mirostat", "n_probs"):
        object.__setattr__(s, f, _integer(f, getattr(s, f)))
    for f in _F32_FIELDS:
        v = getattr(s, f)
        if isinstance(v, bool) or not isinstance(v, int | float | np.number) or v != v:
            raise RequestError(f"invalid sampling parameters: {f} must be a number, not {v!r}")
    if s.seed is not None and not isinstance(s.seed, int | np.integer):
        raise RequestError(f"invalid sampling parameters: seed must be an integer, not {s.seed!r}")


@dataclass(frozen=True)
class Sampler:
    """One request's sampling, with llama.cpp's parameter names and defaults."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    min_keep: int = 0
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: tuple[tuple[int, float], ...] = ()
    samplers: tuple[str, ...] = DEFAULT_ORDER
    n_probs: int = 0

    def __post_init__(self):
        _check_numbers(self)
        if isinstance(self.logit_bias, Mapping):
            object.__setattr__(self, "logit_bias", tuple(self.logit_bias.items()))
        try:
            bias = tuple(
                (_integer("logit_bias token", int(t)), float(b)) for t, b in self.logit_bias
            )
        except (TypeError, ValueError) as exc:
            raise RequestError(
                f"invalid sampling parameters: logit_bias must map token ids to numbers ({exc})"
            ) from None
        object.__setattr__(self, "logit_bias", bias)
        object.__setattr__(self, "samplers", parse_order(self.samplers))
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= 0, "top_k must be >= 0 (0 disables it)"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (0.0 < self.typical_p <= 1.0, "typical_p must be in (0, 1]"),
            (self.dynatemp_range >= 0, "dynatemp_range must be >= 0"),
            (0.0 <= self.xtc_probability <= 1.0, "xtc_probability must be in [0, 1]"),
            (self.min_keep >= 0, "min_keep must be >= 0"),
            (self.repeat_last_n >= -1, "repeat_last_n must be >= -1 (-1: the context)"),
            (self.repeat_penalty > 0, "repeat_penalty must be > 0 (1 disables it)"),
            (self.dry_penalty_last_n >= -1, "dry_penalty_last_n must be >= -1 (-1: the context)"),
            (self.dry_allowed_length >= 0, "dry_allowed_length must be >= 0"),
            (self.mirostat in (0, 1, 2), "mirostat must be 0 (off), 1 or 2"),
            (self.mirostat_eta >= 0, "mirostat_eta must be >= 0"),
            (0 <= self.n_probs <= 64, "n_probs must be in [0, 64]"),
            (all(b for b in self.dry_sequence_breakers), "DRY sequence breakers must be non-empty"),
        ]
        for ok, msg in checks:
            if not ok:
                raise RequestError(f"invalid sampling parameters: {msg}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plan(self) -> tuple[tuple[str, ...], int]:
        """What is compiled in: the stage order (or the mirostat chain) and n_probs."""
        if self.mirostat:
            return (("temperature_plain", f"mirostat{self.mirostat}"), self.n_probs)
        return (self.samplers, self.n_probs)

    @property
    def uses_dry(self) -> bool:
        return (
            not self.mirostat
            and "dry" in self.samplers
            and self.dry_multiplier != 0
            and self.dry_base >= 1.0
            and self.dry_penalty_last_n != 0
        )


GREEDY = Sampler(temperature=0.0)


def dry_breaker_table(pieces: Sequence[bytes], breakers: Sequence[str]) -> np.ndarray:
    """bool[V]: the tokens whose text contains a sequence-breaker string."""
    needles = [b.encode()[:DRY_MAX_CHARS] for b in breakers]
    return np.array([any(n in p for n in needles) for p in pieces], bool)


DRY_MAX_CHARS, DRY_MAX_TAIL = 40, 20  # llama.cpp's clamps on breakers and their tails


def dry_restart_sequences(pieces: Sequence[bytes], breakers: Sequence[str], encode):
    """llama.cpp's get_overlapping_token_sequences for breakers spread over tokens: for a
    token whose text ends with the start of a breaker (without containing it), the head
    token and the tokens of the rest of the breaker. Returns a set of (head, tail)."""
    out = set()
    for b in breakers:
        needle = b.encode()[:DRY_MAX_CHARS]
        for tok, w in enumerate(pieces):
            if not w or needle in w:
                continue
            pos = w.find(needle[:1])
            while pos >= 0:
                n = len(w) - pos
                if n < len(needle) and w[pos:] == needle[:n]:
                    rest = needle[n:].decode("utf-8", "ignore")
                    tail = tuple(encode(rest))[:DRY_MAX_TAIL] if rest else ()
                    if tail:
                        out.add((tok, tail))
                pos = w.find(needle[:1], pos + 1)
    return out


# DRY's tables scan the whole vocabulary in Python (a 262k vocabulary takes ~0.1 s per
# breaker set), so they are built once per tokenizer, keyed by the identity of its piece
# list (held, so the id cannot be reused) and the breakers; `DRY_TABLE_BUILDS` counts
# the builds.
_DRY_CACHE: OrderedDict[int, tuple[Sequence[bytes], dict]] = OrderedDict()
_DRY_CACHE_TOKENIZERS = 4
DRY_TABLE_BUILDS: Counter[str] = Counter()


def _dry_cached(kind: str, pieces: Sequence[bytes], key: tuple, build):
    entry = _DRY_CACHE.get(id(pieces))
    if entry is None or entry[0] is not pieces:
        entry = (pieces, {})
        _DRY_CACHE[id(pieces)] = entry
        while len(_DRY_CACHE) > _DRY_CACHE_TOKENIZERS:
            _DRY_CACHE.popitem(last=False)
    _DRY_CACHE.move_to_end(id(pieces))
    tables = entry[1]
    if (kind, key) not in tables:
        DRY_TABLE_BUILDS[kind] += 1
        tables[(kind, key)] = build()
    return tables[(kind, key)]


def cached_breaker_table(pieces: Sequence[bytes], breakers: tuple[str, ...]) -> np.ndarray:
    """`dry_breaker_table`, built once per (tokenizer pieces, breakers)."""
    return _dry_cached("breakers", pieces, breakers, lambda: dry_breaker_table(pieces, breakers))


def cached_restart_sequences(pieces: Sequence[bytes], breakers: tuple[str, ...], encode):
    """`dry_restart_sequences`, built once per (tokenizer pieces, breakers, encode)."""
    return _dry_cached(
        "restarts",
        pieces,
        (breakers, encode),
        lambda: frozenset(dry_restart_sequences(pieces, breakers, encode)),
    )


def _tail_table(per_slot: list[set]) -> np.ndarray:
    """[B, NT, 1 + LT] int32: head id, then tail ids; -1 pads (NT, LT rounded up to 2^k)."""
    nt = max(1, max(len(x) for x in per_slot))
    lt = max(1, max((len(t) for x in per_slot for _, t in x), default=1))
    nt, lt = 1 << (nt - 1).bit_length(), 1 << (lt - 1).bit_length()
    table = np.full((len(per_slot), nt, 1 + lt), -1, np.int32)
    for i, entries in enumerate(per_slot):
        for k, (head, tail) in enumerate(sorted(entries)):
            table[i, k, 0] = head
            table[i, k, 1 : 1 + len(tail)] = tail
    return table


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SamplingParams:
    """Per-slot sampling parameters as device arrays [B] (bias and breakers [B, V])."""

    temperature: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    dynatemp_range: jax.Array
    dynatemp_exponent: jax.Array
    typical_p: jax.Array
    top_n_sigma: jax.Array
    xtc_probability: jax.Array
    xtc_threshold: jax.Array
    repeat_penalty: jax.Array
    presence_penalty: jax.Array
    frequency_penalty: jax.Array
    dry_multiplier: jax.Array
    dry_base: jax.Array
    mirostat_tau: jax.Array
    mirostat_eta: jax.Array
    top_k: jax.Array
    min_keep: jax.Array
    repeat_last_n: jax.Array
    dry_allowed_length: jax.Array
    dry_penalty_last_n: jax.Array
    logit_bias: jax.Array | None  # [B, V] f32, or None when no slot has a bias
    dry_breakers: jax.Array | None  # [B, V] bool, or None when no slot uses DRY
    dry_tails: jax.Array | None  # [B, NT, 1 + LT] int32 multi-token breakers, or None
    order: tuple[str, ...] = field(metadata=dict(static=True), default=DEFAULT_ORDER)
    n_probs: int = field(metadata=dict(static=True), default=0)

    @staticmethod
    def stack(
        samplers: list[Sampler],
        vocab_size: int | None = None,
        pieces: Sequence[bytes] | None = None,
        encode=None,
    ) -> SamplingParams:
        """The slots' samplers as arrays. `vocab_size` is needed for logit_bias and DRY;
        `pieces` (each token's bytes) for DRY's sequence breakers, and `encode` (text ->
        ids) for breakers that span tokens (without it only tokens containing a whole
        breaker break sequences)."""
        plans = {s.plan for s in samplers}
        if len(plans) != 1:
            raise RequestError(
                "the slots of one batch must share the sampler order, mirostat mode and n_probs"
            )
        order, n_probs = plans.pop()
        # Built in numpy and device_put whole: jnp.asarray(ndarray) would compile an
        # identity program per shape (jax 0.12), on a request's path.
        arr = {f: np.array([getattr(s, f) for s in samplers], np.float32) for f in _F32_FIELDS}
        arr |= {f: np.array([getattr(s, f) for s in samplers], np.int32) for f in _I32_FIELDS}
        arr = jax.device_put(arr)
        bias = breakers = tails = None
        if any(s.logit_bias for s in samplers):
            if vocab_size is None:
                raise RequestError("logit_bias needs the vocabulary size")
            b = np.zeros((len(samplers), vocab_size), np.float32)
            for i, s in enumerate(samplers):
                for t, v in s.logit_bias:
                    if not 0 <= t < vocab_size:
                        raise RequestError(
                            f"logit_bias names token {t}, outside the vocabulary "
                            f"(0..{vocab_size - 1})"
                        )
                    b[i, t] += v
            bias = jax.device_put(b)
        if any(s.uses_dry for s in samplers):
            if pieces is None:
                raise RequestError(
                    "DRY needs the tokenizer's token pieces for its sequence breakers"
                )
            tables = [
                cached_breaker_table(pieces, s.dry_sequence_breakers)
                if s.uses_dry
                else np.zeros(len(pieces), bool)
                for s in samplers
            ]
            breakers = jax.device_put(np.stack(tables))
            if encode is not None:
                seqs = [
                    cached_restart_sequences(pieces, s.dry_sequence_breakers, encode)
                    if s.uses_dry
                    else set()
                    for s in samplers
                ]
                if any(seqs):
                    tails = jax.device_put(_tail_table(seqs))
        return SamplingParams(
            **arr,
            logit_bias=bias,
            dry_breakers=breakers,
            dry_tails=tails,
            order=order,
            n_probs=n_probs,
        )


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SamplerState:
    """What sampling carries between steps, per slot."""

    keys: jax.Array  # [B, 2] uint32 PRNG key data
    history: jax.Array  # [B, HISTORY] int32 ring of recent ids (-1 empty)
    n_seen: jax.Array  # [B] int32 ids pushed so far (ring write position = n_seen % HISTORY)
    mu: jax.Array  # [B] f32 mirostat's running surprise target
    top_logprobs: jax.Array  # [B, n_probs] f32: last step's best log-probabilities
    top_ids: jax.Array  # [B, n_probs] int32: their token ids
    token_logprob: jax.Array  # [B] f32: last step's chosen token's log-probability

    @staticmethod
    def init(
        samplers: list[Sampler],
        histories: list[Sequence[int]] | None = None,
        history: int = HISTORY,
    ) -> SamplerState:
        """Fresh state; `histories` (e.g. the prompts) seed the penalty window, as
        llama.cpp's CLI accepts the prompt tokens into its samplers. `history` is the
        ring's length: pass the context size, and -1 / every window is llama.cpp's."""
        B = len(samplers)
        n_probs = samplers[0].n_probs if samplers else 0
        ring = np.full((B, history), -1, np.int32)
        seen = np.zeros(B, np.int32)
        for i, h in enumerate(histories or []):
            h = list(h)[-history:]
            ring[i, : len(h)] = h
            seen[i] = len(h)
        host = dict(  # numpy, device_put whole: no program compiled per shape
            history=ring,
            n_seen=seen,
            mu=np.array([2.0 * s.mirostat_tau for s in samplers], np.float32),
            top_logprobs=np.zeros((B, n_probs), np.float32),
            top_ids=np.zeros((B, n_probs), np.int32),
            token_logprob=np.zeros((B,), np.float32),
        )
        return SamplerState(keys=seed_keys(samplers), **jax.device_put(host))


def seed_keys(samplers: list[Sampler]) -> jax.Array:
    """One PRNG key per slot (threefry key data [B, 2] uint32: the seed's high and low 32
    bits, as `jax.random.key(seed)` for seeds below 2**32); an unseeded sampler draws
    its seed from the OS. Built in numpy, so thousands of slots cost nothing."""
    seeds = [
        s.seed if s.seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        for s in samplers
    ]
    u = np.array([sd % 2**64 for sd in seeds], np.uint64)
    return jax.device_put(
        np.stack([u >> np.uint64(32), u & np.uint64(0xFFFFFFFF)], -1).astype(np.uint32)
    )
