"""`llamay serve --mesh`: a server whose models are sharded over a dp=2,tp=2 mesh of the 4
forced CPU devices gives the same greedy completions as the unsharded model."""

from __future__ import annotations

import jax
import openai
import pytest
from typer.testing import CliRunner

from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import chat_prompt, greedy, running

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        jax.device_count() != 4,
        reason="needs 4 devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)",
    ),
]

PROMPTS = ["Once upon a time", "The capital of France", "1, 2, 3,"]


@pytest.fixture(scope="module")
def sharded_server(tiny_paths, serve_home):
    models = Models({"tiny": tiny_paths["tiny"]}, use_store=False, mesh="dp=2,tp=2")
    with running(create_app(models)) as s:
        yield s


def test_sharded_server_equals_unsharded(sharded_server, tiny):
    c = openai.OpenAI(base_url=sharded_server.url + "/v1", api_key="-", max_retries=0)
    # several prompts in one request: they run together in the engine's batch
    r = c.completions.create(model="tiny", prompt=PROMPTS, max_tokens=10, temperature=0)
    got = {ch.index: ch.text for ch in r.choices}
    assert [got[i] for i in range(len(PROMPTS))] == [greedy(tiny, p, 10) for p in PROMPTS]
    msgs = [{"role": "user", "content": "Name three colours."}]
    chat = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    assert chat.choices[0].message.content == greedy(tiny, chat_prompt(tiny, msgs), 8)

    lm = sharded_server.state.models.loaded["tiny"]
    assert dict(lm.model.mesh.shape) == {"data": 2, "model": 2}
    # the tiny llama's 4 heads / 2 KV heads divide tp=2: attention weights are split
    wq = jax.tree_util.tree_leaves(lm.model.weights["layers"]["wq"])[0]
    assert len(wq.sharding.device_set) == 4 and not wq.sharding.is_fully_replicated


def test_bad_mesh_is_a_clear_error(tiny_paths):
    from llamay.errors import RequestError
    from llamay_cli.main import app

    with pytest.raises(RequestError, match="needs 6 devices"):
        Models({"tiny": tiny_paths["tiny"]}, use_store=False, mesh="dp=3,tp=2")
    r = CliRunner().invoke(app, ["serve", "-m", str(tiny_paths["tiny"]), "--mesh", "pp=2"])
    assert r.exit_code == 1 and "bad mesh entry 'pp=2'" in r.output
