"""The dispatcher (`llamay.kernels`): which implementation it picks per platform,
LLAMAY_BACKEND and numerics is the one its docstrings document (the platform faked, the
choice checked, nothing run on that platform); the native CPU plug point is asked first
on CPU only; and no module outside the dispatcher (and the native kernels it asks)
type-checks weight forms."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import llamay.kernels_pallas  # noqa: F401  (registers PackedWeight as a matrix form)
from llamay import kernels, kernels_cpu
from llamay.gguf.constants import GGMLType
from llamay.kernels import attention_choice, backend, matmul_choice, weight_form
from llamay.kernels_pallas import repack
from llamay.quant import AffineQTensor, MixedQTensor, QTensor
from llamay.quant.matrix import Matrix
from llamay.quant.quantize import random_blocks

T = GGMLType
LLAMAY = Path(__file__).resolve().parents[2] / "llamay"


def blocks(t: GGMLType, rows: int = 16, cols: int = 256, numerics: str = "exact") -> QTensor:
    return QTensor.from_raw(random_blocks(t, rows, cols, seed=3), t, numerics)


@pytest.fixture
def platform(monkeypatch):
    """fake(name, env="auto", gpu_kernels="triton"): jax.default_backend() says `name`."""

    def fake(name: str, env: str = "auto", gpu_kernels: str = "triton"):
        monkeypatch.setattr(jax, "default_backend", lambda: name)
        monkeypatch.setenv(kernels.ENV, env)
        monkeypatch.setenv(kernels.GPU_KERNELS_ENV, gpu_kernels)
        return backend()

    return fake


def x_rows(n: int) -> jax.Array:
    return jnp.ones((n, 256), jnp.float32)


def test_cpu_auto_asks_native_then_xla_forms(platform):
    be = platform("cpu")
    assert be == kernels.Backend(False, native=True)
    q4 = blocks(T.Q4_0)
    assert matmul_choice(x_rows(1), q4) == "cpu-blocks"
    assert matmul_choice(x_rows(1), AffineQTensor.from_raw(np.asarray(q4.data), T.Q4_0)) == (
        "cpu-affine"
    )
    assert matmul_choice(x_rows(1), blocks(T.Q4_0, numerics="llamacpp")) == "ggml"
    assert matmul_choice(x_rows(1), _stacked(q4)) == "reference"  # no 2-D CPU form
    native = kernels_cpu.available()  # the native kernels take both numerics' weights
    assert (weight_form("exact"), weight_form("llamacpp")) == (
        ("native", "native") if native else ("affine", "blocks")
    )
    q = jnp.ones((1, 1, 4, 8))
    assert attention_choice(q, paged=True) == "paged-reference"
    assert attention_choice(q, paged=True, numerics="llamacpp") == "paged-ggml"
    assert attention_choice(q, paged=False) == "reference"


def _stacked(w: QTensor) -> QTensor:
    """A [2, rows, row_bytes] stack (what no 2-D CPU form takes)."""
    return QTensor(jnp.stack([w.data, w.data]), w.ggml_type, w.cols, w.numerics)


@pytest.mark.parametrize("name", ["METAL", "metal", "mps", "Apple"])
def test_metal_takes_the_reference(platform, name):
    be = platform(name)
    assert not be.pallas and not be.native
    assert matmul_choice(x_rows(1), blocks(T.Q4_0)) == "reference"
    assert matmul_choice(x_rows(1), blocks(T.Q4_K, numerics="llamacpp")) == "ggml"
    assert matmul_choice(x_rows(1), repack(blocks(T.Q4_0))) == "packed-reference"
    assert weight_form("exact") == "blocks"
    assert attention_choice(jnp.ones((1, 1, 4, 8)), paged=True) == "paged-reference"


@pytest.mark.parametrize("name", ["gpu", "cuda", "rocm"])
def test_gpu_takes_pallas_for_kernel_types(platform, name):
    be = platform(name)
    assert be == kernels.Backend(True, "gpu")
    assert matmul_choice(x_rows(1), blocks(T.Q4_0)) == "pallas"
    assert matmul_choice(x_rows(64), repack(blocks(T.Q6_K))) == "pallas"
    assert matmul_choice(x_rows(1), blocks(T.Q3_K)) == "reference"  # no kernel for Q3_K
    assert matmul_choice(x_rows(1), blocks(T.Q4_0, numerics="llamacpp")) == "ggml"
    assert (weight_form("exact"), weight_form("llamacpp")) == ("packed", "blocks")
    q = jnp.ones((1, kernels.MAX_PAGED_QUERY_TOKENS, 4, 8))
    assert attention_choice(q, paged=True) == "pallas"
    assert attention_choice(jnp.ones((1, 17, 4, 8)), paged=True) == "paged-reference"
    assert attention_choice(q, paged=True, causal=False) == "paged-reference"
    assert attention_choice(q, paged=True, numerics="llamacpp") == "paged-ggml"
    assert attention_choice(q, paged=False) == "reference"


def test_gpu_mosaic_serves_decode_rows(platform):
    be = platform("gpu", gpu_kernels="mosaic")
    assert be.mosaic and be.platform == "gpu" and not be.interpret
    w = repack(blocks(T.Q4_K))
    assert matmul_choice(x_rows(kernels.MOSAIC_MAX_ROWS), w) == "pallas-mosaic-gpu"
    assert matmul_choice(x_rows(kernels.MOSAIC_MAX_ROWS + 1), w) == "pallas"


def test_tpu_takes_pallas(platform):
    assert platform("tpu") == kernels.Backend(True, "tpu")
    assert matmul_choice(x_rows(1), blocks(T.Q5_K)) == "pallas"
    assert weight_form("exact") == "packed"


@pytest.mark.parametrize("name", ["cpu", "gpu", "tpu", "METAL"])
def test_reference_env_forces_the_reference(platform, name):
    be = platform(name, env="reference")
    assert be == kernels.Backend(False)
    xla_cpu = "cpu-blocks" if name == "cpu" else "reference"
    assert matmul_choice(x_rows(1), blocks(T.Q4_0)) == xla_cpu
    assert matmul_choice(x_rows(1), repack(blocks(T.Q4_0))) == "packed-reference"
    assert weight_form("exact") == ("affine" if name == "cpu" else "blocks")
    assert attention_choice(jnp.ones((1, 1, 4, 8)), paged=True) == "paged-reference"


@pytest.mark.parametrize(
    ("env", "variant", "mosaic"),
    [("pallas-interpret", "tpu", False), ("pallas-interpret-gpu", "gpu", False),
     ("pallas-interpret-mosaic-gpu", "gpu", True)],
)  # fmt: skip
def test_pallas_interpret_on_any_platform(platform, env, variant, mosaic):
    be = platform("cpu", env=env)
    assert be == kernels.Backend(True, variant, interpret=True, mosaic=mosaic)
    assert matmul_choice(x_rows(1), blocks(T.Q8_0)) == ("pallas-mosaic-gpu" if mosaic else "pallas")
    assert matmul_choice(x_rows(1), blocks(T.Q3_K)) == "cpu-blocks"  # no kernel: XLA CPU
    assert weight_form("exact") == "packed"


def test_unknown_backend_is_refused(platform):
    with pytest.raises(ValueError, match="LLAMAY_BACKEND='triton'"):
        platform("cpu", env="triton")


# -- the native CPU plug point -------------------------------------------------------------


def test_native_cpu_kernels_are_asked_first_on_cpu_only(platform, monkeypatch):
    """A native kernel's answer is what `matmul` / paged `attention` return on CPU; on None,
    and under any other backend, the XLA path runs."""
    asked = []
    monkeypatch.setattr(kernels_cpu, "matmul", lambda x, w, numerics: asked.append(numerics))
    w, x = blocks(T.Q4_0), x_rows(2)
    want = np.asarray(x @ w.dequantize().T)
    platform("cpu")
    np.testing.assert_allclose(kernels.matmul(x, w), want, rtol=1e-5, atol=1e-4)
    assert asked == ["exact"]  # asked, said None: XLA's answer
    monkeypatch.setattr(kernels_cpu, "matmul", lambda x, w, numerics: jnp.full((2, 16), 7.0))
    assert np.all(np.asarray(kernels.matmul(x, w)) == 7.0)
    platform("cpu", env="reference")
    np.testing.assert_allclose(kernels.matmul(x, w), want, rtol=1e-5, atol=1e-4)

    got = {}

    def native_attention(q, k_pages, v_pages, page_table, q_pos, layer=None, **kw):
        got.update(kw, layer=layer)
        return jnp.zeros_like(q)

    monkeypatch.setattr(kernels_cpu, "paged_attention", native_attention)
    q = jnp.ones((1, 1, 2, 8))
    pages = jnp.ones((3, 4, 1, 8))
    table = jnp.array([[1, 2]], jnp.int32)
    pos = jnp.array([[5]], jnp.int32)
    kw = dict(page_table=table, scale=0.5, window=None, softcap=None, causal=True)
    platform("cpu")
    assert np.all(np.asarray(kernels.attention(q, pages, pages, pos, **kw)) == 0)
    assert got == dict(scale=0.5, window=None, softcap=None, causal=True, numerics="exact",
                       q_prescaled=False, layer=None)  # fmt: skip
    platform("cpu", env="reference")  # the reference: uniform values average to 1
    np.testing.assert_allclose(kernels.attention(q, pages, pages, pos, **kw), 1.0, rtol=1e-6)


STACK_TYPES = (T.Q4_0, T.Q8_0, T.Q4_1)  # three: a 3-way switch, unlike any 2-way cond


def _layer_switches(w) -> tuple[int, int, int]:
    """(3-way switches at the top, 3-way switches nested in any branch, ffi calls at the
    top) of `kernels.matmul(x, w)`'s jaxpr."""

    def switch3(e) -> bool:
        return e.primitive.name == "cond" and len(e.params["branches"]) == 3

    def switches(eqns) -> int:  # at any depth
        return sum(
            switch3(e) + sum(switches(b.jaxpr.eqns) for b in e.params.get("branches", ()))
            for e in eqns
        )

    # a fresh function per trace: jax caches a function's jaxpr, and the backend chosen
    # from the environment is not part of that cache's key
    eqns = jax.make_jaxpr(lambda x, w: kernels.matmul(x, w))(x_rows(1), w).jaxpr.eqns
    top = sum(map(switch3, eqns))
    return top, switches(eqns) - top, [e.primitive.name for e in eqns].count("ffi_call")


def test_mixed_weights_switch_once(platform):
    """A MixedQTensor's layer (types differing per layer) is resolved by one `lax.switch`
    (no second one nested in its branches) on every path but the native ones, where one
    native call reads every stack in place and no switch is left (both numerics); all
    give the reference's numbers."""
    w = MixedQTensor(tuple(_stacked(blocks(t)) for t in STACK_TYPES), jnp.int32(1), jnp.int32(0))
    platform("cpu", env="reference")
    want = np.asarray(kernels.matmul(x_rows(1), w))
    for env in ("auto", "pallas-interpret"):
        platform("cpu", env=env)
        top, nested, ffi_calls = _layer_switches(w)
        if env == "auto" and kernels_cpu.available():
            assert (top, nested, ffi_calls) == (0, 0, 1), env
        else:
            assert (top, nested) == (1, 0), env
        np.testing.assert_allclose(kernels.matmul(x_rows(1), w), want, rtol=1e-5, atol=1e-5)
    if kernels_cpu.available():  # llamacpp numerics: one LlamayQmmGgmlMulti call too
        stacks = tuple(_stacked(blocks(t, numerics="llamacpp")) for t in STACK_TYPES)
        platform("cpu")
        top, nested, ffi_calls = _layer_switches(MixedQTensor(stacks, jnp.int32(1), jnp.int32(0)))
        assert (top, nested, ffi_calls) == (0, 0, 1)


# -- no weight-form type checks outside the dispatcher ----------------------------------------


def _forms() -> set[str]:
    seen, todo = set(), [Matrix]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__name__ not in seen:
                seen.add(sub.__name__)
                todo.append(sub)
    return seen


def _type_checks(tree: ast.AST, names: set[str]):
    """(line, class name) of isinstance/issubclass/type() comparisons naming a form."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "isinstance", "issubclass"
        ) and len(node.args) == 2:  # fmt: skip
            for n in ast.walk(node.args[1]):
                name = getattr(n, "id", None) or getattr(n, "attr", None)
                if name in names:
                    yield node.lineno, name
        if isinstance(node, ast.Compare) and any(isinstance(o, ast.Is | ast.Eq) for o in node.ops):
            parts = [node.left, *node.comparators]
            if any(
                isinstance(p, ast.Call) and getattr(p.func, "id", None) == "type" for p in parts
            ):
                for p in parts:
                    name = getattr(p, "id", None) or getattr(p, "attr", None)
                    if name in names:
                        yield node.lineno, name


def test_every_form_implements_the_protocol():
    assert {"QTensor", "AffineQTensor", "MixedQTensor", "PackedWeight"} <= _forms()


def test_the_checker_finds_a_type_check():
    code = "def f(w):\n    return isinstance(w, (int, QTensor)) or type(w) is kp.PackedWeight\n"
    assert list(_type_checks(ast.parse(code), _forms())) == [(2, "QTensor"), (2, "PackedWeight")]


def test_no_weight_form_type_checks_outside_the_dispatcher():
    forms = _forms()
    found = []
    for path in sorted(LLAMAY.rglob("*.py")):
        rel = path.relative_to(LLAMAY).as_posix()
        # the dispatcher, and the native CPU kernels it asks first: by their contract they
        # say themselves which forms they take (None for the others)
        if rel.startswith(("kernels/", "kernels_cpu/")):
            continue
        found += [f"{rel}:{line}: {name}" for line, name in _type_checks(ast.parse(
            path.read_text()), forms)]  # fmt: skip
    assert not found, "weight-form type checks outside llamay/kernels:\n" + "\n".join(found)
