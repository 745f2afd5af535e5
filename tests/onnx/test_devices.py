"""tilecraft.onnx on the other devices (LLVM, OPENCL, PYTHON): two small models cover the op families the
light models use (a Conv with a folded BatchNorm, Relu, MaxPool, Gemm; an embedding Gather on input ids,
MatMul, bias, Softmax) against onnxruntime, each run on two inputs of one signature (the second call
reruns the captured graph on the device), and an out-of-range index is an IndexError there too.
Small shapes: each device compiles a handful of kernels (PYTHON interprets; OPENCL, PoCL at ~0.6 s a
kernel cold, is in the slow tier)."""
from __future__ import annotations
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402

# OPENCL in the slow tier: these kernels take PoCL 15-30 s cold on a loaded 2-core machine
DEVICES = ["LLVM", pytest.param("OPENCL", marks=pytest.mark.slow), "PYTHON"]

def _init(rng: np.random.Generator, name: str, *shape: int, mean: float = 0.0, std: float = 0.5) -> onnx.TensorProto:
  return numpy_helper.from_array((mean + std * rng.standard_normal(shape)).astype(np.float32), name)

def _cnn() -> onnx.ModelProto:
  rng = np.random.default_rng(10)
  inits = [_init(rng, "w", 4, 2, 3, 3), _init(rng, "g", 4, mean=1.0, std=0.1), _init(rng, "b", 4), _init(rng, "mu", 4),
           numpy_helper.from_array(np.array([0.5, 1.0, 1.5, 2.0], np.float32), "var"), _init(rng, "fw", 3, 16), _init(rng, "fb", 3)]
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["n"]),
           helper.make_node("Relu", ["n"], ["r"]), helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
           helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
  g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])

def _attention_head() -> onnx.ModelProto:
  rng = np.random.default_rng(11)
  inits = [_init(rng, "emb", 10, 8), _init(rng, "wq", 8, 8), _init(rng, "bq", 8)]
  nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"), helper.make_node("MatMul", ["e", "wq"], ["q0"]),
           helper.make_node("Add", ["q0", "bq"], ["q"]), helper.make_node("Transpose", ["e"], ["et"], perm=[1, 0]),
           helper.make_node("MatMul", ["q", "et"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
  g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])

@pytest.mark.parametrize("device", DEVICES)
def test_cnn_on_device(device: str) -> None:
  proto = _cnn()
  sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
  m = tox.load(proto, device)
  assert m.bn_folded == 1
  rng = np.random.default_rng(12)
  for _ in range(2):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
  assert len(m._captures) == 1

@pytest.mark.parametrize("device", DEVICES)
def test_embedding_attention_on_device(device: str) -> None:
  proto = _attention_head()
  sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
  m = tox.load(proto, device)
  for ids in ([0, 9, 3, 3, -1], [1, 2, 3, 4, 5]):
    feed = {"ids": np.array(ids, np.int64)}
    np.testing.assert_allclose(m.run(feed)["y"], sess.run(None, feed)[0], rtol=1e-4, atol=1e-6)
  with pytest.raises(IndexError, match=r"'embed' \(op Gather.*index 10 is out of range for axis 0 of size 10"):
    m.run({"ids": np.array([0, 1, 10, 2, 3], np.int64)})
