"""OnnxModel.profile (graph.py): a call's kernels, each timed in sequence, counted under the graph node whose output
they write, with the nodes fused into them; kernels that write no node's output (a Winograd conv's transforms, the
slices of a concatenation written in place) under the node that reads or writes what they write. Every kernel of the
call is in exactly one row. And `tilecraft run --profile`."""
from __future__ import annotations
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402
from tilecraft.device import Device  # noqa: E402

def _t(name: str, *shape: int, seed: int = 0) -> onnx.TensorProto:
  return helper.make_tensor(name, TensorProto.FLOAT, list(shape), (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(np.float32).ravel())

def _model(nodes: list, x_shape: list, inits: list) -> onnx.ModelProto:
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

def _capture_names(m: tox.OnnxModel) -> list[str]:
  cap = next(reversed(m._captures.values()))
  return list(cap.bound.names)

def test_kernels_count_under_the_node_they_compute() -> None:
  # a 3x3 conv at 28^2 with 64 channels (Winograd on CPUs: four kernels), its Relu, a pooled MatMul
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"), helper.make_node("Relu", ["c"], ["r"], name="relu"),
           helper.make_node("ReduceMean", ["r"], ["p"], axes=[2, 3], keepdims=0, name="pool"),
           helper.make_node("MatMul", ["p", "w2"], ["y"], name="fc")]
  m = tox.load(_model(nodes, [1, 64, 28, 28], [_t("w", 64, 64, 3, 3), _t("b", 64, seed=1), _t("w2", 64, 32, seed=2)]))
  x = np.random.default_rng(3).standard_normal((1, 64, 28, 28)).astype(np.float32)
  rows = m.profile({"x": x}, repeat=3)
  by = {r.node: r for r in rows}
  assert sorted(k for r in rows for k in r.kernels) == sorted(_capture_names(m))  # each kernel once
  # the conv and its relu are computed in the kernels that end with the mean: the Winograd transforms' kernels (on CPUs) write
  # no node's output and count under their reader's node
  assert [r.node for r in rows] == ["pool", "fc"]  # (in the order their kernels run)
  assert by["pool"].nodes == ("conv", "relu", "pool") and by["pool"].ops == ("Conv", "Relu", "ReduceMean") and by["pool"].values == ("c", "r", "p")
  assert by["fc"].op == "MatMul" and by["fc"].nodes == ("fc",) and len(by["fc"].kernels) == 1
  if (m.device or Device.DEFAULT).split(":")[0] in ("CPU", "LLVM") and len(by["pool"].kernels) == 1: pytest.fail(f"expected the Winograd conv's kernels: {by['pool'].kernels}")
  assert all(np.isfinite(r.seconds) and r.seconds > 0 for r in rows)
  np.testing.assert_allclose(m.run({"x": x})["y"], tox.load(_model(nodes, [1, 64, 28, 28], [_t("w", 64, 64, 3, 3), _t("b", 64, seed=1),
                                                                                              _t("w2", 64, 32, seed=2)])).run({"x": x})["y"], rtol=1e-5)

def test_concatenated_slices_count_under_the_concat() -> None:
  # an Inception-style block: branch a's conv, then branch b's 1x1 reduce (its own kernel: a 3x3 conv reads it) and 3x3
  # conv, both branches written into the concatenation; branch a counts under the Concat it is written into, not under
  # the reduce conv that comes next in the file
  nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="ca"), helper.make_node("Relu", ["a"], ["ra"], name="relu_a"),
           helper.make_node("Conv", ["x", "wr"], ["r"], name="cr"), helper.make_node("Relu", ["r"], ["rr"], name="relu_r"),
           helper.make_node("Conv", ["rr", "wb"], ["b"], pads=[1, 1, 1, 1], name="cb"), helper.make_node("Relu", ["b"], ["rb"], name="relu_b"),
           helper.make_node("Concat", ["ra", "rb"], ["cat"], axis=1, name="cat"), helper.make_node("Conv", ["cat", "wc"], ["y"], name="cc")]
  m = tox.load(_model(nodes, [1, 8, 12, 12], [_t("wa", 4, 8, 1, 1), _t("wr", 4, 8, 1, 1, seed=3), _t("wb", 4, 4, 3, 3, seed=1), _t("wc", 2, 8, 1, 1, seed=2)]))
  rows = m.profile({"x": np.ones((1, 8, 12, 12), np.float32)}, repeat=1)
  assert sorted(k for r in rows for k in r.kernels) == sorted(_capture_names(m))
  by = {r.node: r for r in rows}
  assert set(by["cat"].nodes) == {"ca", "relu_a", "cb", "relu_b", "cat"} and len(by["cat"].kernels) >= 2, by["cat"]
  assert by["relu_r"].nodes == ("cr", "relu_r")
  assert [r.node for r in rows][-1] == "cc"

def test_profile_refuses_what_it_cannot_time() -> None:
  nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]), helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  m = tox.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
  with pytest.raises(ValueError, match="built again on every call"): m.profile({"x": np.arange(6, dtype=np.float32), "s": np.array([2, 3])})
  relu = tox.load(_model([helper.make_node("Relu", ["x"], ["y"])], [4], []))
  with pytest.raises(ValueError, match="repeat >= 1"): relu.profile({"x": np.ones(4, np.float32)}, repeat=0)

def test_cli_run_profile(tmp_path, capsys) -> None:
  from tilecraft.__main__ import main
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["y"], name="relu")]
  path = tmp_path / "m.onnx"
  onnx.save(_model(nodes, [1, 4, 8, 8], [_t("w", 8, 4, 1, 1)]), str(path))
  assert main(["run", str(path), "--repeat", "1", "--profile", "5"]) == 0
  out = capsys.readouterr().out
  assert "profile: 1 graph nodes run 1 kernels" in out
  assert any(line.split()[-1].startswith("r_") and "relu" in line and "Conv+Relu" in line for line in out.splitlines())
  assert main(["run", str(path), "--repeat", "0", "--profile", "-1"]) != 0
