"""ONNX ops with value-dependent output shapes (tilecraft/onnx/ops/dynamic.py): NonZero, Compress, Unique and
NonMaxSuppression against numpy and onnxruntime on random data, rebuilt for every call (a second call with other
data gives another shape), with the spec's corner cases (0-d NonZero, unsorted Unique, nan, flipped corners,
equal scores, IoU exactly at the threshold) and bad forms named by node."""
from __future__ import annotations
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402

def _model(op: str, ins: list, outs: list, opset: int = 17, first_out: int = TensorProto.INT64, **attrs) -> onnx.ModelProto:
  """One node; its first output of dtype first_out, the others int64."""
  vi = helper.make_tensor_value_info
  g = helper.make_graph([helper.make_node(op, [n for n, _, _ in ins], outs, name="dyn", **attrs)], "g", [vi(n, t, s) for n, t, s in ins],
                        [vi(o, first_out if j == 0 else TensorProto.INT64, None) for j, o in enumerate(outs)])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _ort(m: onnx.ModelProto, feed: dict) -> list:
  rt = pytest.importorskip("onnxruntime")
  return rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)

def test_nonzero_each_call_its_own_count(rng: np.random.Generator) -> None:
  m = _model("NonZero", [("x", TensorProto.FLOAT, [4, 5])], ["y"])
  tm = tox.load(m)
  for p in (0.3, 0.8):
    x = (rng.random((4, 5)) < p).astype(np.float32) * rng.standard_normal((4, 5)).astype(np.float32)
    got = tm.run({"x": x})["y"]
    np.testing.assert_array_equal(got, np.array(np.nonzero(x)))
    np.testing.assert_array_equal(got, _ort(m, {"x": x})[0])
  m0 = _model("NonZero", [("x", TensorProto.FLOAT, [])], ["y"])
  assert tox.load(m0).run({"x": np.array(2.0, np.float32)})["y"].shape == (0, 1)  # (the spec: (0, N) for a 0-d input)

def test_compress_axes_short_condition_and_errors(rng: np.random.Generator) -> None:
  x = rng.standard_normal((3, 4, 5)).astype(np.float32)
  for axis, cond in ((1, np.array([True, False, True, True])), (-1, np.array([False, True])), (None, rng.random(60) < 0.5), (0, np.zeros(3, bool))):
    m = _model("Compress", [("x", TensorProto.FLOAT, [3, 4, 5]), ("c", TensorProto.BOOL, [cond.size])], ["y"], first_out=TensorProto.FLOAT,
               **({} if axis is None else {"axis": axis}))
    got = tox.load(m).run({"x": x, "c": cond})["y"]
    want = np.compress(cond, x, axis=axis)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, _ort(m, {"x": x, "c": cond})[0])
  m = _model("Compress", [("x", TensorProto.FLOAT, [3, 4, 5]), ("c", TensorProto.BOOL, [5])], ["y"], axis=1)
  with pytest.raises(NotImplementedError, match=r"'dyn' \(op Compress.*a condition of 5 elements for an axis of 4"):
    tox.load(m).run({"x": x, "c": np.ones(5, bool)})

@pytest.mark.parametrize("sort", [1, 0])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_unique_all_outputs(rng: np.random.Generator, sort: int, axis) -> None:
  x = rng.integers(0, 3, (6, 4)).astype(np.float32)
  x[2] = x[4]  # (a repeated row, for axis 0)
  m = _model("Unique", [("x", TensorProto.FLOAT, [6, 4])], ["y", "i", "inv", "cnt"], opset=11, first_out=TensorProto.FLOAT, sorted=sort, **({} if axis is None else {"axis": axis}))
  got = tox.load(m).run({"x": x})
  flat = x.reshape(-1) if axis is None else x
  a = 0 if axis is None else axis
  y, first, inv, cnt = np.unique(flat, return_index=True, return_inverse=True, return_counts=True, axis=a)
  if not sort:  # first-occurrence order, written out independently of the implementation
    seen: list = []
    slices = [np.take(flat, j, axis=a) for j in range(flat.shape[a])]
    for s in slices:
      if not any(np.array_equal(s, t) for t in seen): seen.append(s)
    y = np.stack(seen, axis=a)
    first = np.array([next(j for j, s in enumerate(slices) if np.array_equal(s, t)) for t in seen])
    inv = np.array([next(k for k, t in enumerate(seen) if np.array_equal(s, t)) for s in slices])
    cnt = np.array([sum(np.array_equal(s, t) for s in slices) for t in seen])
  np.testing.assert_array_equal(got["y"], y)
  for name, want in (("i", first), ("inv", np.asarray(inv).reshape(-1)), ("cnt", cnt)):
    assert got[name].dtype == np.int64
    np.testing.assert_array_equal(got[name], want)
  if axis is None:
    for g, w in zip((got[k] for k in ("y", "i", "inv", "cnt")), _ort(m, {"x": x})): np.testing.assert_array_equal(g, w)

def _nms_reference(boxes: np.ndarray, scores: np.ndarray, max_out: int, iou_t: float, score_t, center: int) -> np.ndarray:
  """Greedy NMS written from the spec, box by box."""
  out = []
  for b in range(boxes.shape[0]):
    bx = boxes[b].astype(np.float64)
    if center: bx = np.stack([bx[:, 1] - bx[:, 3] / 2, bx[:, 0] - bx[:, 2] / 2, bx[:, 1] + bx[:, 3] / 2, bx[:, 0] + bx[:, 2] / 2], 1)
    y1, y2 = np.minimum(bx[:, 0], bx[:, 2]), np.maximum(bx[:, 0], bx[:, 2])
    x1, x2 = np.minimum(bx[:, 1], bx[:, 3]), np.maximum(bx[:, 1], bx[:, 3])
    for c in range(scores.shape[1]):
      order = sorted((j for j in range(bx.shape[0]) if score_t is None or scores[b, c, j] > score_t), key=lambda j: (-scores[b, c, j], j))
      keep: list = []
      for j in order:
        if len(keep) == max_out: break
        ok = True
        for k in keep:
          ih = min(y2[j], y2[k]) - max(y1[j], y1[k])
          iw = min(x2[j], x2[k]) - max(x1[j], x1[k])
          inter = max(ih, 0) * max(iw, 0)
          union = (y2[j] - y1[j]) * (x2[j] - x1[j]) + (y2[k] - y1[k]) * (x2[k] - x1[k]) - inter
          if inter > 0 and union > 0 and inter / union > iou_t: ok = False
        if ok: keep.append(j)
      out += [(b, c, j) for j in keep]
  return np.array(out, np.int64).reshape(-1, 3)

@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("score_t", [None, 0.3])
def test_non_max_suppression_against_reference_and_onnxruntime(rng: np.random.Generator, center: int, score_t) -> None:
  nb, ncls, nbox = 2, 3, 40
  boxes = rng.uniform(0, 10, (nb, nbox, 4)).astype(np.float32)
  if center: boxes[..., 2:] = rng.uniform(0.5, 4, (nb, nbox, 2))
  scores = rng.integers(0, 8, (nb, ncls, nbox)).astype(np.float32) / 8  # (many equal scores: the lower index first)
  ins = [("b", TensorProto.FLOAT, [nb, nbox, 4]), ("s", TensorProto.FLOAT, [nb, ncls, nbox]), ("m", TensorProto.INT64, [1]), ("t", TensorProto.FLOAT, [1])]
  if score_t is not None: ins.append(("st", TensorProto.FLOAT, [1]))
  m = _model("NonMaxSuppression", ins, ["y"], center_point_box=center)
  feed = {"b": boxes, "s": scores, "m": np.array([5], np.int64), "t": np.array([0.2], np.float32)}
  if score_t is not None: feed["st"] = np.array([score_t], np.float32)
  got = tox.load(m).run(feed)["y"]
  np.testing.assert_array_equal(got, _nms_reference(boxes, scores, 5, 0.2, score_t, center))
  np.testing.assert_array_equal(got, _ort(m, feed)[0])

def test_non_max_suppression_from_a_computed_score_and_bad_shapes(rng: np.random.Generator) -> None:
  """Scores computed in the graph (a Sigmoid) are realized first; a second call with other data selects other boxes."""
  vi = helper.make_tensor_value_info
  g = helper.make_graph([helper.make_node("Sigmoid", ["s"], ["p"]), helper.make_node("NonMaxSuppression", ["b", "p", "m", "t"], ["y"], name="dyn")], "g",
                        [vi("b", TensorProto.FLOAT, [1, 6, 4]), vi("s", TensorProto.FLOAT, [1, 1, 6]), vi("m", TensorProto.INT64, [1]), vi("t", TensorProto.FLOAT, [1])],
                        [vi("y", TensorProto.INT64, None)])
  tm = tox.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
  for _ in range(2):
    boxes = rng.uniform(0, 5, (1, 6, 4)).astype(np.float32)
    s = rng.standard_normal((1, 1, 6)).astype(np.float32)
    got = tm.run({"b": boxes, "s": s, "m": np.array([3]), "t": np.array([0.1], np.float32)})["y"]
    np.testing.assert_array_equal(got, _nms_reference(boxes, 1 / (1 + np.exp(-s.astype(np.float64))), 3, 0.1, None, 0))
  bad = _model("NonMaxSuppression", [("b", TensorProto.FLOAT, [1, 6, 3]), ("s", TensorProto.FLOAT, [1, 1, 6])], ["y"])
  with pytest.raises(NotImplementedError, match=r"'dyn' \(op NonMaxSuppression.*boxes of shape \(1, 6, 3\)"):
    tox.load(bad).run({"b": np.zeros((1, 6, 3), np.float32), "s": np.zeros((1, 1, 6), np.float32)})
