"""A real `llamay serve` app on 127.0.0.1 (uvicorn in a thread, a free port) over the tiny
llama (chat template and tokenizer of SmolLM2, random weights: fast, deterministic) and
the tiny bert (embeddings, rerank); the official clients talk to it unmodified."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.serve import create_app
from llamay.serve.app import serve_in_thread
from llamay.serve.models import Models


@dataclass
class Server:
    url: str
    app: object
    port: int

    @property
    def state(self):
        return self.app.state.llamay


@contextlib.contextmanager
def running(app) -> Iterator[Server]:
    """`app` served by uvicorn on a free loopback port until the block ends."""
    with serve_in_thread(app) as url:
        yield Server(url, app, int(url.rsplit(":", 1)[1]))


@pytest.fixture(scope="session")
def tiny_paths():
    return {
        "tiny": tiny_model_file("llama"),
        "bert": tiny_model_file("bert"),
    }


@pytest.fixture(scope="session")
def tiny(tiny_paths):
    """The tiny llama, loaded directly: the oracle the server's output is held to."""
    return llamay.load(tiny_paths["tiny"])


@pytest.fixture(scope="session")
def serve_home(tmp_path_factory):
    """An empty store for the server (snapshots, pulls): never the user's."""
    import os

    home = tmp_path_factory.mktemp("llamay-home")
    old = os.environ.get("LLAMAY_HOME")
    os.environ["LLAMAY_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("LLAMAY_HOME", None)
    else:
        os.environ["LLAMAY_HOME"] = old


@pytest.fixture(scope="session")
def server(tiny_paths, serve_home) -> Iterator[Server]:
    models = Models(tiny_paths, use_store=False, default_keep_alive=-1)
    app = create_app(models, max_tokens_limit=256)
    with running(app) as s:
        yield s


def chat_prompt(model, messages, **kw) -> str:
    return model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kw)


def greedy(model, prompt: str, n: int) -> str:
    return model.generate(prompt, max_tokens=n, temperature=0)


def want_logprobs(tiny, prompt_ids: list[int], n: int):
    """Greedy tokens after prompt_ids and a float64 log-softmax of the model's logits
    at each: the oracle for the logprobs the server reports."""
    import numpy as np

    from llamay.sample import GREEDY

    toks = list(tiny.generation(prompt_ids, n, GREEDY))
    rows = np.asarray(tiny.logits(prompt_ids + toks)[len(prompt_ids) - 1 : -1], np.float64)
    rows = rows - rows.max(-1, keepdims=True)
    return toks, rows - np.log(np.exp(rows).sum(-1, keepdims=True))


def piece(tiny, i: int) -> str:
    """A token's text as the APIs report it (invalid UTF-8 replaced)."""
    return tiny.tokenizer.token_to_piece(i).decode("utf-8", "replace")


def wait_idle(state, timeout: float = 30.0) -> dict:
    """Wait until every loaded model's engine has nothing queued or active."""
    deadline = time.monotonic() + timeout
    while True:
        stats = {n: lm.engine.stats() for n, lm in state.models.loaded.items()}
        busy = [n for n, s in stats.items() if s.get("queued") or s.get("active")]
        if not busy and state.metrics.in_flight == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(
                f"engines still busy: {stats}, in flight {state.metrics.in_flight}"
            )
        time.sleep(0.05)
