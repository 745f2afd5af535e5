"""Architectures built here with onnx.helper, as the frameworks' exporters write them, for the tests and
the model benchmark (bench/bench_onnx.py) beside the onnx package's nine light models (onnx/light.py).
They cover what the light models don't: a transformer encoder, depthwise-separable inverted residuals
with ReLU6 (Clip), squeeze-and-excitation with SiLU (Sigmoid * x), 5x5 depthwise convs.

Contract: `zoo_model_names()` lists them; `zoo_model(name, seed=0)` builds one (opset 17, seeded random
initializers scaled so activations stay finite and varied: He-normal conv and gemm weights, BatchNorm
scales near 1 except the one ending a residual branch, 0.2-0.3); `zoo_input(model, seed=0)` gives a
matching input dict (float N(0, 1) images; token ids in range for bert_like). `model_names()` and
`model_and_input(name, seed=0)` serve the tools that take a model by name (bench, replay, fuzz): the light
models' names and the zoo's.
- bert_like: a BERT-style encoder (post-norm, GELU by Erf, as PyTorch exports it), input_ids int64
  (1, 128), output `hidden` (1, 128, 256); 2 layers, 4 heads, ffn 1024, vocabulary 2000.
- mobilenet_v2: MobileNet-v2 (width 1.0) at 224^2, BatchNorm unfolded, ReLU6 as Clip(0, 6), output
  `logits` (1, 1000).
- efficientnet_b0: EfficientNet-B0's layout at 224^2 (MBConv blocks with 3x3 and 5x5 depthwise convs,
  squeeze-and-excitation, SiLU as x * Sigmoid(x)); output `logits` (1, 1000)."""
from __future__ import annotations
import math
from typing import Any, Callable
import numpy as np

class _Graph:
  """Nodes and seeded initializers of a model under construction."""
  def __init__(self, seed: int):
    from onnx import helper, numpy_helper
    self.helper, self.numpy_helper = helper, numpy_helper
    self.rng = np.random.default_rng(seed)
    self.inits: list = []
    self.nodes: list = []
  def const(self, name: str, arr: Any) -> str:
    self.inits.append(self.numpy_helper.from_array(np.asarray(arr), name))
    return name
  def w(self, name: str, *shape: int, std: float = 0.02, mean: float = 0.0) -> str:
    return self.const(name, (mean + std * self.rng.standard_normal(shape)).astype(np.float32))
  def node(self, op: str, ins: list, out: str, **attrs: Any) -> str:
    self.nodes.append(self.helper.make_node(op, ins, [out], name=out, **attrs))
    return out
  def conv_bn(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, bn_scale: float = 1.0) -> str:
    """Conv (no bias, He-normal weights) then BatchNormalization, as a PyTorch conv-bn pair exports."""
    wt = self.w(f"{name}_w", cout, cin // groups, k, k, std=math.sqrt(2.0 / (cin // groups * k * k)))
    c = self.node("Conv", [x, wt], f"{name}_conv", kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=groups)
    scale = self.w(f"{name}_g", cout, std=0.05 * bn_scale, mean=bn_scale)
    return self.node("BatchNormalization", [c, scale, self.w(f"{name}_b", cout, std=0.05), self.w(f"{name}_m", cout, std=0.05),
                                            self.const(f"{name}_v", (1.0 + 0.1 * self.rng.random(cout)).astype(np.float32))], name, epsilon=1e-5)
  def model(self, name: str, inputs: list, outputs: list) -> Any:
    graph = self.helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
    m = self.helper.make_model(graph, opset_imports=[self.helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m

def _image_io(g: _Graph, classes: int = 1000) -> tuple[list, list]:
  from onnx import TensorProto
  return ([g.helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 224, 224])],
          [g.helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])])

def _classifier(g: _Graph, x: str, cin: int, classes: int = 1000) -> str:
  pooled = g.node("Flatten", [g.node("GlobalAveragePool", [x], "gap")], "flat", axis=1)
  return g.node("Gemm", [pooled, g.w("fc_w", classes, cin, std=math.sqrt(1.0 / cin)), g.w("fc_b", classes, std=0.05)], "logits", transB=1)

def bert_like(seed: int = 0, layers: int = 2, seq: int = 128, hidden: int = 256, heads: int = 4, ffn: int = 1024, vocab: int = 2000) -> Any:
  """A BERT-style encoder: see the module docstring. Weights N(0, 0.02), embeddings N(0, 0.5), LayerNorm scales near 1."""
  from onnx import TensorProto
  g = _Graph(seed)
  dh = hidden // heads
  g.const("pos_ids", np.arange(seq, dtype=np.int64).reshape(1, seq))
  g.const("heads_shape", np.array([1, seq, heads, dh], np.int64))
  g.const("hidden_shape", np.array([1, seq, hidden], np.int64))
  g.const("scale", np.array(np.sqrt(dh), np.float32))
  g.const("sqrt2", np.array(np.sqrt(2.0), np.float32)); g.const("one", np.array(1.0, np.float32)); g.const("half", np.array(0.5, np.float32))  # noqa: E702
  def layernorm(x: str, name: str) -> str:
    return g.node("LayerNormalization", [x, g.w(f"{name}_g", hidden, std=0.05, mean=1.0), g.w(f"{name}_b", hidden)], name, axis=-1, epsilon=1e-12)
  def linear(x: str, name: str, n_in: int, n_out: int) -> str:
    return g.node("Add", [g.node("MatMul", [x, g.w(f"{name}_w", n_in, n_out)], f"{name}_mm"), g.w(f"{name}_b", n_out)], name)
  def split_heads(t: str, perm: list, nm: str) -> str:
    return g.node("Transpose", [g.node("Reshape", [t, "heads_shape"], f"{nm}_r")], nm, perm=perm)
  emb = g.node("Add", [g.node("Gather", [g.w("word_emb", vocab, hidden, std=0.5), "input_ids"], "tok"),
                       g.node("Gather", [g.w("pos_emb", seq, hidden, std=0.5), "pos_ids"], "pos")], "emb")
  x = layernorm(emb, "emb_ln")
  for li in range(layers):
    p = f"l{li}"
    q = split_heads(linear(x, f"{p}_q", hidden, hidden), [0, 2, 1, 3], f"{p}_qh")
    k = split_heads(linear(x, f"{p}_k", hidden, hidden), [0, 2, 3, 1], f"{p}_kh")
    v = split_heads(linear(x, f"{p}_v", hidden, hidden), [0, 2, 1, 3], f"{p}_vh")
    probs = g.node("Softmax", [g.node("Div", [g.node("MatMul", [q, k], f"{p}_s"), "scale"], f"{p}_ss")], f"{p}_p", axis=-1)
    ctx = g.node("Reshape", [g.node("Transpose", [g.node("MatMul", [probs, v], f"{p}_c")], f"{p}_ct", perm=[0, 2, 1, 3]), "hidden_shape"], f"{p}_cr")
    x = layernorm(g.node("Add", [x, linear(ctx, f"{p}_o", hidden, hidden)], f"{p}_res1"), f"{p}_ln1")
    h = linear(x, f"{p}_f1", hidden, ffn)
    gelu = g.node("Mul", [g.node("Mul", [h, g.node("Add", [g.node("Erf", [g.node("Div", [h, "sqrt2"], f"{p}_hd")], f"{p}_erf"), "one"], f"{p}_e1")],
                                 f"{p}_hg"), "half"], f"{p}_gelu")
    x = layernorm(g.node("Add", [x, linear(gelu, f"{p}_f2", ffn, hidden)], f"{p}_res2"), f"{p}_ln2")
  g.nodes.append(g.helper.make_node("Identity", [x], ["hidden"], name="out"))
  return g.model("bert_like", [g.helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                 [g.helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, hidden])])

def mobilenet_v2(seed: int = 0) -> Any:
  """MobileNet-v2 (Sandler et al. 2018), width 1.0: see the module docstring."""
  g = _Graph(seed)
  g.const("zero", np.array(0.0, np.float32)); g.const("six", np.array(6.0, np.float32))  # noqa: E702
  def relu6(x: str) -> str: return g.node("Clip", [x, "zero", "six"], f"{x}_relu6")
  x, cin = relu6(g.conv_bn("image", "stem", 3, 32, 3, stride=2)), 32
  # (expansion t, output channels c, repeats n, first stride s), as in the paper's table 2
  for bi, (t, c, n, s) in enumerate([(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]):
    for r in range(n):
      p, stride, hid = f"b{bi}_{r}", s if r == 0 else 1, cin * t
      residual = stride == 1 and cin == c
      h = relu6(g.conv_bn(x, f"{p}_exp", cin, hid, 1)) if t != 1 else x
      h = relu6(g.conv_bn(h, f"{p}_dw", hid, hid, 3, stride=stride, groups=hid))
      h = g.conv_bn(h, f"{p}_proj", hid, c, 1, bn_scale=0.25 if residual else 1.0)
      x, cin = (g.node("Add", [x, h], f"{p}_add") if residual else h), c
  x = relu6(g.conv_bn(x, "head", cin, 1280, 1))
  _classifier(g, x, 1280)
  return g.model("mobilenet_v2", *_image_io(g))

def efficientnet_b0(seed: int = 0) -> Any:
  """EfficientNet-B0's layout (Tan & Le 2019; no stochastic depth at inference): see the module docstring."""
  g = _Graph(seed)
  def silu(x: str) -> str: return g.node("Mul", [x, g.node("Sigmoid", [x], f"{x}_sig")], f"{x}_silu")
  x, cin = silu(g.conv_bn("image", "stem", 3, 32, 3, stride=2)), 32
  # (expansion, kernel, first stride, output channels, repeats), B0's stages
  for bi, (t, k, s, c, n) in enumerate([(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3), (6, 5, 2, 192, 4),
                                        (6, 3, 1, 320, 1)]):
    for r in range(n):
      p, stride, hid = f"b{bi}_{r}", s if r == 0 else 1, cin * t
      residual = stride == 1 and cin == c
      h = silu(g.conv_bn(x, f"{p}_exp", cin, hid, 1)) if t != 1 else x
      h = silu(g.conv_bn(h, f"{p}_dw", hid, hid, k, stride=stride, groups=hid))
      # squeeze-and-excitation: the block input's channels / 4 in the middle
      mid = max(1, cin // 4)
      sq = silu(g.node("Conv", [g.node("GlobalAveragePool", [h], f"{p}_se_gap"), g.w(f"{p}_se1_w", mid, hid, 1, 1, std=math.sqrt(2.0 / hid)),
                                g.w(f"{p}_se1_b", mid, std=0.05)], f"{p}_se1"))
      ex = g.node("Sigmoid", [g.node("Conv", [sq, g.w(f"{p}_se2_w", hid, mid, 1, 1, std=math.sqrt(1.0 / mid)), g.w(f"{p}_se2_b", hid, std=0.05)],
                                     f"{p}_se2")], f"{p}_se_gate")
      h = g.conv_bn(g.node("Mul", [h, ex], f"{p}_se"), f"{p}_proj", hid, c, 1, bn_scale=0.25 if residual else 1.0)
      x, cin = (g.node("Add", [x, h], f"{p}_add") if residual else h), c
  x = silu(g.conv_bn(x, "head", cin, 1280, 1))
  _classifier(g, x, 1280)
  return g.model("efficientnet_b0", *_image_io(g))

_BUILDERS: dict[str, Callable[..., Any]] = {"bert_like": bert_like, "mobilenet_v2": mobilenet_v2, "efficientnet_b0": efficientnet_b0}

def zoo_model_names() -> list[str]:
  """The models zoo_model builds."""
  return list(_BUILDERS)

def zoo_model(name: str, seed: int = 0) -> Any:
  """The onnx.ModelProto of model `name` (zoo_model_names()) with weights drawn from `seed`."""
  if name not in _BUILDERS: raise ValueError(f"unknown zoo model {name!r}; the zoo has {', '.join(_BUILDERS)}")
  return _BUILDERS[name](seed=seed)

def zoo_input(model: Any, seed: int = 0) -> dict[str, np.ndarray]:
  """An input dict for a zoo model, of the shape its graph declares: token ids below the vocabulary's
  size for bert_like, N(0, 1) images otherwise."""
  rng = np.random.default_rng(seed)
  inp = model.graph.input[0]
  shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
  if model.graph.name == "bert_like":
    vocab = next(i.dims[0] for i in model.graph.initializer if i.name == "word_emb")
    return {inp.name: rng.integers(0, vocab, shape).astype(np.int64)}
  return {inp.name: rng.standard_normal(shape).astype(np.float32)}

def model_names() -> list[str]:
  """Every model the tools know by name: the onnx package's light models (onnx/light.py), then the zoo's."""
  from tilecraft.onnx.light import light_model_names
  return light_model_names() + zoo_model_names()

def model_and_input(name: str, seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
  """Model `name` (model_names()) with weights drawn from `seed`, and an input for it drawn from `seed`."""
  if name in _BUILDERS:
    m = zoo_model(name, seed=seed)
    return m, zoo_input(m, seed=seed)
  from tilecraft.onnx.light import light_input, light_model, light_model_names
  if name not in light_model_names(): raise ValueError(f"unknown model {name!r}; the models are {', '.join(model_names())}")
  m = light_model(name, seed=seed)
  return m, light_input(m, seed=seed)
