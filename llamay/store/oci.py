"""The OCI distribution protocol, as Ollama's registry speaks it: the client side of a pull.

    GET /v2/<ns>/<name>/manifests/<tag>     the manifest (Accept: schema-2 / OCI manifest)
    GET /v2/<ns>/<name>/blobs/<digest>      a blob; `Range: bytes=<n>-` resumes a download

A `401` with `WWW-Authenticate: Bearer realm=...,service=...,scope=...` is answered by
fetching a token from the realm (anonymously) and retrying with `Authorization: Bearer`.
Blob redirects (to object storage) are followed without the token.

`OciBlobSource` is the store's `Source` for one blob. It is *resumable*: the store keeps the
partial file of an interrupted download and calls `fetch(sink, offset=n)` to continue it
with a ranged GET (restarting from zero only if the registry ignores the range).
Plain HTTP is used for loopback registries (`localhost`, `127.0.0.1`, `[::1]`) or when asked
for (`insecure=True`); HTTPS otherwise.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, ClassVar

from tqdm import tqdm

from llamay.errors import FetchError, ModelNotFoundError
from llamay.store.manifest import MANIFEST_V2, OCI_MANIFEST, Manifest
from llamay.store.source import Sink, Source, register_source

CHUNK = 1 << 20
TIMEOUT_S = 60.0
#: A manifest or token answer larger than this is refused (they are a few KB).
MAX_DOCUMENT = 4 << 20
_LOOPBACK = ("localhost", "127.0.0.1", "[::1]", "::1")


class TransientFetchError(FetchError):
    """A download broke off (connection reset, timeout, short read): worth resuming."""


def default_scheme(host: str, insecure: bool = False) -> str:
    """`http` for loopback hosts or when `insecure`, else `https`."""
    bare = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return "http" if insecure or bare in _LOOPBACK or bare.startswith("127.") else "https"


_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="..."` → ("bearer", {"realm": ..., "service": ...})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_CHALLENGE_PARAM.findall(rest))


class _NoRedirectAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never carry the registry's token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        _check_http_url(newurl, "a redirect")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


def _check_http_url(url: str, what: str) -> None:
    """Refuse anything but http(s) (a registry must not make us read `file:` URLs)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchError(f"{what} points to {url!r}, which is not an http(s) URL; refusing it")


def _read_document(r: Any, what: str) -> bytes:
    data = r.read(MAX_DOCUMENT + 1)
    if len(data) > MAX_DOCUMENT:
        raise FetchError(f"{what} is larger than {MAX_DOCUMENT} bytes; refusing it")
    return data


@dataclass
class Registry:
    """A registry at `scheme://host`, with the bearer token it handed out (if any)."""

    host: str
    scheme: str = "https"
    token: str | None = None
    timeout: float = TIMEOUT_S

    @classmethod
    def shared(cls, host: str, scheme: str) -> Registry:
        """One client per registry per process, so a token serves every blob of a pull."""
        key = (scheme, host)
        reg = _SHARED.get(key)
        if reg is None:
            reg = _SHARED.setdefault(key, cls(host, scheme))
        return reg

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}"

    def _open(self, method: str, path: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        """One request, answering a bearer challenge once. Raises `urllib.error.HTTPError`."""
        opener = urllib.request.build_opener(_NoRedirectAuth())
        for attempt in range(2):
            req = urllib.request.Request(self.base + path, method=method, headers=headers)
            if self.token:
                req.add_unredirected_header("Authorization", f"Bearer {self.token}")
            try:
                return opener.open(req, timeout=self.timeout)
            except urllib.error.HTTPError as e:
                challenge = e.headers.get("WWW-Authenticate", "") if e.headers else ""
                if e.code == 401 and attempt == 0 and challenge:
                    e.close()
                    self._authenticate(challenge)
                    continue
                raise
        raise AssertionError("unreachable")

    def _authenticate(self, challenge: str) -> None:
        scheme, params = parse_challenge(challenge)
        if scheme != "bearer" or "realm" not in params:
            raise FetchError(
                f"registry {self.host} asks for {scheme!r} authentication ({challenge}); "
                "only anonymous bearer tokens are supported"
            )
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        realm = params["realm"]
        _check_http_url(realm, f"the token realm of {self.host}")
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
        try:
            opener = urllib.request.build_opener(_NoRedirectAuth())
            with opener.open(url, timeout=self.timeout) as r:
                doc = json.loads(_read_document(r, f"the token answer of {realm}"))
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise FetchError(f"could not get a token for {self.host} from {realm}: {e}") from e
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise FetchError(f"the token service {realm} answered without a token")
        self.token = token

    def _describe_error(self, e: Exception, what: str) -> FetchError:
        if isinstance(e, urllib.error.HTTPError):
            body = b""
            try:
                body = e.read(2000)
            except OSError:
                pass
            detail = body.decode("utf-8", "replace").strip()
            return FetchError(
                f"{what}: HTTP {e.code} {e.reason}" + (f": {detail}" if detail else "")
            )
        return TransientFetchError(f"{what}: {type(e).__name__}: {e}")

    def manifest(self, repository: str, reference: str) -> tuple[Manifest, bytes]:
        """The manifest of `repository:reference`, checked against the digest the registry
        states. Raises `ModelNotFoundError` on 404, `FetchError` otherwise."""
        what = f"manifest of {self.host}/{repository}:{reference}"
        path = f"/v2/{repository}/manifests/{reference}"
        try:
            with self._open("GET", path, {"Accept": f"{MANIFEST_V2}, {OCI_MANIFEST}"}) as r:
                raw = _read_document(r, what)
                stated = r.headers.get("Docker-Content-Digest")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise ModelNotFoundError(
                    f"{self.host}/{repository}:{reference} was not found on the registry"
                ) from None
            raise self._describe_error(e, what) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise FetchError(f"{what}: cannot reach {self.base}: {e}") from e
        got = "sha256:" + hashlib.sha256(raw).hexdigest()
        if stated and stated != got:
            raise FetchError(f"{what}: the registry states digest {stated}, the bytes are {got}")
        if reference.startswith("sha256:") and reference != got:
            raise FetchError(f"{what}: asked for {reference}, got bytes with digest {got}")
        try:
            return Manifest.loads(raw, what), raw
        except ValueError as e:
            raise FetchError(str(e)) from e

    def open_blob(self, repository: str, digest: str, offset: int = 0):  # noqa: ANN201
        """A response streaming the blob from `offset`, and the offset it really starts at
        (0 if the registry ignored the range)."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        what = f"blob {digest} of {self.host}/{repository}"
        try:
            r = self._open("GET", f"/v2/{repository}/blobs/{digest}", headers)
        except urllib.error.HTTPError as e:
            if e.code == 416 and offset:  # we already have everything
                e.close()
                return None, offset
            raise self._describe_error(e, what) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise TransientFetchError(f"{what}: {e}") from e
        start = 0
        if r.status == 206:
            m = re.match(r"bytes (\d+)-", r.headers.get("Content-Range", ""))
            start = int(m.group(1)) if m else offset
        return r, start


_SHARED: dict[tuple[str, str], Registry] = {}


@register_source
@dataclass(frozen=True)
class OciBlobSource(Source):
    """One blob of a repository on an OCI registry."""

    kind: ClassVar[str] = "oci"
    #: The store may keep a partial download and call `fetch(..., offset=n)`.
    resumable: ClassVar[bool] = True
    host: str
    repository: str
    digest: str
    size: int | None = None
    scheme: str = "https"

    def describe(self) -> str:
        return f"{self.scheme}://{self.host}/{self.repository}@{self.digest[:19]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "host": self.host,
            "repository": self.repository,
            "digest": self.digest,
            "size": self.size,
            "scheme": self.scheme,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OciBlobSource:
        try:
            return cls(
                str(data["host"]),
                str(data["repository"]),
                str(data["digest"]),
                data.get("size"),
                str(data.get("scheme", "https")),
            )
        except (KeyError, TypeError) as e:
            raise FetchError(f"malformed oci source {data!r}: {e}") from e

    def fetch(self, sink: Sink, *, progress: bool = True, offset: int = 0) -> None:
        registry = Registry.shared(self.host, self.scheme)
        response, start = registry.open_blob(self.repository, self.digest, offset)
        if response is None:
            return
        skip = offset - start  # > 0 when the registry ignored the range
        with (
            response,
            tqdm(
                total=self.size,
                initial=offset,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=self.digest[7:19],
                file=sys.stderr,
                disable=not progress,
                dynamic_ncols=True,
            ) as bar,
        ):
            try:
                while chunk := response.read(CHUNK):
                    if skip:
                        cut = min(skip, len(chunk))
                        chunk, skip = chunk[cut:], skip - cut
                        if not chunk:
                            continue
                    sink.write(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as e:
                raise TransientFetchError(
                    f"download of {self.describe()} broke off: {type(e).__name__}: {e}"
                ) from e
