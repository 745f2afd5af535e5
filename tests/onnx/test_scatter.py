"""ONNX ScatterElements / Scatter / ScatterND (tilecraft/onnx/ops/scatter.py) against a numpy loop that applies the
updates in index order (the spec's reference semantics): every reduction, duplicate indices (under "none" the last
wins), negative indices, updates covering part of an axis, int/bool/half data, -0.0 and nan kept exactly, index
errors naming the node, and onnxruntime on the same models."""
from __future__ import annotations
import itertools
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402

NP2ONNX = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int32: TensorProto.INT32, np.int64: TensorProto.INT64,
           np.bool_: TensorProto.BOOL, np.float64: TensorProto.DOUBLE}
COMBINE = {"none": lambda a, b: b, "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "max": max, "min": min}

def _model(op: str, data: np.ndarray, idx: np.ndarray, upd: np.ndarray, opset: int = 18, **attrs) -> onnx.ModelProto:
  node = helper.make_node(op, ["d", "i", "u"], ["y"], name="sc", **attrs)
  vi = helper.make_tensor_value_info
  g = helper.make_graph([node], "g", [vi("d", NP2ONNX[data.dtype.type], list(data.shape)), vi("i", TensorProto.INT64, list(idx.shape)),
                                      vi("u", NP2ONNX[upd.dtype.type], list(upd.shape))], [vi("y", NP2ONNX[data.dtype.type], None)])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def ref_elements(data: np.ndarray, idx: np.ndarray, upd: np.ndarray, axis: int, reduction: str) -> np.ndarray:
  out = data.copy()
  for pos in itertools.product(*map(range, idx.shape)):
    tgt = list(pos)
    tgt[axis] = int(idx[pos]) % data.shape[axis]
    out[tuple(tgt)] = COMBINE[reduction](out[tuple(tgt)], upd[pos])
  return out

def ref_nd(data: np.ndarray, idx: np.ndarray, upd: np.ndarray, reduction: str) -> np.ndarray:
  out = data.copy()
  for pos in itertools.product(*map(range, idx.shape[:-1])):
    tgt = tuple(int(v) % data.shape[m] for m, v in enumerate(idx[pos]))
    out[tgt] = COMBINE[reduction](out[tgt], upd[pos]) if reduction != "max" and reduction != "min" else \
      (np.maximum if reduction == "max" else np.minimum)(out[tgt], upd[pos])
  return out

def _run(m: onnx.ModelProto, data, idx, upd) -> np.ndarray:
  return tox.load(m).run({"d": data, "i": idx, "u": upd})["y"]

@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_scatter_elements_duplicates_and_partial_updates(reduction, dtype):
  """(6, 5, 4) data, updates (3, 7, 2) along axis 1 (7 updates per row into 5 positions: duplicates in every row),
  covering 3 of 6 rows and 2 of 4 columns; indices negative and positive."""
  rng = np.random.default_rng(3)
  data = rng.uniform(-3, 3, (6, 5, 4)).astype(dtype)
  upd = rng.uniform(-3, 3, (3, 7, 2)).astype(dtype)
  idx = rng.integers(-5, 5, (3, 7, 2))
  got = _run(_model("ScatterElements", data, idx, upd, axis=1, reduction=reduction), data, idx, upd)
  want = ref_elements(data, idx, upd, 1, reduction)
  assert got.dtype == want.dtype
  np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5 if dtype != np.float16 else 2e-3, atol=0 if dtype != np.float16 else 1e-2)

def test_scatter_elements_last_update_wins_exactly():
  """Under "none" the last of several updates to one position is the value, bit for bit: -0.0 and nan included;
  positions no update names keep data's value (nan, -0.0) exactly."""
  data = np.array([[np.nan, -0.0, 1.0, 2.0]], np.float32)
  idx = np.array([[2, 2, 3, 3, 2]], np.int64)
  upd = np.array([[5.0, -0.0, 7.0, np.nan, 6.0]], np.float32)
  for red in ("none", "add"):
    got = _run(_model("ScatterElements", data, idx, upd, axis=1, reduction=red), data, idx, upd)
    want = ref_elements(data, idx, upd, 1, red)
    np.testing.assert_array_equal(got, want)
    assert np.signbit(got[0, 1])  # untouched -0.0
  got = _run(_model("ScatterElements", data, np.array([[1]]), np.array([[-0.0]], np.float32), axis=1), data, np.array([[1]]), np.array([[-0.0]], np.float32))
  assert np.signbit(got[0, 1])

def test_scatter_opset_10_and_bool_data():
  data = np.zeros((3, 4), np.bool_)
  idx = np.array([[1, 0, 2, 1]], np.int64)
  upd = np.array([[True, True, False, True]])
  got = _run(_model("Scatter", data, idx, upd, opset=10, axis=0), data, idx, upd)
  np.testing.assert_array_equal(got, ref_elements(data, idx, upd, 0, "none"))

@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_slices_and_elements(reduction):
  """Indices naming whole rows (k=1 of a (5, 3, 4) tensor: (3, 4) slices), element indices (k=3), and duplicates."""
  rng = np.random.default_rng(4)
  data = rng.uniform(-2, 2, (5, 3, 4)).astype(np.float32)
  for k, idx in ((1, np.array([[4], [-1], [0], [2]])), (2, np.array([[[0, 1], [4, -1]], [[0, 1], [3, 2]]])), (3, rng.integers(0, 3, (6, 3)))):
    upd = rng.uniform(-2, 2, idx.shape[:-1] + data.shape[k:]).astype(np.float32)
    got = _run(_model("ScatterND", data, idx, upd, reduction=reduction), data, idx, upd)
    np.testing.assert_allclose(got, ref_nd(data, idx, upd, reduction), rtol=1e-6)

def test_scatter_matches_onnxruntime():
  rt = pytest.importorskip("onnxruntime")
  rng = np.random.default_rng(5)
  data = rng.standard_normal((4, 6, 8)).astype(np.float32)
  idx = np.stack([rng.permutation(6)[:3] for _ in range(4)])[:, :, None].repeat(8, 2)  # (no duplicates: defined for every runtime)
  upd = rng.standard_normal(idx.shape).astype(np.float32)
  for m in (_model("ScatterElements", data, idx, upd, axis=1), _model("ScatterElements", data, idx, upd, axis=1, reduction="add")):
    want = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"d": data, "i": idx, "u": upd})[0]
    np.testing.assert_allclose(_run(m, data, idx, upd), want, rtol=1e-6)
  nidx = np.array([[1, 2], [3, 0], [0, 5]], np.int64)
  nupd = rng.standard_normal((3, 8)).astype(np.float32)
  m = _model("ScatterND", data, nidx, nupd)
  want = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"d": data, "i": nidx, "u": nupd})[0]
  np.testing.assert_array_equal(_run(m, data, nidx, nupd), want)

def test_scatter_index_errors_and_bad_forms_name_the_node():
  data = np.zeros((3, 4), np.float32)
  upd = np.ones((1, 2), np.float32)
  m = tox.load(_model("ScatterElements", data, np.zeros((1, 2), np.int64), upd, axis=1))
  with pytest.raises(IndexError, match=r"'sc' \(op ScatterElements.*index 4 is out of range for axis 1 of size 4"):
    m.run({"d": data, "i": np.array([[0, 4]]), "u": upd})
  m = tox.load(_model("ScatterND", data, np.zeros((2, 2), np.int64), np.ones(2, np.float32)))
  with pytest.raises(IndexError, match=r"'sc' \(op ScatterND.*index -5 \(column 1 of the indices\) is out of range for axis 1 of size 4"):
    m.run({"d": data, "i": np.array([[0, 1], [2, -5]]), "u": np.ones(2, np.float32)})
  with pytest.raises(NotImplementedError, match=r"'sc' \(op ScatterElements.*reduction 'avg'"):
    tox.load(_model("ScatterElements", data, np.zeros((1, 2), np.int64), upd, reduction="avg")).run({"d": data, "i": np.zeros((1, 2), np.int64), "u": upd})
