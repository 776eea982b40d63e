"""The constraint protocol: what the engine needs from a structured-output constraint.

A constraint yields the set of tokens allowed next as a packed bitmask (bit v%32 of
uint32 word v//32, llguidance's layout) and advances on the token that was chosen.
The engine applies the mask to the logits on device (`llamay.sample.sample(...,
mask=)`), computes the next mask on the host while the device runs the next forward
pass, and stops when the constraint is `done` (nothing more can follow). Tokens the
constraint does not allow are never sampled; a constraint that is fed one anyway
raises `ConstraintError` rather than continuing unconstrained.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Constraint(Protocol):
    vocab_size: int

    def mask(self) -> np.ndarray:
        """uint32 [ceil(vocab_size / 32)]: the tokens allowed next."""
        ...

    def advance(self, token: int) -> None:
        """Consume the chosen token (raises ConstraintError if it was not allowed)."""
        ...

    @property
    def done(self) -> bool:
        """True when the constraint is complete and allows nothing further."""
        ...

    @property
    def accepting(self) -> bool:
        """True when the output so far is a complete match (generation may stop)."""
        ...


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def pack_mask(allowed: np.ndarray) -> np.ndarray:
    """bool [V] → packed uint32 [ceil(V/32)]."""
    V = allowed.shape[-1]
    pad = np.zeros(mask_words(V) * 32, bool)
    pad[:V] = allowed
    return np.packbits(pad.reshape(-1, 32), axis=-1, bitorder="little").view("<u4").reshape(-1)


def unpack_mask_np(bits: np.ndarray, vocab_size: int) -> np.ndarray:
    """packed uint32 [W] → bool [V] (host-side mirror of the device unpack)."""
    b = np.ascontiguousarray(bits).astype("<u4").view(np.uint8)
    return np.unpackbits(b, bitorder="little")[:vocab_size].astype(bool)
