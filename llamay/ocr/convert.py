"""PP-OCRv4 text-line recognizer: ONNX graph -> GGUF (architecture `ppocr_rec`).

The ONNX export (Paddle2ONNX, opset 12) keeps every weight in `Constant` nodes and
spells each layer out as elementary ops. The converter walks the graph in order and
recognises the three parts of the model:

- backbone (PP-LCNetV3, re-parameterised): a stem conv + BN, then layers of
  conv(+bias) -> affine (s1, b1) -> hardswish -> affine (s2, b2), some followed by a
  squeeze-excitation (avg-pool, 1x1 conv, relu, 1x1 conv, hardsigmoid, multiply);
- neck (SVTR encoder): avg-pool, conv 1x3 + BN + swish, conv 1x1 + BN + swish,
  pre-norm transformer blocks (LN, qkv, softmax attention, proj, LN, MLP with swish),
  a final LN, conv 1x1 + BN + swish, concat with the pooled input, conv 1x3 + BN +
  swish, conv 1x1 + BN + swish;
- head: a linear layer to the classes, softmax.

BatchNorms are folded into the preceding convs. Tensors keep ONNX's layouts (convs
OIHW, matmuls [in, out]); shapes and per-layer settings go into `ppocr.*` metadata,
the class labels (blank, the charset, space) into `ppocr.labels`. Needs the `onnx`
package (the `ocr` extra).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from llamay.errors import OCRError
from llamay.gguf.writer import tensor_spec, write_gguf

ARCH = "ppocr_rec"


class _Graph:
    def __init__(self, path: Path):
        try:
            import onnx
            from onnx import numpy_helper
        except ImportError:
            raise OCRError(
                "converting an ONNX recognizer needs the onnx package (pip install 'llamay[ocr]')"
            ) from None
        self.model = onnx.load(str(path))
        self.consts: dict[str, np.ndarray] = {}
        for init in self.model.graph.initializer:
            self.consts[init.name] = numpy_helper.to_array(init)
        self.nodes = []
        for n in self.model.graph.node:
            if n.op_type == "Constant":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
            else:
                self.nodes.append(n)
        self.attrs = [
            {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in self.nodes
        ]
        self.meta = {p.key: p.value for p in self.model.metadata_props}
        self.i = 0
        self.path = path

    # -- cursor --------------------------------------------------------------------

    def peek(self, k: int = 0):
        j = self.i + k
        return self.nodes[j] if j < len(self.nodes) else None

    def op(self, k: int = 0) -> str | None:
        n = self.peek(k)
        return None if n is None else n.op_type

    def take(self, op: str):
        n = self.peek()
        if n is None or n.op_type != op:
            got = None if n is None else f"{n.op_type} ({n.name or n.output[0]})"
            raise OCRError(f"{self.path}: expected {op} at node {self.i}, found {got}")
        self.i += 1
        return n, self.attrs[self.i - 1]

    def const(self, node, *, required=True) -> np.ndarray | None:
        for name in node.input:
            if name in self.consts:
                return self.consts[name]
        if required:
            raise OCRError(f"{self.path}: node {node.op_type} {node.output[0]} has no constant")
        return None

    def skip_to(self, op: str) -> None:
        while self.op() is not None and self.op() != op:
            self.i += 1

    # -- layer patterns ---------------------------------------------------------------

    def conv(self):
        """Conv [+ BatchNormalization] -> (weight OIHW, bias, attrs), BN folded."""
        node, a = self.take("Conv")
        w = self.consts[node.input[1]].astype(np.float64)
        b = (
            self.consts[node.input[2]].astype(np.float64)
            if len(node.input) > 2
            else np.zeros(w.shape[0])
        )
        if self.op() == "BatchNormalization":
            bn, ba = self.take("BatchNormalization")
            g, beta, mean, var = (self.consts[n].astype(np.float64) for n in bn.input[1:5])
            scale = g / np.sqrt(var + ba.get("epsilon", 1e-5))
            w = w * scale[:, None, None, None]
            b = (b - mean) * scale + beta
        pads = list(a.get("pads", [0, 0, 0, 0]))
        attrs = {
            "stride": list(a.get("strides", [1, 1])),
            "groups": int(a.get("group", 1)),
            "pad": [pads[0], pads[1]],
        }
        if pads[0] != pads[2] or pads[1] != pads[3]:
            raise OCRError(f"{self.path}: asymmetric conv padding {pads} is not supported")
        return w.astype(np.float32), b.astype(np.float32), attrs

    def scalar_op(self, op: str) -> float:
        node, _ = self.take(op)
        c = self.const(node)
        if c.size != 1:
            raise OCRError(f"{self.path}: expected a scalar in {op} {node.output[0]}")
        return float(c.reshape(()))

    def hardswish(self) -> None:
        for op in ("Add", "Clip", "Mul", "Div"):
            self.take(op)

    def swish(self) -> None:
        self.take("Mul")
        self.take("Sigmoid")
        self.take("Mul")

    def layer_norm(self):
        """ReduceMean, Sub, Pow, ReduceMean, Add(eps), Sqrt, Div, Mul(g), Add(b)."""
        self.take("ReduceMean")
        self.take("Sub")
        self.take("Pow")
        self.take("ReduceMean")
        eps = self.scalar_op("Add")
        self.take("Sqrt")
        self.take("Div")
        g = self.const(self.take("Mul")[0])
        b = self.const(self.take("Add")[0])
        return g.astype(np.float32), b.astype(np.float32), eps

    def linear(self):
        w = self.const(self.take("MatMul")[0])
        b = self.const(self.take("Add")[0])
        return w.astype(np.float32), b.astype(np.float32)


def convert_onnx(onnx_path: str | os.PathLike, gguf_path: str | os.PathLike) -> Path:
    """Convert the PP-OCRv4 recognizer ONNX file to a GGUF file; returns its path."""
    g = _Graph(Path(onnx_path))
    tensors: dict[str, np.ndarray] = {}
    meta: dict = {"general.architecture": ARCH, "general.name": Path(onnx_path).stem}

    # backbone ---------------------------------------------------------------------------
    w, b, a = g.conv()
    tensors["stem.weight"], tensors["stem.bias"] = w, b
    meta["ppocr.stem.stride"] = a["stride"]
    meta["ppocr.stem.pad"] = a["pad"]
    strides, groups, pads, se = [], [], [], []
    i = 0
    while g.op() == "Conv":
        w, b, a = g.conv()
        s1 = g.scalar_op("Mul")
        b1 = g.scalar_op("Add")
        g.hardswish()
        s2 = g.scalar_op("Mul")
        b2 = g.scalar_op("Add")
        tensors[f"blk.{i}.weight"], tensors[f"blk.{i}.bias"] = w, b
        tensors[f"blk.{i}.lab"] = np.array([s1, b1, s2, b2], np.float32)
        strides += [a["stride"]]
        groups.append(a["groups"])
        pads += [a["pad"]]
        has_se = g.op() == "GlobalAveragePool"
        if has_se:
            g.take("GlobalAveragePool")
            w1, b1_, _ = g.conv()
            g.take("Relu")
            w2, b2_, _ = g.conv()
            _, hs = g.take("HardSigmoid")
            if abs(hs.get("alpha", 0.2) - 1 / 6) > 1e-6 or hs.get("beta", 0.5) != 0.5:
                raise OCRError(f"{g.path}: unexpected HardSigmoid parameters {hs}")
            g.take("Mul")
            tensors[f"blk.{i}.se1.weight"] = w1.reshape(w1.shape[:2])
            tensors[f"blk.{i}.se1.bias"] = b1_
            tensors[f"blk.{i}.se2.weight"] = w2.reshape(w2.shape[:2])
            tensors[f"blk.{i}.se2.bias"] = b2_
        se.append(int(has_se))
        i += 1
    if i == 0:
        raise OCRError(f"{g.path}: no backbone layers found (is this a PP-OCR recognizer?)")
    meta["ppocr.block_count"] = i
    meta["ppocr.blk.stride"] = [x for s in strides for x in s]
    meta["ppocr.blk.pad"] = [x for p in pads for x in p]
    meta["ppocr.blk.groups"] = groups
    meta["ppocr.blk.se"] = se

    # neck -------------------------------------------------------------------------------
    _, pa = g.take("AveragePool")
    meta["ppocr.neck.pool"] = list(pa["kernel_shape"])
    if list(pa["strides"]) != list(pa["kernel_shape"]) or any(pa.get("pads", [0])):
        raise OCRError(f"{g.path}: unexpected AveragePool {pa}")
    convs = {}
    for name in ("conv1", "conv2"):
        w, b, a = g.conv()
        g.swish()
        convs[name] = (w, b, a)
    g.skip_to("ReduceMean")
    blocks = []
    scale = None
    while g.op() == "ReduceMean":
        ln1 = g.layer_norm()
        if g.op() != "Shape" and g.op() != "MatMul":
            # the encoder's final LayerNorm
            final = ln1
            break
        g.skip_to("MatMul")
        qkv = g.linear()
        g.skip_to("Mul")
        scale = g.scalar_op("Mul")
        g.skip_to("MatMul")
        g.take("MatMul")
        g.take("Softmax")
        g.take("MatMul")
        g.skip_to("MatMul")
        proj = g.linear()
        g.take("Add")  # residual
        ln2 = g.layer_norm()
        fc1 = g.linear()
        g.swish()
        fc2 = g.linear()
        g.take("Add")  # residual
        blocks.append((ln1, qkv, proj, ln2, fc1, fc2))
    else:
        raise OCRError(f"{g.path}: the SVTR encoder has no final LayerNorm")
    if not blocks or scale is None:
        raise OCRError(f"{g.path}: no transformer blocks found in the neck")
    dim = blocks[0][1][0].shape[0]
    head_dim = round(1.0 / scale**2)
    meta["ppocr.neck.dim"] = dim
    meta["ppocr.neck.head_count"] = dim // head_dim
    meta["ppocr.neck.block_count"] = len(blocks)
    meta["ppocr.neck.ln_eps"] = float(blocks[0][0][2])
    meta["ppocr.neck.final_ln_eps"] = float(final[2])
    names = ("ln1", "qkv", "proj", "ln2", "fc1", "fc2")
    for j, blk in enumerate(blocks):
        for nm, part in zip(names, blk, strict=True):
            tensors[f"neck.blk.{j}.{nm}.weight"] = part[0]
            tensors[f"neck.blk.{j}.{nm}.bias"] = part[1]
    tensors["neck.norm.weight"], tensors["neck.norm.bias"] = final[0], final[1]
    g.skip_to("Conv")
    w, b, a = g.conv()
    g.swish()
    convs["conv3"] = (w, b, a)
    g.take("Concat")
    for name in ("conv4", "conv5"):
        w, b, a = g.conv()
        g.swish()
        convs[name] = (w, b, a)
    for name, (w, b, a) in convs.items():
        tensors[f"neck.{name}.weight"], tensors[f"neck.{name}.bias"] = w, b
        meta[f"ppocr.neck.{name}.pad"] = a["pad"]
        if a["stride"] != [1, 1] or a["groups"] != 1:
            raise OCRError(f"{g.path}: unexpected neck conv {name} {a}")

    # head -------------------------------------------------------------------------------
    g.skip_to("MatMul")
    tensors["head.weight"], tensors["head.bias"] = g.linear()
    g.take("Softmax")
    chars = g.meta.get("character")
    if chars is None:
        raise OCRError(f"{g.path}: no 'character' metadata (the recognizer's charset)")
    labels = ["", *chars.splitlines(), " "]
    n_classes = tensors["head.bias"].shape[0]
    if len(labels) != n_classes:
        raise OCRError(
            f"{g.path}: {len(labels)} labels (blank + charset + space) but {n_classes} classes"
        )
    meta["ppocr.labels"] = labels
    meta["ppocr.blank"] = 0
    meta["ppocr.image_height"] = 48
    specs = [tensor_spec(k, np.ascontiguousarray(v, np.float32)) for k, v in tensors.items()]
    return write_gguf(gguf_path, meta, specs)
