"""Model-name validation: a table of good and evil names, and a property that no string
ever yields a manifest path outside the store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llamay.errors import InvalidModelNameError
from llamay.store import ModelRef, parse_name
from llamay.store.names import manifest_path

GOOD = [
    ("smollm2:135m", ModelRef(None, "smollm2", "135m")),
    ("gemma3:270m", ModelRef(None, "gemma3", "270m")),
    ("gemma3", ModelRef(None, "gemma3", "latest")),
    ("library/gemma3:270m", ModelRef("library", "gemma3", "270m")),
    ("a.b-c_d:q4_k_m", ModelRef(None, "a.b-c_d", "q4_k_m")),
    ("0:0", ModelRef(None, "0", "0")),
    ("x-:y_", ModelRef(None, "x-", "y_")),
    ("a..b:1.5", ModelRef(None, "a..b", "1.5")),
    ("console:latest", ModelRef(None, "console", "latest")),
    ("n" * 128 + ":" + "t" * 126, ModelRef(None, "n" * 128, "t" * 126)),
]

EVIL = [
    "",
    ":",
    ":tag",
    "name:",
    "..",
    ".",
    "../x",
    "../../etc/passwd",
    "a/../b",
    "a/..:x",
    "ns/..",
    "a:..",
    "a:.",
    "a:../../x",
    "a:b/c",
    "/abs",
    "/etc/passwd:x",
    "a//b",
    "a/",
    "/a",
    "a/b/c",
    "a\\b",
    "..\\x",
    "c:\\windows",
    "a\0b",
    "a\0",
    "a:b\0",
    "a b",
    " a",
    "a\n",
    "a\t:b",
    "é",
    "ａ",  # fullwidth a
    "a:b:c",
    "Smollm2:135m",
    "smollm2:135M",
    ".hidden",
    "a/.hidden",
    "-rf",
    "_x",
    "a.",
    "a:b.",
    "con",
    "nul:tag",
    "a:nul",
    "com1.txt",
    "ns/aux:x",
    "~",
    "~root",
    "$HOME",
    "a*",
    "a?",
    "%2e%2e",
    "n" * 129,
    "n" * 128 + ":" + "t" * 127,  # 256 characters in all
]


@pytest.mark.parametrize(("text", "ref"), GOOD)
def test_good_names(text: str, ref: ModelRef) -> None:
    assert parse_name(text) == ref
    assert str(ref) == (text if ":" in text else f"{text}:latest")
    assert parse_name(str(ref)) == ref


@pytest.mark.parametrize("text", EVIL)
def test_evil_names(text: str) -> None:
    with pytest.raises(InvalidModelNameError, match="invalid model name"):
        parse_name(text)


def test_non_string_name() -> None:
    with pytest.raises(InvalidModelNameError):
        parse_name(b"smollm2:135m")  # type: ignore[arg-type]


def test_uppercase_hint() -> None:
    with pytest.raises(InvalidModelNameError, match="lowercase"):
        parse_name("SmolLM2:135m")


def test_manifest_paths(tmp_path: Path) -> None:
    root = tmp_path / "manifests"
    assert manifest_path(root, parse_name("smollm2:135m")) == root / "smollm2" / "135m.json"
    assert manifest_path(root, parse_name("ns/x")) == root / "ns" / "x" / "latest.json"


@pytest.mark.skipif(os.name == "nt", reason="symlinks need privileges on Windows")
def test_symlink_inside_store_cannot_redirect(tmp_path: Path) -> None:
    root = tmp_path / "manifests"
    outside = tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    (root / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidModelNameError, match="outside the store"):
        manifest_path(root, parse_name("evil/x:y"))
    # a store whose root itself is a symlink is fine
    link_root = tmp_path / "link"
    link_root.symlink_to(root, target_is_directory=True)
    assert manifest_path(link_root, parse_name("ok:1")) == link_root / "ok" / "1.json"


DANGEROUS = st.text(alphabet="ab0.-_:/\\\0~ A%é\n", max_size=24)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(DANGEROUS, st.text(max_size=40)))
@example(text="../..")
@example(text="a/../../b")
@example(text="..:..")
def test_no_string_escapes_the_store(tmp_path: Path, text: str) -> None:
    root = tmp_path / "manifests"
    try:
        ref = parse_name(text)
    except InvalidModelNameError:
        return
    path = manifest_path(root, ref)
    rel = path.relative_to(root)
    assert ".." not in rel.parts and "." not in rel.parts
    assert len(rel.parts) in (2, 3)
    assert os.path.normpath(path) == str(path)
    assert path.resolve().is_relative_to(root.resolve())
    assert all(p and p.isascii() and p.isprintable() and "\\" not in p for p in rel.parts)
    # the canonical form parses to the same reference
    assert parse_name(str(ref)) == ref


REGISTRY_GOOD = [
    ("127.0.0.1:5000/library/tiny:latest", ("127.0.0.1:5000", "library", "tiny", "latest")),
    ("example.org/ns/model", ("example.org", "ns", "model", "latest")),
    ("localhost/a/b:c", ("localhost", "a", "b", "c")),
    ("hf.co/org/repo-gguf:q4_k_m", ("hf.co", "org", "repo-gguf", "q4_k_m")),
    ("hf.co/Org/SmolLM2-GGUF:Q4_K_M", ("hf.co", "Org", "SmolLM2-GGUF", "Q4_K_M")),
]
REGISTRY_EVIL = [
    "a/b/c",  # no host-looking first component
    "Example.org/a/b",
    "example.org/a/b/c",
    "example.org//b",
    "example.org/../b",
    "example.org/a/..",
    "..:5000/a/b",
    ".example.org/a/b",
    "example.org:/a/b",
    "example.org:99999999/a/b",
    "exa mple.org/a/b",
    "example.org/a/b:../x",
    "con.example/a/b",
    "example.org/a/CON",
    "example.org/a/b:Nul",
    "example.org/a/b.",
    "example.org/.A/b",
]


@pytest.mark.parametrize(("text", "parts"), REGISTRY_GOOD)
def test_registry_names(text: str, parts: tuple[str, ...], tmp_path: Path) -> None:
    ref = parse_name(text)
    assert (ref.host, ref.namespace, ref.name, ref.tag) == parts
    assert str(ref) == (text if text.rsplit("/", 1)[1].count(":") else f"{text}:latest")
    assert ref.remote_repository == f"{parts[1]}/{parts[2]}"
    assert ref.parts() == parts  # Ollama's layout: no extension
    assert manifest_path(tmp_path, ref) == tmp_path.joinpath(*parts)


@pytest.mark.parametrize("text", REGISTRY_EVIL)
def test_registry_evil_names(text: str) -> None:
    with pytest.raises(InvalidModelNameError, match="invalid model name"):
        parse_name(text)
