"""The onnx package's nine "light" models (onnx/backend/test/data/light: AlexNet, DenseNet-121,
Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512) with usable weights. Contract:
`light_model_names()` lists them; `light_model(name, seed=0, logits=True)` loads one and replaces every
float weight (ConstantOfShape outputs and float initializers) by a seeded random initializer chosen by
the role its consumer gives it, so activations stay finite and varied through the whole network:
conv/gemm weights He-normal (std sqrt(2 / fan_in)), biases, shifts and means N(0, 0.05), BatchNorm
scales and variances near 1, except the scale of a BatchNorm ending a residual branch (0.2-0.3). With
`logits=True` the input of the final Softmax (the logits) is added as a graph output, under its own
name. `light_input(model, seed)` gives a matching N(0, 1) input dict."""
from __future__ import annotations
import math, os
from typing import Any, Optional
import numpy as np

def _light_dir() -> str:
  import onnx
  return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

def light_model_names() -> list[str]:
  """The light models' names (file names without light_ and .onnx), e.g. 'resnet50'."""
  return sorted(f[len("light_"):-len(".onnx")] for f in os.listdir(_light_dir()) if f.startswith("light_") and f.endswith(".onnx"))

def _feeds_sum(name: str, by_output: dict[str, list[tuple[Any, int]]], depth: int = 2) -> bool:
  """Whether `name` reaches a residual Sum/Add within `depth` nodes (through Relu and the like)."""
  for node, _ in by_output.get(name, []):
    if node.op_type in ("Sum", "Add"): return True
    if depth > 1 and node.op_type in ("Relu", "Identity") and _feeds_sum(node.output[0], by_output, depth - 1): return True
  return False

def _role(consumers: list[tuple[Any, int]], by_output: dict[str, list[tuple[Any, int]]]) -> tuple[str, Any]:
  """What a weight is used as: ('conv_w', node), ('gemm_b', node), ('bias', None), ('scale', None), ('var', None), ..."""
  for node, idx in consumers:
    t = node.op_type
    if t == "Conv": return ("conv_w" if idx == 1 else "bias"), node
    if t == "Gemm": return ("gemm_w" if idx == 1 else "gemm_a" if idx == 0 else "bias"), node
    if t == "BatchNormalization":
      if idx == 1 and _feeds_sum(node.output[0], by_output): return "res_scale", node
      return {1: "scale", 2: "bias", 3: "mean", 4: "var"}.get(idx, "other"), node
    if t == "Mul": return "scale", node
    if t in ("Add", "Sum"): return "bias", node
    if t in ("Unsqueeze", "Reshape", "Identity") and idx == 0:
      r = _role(by_output.get(node.output[0], []), by_output)
      if r[0] != "other": return r
  return "other", None

def light_model(name: str, seed: int = 0, logits: bool = True) -> Any:
  """The light model `name` as an onnx.ModelProto with seeded random weights (see the module doc)."""
  import onnx
  from onnx import helper, numpy_helper
  m = onnx.load(os.path.join(_light_dir(), f"light_{name}.onnx"))
  g = m.graph
  rng = np.random.default_rng(seed)
  by_output: dict[str, list[tuple[Any, int]]] = {}
  for node in g.node:
    for j, x in enumerate(node.input): by_output.setdefault(x, []).append((node, j))
  inits = {t.name: t for t in g.initializer}
  def shape_of(node: Any) -> list[int]:
    return [int(v) for v in numpy_helper.to_array(inits[node.input[0]]).reshape(-1)]
  def make(name_: str, shape: list[int]) -> np.ndarray:
    role, node = _role(by_output.get(name_, []), by_output)
    if role == "conv_w": fan_in = int(np.prod(shape[1:]))
    elif role == "gemm_w":
      tb = next((a.i for a in node.attribute if a.name == "transB"), 0)
      fan_in = shape[1] if tb else shape[0]
    else: fan_in = 0
    if fan_in: return (rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(np.float32)
    if role == "scale": return rng.uniform(0.8, 1.2, shape).astype(np.float32)
    if role == "res_scale": return rng.uniform(0.2, 0.3, shape).astype(np.float32)  # residual branches: variance grows ~6% a block
    if role == "var": return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if role in ("bias", "mean"): return (rng.standard_normal(shape) * 0.05).astype(np.float32)
    return (rng.standard_normal(shape) * 0.05).astype(np.float32)
  new_inits, keep_nodes = [], []
  for node in g.node:
    if node.op_type == "ConstantOfShape" and node.input[0] in inits:
      val = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), np.zeros(1, np.float32))
      if val.dtype == np.float32:
        new_inits.append(numpy_helper.from_array(make(node.output[0], shape_of(node)), node.output[0]))
        continue
    keep_nodes.append(node)
  replaced = []
  for t in g.initializer:
    if t.data_type == onnx.TensorProto.FLOAT and t.name in by_output and _role(by_output[t.name], by_output)[0] != "other":
      replaced.append(numpy_helper.from_array(make(t.name, list(t.dims)), t.name))
    else: replaced.append(t)
  del g.node[:]
  g.node.extend(keep_nodes)
  del g.initializer[:]
  g.initializer.extend(replaced + new_inits)
  used = {x for node in g.node for x in node.input}
  for t in [t for t in g.initializer if t.name.endswith("__SHAPE") and t.name not in used]: g.initializer.remove(t)
  for vi in [vi for vi in g.input if vi.name.endswith("__SHAPE") and vi.name not in used]: g.input.remove(vi)
  if logits:
    sm = [node for node in g.node if node.op_type == "Softmax"]
    if sm: g.output.append(helper.make_tensor_value_info(sm[-1].input[0], onnx.TensorProto.FLOAT, None))
  return m

def light_input(model: Any, seed: int = 0) -> dict[str, np.ndarray]:
  """N(0, 1) float32 data for the model's graph inputs that have no initializer."""
  rng = np.random.default_rng(seed + 1)
  inits = {t.name for t in model.graph.initializer}
  out = {}
  for vi in model.graph.input:
    if vi.name in inits: continue
    shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
    out[vi.name] = rng.standard_normal(shape).astype(np.float32)
  return out
