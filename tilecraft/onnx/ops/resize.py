"""ONNX Resize (opsets 10-19 semantics: nearest/linear/cubic, every coordinate_transformation_mode,
nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value, axes, keep_aspect_ratio_policy) and
the deprecated Upsample. Contract: the output size and, per resized axis, the (out, in) interpolation
weights depend only on shapes, so they are computed in numpy (float64) at build time; nearest is an
exact one-hot select, linear and cubic a contraction with the weight matrix; axes are resized one at a
time (the N-d interpolation is separable). antialias=1 stretches the linear/cubic kernel by 1/scale
when downsampling."""
from __future__ import annotations
import math
from typing import Any, Optional
import numpy as np
from tilecraft.dtype import dtypes
from tilecraft.onnx.ops.common import ints, norm_axis, select_sum
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

def _coord(mode: str, o: np.ndarray, scale: float, in_len: int, out_len: int, roi: tuple[float, float]) -> np.ndarray:
  if mode == "half_pixel": return (o + 0.5) / scale - 0.5
  if mode == "half_pixel_symmetric":
    adj = out_len / (scale * in_len)
    center = in_len / 2
    return center * (1 - adj) + (o + 0.5) / scale - 0.5
  if mode == "pytorch_half_pixel": return (o + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(o)
  if mode == "align_corners":  # the resized length is in_len * scale (not rounded), as in the reference
    lr = in_len * scale
    return o * (in_len - 1) / (lr - 1) if lr > 1 else np.zeros_like(o)
  if mode == "asymmetric": return o / scale
  if mode == "tf_crop_and_resize":
    s, e = roi
    if out_len > 1: return s * (in_len - 1) + o * (e - s) * (in_len - 1) / (out_len - 1)
    return np.full_like(o, 0.5 * (s + e) * (in_len - 1))
  raise ValueError(mode)

def _nearest(x: np.ndarray, mode: str) -> np.ndarray:
  if mode == "round_prefer_floor": return np.where(x - np.floor(x) == 0.5, np.floor(x), np.round(x))
  if mode == "round_prefer_ceil": return np.where(x - np.floor(x) == 0.5, np.ceil(x), np.round(x))
  if mode == "floor": return np.floor(x)
  if mode == "ceil": return np.ceil(x)
  raise ValueError(mode)

def _cubic(r: float, a: float) -> list[float]:
  return [((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a, ((a + 2) * r - (a + 3)) * r * r + 1,
          ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1, ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a]

def _kernel(mode: str, t: float, a: float) -> float:
  """The interpolation kernel at distance t: the triangle (linear) or Keys' cubic with coefficient a."""
  t = abs(t)
  if mode == "linear": return max(0.0, 1.0 - t)
  if t <= 1: return ((a + 2) * t - (a + 3)) * t * t + 1
  if t < 2: return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
  return 0.0

def _weights(n: Node, mode: str, ctm: str, in_len: int, out_len: int, scale: float, roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
  """(W (out, in) float64, invalid (out,) bool: rows outside a tf_crop_and_resize crop)."""
  o = np.arange(out_len, dtype=np.float64)
  xs = _coord(ctm, o, scale, in_len, out_len, roi)
  W = np.zeros((out_len, in_len))
  invalid = np.zeros(out_len, dtype=bool)
  if ctm == "tf_crop_and_resize": invalid = (xs < 0) | (xs > in_len - 1)
  excl = n.attr("exclude_outside", 0)
  aa = bool(n.attr("antialias", 0)) and mode != "nearest" and scale < 1
  for j, x in enumerate(xs):
    if invalid[j]: continue
    if mode == "nearest":
      k = int(_nearest(np.array(x), n.attr("nearest_mode", "round_prefer_floor")))
      W[j, min(max(k, 0), in_len - 1)] = 1.0
      continue
    f = math.floor(x); r = x - f
    if aa:  # the kernel stretched by 1/scale (downsampling), normalized: every tap where it is nonzero
      rad = (1.0 if mode == "linear" else 2.0) / scale
      taps = list(range(f - math.ceil(rad) - 1, f + math.ceil(rad) + 2))
      cs = [_kernel(mode, (t - x) * scale, n.attr("cubic_coeff_a", -0.75)) for t in taps]
      if excl: cs = [c if 0 <= t < in_len else 0.0 for t, c in zip(taps, cs)]
      tot = sum(cs); cs = [c / tot for c in cs]
      for t, c in zip(taps, cs):
        if c: W[j, min(max(t, 0), in_len - 1)] += c
      continue
    if mode == "linear": taps, cs = [f, f + 1], [1 - r, r]
    else: taps, cs = [f - 1, f, f + 1, f + 2], _cubic(r, n.attr("cubic_coeff_a", -0.75))
    if excl:
      cs = [c if 0 <= t < in_len else 0.0 for t, c in zip(taps, cs)]
      s = sum(cs); cs = [c / s for c in cs]
    for t, c in zip(taps, cs): W[j, min(max(t, 0), in_len - 1)] += c
  return W, invalid

def _resize_axis(x: Tensor, a: int, W: np.ndarray, invalid: np.ndarray, nearest: bool, extrap: float) -> Tensor:
  xm = x.permute(*[j for j in range(x.ndim) if j != a], a)  # (..., in)
  if nearest:
    mask = Tensor(W > 0.5, device=x.device)  # (out, in) one-hot rows
    out = select_sum(mask, xm.unsqueeze(-2), xm.ndim)  # (..., out)
  else:
    wt = Tensor(W.T.astype(np.float64 if x.dtype == dtypes.float64 else np.float32), device=x.device)
    out = xm.cast(wt.dtype).matmul(wt).cast(x.dtype)
  if invalid.any():
    out = Tensor(invalid, device=x.device).where(Tensor(extrap, dtype=x.dtype, device=x.device), out)
  back = list(range(x.ndim - 1)); back.insert(a, x.ndim - 1)
  return out.permute(*back)

def _resize(n: Node, x: Tensor, mode: str, ctm: str, scales: Optional[list[float]], sizes: Optional[list[int]], roi: Optional[list[float]], axes: list[int]) -> Tensor:
  if mode not in ("nearest", "linear", "cubic"): raise unsupported(n, f"mode {mode}")
  in_sh = [x.shape[a] for a in axes]
  if sizes is not None:
    policy = n.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch": sc = [s / i for s, i in zip(sizes, in_sh)]
    else:
      r = [s / i for s, i in zip(sizes, in_sh)]
      k = min(r) if policy == "not_larger" else max(r)
      sc = [k] * len(axes)
      sizes = [int(np.round(k * i)) for i in in_sh]
    out_sh = list(sizes)
  else:
    sc = list(scales)
    out_sh = [int(math.floor(i * s)) for i, s in zip(in_sh, sc)]
  extrap = n.attr("extrapolation_value", 0.0)
  for j, a in enumerate(axes):
    rj = (roi[j], roi[j + len(axes)]) if roi is not None and len(roi) == 2 * len(axes) else (0.0, 1.0)
    W, inv = _weights(n, mode, ctm, in_sh[j], out_sh[j], sc[j], rj)
    if W.shape[0] == W.shape[1] and np.array_equal(W, np.eye(W.shape[0])) and not inv.any(): continue
    x = _resize_axis(x, a, W, inv, mode == "nearest", extrap)
  return x

@op("Resize", since=10)
def _resize_op(n: Node, i: list) -> Tensor:
  x = i[0]
  if n.opset < 11:
    sc = [float(v) for v in np.asarray(n.static(1)).reshape(-1)]
    return _resize(n, x, n.attr("mode", "nearest"), "asymmetric", sc, None, None, list(range(x.ndim)))
  axes = [norm_axis(a, x.ndim) for a in n.attr("axes", list(range(x.ndim)))]
  roi = n.static(1) if n.has(1) else None
  roi_l = [float(v) for v in np.asarray(roi).reshape(-1)] if roi is not None and np.asarray(roi).size else None
  if roi_l is not None and len(roi_l) == 2 * x.ndim and len(axes) != x.ndim:
    roi_l = [roi_l[a] for a in axes] + [roi_l[a + x.ndim] for a in axes]
  scales = n.static(2) if n.has(2) else None
  sizes = n.static(3) if n.has(3) else None
  if scales is not None and np.asarray(scales).size:
    sc = [float(v) for v in np.asarray(scales).reshape(-1)]
    if len(sc) == x.ndim and len(axes) != x.ndim: sc = [sc[a] for a in axes]
    return _resize(n, x, n.attr("mode", "nearest"), n.attr("coordinate_transformation_mode", "half_pixel"), sc, None, roi_l, axes)
  if sizes is None: raise unsupported(n, "neither scales nor sizes")
  sz = ints(sizes)
  if len(sz) == x.ndim and len(axes) != x.ndim: sz = [sz[a] for a in axes]
  return _resize(n, x, n.attr("mode", "nearest"), n.attr("coordinate_transformation_mode", "half_pixel"), None, sz, roi_l, axes)

@op("Upsample")
def _upsample(n: Node, i: list) -> Tensor:
  x = i[0]
  sc = [float(v) for v in (np.asarray(n.static(1)).reshape(-1) if n.opset >= 9 else n.attr("scales"))]
  mode = n.attr("mode", "nearest")
  n.attrs.setdefault("nearest_mode", "floor")
  return _resize(n, x, mode, "asymmetric", sc, None, None, list(range(x.ndim)))
