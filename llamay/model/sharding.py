"""Sharding a model over devices (and hosts): a data × model mesh and logical-axis rules.

    mesh = make_mesh(parse_mesh("dp=2,tp=2"))          # jax.make_mesh(..., ("data", "model"))
    weights = shard_weights(cfg, weights, mesh)          # every leaf placed by the rules
    tokens = put_batch(np_tokens, mesh)                  # rows along "data"

Rules. Every weight gets logical axes from its role; `RULES` maps logical axes to mesh
axes. GGUF stores a matrix W [out, in] row-major, and a `QTensor` keeps it as packed
blocks [..., rows=out, row_bytes], so:

- "heads" / "kv_heads" / "ffn" / "vocab" are output rows (wq, wk, wv, wqkv, w_gate,
  w_up, output, tok_embd): split along rows (column-parallel);
- "heads_in" / "ffn_in" are input columns (wo, w_down): split along row_bytes, which is
  only allowed in whole quantisation blocks (row-parallel; XLA adds the all-reduce);
  a repacked `AffineQTensor` (CPU, `llamay.quant.cpu_dot`) keeps rows on axis -2 of its
  quants, scales and offsets alike, and splits columns only in whole scale groups; a
  Pallas `PackedWeight` is transposed (rows on axis -1, columns in 32-element groups
  on axis -2 of every plane);
- norms, biases of row-parallel layers, routers and the stacked layer axis: replicated.

A logical axis is sharded only when it divides evenly: attention only when both the head
and the kv-head counts divide by the "model" size (SmolLM2's 9/3 heads on tp=2 or 4 stay
replicated while its FFN splits), columns only in whole blocks. Anything else stays
replicated, so any mesh gives the same numbers, just with less memory saved.

Multi-host (one process per host, the same model file on each): call
`initialize_distributed()` (`jax.distributed.initialize`, which detects a Cloud TPU /
SLURM / Open MPI / Kubernetes cluster; elsewhere set JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID) before anything touches a device; then the mesh
spans every host's
devices, each host builds its shards from its own mmap of the file
(`jax.make_array_from_callback`), every host runs the same program on the same inputs,
and `fetch` gathers results. Launch, e.g.:

    # TPU pod slice (every worker): gcloud compute tpus tpu-vm ssh NAME --worker=all \
    #   --command="llamay eval perplexity -m model.gguf text.txt --mesh dp=4,tp=8 --distributed"
    # GPU hosts: on each host i of N
    #   JAX_COORDINATOR_ADDRESS=host0:1234 JAX_NUM_PROCESSES=N JAX_PROCESS_ID=i \
    #   llamay eval perplexity -m model.gguf text.txt --mesh dp=N,tp=8 --distributed
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from llamay.errors import RequestError
from llamay.kv import DenseKV
from llamay.quant.matrix import is_matrix

AXES = ("data", "model")
MESH_KEYS = {"dp": "data", "data": "data", "tp": "model", "model": "model"}

# logical axis -> mesh axis
RULES: dict[str, str | None] = {
    "batch": "data",
    "heads": "model",
    "kv_heads": "model",
    "ffn": "model",
    "vocab": "model",
    "heads_in": "model",
    "ffn_in": "model",
    "embed": None,
    "layers": None,
}

# role -> (logical axis of the output rows, logical axis of the input columns)
ROLE_AXES: dict[str, tuple[str | None, str | None]] = {
    "tok_embd": ("vocab", None),
    "output": ("vocab", None),
    "wq": ("heads", None),
    "wk": ("kv_heads", None),
    "wv": ("kv_heads", None),
    "wqkv": ("heads", None),
    "wo": (None, "heads_in"),
    "w_gate": ("ffn", None),
    "w_up": ("ffn", None),
    "w_down": (None, "ffn_in"),
    "w_gate_exps": ("ffn", None),
    "w_up_exps": ("ffn", None),
    "w_down_exps": (None, "ffn_in"),
    "wq_b": ("heads", None),
    "wk_b": ("kv_heads", None),
    "wv_b": ("kv_heads", None),
    "wqkv_b": ("heads", None),
    "w_gate_b": ("ffn", None),
    "w_up_b": ("ffn", None),
}


def parse_mesh(text: str | None) -> dict[str, int]:
    """ "dp=2,tp=2" -> {"data": 2, "model": 2} (missing axes are 1)."""
    sizes = {"data": 1, "model": 1}
    for part in (text or "").replace(" ", "").split(","):
        if not part:
            continue
        key, _, val = part.partition("=")
        if key not in MESH_KEYS or not val.isdigit() or int(val) < 1:
            raise RequestError(
                f"bad mesh entry {part!r}: use dp=N and/or tp=M with positive integers "
                "(e.g. --mesh dp=2,tp=2)"
            )
        sizes[MESH_KEYS[key]] = int(val)
    return sizes


def make_mesh(sizes: dict[str, int] | str | None = None) -> Mesh:
    """A ("data", "model") mesh over all devices (every host's, after distributed init)."""
    if sizes is None or isinstance(sizes, str):
        sizes = parse_mesh(sizes)
    shape = tuple(sizes.get(a, 1) for a in AXES)
    n = int(np.prod(shape))
    if n != jax.device_count():
        raise RequestError(
            f"the mesh {dict(zip(AXES, shape, strict=True))} needs {n} devices, but "
            f"{jax.device_count()} are visible (on CPU, XLA_FLAGS="
            f"--xla_force_host_platform_device_count={n} gives fake ones)"
        )
    auto = jax.sharding.AxisType.Auto
    return jax.make_mesh(shape, AXES, axis_types=(auto, auto))


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """`jax.distributed.initialize` once, for multi-host runs (see the module doc).

    Arguments left out come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
    JAX_PROCESS_ID when set (JAX itself reads only the first), else from the cluster JAX
    detects. On CPU the processes exchange data through JAX's gloo collectives."""
    if getattr(initialize_distributed, "_done", False):
        return
    env = os.environ
    if num_processes is None and env.get("JAX_NUM_PROCESSES"):
        num_processes = int(env["JAX_NUM_PROCESSES"])
    if process_id is None and env.get("JAX_PROCESS_ID"):
        process_id = int(env["JAX_PROCESS_ID"])
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    initialize_distributed._done = True


# -- rules -> PartitionSpecs ---------------------------------------------------------------


def _divides(cfg, mesh: Mesh, logical: str | None) -> bool:
    axis = RULES.get(logical) if logical else None
    if axis is None:
        return False
    n = mesh.shape[axis]
    if n == 1:
        return False
    if logical in ("heads", "kv_heads", "heads_in"):
        return cfg.n_heads % n == 0 and cfg.n_kv_heads % n == 0
    return True


def _matrix_spec(
    cfg, mesh: Mesh, role: str, rows: int, col_units: int, ndim: int, transposed: bool = False
) -> P:
    """Spec for a matrix array [*lead dims, rows, cols] of `ndim` dims (lead: layer/expert
    axes; [*lead, cols, rows] when `transposed`) whose columns split only in whole units
    (quantisation blocks, scale groups)."""
    rows_ax, cols_ax = ROLE_AXES.get(role, (None, None))
    row_dim, col_dim = (-1, -2) if transposed else (-2, -1)
    spec: list[str | None] = [None] * ndim
    if _divides(cfg, mesh, rows_ax) and rows % mesh.shape[RULES[rows_ax]] == 0:
        spec[row_dim] = RULES[rows_ax]
    elif _divides(cfg, mesh, cols_ax) and col_units % mesh.shape[RULES[cols_ax]] == 0:
        spec[col_dim] = RULES[cols_ax]
    return P(*spec)


def _vector_spec(cfg, mesh: Mesh, role: str, shape, lead: int) -> P:
    rows_ax, _ = ROLE_AXES.get(role, (None, None))
    spec: list[str | None] = [None] * len(shape)
    if _divides(cfg, mesh, rows_ax) and shape[-1] % mesh.shape[RULES[rows_ax]] == 0:
        spec[-1] = RULES[rows_ax]
    return P(*spec)


def _leaf_specs(cfg, mesh: Mesh, role: str, leaf, lead: int):
    if is_matrix(leaf):  # each form says where its arrays keep rows and column units

        def spec(n_rows, col_units, ndim, transposed):
            return _matrix_spec(cfg, mesh, role, n_rows, col_units, ndim, transposed)

        return leaf.partition_specs(spec)
    return _vector_spec(cfg, mesh, role, np.shape(leaf), lead)


def weight_specs(cfg, weights: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """A pytree like `weights` whose leaves are PartitionSpecs (every array of every
    matrix form included: `Matrix.partition_specs`)."""
    out = {r: _leaf_specs(cfg, mesh, r, w, 0) for r, w in weights.items() if r != "layers"}
    out["layers"] = {r: _leaf_specs(cfg, mesh, r, w, 1) for r, w in weights["layers"].items()}
    return out


def _put(x, sharding: NamedSharding) -> jax.Array:
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _keep_cpu_meshes_out_of_the_compile_cache(mesh: Mesh) -> None:
    """XLA CPU (jax 0.12) crashes, intermittently, serialising or loading multi-device
    executables of the persistent compilation cache (segfaults in `serialize()` and on
    load, seen in full test runs over 4 host devices). A process that shards over several
    CPU devices therefore stops writing to that cache; its programs compile in memory."""
    if mesh.devices.size > 1 and mesh.devices.flat[0].platform == "cpu":
        from llamay.runtime import enable_compilation_cache

        enable_compilation_cache()  # first, so that it cannot lower the threshold later
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))


def shard_weights(cfg, weights: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """`weights` with every array placed on `mesh` by `weight_specs` (works multi-host:
    each process builds only its own shards from its host copy)."""
    _keep_cpu_meshes_out_of_the_compile_cache(mesh)
    specs = weight_specs(cfg, weights, mesh)
    return jax.tree.map(lambda w, s: _put(w, NamedSharding(mesh, s)), weights, specs)


def kv_sharding(cfg, mesh: Mesh) -> DenseKV:
    """The scratch cache [L, B, S, K, D]: rows along "data", kv heads along "model"."""
    heads = "model" if _divides(cfg, mesh, "kv_heads") else None
    s = NamedSharding(mesh, P(None, "data", None, heads, None))
    return DenseKV(s, s)


def put_batch(x, mesh: Mesh | None) -> jax.Array:
    """A host array [B, ...] as a device array, rows along "data" when there is a mesh."""
    if mesh is None:
        return jax.numpy.asarray(x)
    spec = P("data", *([None] * (np.ndim(x) - 1)))
    return _put(x, NamedSharding(mesh, spec))


def fetch(x: jax.Array) -> np.ndarray:
    """A (possibly multi-host sharded) array as a full numpy array on every process."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def data_size(mesh: Mesh | None) -> int:
    return 1 if mesh is None else mesh.shape["data"]


def sharded_model(model, mesh: Mesh | str | dict | None):
    """A shallow copy of a `llamay.Model` whose weights live on `mesh` (`.mesh` set);
    the model itself when mesh is None or a single device."""
    import copy

    if mesh is None:
        return model
    if not isinstance(mesh, Mesh):
        mesh = make_mesh(mesh)
    new = copy.copy(model)
    new.weights = shard_weights(model.config, model.weights, mesh)
    new.mesh = mesh
    return new


__all__ = [
    "AXES",
    "RULES",
    "ROLE_AXES",
    "data_size",
    "fetch",
    "initialize_distributed",
    "kv_sharding",
    "make_mesh",
    "parse_mesh",
    "put_batch",
    "shard_weights",
    "sharded_model",
    "weight_specs",
]
