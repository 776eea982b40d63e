"""bench/llamaserver_compare.py: its aggregates by hand, the whole run against fake servers
whose sleeps bound what it may measure, and (where they run here) both real servers on the
tiny llama fixture: exactly `n_predict` tokens per stream, and the TTFT prefix reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixture_data import tiny_model_file

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def B(monkeypatch):
    """The bench module (bench/ is no package of the install: imported from the checkout)."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    monkeypatch.chdir(REPO_ROOT)  # the fake servers run as `python -m bench....`
    from bench import llamaserver_compare

    return llamaserver_compare


# What llama-server (llama.cpp as vendored in llama-cpp-python 0.3.36) streamed for
# POST /completion on the tiny llama fixture: a 64-token prefix seen before + 8 new tokens,
# n_predict 2, ignore_eos (the final event's generation_settings and prompt left out).
LLAMA_SERVER_LINES = [
    'data: {"index":0,"content":"‘","tokens":[7765],"stop":false,"id_slot":-1,"tokens_predicted":1,"tokens_evaluated":72}',  # noqa: E501
    "",
    'data: {"index":0,"content":" unauthorized","tokens":[23144],"stop":false,"id_slot":-1,"tokens_predicted":2,"tokens_evaluated":72}',  # noqa: E501
    "",
    'data: {"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"llama.gguf","tokens_predicted":2,"tokens_evaluated":72,"has_new_line":false,"truncated":false,"stop_type":"limit","stopping_word":"","tokens_cached":73,"timings":{"cache_n":64,"prompt_n":8,"prompt_ms":1.87,"prompt_per_token_ms":0.23375,"prompt_per_second":4278.07486631016,"predicted_n":2,"predicted_ms":1.027,"predicted_per_token_ms":1.027,"predicted_per_second":973.7098344693283}}',  # noqa: E501
]


def test_events_and_cached_tokens_as_each_server_reports_them(B):
    events = [e for e in map(B.parse_event, LLAMA_SERVER_LINES) if e is not None]
    assert [e["stop"] for e in events] == [False, False, True]
    assert B.parse_event("data: [DONE]") is None
    # timings.cache_n, not tokens_cached (the whole slot: prompt + generated)
    assert B.cached_tokens(events[-1]) == 64


def test_aggregates_by_hand(B):
    a = B.Stream(t_start=0.0, t_first=1.0, t_end=3.0, tokens=5, cached_tokens=0)
    b = B.Stream(t_start=0.5, t_first=1.5, t_end=4.0, tokens=9, cached_tokens=0)
    assert B.decode_tok_s([a, b]) == pytest.approx((4 + 8) / (4.0 - 1.0))
    assert B.e2e_tok_s([a, b]) == pytest.approx(14 / 4.0)
    assert (a.ttft, b.ttft) == (1.0, 1.0)
    rows = [
        {"engine": "llamay", "kind": "decode", "streams": 4, "decode_tok_s": 30.0,
         "ttft_p50_s": 0.5, "loadavg": [1] * 6},
        {"engine": "llama-server", "kind": "decode", "streams": 4, "decode_tok_s": 120.0,
         "ttft_p50_s": 0.25, "loadavg": [2] * 6},
    ]  # fmt: skip
    (line,) = B.summarise(rows)
    assert line["decode_tok_s"] == {
        "llama-server": 120.0,
        "llama-server-passive": None,
        "llamay": 30.0,
        "ratio": 0.25,
    }
    assert line["ttft_p50_s"]["ratio"] == 2.0
    assert "| decode | 4 | decode_tok_s | 30 | 120 | - | 0.25 |" in B.table([line])
    assert B.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert B.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) == pytest.approx(4.96)


def test_plan_measures_fresh_servers_first(B):
    assert B.plan([1, 4], True) == [(1, ["fresh", "ttft", "decode"]), (4, ["fresh", "decode"])]
    assert B.plan([4], True) == [(1, ["fresh", "ttft"]), (4, ["fresh", "decode"])]
    assert B.plan([4], False) == [(4, ["fresh", "decode"])]


def test_llama_server_runs_at_its_defaults_and_passive_as_a_second_row(B, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert "OMP_WAIT_POLICY" not in B.server_env("llama-server")
    assert B.server_env("llama-server-passive")["OMP_WAIT_POLICY"] == "PASSIVE"
    assert B.server_env("llamay")["OMP_WAIT_POLICY"] == "ACTIVE"


def _run(B, tmp_path, *extra: str) -> dict:
    return B.main(["--streams", "1,3", "--tokens", "6", "--prefix", "200", "--reps", "1",
                   "--out-dir", str(tmp_path), *extra])  # fmt: skip


def test_dry_run_against_fake_servers_and_resume(B, tmp_path):
    doc = _run(B, tmp_path, "--dry-run")
    rows = {(r["engine"], r["kind"], r["streams"]): r for r in doc["rows"]}
    kinds = (("fresh", 1), ("decode", 1), ("ttft", 1), ("fresh", 3), ("decode", 3))
    primed = [("llamay", "prime", 1), ("llamay", "prime", 3)]  # its program cache filled first
    assert sorted(rows) == sorted([(e, k, n) for e in B.ENGINES for k, n in kinds] + primed)
    assert [r["kind"] for r in doc["rows"][:2]] == ["prime", "prime"]
    # the fakes' sleeps (server_command)
    token_ms = {"llama-server": 2.0, "llama-server-passive": 3.0, "llamay": 4.0}
    for (engine, kind, n), r in rows.items():
        if kind == "prime":
            assert r["prime_ready_s"] > 0
        elif kind == "fresh":
            assert 0 < r["serving_s"] <= r["ready_s"]
            assert r["first_request_s"] >= 4 * token_ms[engine] / 1e3  # 4 tokens
        elif kind == "decode":
            assert r["tokens_per_stream"] == [6]
            # each stream sleeps token_ms after every token, so from request to last event
            # no faster than that (client-side first-token times may come late, in a burst:
            # decode_tok_s has no such bound)
            assert r["decode_tok_s"] > 0
            assert 0 < r["e2e_tok_s"] <= n * 1000 / token_ms[engine]
        else:
            assert r["cached_tokens"] == [200]
            # the fake sleeps 0.2 ms per uncached prompt token (208) before its first token
            assert r["ttft_uncached_s"] >= 208 * 0.2e-3
            assert r["first_miss_s"] >= 208 * 0.2e-3 and r["first_hit_s"] > 0
        assert len(r["loadavg"]) == 6
    line = next(s for s in doc["summary"] if (s["kind"], s["streams"]) == ("decode", 3))
    ours, theirs = rows["llamay", "decode", 3], rows["llama-server", "decode", 3]
    assert line["decode_tok_s"]["ratio"] == round(ours["decode_tok_s"] / theirs["decode_tok_s"], 3)

    (saved,) = tmp_path.glob("llamaserver-*.json")
    assert json.loads(saved.read_text())["rows"] == doc["rows"]
    more = B.main(["--streams", "1,3,2", "--tokens", "6", "--prefix", "200", "--reps", "1",
                   "--dry-run", "--resume", str(saved)])  # fmt: skip
    assert more["rows"][: len(doc["rows"])] == doc["rows"]
    assert {(r["engine"], r["streams"]) for r in more["rows"][len(doc["rows"]) :]} == {
        (e, 2) for e in B.ENGINES
    }
    assert ("llamay", "prime", 2) in {(r["engine"], r["kind"], r["streams"]) for r in more["rows"]}
    quick = B.main(["--dry-run", "--quick", "--engines", "llama-server", "--prefix", "0",
                    "--out-dir", str(tmp_path / "quick")])  # fmt: skip
    assert quick["params"] == {"model": "smollm2:135m", "tokens": 32, "prefix": 0, "reps": 1,
                               "threads": 2, "dry_run": True}  # fmt: skip
    assert sorted({r["streams"] for r in quick["rows"]}) == [1, 8]
    with pytest.raises(SystemExit, match="was run with"):
        B.main(["--tokens", "7", "--dry-run", "--resume", str(saved)])


def _real_run(B, tmp_path, engine: str, streams: str) -> list[dict]:
    tiny = tiny_model_file("llama")
    doc = B.main(["--engines", engine, "--model", str(tiny), "--streams", streams, "--tokens", "6",
                  "--prefix", "64", "--reps", "1", "--out-dir", str(tmp_path)])  # fmt: skip
    return doc["rows"]


def _check_real(rows: list[dict], streams: list[int]) -> None:
    decode = [r for r in rows if r["kind"] == "decode"]
    assert [r["streams"] for r in decode] == streams
    # ignore_eos and n_predict: exactly 6 tokens per stream, whatever the model says
    assert all(r["tokens_per_stream"] == [6] and r["decode_tok_s"] > 0 for r in decode)
    (ttft,) = [r for r in rows if r["kind"] == "ttft"]
    assert ttft["cached_tokens"] == [64]  # the 64-token prefix, not the differing tail


def test_llama_server_on_the_tiny_model(B, tmp_path):
    if B.llama_server_binary() is None:
        pytest.skip(
            "no llama-server binary (build it as bench/llamaserver_compare.py's docstring "
            f"says, or set LLAMA_SERVER); looked in {B.DEFAULT_BINARY} and PATH"
        )
    _check_real(_real_run(B, tmp_path, "llama-server", "1,2"), [1, 2])


@pytest.mark.slow
def test_llamay_serve_on_the_tiny_model(B, tmp_path):
    # one server (JAX start-up and compiles dominate); concurrency is the dry run's part
    _check_real(_real_run(B, tmp_path, "llamay", "1"), [1])
