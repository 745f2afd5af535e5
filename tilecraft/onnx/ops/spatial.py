"""ONNX spatial sampling and rearranging ops: GridSample (opset 16: 4-D, bilinear/nearest/bicubic; opset 20 on: N-D,
linear/nearest/cubic, either spelling accepted), AffineGrid (2-D and 3-D), RoiAlign (avg/max, half_pixel and
output_half_pixel, fixed or adaptive sampling_ratio, spatial_scale, output size), Col2Im (N-D, strides, pads,
dilations) and MaxUnpool (with and without output_shape). LRN is nn.py's (registered there).

Contract. The semantics are the ONNX reference implementation's (onnx/reference/ops), which the conformance outputs
follow: GridSample's nearest mode rounds half to even before padding_mode applies; border/reflection clamp or reflect
the coordinate, then every tap index (for linear and nearest the same answers as PyTorch's and onnxruntime's).
RoiAlign's max mode is the max over samples of the largest weighted corner. MaxUnpool's indices index the unpooled
shape ((in - 1) * stride - pads + kernel), which output_shape then pads at the end (onnxruntime reads them as indices
into output_shape instead). Float16/bfloat16 compute in float32 and round once; float64 stays.

How: data-dependent coordinates become integer tap indices and weights as tensors; the taps are gathered with exact
one-hot selects (a compare fused into a reduce: where(index == position, x, 0) summed, so inf/nan elsewhere never
leak). GridSample selects every corner of every output point over the flattened spatial axes: cost N x C x outputs x
corners x input pixels. RoiAlign's samples are separable, so it selects rows, then columns: R x C x samples x (H x W
+ samples x W). MaxUnpool selects, for each output element, the last input element whose index names it: 2 x output
elements x input elements. These are fine for the sizes models use these ops at (a few thousand pixels), slow beyond.
Col2Im is a sum of strided, padded views (no data-dependent indexing); AffineGrid a product with a build-time grid.
Shapes (AffineGrid's size, Col2Im's shapes, MaxUnpool's output_shape, RoiAlign's rois under adaptive sampling) are
read at build time (n.static). A nan grid coordinate makes that GridSample output nan (the reference has no answer).

Raises: unsupported() for a mode or padding mode the spec doesn't name, GridSample linear/cubic on integer data,
opset-16 GridSample on non-4-D input, GridSample cubic with border or reflection padding (the reference clamps or
reflects the coordinate before the taps, PyTorch and onnxruntime only the taps: they differ within 2 pixels of a
border), AffineGrid with align_corners=1 and a spatial size of 1 (the reference and onnxruntime disagree),
MaxUnpool with both output_shape and non-zero pads (the spec ignores the pads, the reference uses them) or an
output_shape smaller than the unpooled shape; ValueError naming the node for inconsistent shapes; IndexError naming
the node for a RoiAlign batch index or a MaxUnpool index out of range (negative ones count from the end)."""
from __future__ import annotations
import itertools, math
from typing import Optional
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.onnx.ops.common import gather_axis, ints, select_sum, wide, wrap_index
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

def _cdt(*ts: Tensor) -> DType:
  """The float dtype sampling math runs in: float64 if any operand is, else float32."""
  return dtypes.float64 if any(t.dtype == dtypes.float64 for t in ts) else dtypes.float32

def _bad(n: Node, why: str) -> ValueError:
  return ValueError(f"tilecraft.onnx: {n.describe()}: {why}")

# ---- GridSample ----------------------------------------------------------------------------------------
def _reflect(u: Tensor, lo: float, hi: float) -> Tensor:
  """u reflected by the borders lo/hi until inside (the reference's rule: whole periods off, then mirrored)."""
  rng = hi - lo
  below = u < lo
  dx = below.where(lo - u, u - hi)
  k = (dx / rng).floor()
  r = dx - k * rng
  even = (k - (k / 2).floor() * 2) == 0
  return (below == even).where(r + lo, hi - r)

def _cubic(t: Tensor) -> list[Tensor]:
  """Keys' cubic convolution weights (A = -0.75) of the taps at floor-1 .. floor+2 for the fraction t in [0, 1)."""
  A = -0.75
  # (constants added, never subtracted: the C renderer writes x - (-3.75) as "x--3.75f", which doesn't compile)
  def far(s: Tensor) -> Tensor: return ((s * A + (-5 * A)) * s + 8 * A) * s + (-4 * A)
  def near(s: Tensor) -> Tensor: return ((s * (A + 2) + (-(A + 3))) * s) * s + 1
  return [far(t + 1), near(t), near(1 - t), far(2 - t)]

def _tap(f: Tensor, L: int, pm: str, lo: float, hi: float) -> tuple[Tensor, Tensor]:
  """A tap position f (integral floats) -> (int64 index into 0..L-1, valid); an invalid tap reads 0 (zeros mode)."""
  ok = f == f  # not nan
  if pm == "zeros":
    valid = (f >= 0) & (f < L)
    return valid.where(f, 0).cast(dtypes.int64), valid
  if pm == "border": g = f.clip(0, L - 1)
  else: g = _reflect(f, lo, hi) if hi > lo else f * 0
  return ok.where(g, 0).cast(dtypes.int64), ok

@op("GridSample", since=16)
def _grid_sample(n: Node, i: list) -> Tensor:
  x, grid = i[0], i[1]
  mode, pm, ac = n.attr("mode", "linear" if n.opset >= 20 else "bilinear"), n.attr("padding_mode", "zeros"), bool(n.attr("align_corners", 0))
  kind = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic", "bicubic": "cubic"}.get(mode)
  if kind is None: raise unsupported(n, f"mode {mode!r}")
  if pm not in ("zeros", "border", "reflection"): raise unsupported(n, f"padding_mode {pm!r}")
  r = x.ndim - 2
  if r < 1: raise unsupported(n, f"input of {x.ndim} dims")
  if n.opset < 20 and r != 2: raise unsupported(n, "before opset 20 GridSample takes 4-D input only")
  if kind != "nearest" and not dtypes.is_float(x.dtype): raise unsupported(n, f"{mode} interpolation of {x.dtype.name} data")
  if kind == "cubic" and pm != "zeros":  # the reference pads the coordinate, then each tap; PyTorch and onnxruntime pad only the taps
    raise unsupported(n, f"{mode} with padding_mode {pm!r} (the ONNX reference and onnxruntime/PyTorch disagree near the border)")
  if grid.ndim != r + 2 or grid.shape[-1] != r or grid.shape[0] != x.shape[0]:
    raise _bad(n, f"grid of shape {grid.shape} for input of shape {x.shape}")
  N, C, sp, osp = x.shape[0], x.shape[1], tuple(x.shape[2:]), tuple(grid.shape[1:-1])
  P, S = math.prod(osp), math.prod(sp)
  if N * C * P == 0 or S == 0:
    if N * C * P and S == 0: raise _bad(n, f"sampling an empty input of shape {x.shape}")
    return Tensor.full((N, C, *osp), 0, x.dtype, x.device)
  dt = _cdt(x, grid)
  g = grid.cast(dt).reshape(N, P, r)
  idx, valid, wts = None, None, []
  stride = 1
  for d in range(r - 1, -1, -1):  # the last spatial axis is the grid's first coordinate
    L = sp[d]
    c = g.shrink((None, None, (r - 1 - d, r - d))).reshape(N, P)
    u = (c + 1) / 2 * (L - 1) if ac else ((c + 1) * L - 1) / 2
    lo, hi = (0.0, L - 1.0) if ac else (-0.5, L - 0.5)
    if kind == "nearest": u = u.round()
    if pm != "zeros":
      out = (u < lo) | (u > hi)
      u = out.where(u.clip(0, L - 1) if pm == "border" else (_reflect(u, lo, hi) if hi > lo else u * 0), u)
    if kind == "nearest": taps, w = [u], None
    else:
      f = u.floor()
      t = u - f
      taps = [f, f + 1] if kind == "linear" else [f - 1, f, f + 1, f + 2]
      w = [1 - t, t] if kind == "linear" else _cubic(t)
    k = len(taps)
    tv = [_tap(tp, L, pm, lo, hi) for tp in taps]
    shp = (N, P, *([1] * d), k, *([1] * (r - 1 - d)))
    ti = Tensor.stack(*[a for a, _ in tv], axis=-1).reshape(*shp) * stride
    tk = Tensor.stack(*[b for _, b in tv], axis=-1).reshape(*shp)
    idx = ti if idx is None else idx + ti
    valid = tk if valid is None else valid & tk
    if w is not None: wts.insert(0, Tensor.stack(*w, axis=-1))
    stride *= L
  K = math.prod(idx.shape[2:])
  idx = valid.where(idx, -1).reshape(N, 1, P, K, 1)  # an invalid corner matches no position: it reads 0
  oh = idx == Tensor.arange(S, dtype=dtypes.int64, device=x.device)
  v = select_sum(oh, x.reshape(N, C, 1, 1, S), 4)  # (N, C, P, K)
  if kind == "nearest": y = v.reshape(N, C, P)
  else:
    y = v.cast(dt).reshape(N, C, P, *([wts[0].shape[-1]] * r))
    for d in range(r - 1, -1, -1):  # the innermost axis first, as the reference nests them
      y = (y * wts[d].reshape(N, 1, P, *([1] * d), wts[d].shape[-1])).sum(-1)
  nan = (g != g).max(-1).reshape(N, 1, P)
  if dtypes.is_float(x.dtype): y = nan.where(math.nan, y.cast(dt))
  return y.reshape(N, C, *osp).cast(x.dtype)

# ---- AffineGrid ----------------------------------------------------------------------------------------
def _linspace(L: int, ac: bool) -> np.ndarray:
  """The base grid's positions along an axis of L (as the reference's arange: start + i * step, in float64)."""
  if ac: return -1.0 + np.arange(L) * (2.0 / (L - 1))
  step = 2.0 / L
  return (-1 + step / 2) + np.arange(L) * step

@op("AffineGrid", since=20)
def _affine_grid(n: Node, i: list) -> Tensor:
  theta = i[0]
  size = ints(n.static(1))
  ac = bool(n.attr("align_corners", 0))
  r = len(size) - 2
  if r not in (2, 3): raise unsupported(n, f"size of {len(size)} values (2-D: 4, 3-D: 5)")
  N = theta.shape[0]
  if tuple(theta.shape) != (N, r, r + 1) or size[0] != N: raise _bad(n, f"theta of shape {theta.shape} for size {size}")
  sp = size[2:]
  if any(L < 0 for L in sp): raise _bad(n, f"size {size}")
  if ac and 1 in sp: raise unsupported(n, "align_corners=1 with a spatial size of 1 (no position is both corners)")
  if N == 0 or 0 in sp: return Tensor.full((N, *sp, r), 0, theta.dtype, theta.device)
  # homogeneous positions (x, y[, z], 1): x runs along the last axis
  axes = np.meshgrid(*[_linspace(L, ac) for L in sp], indexing="ij")
  base = np.stack([axes[r - 1 - j] for j in range(r)] + [np.ones(sp)], axis=-1).reshape(-1, r + 1)
  dt = _cdt(theta)
  bt = Tensor(base.astype(np.float64 if dt == dtypes.float64 else np.float32), dtype=dt, device=theta.device)
  out = (theta.cast(dt).reshape(N, 1, r, r + 1) * bt.reshape(1, -1, 1, r + 1)).sum(-1)
  return out.reshape(N, *sp, r).cast(theta.dtype)

# ---- RoiAlign ------------------------------------------------------------------------------------------
def _roi_axis(start: Tensor, bins: Tensor, grid: Tensor, out: int, G: int, L: int) -> tuple[Tensor, Tensor, Tensor]:
  """Along one axis, for every roi, output bin and sample: the (low, high) tap indices (R, out*G, 2) int64 and weights
  (R, out, G, 2); a sample outside [-1, L] weighs 0 and reads index 0, as in the reference."""
  R, dt = start.shape[0], start.dtype
  ph = Tensor.arange(out, dtype=dt, device=start.device).reshape(1, out, 1)
  s = Tensor.arange(G, dtype=dt, device=start.device).reshape(1, 1, G)
  st, b, gr = start.reshape(R, 1, 1), bins.reshape(R, 1, 1), grid.reshape(R, 1, 1)
  y = st + ph * b + (s + 0.5) * b / gr
  oob = (y < -1) | (y > L)
  yv = y.maximum(0)
  fl = yv.floor()
  top = fl >= L - 1
  low = top.where(L - 1, fl)
  high = top.where(L - 1, fl + 1)
  yv = top.where(L - 1, yv)
  ly = yv - low
  hy = 1 - ly
  safe = oob | (yv != yv)
  ids = Tensor.stack(safe.where(0, low), safe.where(0, high), axis=-1).cast(dtypes.int64).reshape(R, out * G * 2)
  w = Tensor.stack(oob.where(0, hy), oob.where(0, ly), axis=-1)
  return ids, w

@op("RoiAlign", since=10)
def _roi_align(n: Node, i: list) -> Tensor:
  x, rois, bidx = i[0], i[1], i[2]
  mode = n.attr("mode", "avg")
  ctm = n.attr("coordinate_transformation_mode", "half_pixel") if n.opset >= 16 else "output_half_pixel"
  if mode not in ("avg", "max"): raise unsupported(n, f"mode {mode!r}")
  if ctm not in ("half_pixel", "output_half_pixel"): raise unsupported(n, f"coordinate_transformation_mode {ctm!r}")
  oh, ow = int(n.attr("output_height", 1)), int(n.attr("output_width", 1))
  ratio, scale = int(n.attr("sampling_ratio", 0)), float(n.attr("spatial_scale", 1.0))
  if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or bidx.ndim != 1 or bidx.shape[0] != rois.shape[0]:
    raise _bad(n, f"X {x.shape}, rois {rois.shape}, batch_indices {bidx.shape}")
  N, C, H, W = x.shape
  R = rois.shape[0]
  if R * C * oh * ow == 0: return Tensor.full((R, C, oh, ow), 0, x.dtype, x.device)
  n.check_indices(2, N, 0)
  dt = _cdt(x)
  half = ctm == "half_pixel"
  off = 0.5 if half else 0.0
  def box(rv):  # (start_w, start_h, width, height) of each roi: numpy (rois read at build time) or Tensors alike
    sw, sh, ew, eh = [rv[:, j] * scale - off for j in range(4)]
    rw, rh = ew - sw, eh - sh
    if not half: rw, rh = [np.maximum(v, 1.0) if isinstance(v, np.ndarray) else v.maximum(1.0) for v in (rw, rh)]  # malformed rois are 1x1
    return sw, sh, rw, rh
  sw, sh, rw, rh = box(rois.cast(dt))
  if ratio > 0: gh_np = gw_np = np.full(R, ratio, np.int64)
  else:  # adaptive: the number of samples per bin depends on each roi's size, read at build time
    _, _, rwn, rhn = box(np.asarray(n.static(1), dtype=np.float64 if dt == dtypes.float64 else np.float32).reshape(R, 4))
    gh_np, gw_np = [np.maximum(np.ceil(v / o), 0).astype(np.int64) for v, o in ((rhn, oh), (rwn, ow))]
  Gh, Gw = max(int(gh_np.max()), 1), max(int(gw_np.max()), 1)
  npdt = np.float64 if dt == dtypes.float64 else np.float32
  gh = Tensor(np.maximum(gh_np, 1).astype(npdt), dtype=dt, device=x.device)
  gw = Tensor(np.maximum(gw_np, 1).astype(npdt), dtype=dt, device=x.device)
  yi, wy = _roi_axis(sh, rh / oh, gh, oh, Gh, H)
  xi, wx = _roi_axis(sw, rw / ow, gw, ow, Gw, W)
  xr = x.expand(R, C, H, W) if N == 1 else gather_axis(x, wrap_index(bidx, N), 0)  # (R, C, H, W): each roi's image
  rows = select_sum(yi.reshape(R, 1, -1, 1, 1) == Tensor.arange(H, dtype=dtypes.int64, device=x.device).reshape(H, 1),
                    xr.reshape(R, C, 1, H, W), 3)  # (R, C, oh*Gh*2, W)
  v = select_sum(xi.reshape(R, 1, 1, -1, 1) == Tensor.arange(W, dtype=dtypes.int64, device=x.device),
                 rows.reshape(R, C, -1, 1, W), 4)  # (R, C, oh*Gh*2, ow*Gw*2)
  v = v.cast(dt).reshape(R, C, oh, Gh, 2, ow, Gw, 2)
  w = wy.reshape(R, 1, oh, Gh, 2, 1, 1, 1) * wx.reshape(R, 1, 1, 1, 1, ow, Gw, 2)
  pv = w * v
  # samples a roi doesn't have (adaptive sampling: fewer than the most any roi has) are left out
  used = (np.arange(Gh)[None, :, None] < gh_np[:, None, None]) & (np.arange(Gw)[None, None, :] < gw_np[:, None, None])  # (R, Gh, Gw)
  mask = None if used.all() else Tensor(used.reshape(R, 1, 1, Gh, 1, Gw), dtype=dtypes.bool, device=x.device)
  if mode == "avg":
    s = pv.sum((4, 7))
    if mask is not None: s = mask.where(s, 0.0)
    count = Tensor(np.maximum(gh_np * gw_np, 1).astype(npdt).reshape(R, 1, 1, 1), dtype=dt, device=x.device)
    y = s.sum((3, 5)) / count
  else:
    m = pv.max((4, 7))
    if mask is not None: m = mask.where(m, -math.inf)
    y = m.max((3, 5))
    if mask is not None and not used.any(axis=(1, 2)).all():
      y = Tensor(used.any(axis=(1, 2)).reshape(R, 1, 1, 1), dtype=dtypes.bool, device=x.device).where(y, 0.0)
  return y.cast(x.dtype)

# ---- Col2Im --------------------------------------------------------------------------------------------
def _spread(t: Tensor, axis: int, s: int) -> Tensor:
  """s - 1 zeros between the elements along axis (a view of a padded tensor)."""
  L = t.shape[axis]
  if s == 1 or L <= 1: return t
  u = t.unsqueeze(axis + 1)
  p = [(0, 0)] * u.ndim
  p[axis + 1] = (0, s - 1)
  u = u.pad(p).reshape(*t.shape[:axis], L * s, *t.shape[axis + 1:])
  return u.shrink(tuple((0, (L - 1) * s + 1) if j == axis else None for j in range(u.ndim)))

@op("Col2Im", since=18)
def _col2im(n: Node, i: list) -> Tensor:
  x = i[0]
  img, blk = ints(n.static(1)), ints(n.static(2))
  nd = len(img)
  dil = list(n.attr("dilations", [1] * nd)); st = list(n.attr("strides", [1] * nd)); pads = list(n.attr("pads", [0] * (2 * nd)))
  if len(blk) != nd or len(dil) != nd or len(st) != nd or len(pads) != 2 * nd or nd < 1 or x.ndim != 3:
    raise _bad(n, f"input {x.shape}, image_shape {img}, block_shape {blk}, dilations {dil}, strides {st}, pads {pads}")
  if min(pads) < 0 or min(st) < 1 or min(dil) < 1 or min(blk) < 1 or min(img) < 0: raise _bad(n, "negative pads or non-positive sizes")
  B = math.prod(blk)
  N, CB, L = x.shape
  if CB % B: raise _bad(n, f"input channels {CB} not a multiple of the block size {B}")
  C = CB // B
  padded = [img[d] + pads[d] + pads[nd + d] for d in range(nd)]
  cols = [(padded[d] - (dil[d] * (blk[d] - 1) + 1)) // st[d] + 1 for d in range(nd)]
  if min(cols) < 1 or math.prod(cols) != L: raise _bad(n, f"{L} blocks where the shapes make {cols}")
  if N * C == 0 or 0 in img: return Tensor.full((N, C, *img), 0, x.dtype, x.device)
  t = wide(x).reshape(N, C, B, *cols)
  acc: Optional[Tensor] = None
  for b, offs in enumerate(itertools.product(*[range(k) for k in blk])):  # block offsets in the input's (row-major) order
    slab = t.shrink((None, None, (b, b + 1), *[None] * nd)).reshape(N, C, *cols)
    for d in range(nd): slab = _spread(slab, 2 + d, st[d])
    spec = [(offs[d] * dil[d], padded[d] - offs[d] * dil[d] - ((cols[d] - 1) * st[d] + 1)) for d in range(nd)]
    slab = slab.pad(((0, 0), (0, 0), *spec))
    acc = slab if acc is None else acc + slab
  return acc.shrink((None, None, *[(pads[d], pads[d] + img[d]) for d in range(nd)])).cast(x.dtype)

# ---- MaxUnpool -----------------------------------------------------------------------------------------
@op("MaxUnpool", since=9)
def _max_unpool(n: Node, i: list) -> Tensor:
  x, ind = i[0], i[1]
  k = list(n.attr("kernel_shape"))
  nd = len(k)
  st = list(n.attr("strides", [1] * nd)); pads = list(n.attr("pads", [0] * (2 * nd)))
  if x.ndim != nd + 2 or tuple(ind.shape) != tuple(x.shape) or len(st) != nd or len(pads) != 2 * nd:
    raise _bad(n, f"X {x.shape}, I {ind.shape}, kernel_shape {k}, strides {st}, pads {pads}")
  N, C = x.shape[0], x.shape[1]
  unp = [(x.shape[2 + d] - 1) * st[d] - (pads[d] + pads[nd + d]) + k[d] for d in range(nd)]
  shape = [N, C, *unp]
  if n.has(2):
    shape = ints(n.static(2))
    if any(pads): raise unsupported(n, "output_shape with non-zero pads (the spec ignores the pads, the reference doesn't)")
    if len(shape) != x.ndim or shape[:2] != [N, C]: raise _bad(n, f"output_shape {shape} for input of shape {x.shape}")
    if any(s < u for s, u in zip(shape[2:], unp)): raise unsupported(n, f"output_shape {shape} smaller than the unpooled shape {[N, C, *unp]}")
  if min(unp) < 0: raise _bad(n, f"unpooled shape {[N, C, *unp]}")
  T, M = N * C * math.prod(unp), math.prod(x.shape)
  if T == 0 or M == 0: return Tensor.full(tuple(shape), 0, x.dtype, x.device)
  n.check_indices(1, T, 0)
  # each output element takes the last input element (in order) whose index names it, else 0
  pos = wrap_index(ind.reshape(1, M), T)
  eq = pos == Tensor.arange(T, dtype=dtypes.int64, device=x.device).reshape(T, 1)  # (T, M)
  j = Tensor.arange(M, dtype=dtypes.int64, device=x.device).reshape(1, M)
  last = eq.where(j, -1).max(1, keepdim=True)
  lowest = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
  val = (eq & (j == last)).where(x.reshape(1, M), lowest).max(1, keepdim=True)  # a max, so -0.0 and nan stay what they are
  y = (last >= 0).where(val, 0).reshape(N, C, *unp).cast(x.dtype)
  if shape[2:] != unp: y = y.pad(((0, 0), (0, 0), *[(0, s - u) for s, u in zip(shape[2:], unp)]))
  return y
