"""Model names: `[host/namespace/]` or `[namespace/]` `name[:tag]`, validated so that a name
can never leave the store.

A name becomes path components under `manifests/` (`manifests/<ns>/<name>/<tag>.json`), so
the grammar is deliberately narrow: each component is lowercase ASCII letters and digits
plus `.`, `-`, `_`, starts with a letter or digit, does not end with `.`, and is not a
Windows device name (`con`, `nul`, `com1`, ...). That rules out `..`, absolute paths,
separators of either kind, NUL and every other control or non-ASCII character by
construction. A registry name `host/ns/name:tag` (Docker's rule: the first of three
components is a host, and a host contains a `.` or a `:port`, or is `localhost`) lives in
Ollama's layout, `manifests/<host>/<ns>/<name>/<tag>` with no extension; a host is lowercase
letters, digits, `.` and `-` with an optional `:port`, and the other components of a
registry name may use upper case too (as the registry spells them, e.g. on `hf.co`).
`manifest_path` additionally checks the resolved path against the store root so a symlink
planted inside the store cannot redirect a write either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llamay.errors import InvalidModelNameError

DEFAULT_TAG = "latest"
MAX_COMPONENT_LEN = 128
MAX_NAME_LEN = 255
#: How many `ns/` levels may precede the name (`ns/name:tag`).
MAX_NAMESPACE_DEPTH = 1

_COMPONENT = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9_-])?")
_HOST = re.compile(r"[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::[0-9]{1,5})?")
_WINDOWS_DEVICES = frozenset(
    ["con", "prn", "aux", "nul"] + [f"com{i}" for i in range(10)] + [f"lpt{i}" for i in range(10)]
)


@dataclass(frozen=True, order=True)
class ModelRef:
    """A parsed, valid model name. `str(ref)` is the canonical `[host/]ns/name:tag` form."""

    namespace: str | None
    name: str
    tag: str
    #: The registry (`127.0.0.1:5000`, `example.org`) of a registry name; then `namespace`
    #: is set too.
    host: str | None = None

    @property
    def repository(self) -> str:
        """`[host/]ns/name` (or `name`), without the tag."""
        repo = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.host}/{repo}" if self.host else repo

    @property
    def remote_repository(self) -> str:
        """`ns/name`: the repository path on the registry."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}"

    def parts(self) -> tuple[str, ...]:
        """Path components of the manifest, relative to `manifests/`.

        Registry names use Ollama's layout (`host/ns/name/tag`), the others llamay's own
        (`[ns/]name/tag.json`).
        """
        if self.host:
            return (self.host, self.namespace or "", self.name, self.tag)
        head = (self.namespace,) if self.namespace else ()
        return (*head, self.name, f"{self.tag}.json")


def _check_component(component: str, what: str, full: str, *, upper: bool = False) -> None:
    if not component:
        raise InvalidModelNameError(f"invalid model name {full!r}: empty {what}")
    if len(component) > MAX_COMPONENT_LEN:
        raise InvalidModelNameError(
            f"invalid model name {full!r}: {what} longer than {MAX_COMPONENT_LEN} characters"
        )
    if upper and _COMPONENT.fullmatch(component.lower()):
        pass  # registry names keep their case (`hf.co/Org/Repo-GGUF:Q4_K_M`)
    elif not _COMPONENT.fullmatch(component):
        hint = ""
        if component.lower() != component and _COMPONENT.fullmatch(component.lower()):
            hint = " (names are lowercase)"
        raise InvalidModelNameError(
            f"invalid model name {full!r}: {what} {component!r} must be lowercase letters, "
            f"digits, '.', '-' or '_', starting with a letter or digit and not ending "
            f"with '.'{hint}"
        )
    if component.split(".", 1)[0].lower() in _WINDOWS_DEVICES:
        raise InvalidModelNameError(
            f"invalid model name {full!r}: {what} {component!r} is a reserved device name"
        )


def is_host(component: str) -> bool:
    """Whether the first of three name components names a registry host (Docker's rule)."""
    return "." in component or ":" in component or component == "localhost"


def _check_host(host: str, full: str) -> None:
    if len(host) > MAX_COMPONENT_LEN or not _HOST.fullmatch(host):
        raise InvalidModelNameError(
            f"invalid model name {full!r}: registry host {host!r} must be lowercase letters, "
            "digits, '.' and '-', optionally with ':<port>'"
        )
    if host.split(":", 1)[0].split(".", 1)[0] in _WINDOWS_DEVICES:
        raise InvalidModelNameError(
            f"invalid model name {full!r}: host {host!r} is a reserved device name"
        )


def parse_name(text: str) -> ModelRef:
    """Parse and validate `[host/ns/]` or `[ns/]` `name[:tag]`; the tag defaults to `latest`.

    Raises `InvalidModelNameError` saying which part is wrong.
    """
    if not isinstance(text, str):
        raise InvalidModelNameError(f"invalid model name {text!r}: not a string")
    if len(text) > MAX_NAME_LEN:
        raise InvalidModelNameError(
            f"invalid model name {text[:40]!r}...: longer than {MAX_NAME_LEN} characters"
        )
    if not text:
        raise InvalidModelNameError("invalid model name '': empty")
    host = None
    first, slash, rest = text.partition("/")
    if slash and rest.count("/") == 1 and is_host(first):
        _check_host(first, text)
        host, text_rest = first, rest
    else:
        text_rest = text
    repo, sep, tag = text_rest.partition(":")
    if not sep:
        tag = DEFAULT_TAG
    elif ":" in tag:
        raise InvalidModelNameError(f"invalid model name {text!r}: more than one ':'")
    components = repo.split("/")
    if host is None and len(components) > MAX_NAMESPACE_DEPTH + 1:
        raise InvalidModelNameError(
            f"invalid model name {text!r}: at most {MAX_NAMESPACE_DEPTH} namespace level(s) "
            "(`ns/name:tag`)"
        )
    *namespace, name = components
    for ns in namespace:
        _check_component(ns, "namespace", text, upper=host is not None)
    _check_component(name, "name", text, upper=host is not None)
    _check_component(tag, "tag", text, upper=host is not None)
    return ModelRef(namespace=namespace[0] if namespace else None, name=name, tag=tag, host=host)


def contained_path(root: Path, *parts: str) -> Path:
    """`root/parts...`, refusing any result that resolves outside `root` (e.g. via symlinks)."""
    path = root.joinpath(*parts)
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and not real.is_relative_to(real_root):
        raise InvalidModelNameError(
            f"{path} resolves to {real}, outside the store {real_root} (a symlink in the "
            "store?); refusing to use it"
        )
    return path


def manifest_path(manifests_root: Path, ref: ModelRef) -> Path:
    """Where `ref`'s manifest lives under `manifests_root`, checked to stay inside it."""
    return contained_path(manifests_root, *ref.parts())
