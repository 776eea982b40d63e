"""The lm-evaluation-harness adapter on tasks built from local files (no hub downloads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_data import oracle, tiny_model_file

oracle("lm_eval")

MC = [
    {"question": "The capital of France is", "choices": ["Paris", "London", "Rome"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["four", "five"], "answer": 0},
    {"question": "The sky is", "choices": ["green", "blue", "loud"], "answer": 1},
]
TEXTS = [
    {"text": "It was the best of times, it was the worst of times."},
    {"text": "Call me Ishmael. Some years ago, never mind how long precisely."},
]

TASKS = {
    "llamay_local_mc": """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""",
    "llamay_local_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
""",
    "llamay_local_gen": """output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{choices[answer]}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""",
}


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    (d / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MC))
    (d / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TEXTS))
    for name, body in TASKS.items():
        data = d / ("text.jsonl" if "rolling" in name else "mc.jsonl")
        head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        head += f"    test: {data}\ntest_split: test\n"
        (d / f"{name}.yaml").write_text(head + body)
    return d


@pytest.fixture(scope="module")
def offline_env(task_dir):
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(task_dir / "hf")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def evaluated(tiny_llama_model, task_dir, offline_env):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from llamay.eval.lm_eval_adapter import LlamayLM

    lm = LlamayLM(llamay_model=tiny_llama_model, batch_size=4)
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=list(TASKS),
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        log_samples=True,
    )


def test_loglikelihood_equals_score(tiny_llama_model, evaluated):
    samples = evaluated["samples"]["llamay_local_mc"]
    assert len(samples) == len(MC)
    for s in samples:
        ctxs, conts = zip(*s["arguments"], strict=True)
        want = tiny_llama_model.score(list(ctxs), list(conts))
        got = [r[0] for r in s["resps"]]
        assert [g[1] for g in got] == [w[1] for w in want]
        assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-4)
    assert 0.0 <= evaluated["results"]["llamay_local_mc"]["acc,none"] <= 1.0


def test_loglikelihood_rolling_equals_model(tiny_llama_model, evaluated):
    samples = evaluated["samples"]["llamay_local_rolling"]
    texts = [s["arguments"][0][0] for s in samples]
    want = tiny_llama_model.loglikelihood_rolling(texts)
    assert [s["resps"][0][0] for s in samples] == pytest.approx(want, abs=1e-4)


def test_generate_until_stops(tiny_llama_model, evaluated):
    from llamay.sample import GREEDY

    m = tiny_llama_model
    for s in evaluated["samples"]["llamay_local_gen"]:
        out = s["resps"][0][0]
        assert isinstance(out, str) and "\n" not in out and "." not in out
        ctx = s["arguments"][0][0]
        ids = m.tokenize(ctx, add_special=True, parse_special=True)
        full = m.detokenize(list(m.generation(ids, 6, GREEDY)))
        assert full.startswith(out)


REGISTRY_PROBE = """
import sys
from lm_eval.api.registry import get_model, model_registry
try:
    cls = get_model("llamay")
except ValueError:
    print("unknown")
else:
    assert "hf" in model_registry and "dummy" in model_registry  # built-ins still listed
    print(cls.__module__ + ":" + cls.__name__)
"""


def run_probe(python: Path) -> str:
    proc = subprocess.run([python, "-c", REGISTRY_PROBE], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Error processing line" not in proc.stderr  # a broken .pth line
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def hooked_python(tmp_path_factory):
    """A throwaway venv that sees this one's packages; `llamay eval lm-eval-plugin` run
    with its python puts the hook into its site-packages (this venv stays untouched)."""
    import sysconfig
    import venv

    from llamay.eval.lm_eval_hook import PTH_NAME

    root = tmp_path_factory.mktemp("hooked_venv")
    venv.create(root, with_pip=False)
    python = root / "bin" / "python"
    site = Path(
        subprocess.check_output([python, "-c", "import site; print(site.getsitepackages()[0])"])
        .decode()
        .strip()
    )
    ours = sysconfig.get_paths()["purelib"]
    (site / "_deps.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    assert run_probe(python) == "unknown"  # lm-eval alone does not find llamay
    cmd = [python, "-m", "llamay_cli.main", "eval", "lm-eval-plugin"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (site / PTH_NAME).exists()
    return python, site


def test_hook_registers_the_entry_point(hooked_python):
    from llamay.eval.lm_eval_hook import pth_line, remove_pth

    python, site = hooked_python
    assert run_probe(python) == "llamay.eval.lm_eval_adapter:LlamayLM"
    # the hook itself imports neither lm-eval nor JAX at startup
    out = subprocess.check_output(
        [python, "-c", "import sys; print('lm_eval' in sys.modules, 'jax' in sys.modules)"]
    )
    assert out.decode().split() == ["False", "False"]
    # a hook left behind by an uninstalled llamay is a silent no-op
    stale = site / "stale_llamay_lm_eval.pth"
    stale.write_text(pth_line(site / "gone" / "lm_eval_hook.py"))
    assert run_probe(python) == "llamay.eval.lm_eval_adapter:LlamayLM"
    stale.unlink()
    assert remove_pth(site) == site / "llamay_lm_eval.pth"
    assert run_probe(python) == "unknown"
    assert remove_pth(site) is None
    subprocess.run([python, "-m", "llamay_cli.main", "eval", "lm-eval-plugin"], check=True)


@pytest.mark.slow
def test_stock_lm_eval_command(tiny_llama_model, hooked_python, task_dir, offline_env, tmp_path):
    """lm-eval's own `lm_eval` console script, run by a python with the hook installed."""
    python, _ = hooked_python
    model = tiny_model_file("llama")
    script = Path(sys.executable).parent / "lm_eval"
    cmd = [python, script, "--model", "llamay", "--tasks", "llamay_local_mc"]
    cmd += ["--model_args", f"model={model},batch_size=4"]
    cmd += ["--include_path", str(task_dir), "--output_path", str(tmp_path), "--log_samples"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **offline_env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    [samples] = list(tmp_path.rglob("samples_llamay_local_mc_*.jsonl"))
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == len(MC)
    for r in rows:
        args = [(a["arg_0"], a["arg_1"]) for a in r["arguments"].values()]
        want = tiny_llama_model.score([a[0] for a in args], [a[1] for a in args])
        got = [float(resp[0][0]) for resp in r["resps"]]
        assert got == pytest.approx([w[0] for w in want], abs=1e-4)


@pytest.mark.skipif(
    __import__("jax").device_count() < 4, reason="needs 4 devices (XLA_FLAGS as `make test`)"
)
def test_adapter_on_a_mesh(tiny_llama_model):
    """model_args dp=2,tp=2: the same log-likelihoods from the sharded model."""
    from lm_eval.api.instance import Instance

    from llamay.eval.lm_eval_adapter import LlamayLM

    lm = LlamayLM.create_from_arg_string(
        f"model={tiny_model_file('llama')},dp=2,tp=2", {"batch_size": 2}
    )
    assert lm.model.mesh.shape == {"data": 2, "model": 2} and lm.batch_size == 2
    pairs = [(d["question"], " " + c) for d in MC for c in d["choices"]]
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    got = lm.loglikelihood(reqs)
    want = tiny_llama_model.score([p[0] for p in pairs], [p[1] for p in pairs])
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-4)


def test_model_args_unknown_keys_are_errors():
    """A misspelt key (`modle=`) used to be dropped: the default model was evaluated."""
    from llamay.eval.lm_eval_adapter import LlamayLM

    with pytest.raises(ValueError, match="unknown max_lenght, modle"):
        LlamayLM.create_from_arg_string(
            "modle=/tmp/nope.gguf,max_lenght=64", {"device": "cpu", "max_batch_size": None}
        )
    with pytest.warns(UserWarning, match="8 at a time"):
        lm = LlamayLM.create_from_arg_string(
            f"model={tiny_model_file('llama')},batch_size=auto", {"device": "cpu"}
        )
    assert lm.batch_size == 8
