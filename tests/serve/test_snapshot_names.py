"""Snapshot names are plain names: `"evil\\n"` (which `re.match` with `$` let through, making
the file `evil\\n.json`), paths and dot-names are refused with a 400 naming the rule, on
save, on create-from and on delete."""

from __future__ import annotations

import httpx
import pytest
from fixture_data import tiny_model_file

from llamay.serve import create_app
from llamay.serve.app import serve_in_thread
from llamay.serve.models import Models

BAD = ["evil\n", "evil\r\n", "../evil", "a/b", ".hidden", "", "x" * 129, "e vil", "evil\x00"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tiny = tiny_model_file("llama")
    home = tmp_path_factory.mktemp("llamay-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("LLAMAY_HOME", str(home))
    app = create_app(Models({"tiny": tiny}, use_store=False, default_keep_alive=-1))
    with serve_in_thread(app) as u:
        yield u, home
    mp.undo()


def test_snapshot_names_must_be_plain(url) -> None:
    base, home = url
    ctx = httpx.post(f"{base}/v1/contexts", json={"model": "tiny", "text": "Hi"}, timeout=120)
    assert ctx.status_code == 200, ctx.text
    cid = ctx.json()["id"]
    for name in BAD:
        r = httpx.post(f"{base}/v1/contexts/{cid}/snapshot", json={"name": name}, timeout=60)
        if name == "":  # no name: the context's id is the name
            assert r.status_code == 200, r.text
            continue
        assert r.status_code == 400, (name, r.status_code, r.text)
        assert "snapshot name" in r.json()["error"]["message"]
        r = httpx.post(f"{base}/v1/contexts", json={"model": "tiny", "snapshot": name})
        assert r.status_code == 400, (name, r.text)
    r = httpx.delete(f"{base}/v1/snapshots/evil%0A")
    assert r.status_code == 400, r.text
    saved = sorted(p.name for p in (home / "contexts").iterdir())
    assert saved == [f"{cid}.json"], saved
    ok = httpx.post(f"{base}/v1/contexts/{cid}/snapshot", json={"name": "ok-name.1_2"})
    assert ok.status_code == 200 and (home / "contexts" / "ok-name.1_2.json").is_file()
