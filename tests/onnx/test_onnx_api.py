"""tilecraft.onnx's API: load from a path, bytes or ModelProto; outputs keyed by name; NotImplementedError
naming node, op and opset (at load and at run); the onnx Backend (prepare/run with a list or dict,
run_model, run_node, supports_device); the `tilecraft run` command line; the light-model helper."""
from __future__ import annotations
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402
from tilecraft.onnx import backend  # noqa: E402

def _model(opset: int = 17) -> onnx.ModelProto:
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
  z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])
  r = helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 4])
  nodes = [helper.make_node("MatMul", ["x", "y"], ["m"], name="mm"), helper.make_node("Add", ["m", "b"], ["z"], name="add"),
           helper.make_node("Relu", ["z"], ["r"], name="relu")]
  b = helper.make_tensor("b", TensorProto.FLOAT, [4], [1.0, -1.0, 0.5, -0.5])
  g = helper.make_graph(nodes, "g", [x, y], [z, r], initializer=[b])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _ref(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  z = x @ y + np.array([1.0, -1.0, 0.5, -0.5], np.float32)
  return z, np.maximum(z, 0)

@pytest.fixture
def xy() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  return rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)

@pytest.mark.parametrize("kind", ["proto", "bytes", "path"])
def test_load_and_run(kind: str, xy: tuple, tmp_path) -> None:
  m = _model()
  src = {"proto": m, "bytes": m.SerializeToString()}.get(kind)
  if kind == "path":
    p = tmp_path / "m.onnx"
    onnx.save(m, str(p))
    src = str(p)
  out = tox.load(src).run({"x": xy[0], "y": xy[1]})
  assert list(out) == ["z", "r"]
  z, r = _ref(*xy)
  np.testing.assert_allclose(out["z"], z, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["r"], r, rtol=1e-5, atol=1e-6)

def test_unsupported_op_names_node_op_opset() -> None:
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
  g = helper.make_graph([helper.make_node("DeformConv", ["x", "x", "x"], ["y"], name="dc1")], "g", [x],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  with pytest.raises(NotImplementedError, match=r"dc1.*DeformConv.*opset 19"):
    tox.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]))

def test_unsupported_at_run_names_node() -> None:
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2])
  ps = [helper.make_tensor(nm, TensorProto.FLOAT, [2], [1.0, 1.0]) for nm in ("s", "b", "m", "v")]
  n = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", training_mode=1)
  g = helper.make_graph([n], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=ps)
  m = tox.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]))
  with pytest.raises(NotImplementedError, match=r"bn.*BatchNormalization.*opset 15.*training"):
    m.run({"x": np.zeros((1, 2, 2), np.float32)})

def test_opset_out_of_range() -> None:
  with pytest.raises(NotImplementedError, match="opset"):
    tox.load(_model(opset=40))

def test_missing_input(xy: tuple) -> None:
  with pytest.raises(ValueError, match="missing graph input 'y'"):
    tox.load(_model()).run({"x": xy[0]})

def test_backend(xy: tuple) -> None:
  z, r = _ref(*xy)
  rep = backend.prepare(_model(), device="CPU")
  for out in (rep.run([xy[0], xy[1]]), rep.run({"x": xy[0], "y": xy[1]})):
    assert len(out) == 2
    np.testing.assert_allclose(out[0], z, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], r, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(backend.run_model(_model(), [xy[0], xy[1]])[1], r, rtol=1e-5, atol=1e-6)
  node = helper.make_node("Relu", ["a"], ["b"])
  np.testing.assert_array_equal(backend.run_node(node, [np.array([-1.0, 2.0], np.float32)])[0], [0.0, 2.0])
  assert backend.supports_device("CPU") and not backend.supports_device("TPU")
  from onnx.backend.base import Backend
  assert issubclass(backend.TilecraftBackend, Backend)

def test_cli_run(xy: tuple, tmp_path, capsys) -> None:
  from tilecraft.__main__ import main
  p = tmp_path / "m.onnx"
  onnx.save(_model(), str(p))
  np.save(tmp_path / "x.npy", xy[0]); np.save(tmp_path / "y.npy", xy[1])
  rc = main(["run", str(p), "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}", "--out", str(tmp_path / "out"), "--repeat", "1"])
  text = capsys.readouterr().out
  assert rc == 0 and "time per call" in text
  np.testing.assert_allclose(np.load(tmp_path / "out" / "r.npy"), _ref(*xy)[1], rtol=1e-5, atol=1e-6)
  assert main(["run", str(tmp_path / "nope.onnx")]) == 2

def test_light_helper_replaces_weights() -> None:
  from tilecraft.onnx.light import light_input, light_model, light_model_names
  assert len(light_model_names()) == 9
  m = light_model("squeezenet", seed=0)
  assert not any(n.op_type == "ConstantOfShape" for n in m.graph.node)
  assert [o.name for o in m.graph.output][-1] != "softmaxout_1"  # the logits were added
  inp = light_input(m)
  assert list(inp) == ["data_0"] and inp["data_0"].shape == (1, 3, 224, 224)
  w = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}["conv1_w_0"]
  assert w.std() > 0.01 and np.isfinite(w).all()
