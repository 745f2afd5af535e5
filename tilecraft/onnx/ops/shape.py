"""ONNX shape, indexing and construction ops: Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Slice,
Gather, GatherElements, GatherND, Concat, Split, Pad (constant, reflect, edge, wrap), Expand, Tile,
OneHot, Range, Trilu, Shape, Size, Constant, ConstantOfShape, EyeLike, DepthToSpace, SpaceToDepth, CenterCropPad,
and the signal windows (Hann, Hamming, Blackman: constants at build time).
Contract: movement is views (reshape/permute/shrink/pad/expand); gathers with runtime indices are
one-hot selects (exact: where + sum), with known indices views; every gather's indices are guarded
(Node.check_indices: out of range is an IndexError naming the node, the axis and the index, never 0); values known at build time (Shape,
Size, Range, Constant) are returned as numpy arrays so later shape computations need no kernel."""
from __future__ import annotations
import math
from typing import Any, Optional
import numpy as np
from tilecraft.dtype import dtypes
from tilecraft.onnx.types import onnx_dtype
from tilecraft.onnx.ops.common import cat_exact, const, gather_axis, ints, norm_axis, select_sum, take_static, wrap_index
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

@op("Reshape")
def _reshape(n: Node, i: list) -> Tensor:
  x = i[0]
  shape = ints(n.static(1)) if n.opset >= 5 else list(n.attr("shape"))
  allowzero = n.attr("allowzero", 0)
  out = [x.shape[j] if (s == 0 and not allowzero) else s for j, s in enumerate(shape)]
  return x.reshape(*out) if out else x.reshape(())

@op("Transpose")
def _transpose(n: Node, i: list) -> Tensor:
  x = i[0]
  perm = n.attr("perm", list(range(x.ndim))[::-1])
  return x.permute(*perm) if x.ndim else x

@op("Flatten")
def _flatten(n: Node, i: list) -> Tensor:
  x = i[0]
  a = n.attr("axis", 1)
  a = a + x.ndim if a < 0 else a
  lead = math.prod(x.shape[:a])
  return x.reshape(lead, math.prod(x.shape[a:]))

@op("Squeeze")
def _squeeze(n: Node, i: list) -> Tensor:
  x = i[0]
  axes = ints(n.static(1)) if n.opset >= 13 else list(n.attr("axes", []))
  if not axes: return x.reshape(*[s for s in x.shape if s != 1])
  axes = {norm_axis(a, x.ndim) for a in axes}
  if any(x.shape[a] != 1 for a in axes): raise unsupported(n, f"squeezing an axis that isn't 1 (shape {x.shape}, axes {sorted(axes)})")
  return x.reshape(*[s for j, s in enumerate(x.shape) if j not in axes])

@op("Unsqueeze")
def _unsqueeze(n: Node, i: list) -> Tensor:
  x = i[0]
  axes = ints(n.static(1)) if n.opset >= 13 else list(n.attr("axes"))
  nd = x.ndim + len(axes)
  axes = sorted(norm_axis(a, nd) for a in axes)
  shape = list(x.shape)
  for a in axes: shape.insert(a, 1)
  return x.reshape(*shape)

@op("Slice")
def _slice(n: Node, i: list) -> Tensor:
  x = i[0]
  if n.opset >= 10:
    starts, ends = ints(n.static(1)), ints(n.static(2))
    axes = ints(n.static(3)) if n.has(3) else list(range(len(starts)))
    steps = ints(n.static(4)) if n.has(4) else [1] * len(starts)
  else:
    starts, ends = list(n.attr("starts")), list(n.attr("ends"))
    axes, steps = list(n.attr("axes", range(len(starts)))), [1] * len(starts)
  idx: list[Any] = [slice(None)] * x.ndim
  for s, e, a, st in zip(starts, ends, axes, steps):
    if st == 0: raise unsupported(n, "step 0")
    idx[norm_axis(a, x.ndim)] = slice(s, e, st)
  return x[tuple(idx)] if x.ndim else x

@op("Gather")
def _gather(n: Node, i: list) -> Tensor:
  x, idx = i
  a = norm_axis(n.attr("axis", 0), x.ndim)
  L = x.shape[a]
  n.check_indices(1, L, a)
  known = n.const(1)  # (indices from a graph input stay runtime ones: the built graph serves any data)
  if known is not None and known.size <= 64:
    flat = [int(v) + L if v < 0 else int(v) for v in np.asarray(known).reshape(-1)]
    t = take_static(x, flat, a)
    return t.reshape(*x.shape[:a], *known.shape, *x.shape[a + 1:])
  # a constant table indexed by a graph input (an embedding lookup by token ids): rows copied on the host in each
  # call (after the index guard), instead of a one-hot select over the whole table (BERT-like's 2000-word
  # vocabulary: 17 ms a call, 5x onnxruntime's whole model)
  if n.const(0) is not None and (t := n.host([0, 1], lambda table, ix: np.take(table, np.where(ix < 0, ix + L, ix), axis=a))) is not None:
    return t.cast(x.dtype) if t.dtype != x.dtype else t
  return gather_axis(x, wrap_index(idx, L), a)

@op("GatherElements")
def _gather_elements(n: Node, i: list) -> Tensor:
  x, idx = i
  a = norm_axis(n.attr("axis", 0), x.ndim)
  L = x.shape[a]
  n.check_indices(1, L, a)
  idx = wrap_index(idx, L)
  xs = x.shrink(tuple(None if j == a else (0, idx.shape[j]) for j in range(x.ndim)))
  xm = xs.permute(*[j for j in range(x.ndim) if j != a], a).unsqueeze(a)  # (..., 1 at a, ..., L)
  oh = idx.unsqueeze(-1) == Tensor.arange(L, dtype=dtypes.int64, device=x.device)
  return select_sum(oh, xm, x.ndim)

@op("GatherND")
def _gather_nd(n: Node, i: list) -> Tensor:
  x, idx = i
  b = n.attr("batch_dims", 0)
  q = idx.shape[-1]
  B = x.shape[:b]
  sub = x.shape[b:b + q]
  rest = x.shape[b + q:]
  M = math.prod(sub)
  lin = None
  stride = 1
  for j in range(q - 1, -1, -1):
    n.check_indices(1, sub[j], b + j, column=j)
    c = wrap_index(idx[..., j], sub[j]) * stride
    lin = c if lin is None else lin + c
    stride *= sub[j]
  I = idx.shape[b:-1]
  xr = x.reshape(*B, *([1] * len(I)), M, *rest)
  oh = (lin.unsqueeze(-1) == Tensor.arange(M, dtype=dtypes.int64, device=x.device)).reshape(*idx.shape[:-1], M, *([1] * len(rest)))
  return select_sum(oh, xr, b + len(I))

@op("Concat")
def _concat(n: Node, i: list) -> Tensor:
  ts = [t for t in i if t is not None]
  a = norm_axis(n.attr("axis"), ts[0].ndim)
  return cat_exact(ts, a)

@op("Split")
def _split(n: Node, i: list) -> list:
  x = i[0]
  a = norm_axis(n.attr("axis", 0), x.ndim)
  nout = len(n.outputs)
  sizes = ints(n.static(1)) if (n.opset >= 13 and n.has(1)) else list(n.attr("split", []))
  if not sizes:
    L = x.shape[a]
    if n.opset >= 18 and n.attr("num_outputs") is not None:
      k = int(n.attr("num_outputs"))
      c = -(-L // k)
      sizes = [c] * (L // c) + ([L % c] if L % c else [])
    else:
      sizes = [L // nout] * nout
  outs, off = [], 0
  for s in sizes:
    sl = [None] * x.ndim; sl[a] = (off, off + s)
    outs.append(x.shrink(tuple(sl)))
    off += s
  return outs

def _pad_axis(x: Tensor, a: int, lo: int, hi: int, mode: str, value: Any) -> Tensor:
  L = x.shape[a]
  def piece(s: int, e: int) -> Tensor:
    sl = [None] * x.ndim; sl[a] = (s, e)
    return x.shrink(tuple(sl))
  if mode == "edge":
    left = [piece(0, 1).expand(*[lo if j == a else s for j, s in enumerate(x.shape)])] if lo else []
    right = [piece(L - 1, L).expand(*[hi if j == a else s for j, s in enumerate(x.shape)])] if hi else []
    return cat_exact(left + [x] + right, a)
  if mode == "reflect":
    idx = list(range(lo, 0, -1)) + list(range(L)) + list(range(L - 2, L - 2 - hi, -1))
    period = 2 * (L - 1) if L > 1 else 1
    fix = [(abs(v) % period) for v in idx]
    fix = [v if v < L else period - v for v in fix]
    return take_static(x, fix, a)
  if mode == "wrap":
    idx = [v % L for v in range(-lo, L + hi)]
    return take_static(x, idx, a)
  raise ValueError(mode)

@op("Pad")
def _pad(n: Node, i: list) -> Tensor:
  x = i[0]
  mode = n.attr("mode", "constant")
  if n.opset >= 11:
    pads = ints(n.static(1))
    v = n.static(2) if n.has(2) else None
    value = np.asarray(v).reshape(-1)[0].item() if v is not None and np.asarray(v).size else 0
    axes = ints(n.static(3)) if n.has(3) else list(range(x.ndim))
  else:
    pads, value, axes = list(n.attr("pads")), n.attr("value", 0.0), list(range(x.ndim))
  axes = [norm_axis(a, x.ndim) for a in axes]
  k = len(axes)
  pw = [(0, 0)] * x.ndim
  for j, a in enumerate(axes): pw[a] = (pads[j], pads[j + k])
  if mode == "constant": return x.pad(tuple(pw), value=value if value == value or dtypes.is_float(x.dtype) else 0)
  if mode not in ("reflect", "edge", "wrap"): raise unsupported(n, f"mode {mode}")
  # negative widths crop first
  crop = tuple((max(0, -lo), x.shape[j] - max(0, -hi)) for j, (lo, hi) in enumerate(pw))
  x = x.shrink(crop)
  for a, (lo, hi) in enumerate(pw):
    if lo > 0 or hi > 0:
      if mode == "reflect" and x.shape[a] < 2: raise unsupported(n, "reflect padding of an axis shorter than 2")
      x = _pad_axis(x, a, max(lo, 0), max(hi, 0), mode, value)
  return x

@op("Expand")
def _expand(n: Node, i: list) -> Tensor:
  x = i[0]
  shape = ints(n.static(1))
  nd = max(len(shape), x.ndim)
  xs = [1] * (nd - x.ndim) + list(x.shape)
  ss = [1] * (nd - len(shape)) + shape
  out = []
  for a, b in zip(xs, ss):
    if a != b and a != 1 and b != 1: raise unsupported(n, f"shapes {x.shape} and {shape} don't broadcast")
    out.append(a if b == 1 else b)
  return x.reshape(*xs).expand(*out)

@op("Tile")
def _tile(n: Node, i: list) -> Tensor:
  x = i[0]
  reps = ints(n.static(1))
  for a, r in enumerate(reps):
    if r == 1: continue
    s = x.shape
    x = x.unsqueeze(a).expand(*s[:a], r, *s[a:]).reshape(*s[:a], r * s[a], *s[a + 1:])
  return x

@op("OneHot")
def _onehot(n: Node, i: list) -> Tensor:
  idx, vals = i[0], i[2]
  depth = int(np.asarray(n.static(1)).reshape(-1)[0])
  a = n.attr("axis", -1)
  nd = idx.ndim + 1
  a = norm_axis(a, nd)
  ix = idx if dtypes.is_int(idx.dtype) else idx.cast(dtypes.int64)  # (floats truncate, as the spec's reference)
  ix = ix.cast(dtypes.int64)
  ix = (ix < 0).where(ix + depth, ix).unsqueeze(a)
  sh = [1] * nd; sh[a] = depth
  hit = ix == Tensor.arange(depth, dtype=dtypes.int64, device=idx.device).reshape(*sh)
  return hit.where(vals[1], vals[0]).cast(vals.dtype)

@op("Range")
def _range(n: Node, i: list) -> np.ndarray:
  """start + i * delta for i < max(ceil((limit - start) / delta), 0), in numpy at build time (from opset 27,
  float16/bfloat16 are computed in float32 with stash_type 1, the default)."""
  s, l, d = (np.asarray(n.static(j)).reshape(()) for j in range(3))
  dt = s.dtype
  cnt = max(int(math.ceil((float(l) - float(s)) / float(d))), 0)
  if dt.kind in "iu": return (s + np.arange(cnt, dtype=np.int64) * d).astype(dt)
  if dt.name == "bfloat16" or (dt == np.float16 and n.opset >= 27 and n.attr("stash_type", 1) == 1):
    f = np.float32
    return (np.float32(s) + np.arange(cnt, dtype=f) * np.float32(d)).astype(dt)
  return (s + np.arange(cnt, dtype=dt) * d).astype(dt)
op("Range", since=27)(_range)

@op("Trilu")
def _trilu(n: Node, i: list) -> Tensor:
  x = i[0]
  k = int(np.asarray(n.static(1)).reshape(-1)[0]) if n.has(1) else 0
  R, C = x.shape[-2], x.shape[-1]
  r = Tensor.arange(R, dtype=dtypes.int64, device=x.device).reshape(R, 1)
  c = Tensor.arange(C, dtype=dtypes.int64, device=x.device).reshape(1, C)
  keep = (c - r >= k) if n.attr("upper", 1) else (c - r <= k)
  return keep.where(x, x._const_like(0)).cast(x.dtype)

@op("Shape")
def _shape(n: Node, i: list) -> np.ndarray:
  sh = list(i[0].shape)
  s, e = n.attr("start", 0), n.attr("end")
  return np.array(sh[slice(s, e)], dtype=np.int64)

@op("Size")
def _size(n: Node, i: list) -> np.ndarray: return np.array(math.prod(i[0].shape), dtype=np.int64)

@op("Constant")
def _constant(n: Node, i: list) -> np.ndarray:
  a = n.attrs
  if "value" in a: return np.asarray(a["value"])
  if "value_float" in a: return np.array(a["value_float"], dtype=np.float32)
  if "value_floats" in a: return np.array(a["value_floats"], dtype=np.float32)
  if "value_int" in a: return np.array(a["value_int"], dtype=np.int64)
  if "value_ints" in a: return np.array(a["value_ints"], dtype=np.int64)
  raise unsupported(n, f"attribute {sorted(a)}")

@op("ConstantOfShape")
def _constant_of_shape(n: Node, i: list) -> Tensor:
  shape = ints(n.static(0))
  v = n.attr("value")
  val = np.asarray(v).reshape(-1)[0] if v is not None else np.float32(0)
  dt = dtypes.from_np(val.dtype)
  return Tensor.full(tuple(shape), val.item(), dt, n.device or None)

@op("EyeLike")
def _eyelike(n: Node, i: list) -> Tensor:
  x = i[0]
  dt = onnx_dtype(n.attr("dtype"), n.describe()) if n.attr("dtype") is not None else x.dtype
  R, C = x.shape
  k = n.attr("k", 0)
  r = Tensor.arange(R, dtype=dtypes.int64, device=x.device).reshape(R, 1)
  c = Tensor.arange(C, dtype=dtypes.int64, device=x.device).reshape(1, C)
  return (c - r == k).cast(dt)

@op("DepthToSpace")
def _d2s(n: Node, i: list) -> Tensor:
  x = i[0]
  b = n.attr("blocksize")
  N, C, H, W = x.shape
  if n.attr("mode", "DCR") == "DCR":
    t = x.reshape(N, b, b, C // (b * b), H, W).permute(0, 3, 4, 1, 5, 2)
  else:
    t = x.reshape(N, C // (b * b), b, b, H, W).permute(0, 1, 4, 2, 5, 3)
  return t.reshape(N, C // (b * b), H * b, W * b)

@op("SpaceToDepth")
@op("SpaceToDepth", since=28)
def _s2d(n: Node, i: list) -> Tensor:
  x = i[0]
  b = n.attr("blocksize")
  N, C, H, W = x.shape
  if n.attr("mode", "DCR") == "CRD": t = x.reshape(N, C, H // b, b, W // b, b).permute(0, 1, 3, 5, 2, 4)  # (opset 28)
  else: t = x.reshape(N, C, H // b, b, W // b, b).permute(0, 3, 5, 1, 2, 4)
  return t.reshape(N, C * b * b, H // b, W // b)

@op("CenterCropPad", since=18)
def _center_crop_pad(n: Node, i: list) -> Tensor:
  """Each of `axes` (default all) cropped or zero-padded to its target size, centered: an odd difference
  puts the extra row at the end (crop from floor(d/2), pad floor(d/2) before)."""
  x = i[0]
  target = ints(n.static(1))
  axes = [norm_axis(a, x.ndim) for a in n.attr("axes", list(range(x.ndim)))]
  if len(axes) != len(target): raise unsupported(n, f"{len(target)} target sizes for {len(axes)} axes")
  crop: list = [None] * x.ndim
  pad = [(0, 0)] * x.ndim
  for a, t in zip(axes, target):
    d = x.shape[a] - t
    if d > 0: crop[a] = (d // 2, d // 2 + t)
    elif d < 0: pad[a] = (-d // 2, -d - (-d // 2))
  return x.shrink(tuple(crop)).pad(pad).cast(x.dtype)

@op("HannWindow", "HammingWindow", "BlackmanWindow", since=17)
def _window(n: Node, i: list) -> np.ndarray:
  """A signal window of `size` points, at build time in float64 (then output_datatype, float by default):
  Hann sin^2(pi k / N), Hamming 25/46 - 21/46 cos(2 pi k / N), Blackman 0.42 - 0.5 cos(2 pi k / N) +
  0.08 cos(4 pi k / N), with N = size (periodic, the default) or size - 1 (symmetric)."""
  size = int(np.asarray(n.static(0)).reshape(()))
  k = np.arange(size, dtype=np.float64)
  N = size if n.attr("periodic", 1) else size - 1
  ph = 2 * np.pi * k / N if N > 0 else np.zeros_like(k)
  if n.op == "HannWindow": w = np.sin(ph / 2) ** 2
  elif n.op == "HammingWindow": w = 25 / 46 - (21 / 46) * np.cos(ph)
  else: w = 0.42 - 0.5 * np.cos(ph) + 0.08 * np.cos(2 * ph)
  dt = onnx_dtype(n.attr("output_datatype", 1), f"{n.op} output_datatype")
  if dt.np is None: raise unsupported(n, f"output_datatype {dt.name}")
  return w.astype(dt.np)
