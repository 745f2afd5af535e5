"""ONNX GridSample / AffineGrid / RoiAlign / Col2Im / MaxUnpool (tilecraft/onnx/ops/spatial.py) and LRN (nn.py) against
numpy loops written here from the spec (float64), on random data: every mode, padding mode and align_corners of
GridSample in 1-D to 3-D (ties of nearest rounding half to even, nan grids, inf data that no tap reads, int data,
float16), AffineGrid 2-D/3-D into GridSample, RoiAlign avg/max under both coordinate modes with fixed and adaptive
sampling (rois read at build time: rebuilt per call), Col2Im 2-D/3-D with strides/pads/dilations, MaxUnpool with
duplicates and output_shape; errors naming the node; and onnxruntime on the same models where it has the op."""
from __future__ import annotations
import itertools, math
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402

def _et(a: np.ndarray) -> int: return helper.np_dtype_to_tensor_dtype(a.dtype)

def _model(op: str, feeds: dict, consts: dict | None = None, opset: int = 22, **attrs) -> onnx.ModelProto:
  """One node named 'sp' over graph inputs `feeds` and initializers `consts` (input order: feeds, then consts)."""
  consts = consts or {}
  names = list(feeds) + list(consts)
  node = helper.make_node(op, names, ["y"], name="sp", **attrs)
  vi = helper.make_tensor_value_info
  ins = [vi(k, _et(v), list(v.shape)) for k, v in feeds.items()]
  inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
  g = helper.make_graph([node], "g", ins, [vi("y", _et(next(iter(feeds.values()))), None)], initializer=inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _model_in_order(op: str, inputs: list, opset: int = 22, **attrs) -> onnx.ModelProto:
  """inputs: (name, array, is_const) in the node's input order."""
  node = helper.make_node(op, [nm for nm, _, _ in inputs], ["y"], name="sp", **attrs)
  vi = helper.make_tensor_value_info
  ins = [vi(nm, _et(a), list(a.shape)) for nm, a, c in inputs if not c]
  inits = [numpy_helper.from_array(a, nm) for nm, a, c in inputs if c]
  g = helper.make_graph([node], "g", ins, [vi("y", _et(inputs[0][1]), None)], initializer=inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _feeds(inputs: list) -> dict:
  return {nm: a for nm, a, c in inputs if not c}

def _ort(m: onnx.ModelProto, feeds: dict) -> np.ndarray:
  rt = pytest.importorskip("onnxruntime")
  try: sess = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  except Exception as e: pytest.skip(f"onnxruntime doesn't run this model: {e}")
  return sess.run(None, feeds)[0]

# ---- GridSample reference ------------------------------------------------------------------------------
def _reflect(v: float, lo: float, hi: float) -> float:
  """Mirror v at lo and hi until it is inside (period 2 * (hi - lo))."""
  if lo <= v <= hi: return v
  span = hi - lo
  if span == 0: return lo
  t = (v - lo) % (2 * span)
  return lo + (t if t <= span else 2 * span - t)

def _cubic_w(t: float) -> list[float]:
  A = -0.75
  def k(s: float) -> float:
    s = abs(s)
    return ((A + 2) * s - (A + 3)) * s * s + 1 if s <= 1 else ((A * s - 5 * A) * s + 8 * A) * s - 4 * A
  return [k(t + 1), k(t), k(1 - t), k(2 - t)]

def ref_grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, pad: str, ac: bool) -> np.ndarray:
  N, C, *sp = x.shape
  r = len(sp)
  osp = grid.shape[1:-1]
  y = np.zeros((N, C, *osp), np.float64)
  xd = x.astype(np.float64)
  for nn_ in range(N):
    for o in itertools.product(*map(range, osp)):
      coords = grid[(nn_, *o)][::-1].astype(np.float64)  # per spatial axis
      if np.isnan(coords).any():
        y[(nn_, slice(None), *o)] = np.nan
        continue
      taps = []
      for d, L in enumerate(sp):
        u = (coords[d] + 1) / 2 * (L - 1) if ac else ((coords[d] + 1) * L - 1) / 2
        lo, hi = (0.0, L - 1.0) if ac else (-0.5, L - 0.5)
        if mode == "nearest": u = float(np.round(u))  # half to even
        if u < lo or u > hi:
          if pad == "border": u = min(max(u, 0.0), L - 1.0)
          elif pad == "reflection": u = _reflect(u, lo, hi)
        if mode == "nearest": taps.append([(int(u), 1.0)])
        else:
          f = math.floor(u)
          t = u - f
          taps.append([(f, 1 - t), (f + 1, t)] if mode == "linear" else list(zip(range(f - 1, f + 3), _cubic_w(t))))
      acc = np.zeros(C)
      for combo in itertools.product(*taps):
        w, pos = 1.0, []
        for d, (p, wd) in enumerate(combo):
          L = sp[d]
          lo, hi = (0.0, L - 1.0) if ac else (-0.5, L - 0.5)
          if pad == "zeros" and not 0 <= p < L: pos = None; break
          if pad == "border": p = min(max(p, 0), L - 1)
          if pad == "reflection": p = int(_reflect(float(p), lo, hi))
          pos.append(p); w *= wd
        if pos is not None: acc += w * xd[(nn_, slice(None), *pos)]
      y[(nn_, slice(None), *o)] = acc
  return y

def _gs(x, grid, opset=22, **attrs):
  m = _model("GridSample", {"x": x, "g": grid}, opset=opset, **attrs)
  return m, tox.load(m).run({"x": x, "g": grid})["y"]

@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("ac", [0, 1])
def test_grid_sample_2d_every_mode(mode, pad, ac):
  """(2, 3, 5, 6) data, a 4 x 7 grid reaching well outside [-1, 1] (every padding mode's far branch: several reflections).
  Cubic with border/reflection padding is refused (the ONNX reference pads the coordinate, onnxruntime only the taps)."""
  rng = np.random.default_rng(len(mode) * 100 + len(pad) * 10 + ac)
  x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
  grid = rng.uniform(-2.6, 2.6, (2, 4, 7, 2)).astype(np.float32)
  if mode == "cubic" and pad != "zeros":
    with pytest.raises(NotImplementedError, match=r"'sp' \(op GridSample.*cubic with padding_mode"): _gs(x, grid, mode=mode, padding_mode=pad)
    return
  _, got = _gs(x, grid, mode=mode, padding_mode=pad, align_corners=ac)
  np.testing.assert_allclose(got, ref_grid_sample(x, grid, mode, pad, bool(ac)), rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("mode,pad,ac", [("linear", "zeros", 0), ("nearest", "border", 1), ("linear", "reflection", 1), ("cubic", "zeros", 0),
                                         ("cubic", "zeros", 1), ("nearest", "reflection", 0)])
def test_grid_sample_1d_and_3d(mode, pad, ac):
  rng = np.random.default_rng(7)
  x1 = rng.standard_normal((2, 2, 7)).astype(np.float32)
  g1 = rng.uniform(-1.8, 1.8, (2, 5, 1)).astype(np.float32)
  x3 = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
  g3 = rng.uniform(-1.5, 1.5, (1, 2, 3, 2, 3)).astype(np.float32)
  for x, g in ((x1, g1), (x3, g3)):
    got = _gs(x, g, mode=mode, padding_mode=pad, align_corners=ac)[1]
    np.testing.assert_allclose(got, ref_grid_sample(x, g, mode, pad, bool(ac)), rtol=1e-5, atol=1e-5)

def test_grid_sample_edges():
  """Nearest ties round half to even; a nan grid point gives nan there only; inf data no tap reads doesn't leak into the
  zero-weight or out-of-range taps; int data (nearest) exact; float16 computed in float32, rounded once; float64; a
  size-1 axis under align_corners with reflection; opset 16 spellings (bilinear, bicubic)."""
  x = np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8) * 10
  g = np.array([[[[0.0, 0.0], [0.25, 0.0], [-0.25, 0.0], [-0.75, 0.0], [0.125, 0.0]]]], np.float32)  # positions 3.5, 4.5, 2.5, 0.5, 4.0
  _, got = _gs(x, g, mode="nearest")
  np.testing.assert_array_equal(got.reshape(-1), [40, 40, 20, 0, 40])
  rng = np.random.default_rng(1)
  x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
  x[0, :, 0, :] = np.inf
  g = rng.uniform(-0.4, 0.4, (1, 3, 3, 2)).astype(np.float32)
  g[0, 1, 1, 0] = np.nan
  for mode in ("linear", "nearest", "cubic"):
    _, got = _gs(x, g, mode=mode)
    want = ref_grid_sample(x, g, mode, "zeros", False)
    assert np.isnan(got[0, :, 1, 1]).all() and np.isfinite(np.delete(got.reshape(2, 9), 4, 1)).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  xi = rng.integers(-100, 100, (2, 3, 4, 5)).astype(np.int32)
  gi = rng.uniform(-1.3, 1.3, (2, 3, 3, 2)).astype(np.float32)
  _, got = _gs(xi, gi, mode="nearest", padding_mode="border")
  assert got.dtype == np.int32
  np.testing.assert_array_equal(got, ref_grid_sample(xi, gi, "nearest", "border", False).astype(np.int32))
  xh = rng.standard_normal((1, 2, 5, 5)).astype(np.float16)
  gh = rng.uniform(-1.2, 1.2, (1, 3, 4, 2)).astype(np.float16)
  _, got = _gs(xh, gh, mode="cubic")
  assert got.dtype == np.float16
  np.testing.assert_allclose(got.astype(np.float64), ref_grid_sample(xh, gh, "cubic", "zeros", False), rtol=2e-3, atol=2e-3)
  xd, gd = rng.standard_normal((1, 1, 4, 5)), rng.uniform(-1.5, 1.5, (1, 3, 3, 2))
  np.testing.assert_allclose(_gs(xd, gd, padding_mode="reflection")[1], ref_grid_sample(xd, gd, "linear", "reflection", False), rtol=1e-12)
  x1 = rng.standard_normal((1, 2, 1, 5)).astype(np.float32)
  g1 = rng.uniform(-2, 2, (1, 2, 3, 2)).astype(np.float32)
  got = _gs(x1, g1, padding_mode="reflection", align_corners=1)[1]
  np.testing.assert_allclose(got, ref_grid_sample(x1, g1, "linear", "reflection", True), rtol=1e-5, atol=1e-6)
  x, g = rng.standard_normal((1, 2, 4, 5)).astype(np.float32), rng.uniform(-1.2, 1.2, (1, 3, 2, 2)).astype(np.float32)
  np.testing.assert_allclose(_gs(x, g, opset=16, mode="bicubic")[1], ref_grid_sample(x, g, "cubic", "zeros", False), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(_gs(x, g, opset=16, mode="bilinear")[1], ref_grid_sample(x, g, "linear", "zeros", False), rtol=1e-5, atol=1e-5)

def test_grid_sample_refusals_name_the_node():
  x, g = np.zeros((1, 1, 2, 2, 2), np.float32), np.zeros((1, 1, 1, 1, 3), np.float32)
  with pytest.raises(NotImplementedError, match=r"'sp' \(op GridSample, opset 16\).*4-D"): _gs(x, g, opset=16)
  x, g = np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 1, 2), np.float32)
  with pytest.raises(NotImplementedError, match=r"'sp' \(op GridSample.*mode 'area'"): _gs(x, g, mode="area")
  with pytest.raises(NotImplementedError, match=r"'sp' \(op GridSample.*padding_mode 'wrap'"): _gs(x, g, padding_mode="wrap")
  with pytest.raises(NotImplementedError, match=r"'sp' \(op GridSample.*linear interpolation of int"): _gs(x.astype(np.int32), g)

@pytest.mark.parametrize("opset", [16, 20])
def test_grid_sample_matches_onnxruntime(opset):
  rng = np.random.default_rng(opset)
  x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
  g = rng.uniform(-1.4, 1.4, (2, 4, 3, 2)).astype(np.float32)
  modes = ("bilinear", "nearest", "bicubic") if opset == 16 else ("linear", "nearest", "cubic")
  for mode, pad, ac in itertools.product(modes, ("zeros", "border", "reflection"), (0, 1)):
    if "cubic" in mode and pad != "zeros": continue  # refused (see test_grid_sample_2d_every_mode)
    m, got = _gs(x, g, opset=opset, mode=mode, padding_mode=pad, align_corners=ac)
    np.testing.assert_allclose(got, _ort(m, {"x": x, "g": g}), rtol=1e-4, atol=1e-5, err_msg=f"{mode} {pad} {ac}")

# ---- AffineGrid ----------------------------------------------------------------------------------------
def ref_affine_grid(theta: np.ndarray, size: list[int], ac: bool) -> np.ndarray:
  sp = size[2:]
  r = len(sp)
  lin = [np.array([-1 + 2 * i / (L - 1) if ac else (2 * i + 1) / L - 1 for i in range(L)]) for L in sp]
  out = np.zeros((theta.shape[0], *sp, r))
  for nn_ in range(theta.shape[0]):
    for pos in itertools.product(*map(range, sp)):
      h = np.array([lin[d][pos[d]] for d in reversed(range(r))] + [1.0])  # x (last axis) first
      out[(nn_, *pos)] = theta[nn_].astype(np.float64) @ h
  return out

@pytest.mark.parametrize("ac", [0, 1])
def test_affine_grid_2d_3d_and_into_grid_sample(ac):
  rng = np.random.default_rng(ac)
  for size in ([2, 3, 4, 5], [2, 1, 3, 4, 2], [2, 1, 1, 6]):
    if ac and 1 in size[2:]: continue
    r = len(size) - 2
    theta = rng.uniform(-1, 1, (2, r, r + 1)).astype(np.float32)
    m = _model_in_order("AffineGrid", [("t", theta, False), ("s", np.array(size, np.int64), True)], opset=20, align_corners=ac)
    got = tox.load(m).run({"t": theta})["y"]
    want = ref_affine_grid(theta, size, bool(ac))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, _ort(m, {"t": theta}), rtol=1e-5, atol=1e-6)
  # the spatial transformer: AffineGrid then GridSample, size fed as a graph input (read at build time)
  x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
  theta = (np.eye(2, 3)[None] + rng.uniform(-0.3, 0.3, (2, 2, 3))).astype(np.float32)
  vi = helper.make_tensor_value_info
  g = helper.make_graph([helper.make_node("AffineGrid", ["t", "s"], ["g"], align_corners=ac),
                         helper.make_node("GridSample", ["x", "g"], ["y"], align_corners=ac)], "g",
                        [vi("x", TensorProto.FLOAT, x.shape), vi("t", TensorProto.FLOAT, theta.shape), vi("s", TensorProto.INT64, [4])],
                        [vi("y", TensorProto.FLOAT, None)])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
  feeds = {"x": x, "t": theta, "s": np.array([2, 3, 4, 4], np.int64)}
  got = tox.load(m).run(feeds)["y"]
  want = ref_grid_sample(x, ref_affine_grid(theta, [2, 3, 4, 4], bool(ac)).astype(np.float32), "linear", "zeros", bool(ac))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got, _ort(m, feeds), rtol=1e-4, atol=1e-5)

def test_affine_grid_size_one_align_corners_refused():
  theta = np.zeros((1, 2, 3), np.float32)
  m = _model_in_order("AffineGrid", [("t", theta, False), ("s", np.array([1, 1, 1, 3], np.int64), True)], opset=20, align_corners=1)
  with pytest.raises(NotImplementedError, match=r"'sp' \(op AffineGrid.*size of 1"): tox.load(m).run({"t": theta})

# ---- RoiAlign ------------------------------------------------------------------------------------------
def _bilinear_corners(img: np.ndarray, y: float, x: float) -> list[tuple[float, np.ndarray]]:
  """(weight, value) of the 4 corners of a sample at (y, x); a sample out of [-1, L] has none."""
  H, W = img.shape[-2:]
  if y < -1.0 or y > H or x < -1.0 or x > W: return []
  y, x = max(y, 0.0), max(x, 0.0)
  y0, x0 = int(y), int(x)
  if y0 >= H - 1: y0 = y1 = H - 1; y = float(y0)
  else: y1 = y0 + 1
  if x0 >= W - 1: x0 = x1 = W - 1; x = float(x0)
  else: x1 = x0 + 1
  ly, lx = y - y0, x - x0
  return [((1 - ly) * (1 - lx), img[..., y0, x0]), ((1 - ly) * lx, img[..., y0, x1]), (ly * (1 - lx), img[..., y1, x0]), (ly * lx, img[..., y1, x1])]

def ref_roi_align(x, rois, bidx, oh, ow, ratio, scale, mode, half):
  R, C = len(rois), x.shape[1]
  out = np.zeros((R, C, oh, ow))
  xd = x.astype(np.float64)
  for r in range(R):
    off = 0.5 if half else 0.0
    x1, y1, x2, y2 = [float(v) * scale - off for v in rois[r]]
    rw, rh = x2 - x1, y2 - y1
    if not half: rw, rh = max(rw, 1.0), max(rh, 1.0)
    bh, bw = rh / oh, rw / ow
    gh = ratio if ratio > 0 else max(math.ceil(rh / oh), 0)
    gw = ratio if ratio > 0 else max(math.ceil(rw / ow), 0)
    img = xd[bidx[r]]
    for ph, pw in itertools.product(range(oh), range(ow)):
      vals = []
      for iy, ix in itertools.product(range(gh), range(gw)):
        yy = y1 + ph * bh + (iy + 0.5) * bh / gh
        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
        cs = _bilinear_corners(img, yy, xx)
        if mode == "avg": vals.append(sum(w * v for w, v in cs) if cs else np.zeros(C))
        else: vals.append(np.max([w * v for w, v in cs], axis=0) if cs else np.zeros(C))
      if vals: out[r, :, ph, pw] = np.sum(vals, 0) / max(gh * gw, 1) if mode == "avg" else np.max(vals, 0)
  return out

def _roi_inputs(rng, x_shape=(2, 3, 9, 11), R=5):
  x = rng.standard_normal(x_shape).astype(np.float32)
  H, W = x_shape[2:]
  a = rng.uniform(-3, W + 2, (R, 2)); b = rng.uniform(-3, H + 2, (R, 2))
  rois = np.stack([a.min(1), b.min(1), a.max(1), b.max(1)], 1).astype(np.float32)
  rois[0] = [2, 2, 2.3, 2.2]  # tiny (below 1x1: output_half_pixel stretches it)
  return x, rois, rng.integers(0, x_shape[0], R).astype(np.int64)

@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [2, 0])
def test_roi_align(mode, ctm, ratio):
  rng = np.random.default_rng(len(mode) * 7 + len(ctm) + ratio)
  x, rois, bidx = _roi_inputs(rng)
  inputs = [("x", x, False), ("rois", rois, False), ("bi", bidx, False)]
  m = _model_in_order("RoiAlign", inputs, opset=16, mode=mode, coordinate_transformation_mode=ctm, output_height=3, output_width=4,
                      sampling_ratio=ratio, spatial_scale=0.75)
  model = tox.load(m)
  for k in range(2):  # new rois each call (adaptive sampling reads them at build time: the graph is rebuilt)
    got = model.run(_feeds(inputs))["y"]
    np.testing.assert_allclose(got, ref_roi_align(x, rois, bidx, 3, 4, ratio, 0.75, mode, ctm == "half_pixel"), rtol=1e-5, atol=1e-5)
    x, rois, bidx = _roi_inputs(rng)
    inputs = [("x", x, False), ("rois", rois, False), ("bi", bidx, False)]

def test_roi_align_opset10_float16_and_errors():
  rng = np.random.default_rng(4)
  x, rois, bidx = _roi_inputs(rng, (1, 2, 6, 7), 3)
  m = _model_in_order("RoiAlign", [("x", x, False), ("rois", rois, False), ("bi", np.zeros(3, np.int64), False)], opset=10, output_height=2,
                      output_width=2)
  got = tox.load(m).run({"x": x, "rois": rois, "bi": np.zeros(3, np.int64)})["y"]
  np.testing.assert_allclose(got, ref_roi_align(x, rois, [0, 0, 0], 2, 2, 0, 1.0, "avg", False), rtol=1e-5, atol=1e-5)
  xh, rh = x.astype(np.float16), rois.astype(np.float16)
  m = _model_in_order("RoiAlign", [("x", xh, False), ("rois", rh, True), ("bi", np.zeros(3, np.int64), True)], opset=16, output_height=2,
                      output_width=3, sampling_ratio=2)
  got = tox.load(m).run({"x": xh})["y"]
  assert got.dtype == np.float16
  np.testing.assert_allclose(got.astype(np.float64), ref_roi_align(xh, rh, [0, 0, 0], 2, 3, 2, 1.0, "avg", True), rtol=2e-3, atol=2e-3)
  x, rois, _ = _roi_inputs(rng, (2, 1, 5, 5), 2)
  m = _model_in_order("RoiAlign", [("x", x, False), ("rois", rois, False), ("bi", np.zeros(2, np.int64), False)], opset=16, sampling_ratio=1)
  with pytest.raises(IndexError, match=r"'sp' \(op RoiAlign.*index 2 is out of range"):
    tox.load(m).run({"x": x, "rois": rois, "bi": np.array([0, 2], np.int64)})
  m = _model_in_order("RoiAlign", [("x", x, False), ("rois", rois, False), ("bi", np.zeros(2, np.int64), False)], opset=16, mode="median")
  with pytest.raises(NotImplementedError, match=r"'sp' \(op RoiAlign.*mode 'median'"):
    tox.load(m).run({"x": x, "rois": rois, "bi": np.array([0, 1], np.int64)})

def test_roi_align_matches_onnxruntime():
  rng = np.random.default_rng(9)
  x, rois, bidx = _roi_inputs(rng)
  feeds = {"x": x, "rois": rois, "bi": bidx}
  for ctm, ratio in itertools.product(("half_pixel", "output_half_pixel"), (0, 2)):
    m = _model_in_order("RoiAlign", [("x", x, False), ("rois", rois, False), ("bi", bidx, False)], opset=16, coordinate_transformation_mode=ctm,
                        output_height=3, output_width=2, sampling_ratio=ratio, spatial_scale=0.5)
    np.testing.assert_allclose(tox.load(m).run(feeds)["y"], _ort(m, feeds), rtol=1e-4, atol=1e-5)

# ---- Col2Im --------------------------------------------------------------------------------------------
def ref_col2im(x, img, blk, st, pads, dil):
  nd = len(img)
  N, CB, L = x.shape
  B = math.prod(blk)
  C = CB // B
  cols = [(img[d] + pads[d] + pads[nd + d] - dil[d] * (blk[d] - 1) - 1) // st[d] + 1 for d in range(nd)]
  out = np.zeros((N, C, *img))
  xr = x.astype(np.float64).reshape(N, C, B, L)
  for b, off in enumerate(itertools.product(*map(range, blk))):
    for l, pos in enumerate(itertools.product(*map(range, cols))):
      p = [pos[d] * st[d] - pads[d] + off[d] * dil[d] for d in range(nd)]
      if all(0 <= p[d] < img[d] for d in range(nd)): out[(slice(None), slice(None), *p)] += xr[:, :, b, l]
  return out

@pytest.mark.parametrize("img,blk,st,pads,dil", [([5, 6], [2, 3], [1, 1], [0, 0, 0, 0], [1, 1]), ([7, 6], [3, 2], [2, 1], [1, 0, 2, 1], [1, 2]),
                                                 ([4, 5, 6], [2, 2, 3], [1, 2, 2], [0, 1, 1, 1, 0, 1], [2, 1, 1])])
def test_col2im(img, blk, st, pads, dil):
  rng = np.random.default_rng(len(img) + sum(pads))
  nd = len(img)
  L = math.prod((img[d] + pads[d] + pads[nd + d] - dil[d] * (blk[d] - 1) - 1) // st[d] + 1 for d in range(nd))
  x = rng.standard_normal((2, 3 * math.prod(blk), L)).astype(np.float32)
  inputs = [("x", x, False), ("img", np.array(img, np.int64), True), ("blk", np.array(blk, np.int64), True)]
  m = _model_in_order("Col2Im", inputs, opset=18, strides=st, pads=pads, dilations=dil)
  got = tox.load(m).run({"x": x})["y"]
  np.testing.assert_allclose(got, ref_col2im(x, img, blk, st, pads, dil), rtol=1e-5, atol=1e-5)
  x1 = x[:, :math.prod(blk)]  # (onnxruntime 1.2x's N-D Col2Im is wrong past the first channel: compared on one)
  m1 = _model_in_order("Col2Im", [("x", x1, False)] + inputs[1:], opset=18, strides=st, pads=pads, dilations=dil)
  np.testing.assert_allclose(tox.load(m1).run({"x": x1})["y"], _ort(m1, {"x": x1}), rtol=1e-5, atol=1e-5)
  if len(img) == 2: np.testing.assert_allclose(got, _ort(m, {"x": x}), rtol=1e-5, atol=1e-5)
  xh = x.astype(np.float16)
  got = tox.load(_model_in_order("Col2Im", [("x", xh, False)] + inputs[1:], opset=18, strides=st, pads=pads, dilations=dil)).run({"x": xh})["y"]
  assert got.dtype == np.float16
  np.testing.assert_allclose(got.astype(np.float64), ref_col2im(xh, img, blk, st, pads, dil).astype(np.float16), rtol=1e-3, atol=1e-3)

# ---- MaxUnpool -----------------------------------------------------------------------------------------
def ref_max_unpool(x, idx, k, st, pads, out_shape=None):
  nd = len(k)
  unp = [(x.shape[2 + d] - 1) * st[d] - pads[d] - pads[nd + d] + k[d] for d in range(nd)]
  flat = np.zeros(x.shape[0] * x.shape[1] * math.prod(unp), x.dtype)
  for v, i in zip(x.reshape(-1), idx.reshape(-1)): flat[i] = v  # in order: the last wins
  y = flat.reshape(*x.shape[:2], *unp)
  if out_shape is None: return y
  out = np.zeros(out_shape, x.dtype)
  out[tuple(slice(0, u) for u in y.shape)] = y
  return out

def test_max_unpool_after_max_pool_and_with_duplicates():
  """MaxPool's indices (onnxruntime's) unpooled, 2-D and 1-D with pads; random indices with duplicates (the last
  element naming a position wins) and -0.0 kept; output_shape padding at the end; onnxruntime without output_shape."""
  rng = np.random.default_rng(2)
  x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
  vi = helper.make_tensor_value_info
  g = helper.make_graph([helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 3], strides=[2, 2])], "g",
                        [vi("x", TensorProto.FLOAT, x.shape)], [vi("p", TensorProto.FLOAT, None), vi("i", TensorProto.INT64, None)])
  sess = pytest.importorskip("onnxruntime").InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)]).SerializeToString(),
                                                              providers=["CPUExecutionProvider"])
  p, i = sess.run(None, {"x": x})
  m = _model("MaxUnpool", {"p": p, "i": i}, kernel_shape=[2, 3], strides=[2, 2])
  got = tox.load(m).run({"p": p, "i": i})["y"]
  np.testing.assert_array_equal(got, ref_max_unpool(p, i, [2, 3], [2, 2], [0] * 4))
  np.testing.assert_array_equal(got, _ort(m, {"p": p, "i": i}))
  m = _model("MaxUnpool", {"p": p, "i": i}, {"os": np.array([2, 3, 7, 8], np.int64)}, kernel_shape=[2, 3], strides=[2, 2])
  np.testing.assert_array_equal(tox.load(m).run({"p": p, "i": i})["y"], ref_max_unpool(p, i, [2, 3], [2, 2], [0] * 4, [2, 3, 7, 8]))
  x1 = rng.standard_normal((2, 2, 5)).astype(np.float32)
  x1[0, 0, 0] = -0.0
  T = 2 * 2 * ((5 - 1) * 2 - 1 - 0 + 3)
  i1 = rng.integers(0, T, x1.shape).astype(np.int64)
  i1[0, 1, :3] = i1[1, 0, 4]  # several elements to one position
  i1[0, 0, 0] = T - 1
  m = _model("MaxUnpool", {"p": x1, "i": i1}, kernel_shape=[3], strides=[2], pads=[1, 0])
  got = tox.load(m).run({"p": x1, "i": i1})["y"]
  want = ref_max_unpool(x1, i1, [3], [2], [1, 0])
  np.testing.assert_array_equal(got, want)
  assert np.signbit(got.reshape(-1)[T - 1])

def test_max_unpool_errors_name_the_node():
  x, i = np.ones((1, 1, 2, 2), np.float32), np.array([[[[0, 3], [8, 16]]]], np.int64)
  m = _model("MaxUnpool", {"p": x, "i": i}, kernel_shape=[2, 2], strides=[2, 2])
  with pytest.raises(IndexError, match=r"'sp' \(op MaxUnpool.*index 16 is out of range"): tox.load(m).run({"p": x, "i": i})
  m = _model("MaxUnpool", {"p": x, "i": i}, {"os": np.array([1, 1, 5, 5], np.int64)}, kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 0, 0])
  with pytest.raises(NotImplementedError, match=r"'sp' \(op MaxUnpool.*output_shape with non-zero pads"): tox.load(m).run({"p": x, "i": i})
  m = _model("MaxUnpool", {"p": x, "i": i}, {"os": np.array([1, 1, 3, 5], np.int64)}, kernel_shape=[2, 2], strides=[2, 2])
  with pytest.raises(NotImplementedError, match=r"'sp' \(op MaxUnpool.*smaller than the unpooled"): tox.load(m).run({"p": x, "i": i})

# ---- LRN -----------------------------------------------------------------------------------------------
def ref_lrn(x, size, alpha, beta, bias):
  xd = x.astype(np.float64)
  C = x.shape[1]
  sq = np.zeros_like(xd)
  for c in range(C):
    lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + math.ceil((size - 1) / 2))
    sq[:, c] = (xd[:, lo:hi + 1] ** 2).sum(1)
  return xd / (bias + alpha / size * sq) ** beta

@pytest.mark.parametrize("size", [1, 2, 5])
def test_lrn(size):
  rng = np.random.default_rng(size)
  x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32) * 3
  m = _model("LRN", {"x": x}, opset=13, size=size, alpha=0.3, beta=0.6, bias=1.5)
  got = tox.load(m).run({"x": x})["y"]
  np.testing.assert_allclose(got, ref_lrn(x, size, 0.3, 0.6, 1.5), rtol=1e-5)
  xh = x.astype(np.float16)
  goth = tox.load(_model("LRN", {"x": xh}, opset=13, size=size)).run({"x": xh})["y"]
  assert goth.dtype == np.float16
  np.testing.assert_allclose(goth.astype(np.float64), ref_lrn(xh, size, 1e-4, 0.75, 1.0).astype(np.float16), rtol=1e-3)
  np.testing.assert_allclose(got, _ort(m, {"x": x}), rtol=1e-5)  # (onnxruntime takes odd sizes only)
