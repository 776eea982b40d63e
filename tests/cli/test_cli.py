"""The `llamay` command, in-process through Typer's runner, against the llama.cpp goldens."""

from __future__ import annotations

import json

import pytest
from fixture_data import tiny_model_file
from typer.testing import CliRunner

from llamay_cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def smollm2_goldens(fixtures_dir, kind):
    return json.loads((fixtures_dir / kind / "smollm2-135m-instruct-q4_1.json").read_text())


@pytest.mark.model
def test_generate_streams_only_the_text_to_stdout(smollm2_path, fixtures_dir):
    import llamay

    g = smollm2_goldens(fixtures_dir, "transformers")["greedy"][0]
    r = run("generate", "-m", str(smollm2_path), "-n", "12", "--temperature", "0", g["prompt"])
    assert r.exit_code == 0, r.stderr
    expect = llamay.load(smollm2_path).detokenize(g["greedy_ids"][:12])
    assert r.stdout == expect + "\n"
    assert "[llamay] 12 tokens, ended by -n or the context" in r.stderr
    # --stop ends the text before the string, and the summary says so
    cut = expect[: len(expect) // 2]
    word = expect[len(cut) :][:3]
    r = run(
        "generate", "-m", str(smollm2_path), "-n", "12", "--temp", "0", "--stop", word, g["prompt"]
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout == expect[: expect.index(word)] + "\n"
    assert "ended by an end token or --stop" in r.stderr


@pytest.mark.model
@pytest.mark.parametrize("source", ["file", "stdin"])
def test_generate_reads_the_prompt_from_a_file_or_stdin(
    smollm2_path, fixtures_dir, tmp_path, source
):
    """As llama-cli's -f: the file's text less one final newline is the prompt."""
    import llamay

    g = smollm2_goldens(fixtures_dir, "transformers")["greedy"][0]
    args = ["generate", "-m", str(smollm2_path), "-n", "12", "--temperature", "0"]
    if source == "file":
        (tmp_path / "prompt.txt").write_text(g["prompt"] + "\n")
        r = runner.invoke(app, [*args, "-f", str(tmp_path / "prompt.txt")])
    else:
        r = runner.invoke(app, [*args, "--file", "-"], input=g["prompt"] + "\n")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == llamay.load(smollm2_path).detokenize(g["greedy_ids"][:12]) + "\n"


@pytest.mark.parametrize("args", [[], ["text", "-f", "-"]])
def test_generate_needs_one_prompt(args):
    r = run("generate", *args)
    assert r.exit_code == 2 and "PROMPT or --file" in r.stderr, r.output


def test_an_unreadable_prompt_file_is_a_clear_error(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    r = run("generate", "-f", str(tmp_path / "bin.txt"))
    assert r.exit_code == 1 and "cannot read the prompt" in r.stderr, r.output
    r = run("generate", "-f", str(tmp_path / "missing.txt"))
    assert r.exit_code == 1 and "cannot read the prompt" in r.stderr, r.output


@pytest.mark.model
@pytest.mark.parametrize(
    "flags,key",
    [
        ((), "ids_add_special"),
        (("--no-special",), "ids_raw"),
        (("--no-special", "--parse-special"), "ids_parse_special"),
    ],
)
def test_tokenize_json_equals_llamacpp(smollm2_path, fixtures_dir, flags, key):
    item = next(
        t for t in smollm2_goldens(fixtures_dir, "llamacpp")["tokenize"] if "<|" in t["text"]
    )
    r = run("tokenize", "-m", str(smollm2_path), *flags, "--json", item["text"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout) == item[key]


def test_missing_model_file_is_a_clear_error(tmp_path):
    r = run("generate", "-m", str(tmp_path / "nope.gguf"), "hello")
    assert r.exit_code == 1
    assert "nope.gguf" in r.stderr and r.stdout == ""


def test_corrupt_model_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    r = run("generate", "-m", str(bad), "hello")
    assert r.exit_code == 1
    assert "error:" in r.stderr and "bad.gguf" in r.stderr


def test_unknown_store_name_lists_known_models():
    r = run("generate", "-m", "no-such-model:1b", "hello")
    assert r.exit_code == 1
    assert "smollm2:135m" in r.stderr


@pytest.mark.model
def test_list_shows_pulled_model(smollm2_path):
    r = run("list")
    assert r.exit_code == 0
    assert "smollm2:135m" in r.stdout


def test_show_describes_a_model_as_gguf_py_reads_it():
    from gguf import GGUFReader

    path = tiny_model_file("qwen3")
    r = run("show", str(path), "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    ref = GGUFReader(path)
    assert info["architecture"] == "qwen3"
    assert info["tensor_count"] == len(ref.tensors)
    assert info["parameter_count"] == sum(int(t.n_elements) for t in ref.tensors)
    counts = {}
    for t in ref.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    assert info["tensor_types"] == counts
    text = run("show", str(path))
    assert text.exit_code == 0 and "qwen3" in text.stdout


def _bench_rows(path, *extra) -> list[dict]:
    """`llamay bench --json` over pp16 and tg4 at batches 1 and 2: its rows."""
    r = run("bench", "-m", str(path), "-p", "16", "-n", "4", "-b", "1,2", "-r", "1", *extra,
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_bench_json_lines():
    path = tiny_model_file("llama")
    rows = _bench_rows(path)
    assert [(x["test"], x["batch"]) for x in rows] == [
        ("pp16", 1),
        ("tg4", 1),
        ("pp16", 2),
        ("tg4", 2),
    ]
    assert all(x["tokens_per_s"] > 0 and x["backend"] == "cpu" for x in rows)
    assert run("bench", "-m", str(path), "-b", "0").exit_code != 0
    nothing = run("bench", "-m", "no-such-model:1b", "-p", "0", "-n", "0")  # before loading
    assert nothing.exit_code == 2 and "no test to run" in nothing.output


def test_bench_at_a_depth():
    """llama-bench's -d: the tests after D tokens in the cache, named as llama-bench
    names them; a depth past the context is refused with the context in the message."""
    path = tiny_model_file("llama")
    rows = _bench_rows(path, "-d", "40")
    assert [(x["test"], x["batch"]) for x in rows] == [
        ("pp16 @ d40", 1),
        ("tg4 @ d40", 1),
        ("pp16 @ d40", 2),
        ("tg4 @ d40", 2),
    ]
    assert all(x["tokens_per_s"] > 0 for x in rows)
    far = run("bench", "-m", str(path), "-p", "16", "-n", "4", "-d", "5000")
    assert far.exit_code != 0 and "2048" in far.stderr + far.stdout
