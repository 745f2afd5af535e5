"""ONNX matrix and convolution ops: MatMul, Gemm, Einsum (any number of operands, repeated letters
as diagonals, ellipsis), Conv and ConvTranspose (1-D to 3-D, groups, dilations, explicit or auto pads,
output_shape/output_padding), and pooling (MaxPool, AveragePool, LpPool, Global*; pads, dilations,
ceil_mode, count_include_pad). Contract: windows are views of the padded input
(Tensor.conv2d for 2-D convolutions, its window helper otherwise); MaxPool's Indices output is refused."""
from __future__ import annotations
import math
import numpy as np
from typing import Any
from tilecraft.dtype import dtypes
from tilecraft.frontend.nn import max_pad_value
from tilecraft.frontend.panels import panel_eligible, panel_layout, panel_matmul
from tilecraft.frontend.pointwise_layout import pointwise_conv, pointwise_eligible, pointwise_layout
from tilecraft.onnx.ops.common import wide
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

def _matmul_weight(n: Node, a: Tensor, b: Tensor, transposed: bool = False) -> Tensor:
  """a @ b, for b input 1 of n (transposed: b is that input's transpose). A constant b on a CPU is read in column
  panels (frontend/panels.py), laid out once per model."""
  if panel_eligible(a.shape, b.shape, a.dtype, a.device) and b.dtype == a.dtype:
    wp = n.derived(1, "panels_t" if transposed else "panels", lambda w: panel_layout(w.T if transposed else w))
    if wp is not None: return panel_matmul(a, wp)
  return a.matmul(b)

@op("MatMul")
def _matmul(n: Node, i: list) -> Tensor:
  a, b = i
  if a.dtype != b.dtype: raise unsupported(n, "operands of differing dtypes")
  return _matmul_weight(n, a, b).cast(a.dtype)

@op("Gemm")
def _gemm(n: Node, i: list) -> Tensor:
  a, b = i[0], i[1]
  c = i[2] if len(i) > 2 else None
  if n.attr("transA", 0): a = a.transpose(0, 1)
  if n.attr("transB", 0): b = b.transpose(0, 1)
  alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
  y = _matmul_weight(n, a, b, transposed=bool(n.attr("transB", 0)))
  if alpha != 1.0: y = y * alpha
  if c is not None:
    y = y + (c * beta if beta != 1.0 else c)
  return y.cast(i[0].dtype)

def _diagonal(x: Tensor, a: int, b: int) -> Tensor:
  """The diagonal over axes a < b (same size), put at axis a, b removed."""
  d = x.shape[a]
  order = [j for j in range(x.ndim) if j not in (a, b)] + [a, b]
  t = x.permute(*order)
  t = t.reshape(*t.shape[:-2], d * d)
  sl = [None] * t.ndim; sl[-1] = (0, d * d)
  t = t._mv("stride", tuple([1] * (t.ndim - 1) + [d + 1])) if d > 1 else t  # every (d+1)-th element
  rest = [j for j in range(x.ndim) if j not in (a, b)]
  # put the diagonal back at axis a
  pos = rest.index(next((j for j in rest if j > a), x.ndim)) if any(j > a for j in rest) else len(rest)
  perm = list(range(len(rest)))
  perm.insert(pos, len(rest))
  return t.permute(*perm)

@op("Einsum")
def _einsum(n: Node, i: list) -> Tensor:
  eq = n.attr("equation").replace(" ", "")
  lhs, _, rhs = eq.partition("->")
  terms = lhs.split(",")
  if len(terms) != len(i): raise unsupported(n, "operand count differs from the equation")
  used = set(c for c in eq if c.isalpha())
  free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used]
  ell_nd = max((t.ndim - len(term.replace("...", "")) for term, t in zip(terms, i) if "..." in term), default=0)
  ell = "".join(free[:ell_nd])
  ops = []
  for term, t in zip(terms, i):
    if "..." in term:
      k = t.ndim - len(term.replace("...", ""))
      term = term.replace("...", ell[ell_nd - k:])
    if len(term) != t.ndim: raise unsupported(n, f"term {term!r} vs operand of {t.ndim} dims")
    # repeated letters: diagonals
    while len(set(term)) != len(term):
      c = next(ch for ch in term if term.count(ch) > 1)
      a = term.index(c); b = term.index(c, a + 1)
      t = _diagonal(t, a, b)
      term = term[:b] + term[b + 1:]
    ops.append((term, t))
  if not _:
    out = "".join(sorted(c for c in set("".join(tm for tm, _t in ops)) if "".join(tm for tm, _t in ops).count(c) == 1 and c not in ell))
    out = ell + out
  else: out = rhs.replace("...", ell)
  letters = list(out) + sorted(set("".join(tm for tm, _t in ops)) - set(out))
  dims: dict[str, int] = {}
  for tm, t in ops:
    for c, s in zip(tm, t.shape):
      if s != 1: dims[c] = s
      else: dims.setdefault(c, 1)
  dt = i[0].dtype
  prod_ = None
  for tm, t in ops:
    sizes = dict(zip(tm, t.shape))
    present = [c for c in letters if c in tm]
    if present: t = t.permute(*[tm.index(c) for c in present])
    t = t.reshape(*[sizes[c] if c in tm else 1 for c in letters])
    prod_ = t if prod_ is None else prod_ * t
  if len(letters): prod_ = prod_.expand(*[dims[c] for c in letters])
  red = tuple(range(len(out), len(letters)))
  res = prod_.sum(red) if red else prod_
  return res.cast(dt)

# ---- convolution ---------------------------------------------------------------------------------------
def _conv_pads(n: Node, in_sp: tuple, k: tuple, st: tuple, dl: tuple) -> list[tuple[int, int]]:
  nd = len(k)
  ap = n.attr("auto_pad", "NOTSET")
  if ap in ("NOTSET", ""):
    p = n.attr("pads", [0] * (2 * nd))
    return [(p[j], p[j + nd]) for j in range(nd)]
  if ap == "VALID": return [(0, 0)] * nd
  if ap in ("SAME_UPPER", "SAME_LOWER"):
    res = []
    for s, kk, stv, d in zip(in_sp, k, st, dl):
      out = -(-s // stv)
      tot = max(0, (out - 1) * stv + (kk - 1) * d + 1 - s)
      lo = tot // 2 if ap == "SAME_UPPER" else tot - tot // 2
      res.append((lo, tot - lo))
    return res
  raise unsupported(n, f"auto_pad {ap}")

def _convnd(x: Tensor, w: Tensor, st: tuple, dl: tuple, groups: int) -> Tensor:
  """Unpadded N-d convolution of x (N, Cin, *sp) with w (Cout, Cin/g, *k)."""
  nd = x.ndim - 2
  if nd == 2: return x.conv2d(w, stride=st, dilation=dl, groups=groups)
  if nd == 1:
    return x.unsqueeze(2).conv2d(w.unsqueeze(2), stride=(1, st[0]), dilation=(1, dl[0]), groups=groups).squeeze(2)
  N = x.shape[0]
  cout, cpg = w.shape[0], w.shape[1]
  k = tuple(w.shape[2:])
  win = x._pool(k, st, dl)  # N, cin, *o, *k
  o = win.shape[2:2 + nd]
  win = win.reshape(N, groups, 1, cpg, *o, *k)
  wt = w.reshape(1, groups, cout // groups, cpg, *([1] * nd), *k)
  prod_ = win * wt  # N g co cpg *o *k
  prod_ = prod_.permute(0, 1, 2, *range(4, 4 + nd), 3, *range(4 + nd, 4 + 2 * nd))
  return prod_.sum(tuple(range(3 + nd, 4 + 2 * nd))).reshape(N, cout, *o)

@op("Conv")
def _conv(n: Node, i: list) -> Tensor:
  x, w = i[0], i[1]
  b = i[2] if len(i) > 2 else None
  nd = x.ndim - 2
  if nd < 1: raise unsupported(n, f"input of {x.ndim} dims")
  k = tuple(w.shape[2:])
  st = tuple(n.attr("strides", [1] * nd)); dl = tuple(n.attr("dilations", [1] * nd))
  pads = _conv_pads(n, tuple(x.shape[2:]), k, st, dl)
  if any(p != (0, 0) for p in pads): x = x.pad(((0, 0), (0, 0), *pads))
  # a constant 1x1 weight on an AVX-512 CPU is read with its output channels innermost (frontend/pointwise_layout.py)
  wt = n.derived(1, "pointwise_panels", pointwise_layout) if w.dtype == x.dtype and \
    pointwise_eligible(x.shape, w.shape, st, n.attr("group", 1), x.dtype, x.device) else None
  y = pointwise_conv(x, wt, st) if wt is not None else _convnd(x, w.cast(x.dtype), st, dl, n.attr("group", 1))
  if b is not None: y = y + b.reshape(-1, *([1] * nd))
  return y.cast(i[0].dtype)

def _dilate(x: Tensor, axis: int, s: int) -> Tensor:
  """Insert s-1 zeros between elements along axis."""
  if s == 1 or x.shape[axis] <= 1: return x
  L = x.shape[axis]
  t = x.unsqueeze(axis + 1)
  p = [(0, 0)] * t.ndim; p[axis + 1] = (0, s - 1)
  t = t.pad(p).reshape(*x.shape[:axis], L * s, *x.shape[axis + 1:])
  sl = [None] * t.ndim; sl[axis] = (0, (L - 1) * s + 1)
  return t.shrink(tuple(sl))

@op("ConvTranspose")
def _convtranspose(n: Node, i: list) -> Tensor:
  x, w = i[0], i[1]
  b = i[2] if len(i) > 2 else None
  nd = x.ndim - 2
  g = n.attr("group", 1)
  cin, coutg = w.shape[0], w.shape[1]
  k = tuple(n.attr("kernel_shape", list(w.shape[2:])))
  st = tuple(n.attr("strides", [1] * nd)); dl = tuple(n.attr("dilations", [1] * nd))
  opad = list(n.attr("output_padding", [0] * nd))
  in_sp = x.shape[2:]
  full = [(in_sp[j] - 1) * st[j] + (k[j] - 1) * dl[j] + 1 + opad[j] for j in range(nd)]
  out_shape = n.attr("output_shape")
  ap = n.attr("auto_pad", "NOTSET")
  if out_shape is not None:
    out_shape = list(out_shape)[-nd:]
    pads = []
    for j in range(nd):
      tot = full[j] - out_shape[j]  # negative: the output extends past the full one (zeros in, conv taps out)
      lo = tot // 2 if ap == "SAME_UPPER" else tot - tot // 2  # (the spec's split, with floor division)
      pads.append((lo, tot - lo))
  elif ap in ("SAME_UPPER", "SAME_LOWER"):
    pads = []
    for j in range(nd):
      tot = max(0, full[j] - in_sp[j] * st[j])
      lo = tot - tot // 2 if ap == "SAME_LOWER" else tot // 2
      pads.append((lo, tot - lo))
  elif ap == "VALID": pads = [(0, 0)] * nd
  else:
    p = n.attr("pads", [0] * (2 * nd))
    pads = [(p[j], p[j + nd]) for j in range(nd)]
  t = x
  for j in range(nd): t = _dilate(t, 2 + j, st[j])
  t = t.pad(((0, 0), (0, 0), *[((k[j] - 1) * dl[j] + max(0, -pads[j][0]), (k[j] - 1) * dl[j] + opad[j] + max(0, -pads[j][1])) for j in range(nd)]))
  pads = [(max(0, lo), max(0, hi)) for lo, hi in pads]
  # weight (cin, cout/g, *k) -> (cout, cin/g, *k), flipped
  wt = w.reshape(g, cin // g, coutg, *k).permute(0, 2, 1, *range(3, 3 + nd)).reshape(g * coutg, cin // g, *k)
  wt = wt.flip(tuple(range(2, 2 + nd)))
  y = _convnd(t, wt.cast(x.dtype), (1,) * nd, dl, g)
  sl = [None, None] + [(pads[j][0], y.shape[2 + j] - pads[j][1]) for j in range(nd)]
  y = y.shrink(tuple(sl))
  if b is not None: y = y + b.reshape(-1, *([1] * nd))
  return y.cast(x.dtype)

# ---- pooling -----------------------------------------------------------------------------------------
def _pool_setup(n: Node, x: Tensor) -> tuple:
  nd = x.ndim - 2
  k = tuple(n.attr("kernel_shape"))
  st = tuple(n.attr("strides", [1] * nd)); dl = tuple(n.attr("dilations", [1] * nd))
  pads = _conv_pads(n, tuple(x.shape[2:]), k, st, dl)
  extra = []
  for j in range(nd):
    L = x.shape[2 + j] + pads[j][0] + pads[j][1]
    span = (k[j] - 1) * dl[j] + 1
    if n.attr("ceil_mode", 0):
      o = -(-(L - span) // st[j]) + 1
      if (o - 1) * st[j] >= x.shape[2 + j] + pads[j][0]: o -= 1  # the last window must start inside the input or left pad
    else: o = (L - span) // st[j] + 1
    extra.append(max(0, (o - 1) * st[j] + span - L))
  return nd, k, st, dl, pads, extra

@op("MaxPool")
def _maxpool(n: Node, i: list) -> Any:
  """Max over windows of the input padded with -inf (the dtype's minimum for integers); the optional
  Indices output is the first maximum's flat index into the unpadded input (row-major, or column-major
  spatial with storage_order=1)."""
  x = i[0]
  nd, k, st, dl, pads, extra = _pool_setup(n, x)
  spatial = [(p[0], p[1] + e) for p, e in zip(pads, extra)]
  indices = len(n.outputs) > 1 and bool(n.outputs[1])
  # (with Indices the pad stays the lowest value: a padded 0 tied with a real 0 could be the first maximum)
  xp = x.pad(((0, 0), (0, 0), *spatial), value=max_pad_value(x, spatial, k, st, dl, zero_ok=not indices))
  win = xp._pool(k, st, dl)
  y = win.max(tuple(range(2 + nd, 2 + 2 * nd))).cast(x.dtype)
  if not indices: return y
  o = win.shape[2:2 + nd]
  K = math.prod(k)
  rem = win.reshape(*win.shape[:2 + nd], K).argmax(-1).cast(dtypes.int64)  # (N, C, *o)
  taps = [None] * nd
  for j in range(nd - 1, -1, -1):
    taps[j] = rem % k[j]
    rem = rem // k[j]
  sp = x.shape[2:]
  ar = lambda j: Tensor.arange(o[j], dtype=dtypes.int64, device=x.device).reshape(*([1] * (2 + j)), o[j], *([1] * (nd - j - 1)))  # noqa: E731
  pos = [ar(j) * st[j] + taps[j] * dl[j] - pads[j][0] for j in range(nd)]
  N, C = x.shape[0], x.shape[1]
  nc = Tensor.arange(N * C, dtype=dtypes.int64, device=x.device).reshape(N, C, *([1] * nd))
  order = list(range(nd)) if not n.attr("storage_order", 0) else list(range(nd))[::-1]
  flat, size = None, 1
  for j in reversed(order):
    flat = pos[j] * size if flat is None else flat + pos[j] * size
    size *= sp[j]
  return [y, (nc * size + flat).cast(dtypes.int64)]

@op("AveragePool")
def _avgpool(n: Node, i: list) -> Tensor:
  x = i[0]
  nd, k, st, dl, pads, extra = _pool_setup(n, x)
  padspec = ((0, 0), (0, 0), *[(p[0], p[1] + e) for p, e in zip(pads, extra)])
  win_axes = tuple(range(2 + nd, 2 + 2 * nd))
  s = x.pad(padspec)._pool(k, st, dl).sum(win_axes)
  # the divisor depends only on shapes: per axis, how many taps of each window count (numpy, at build time)
  cnt = np.ones((), dtype=np.float64)
  for j in range(nd):
    L = x.shape[2 + j]
    valid = np.concatenate([np.full(pads[j][0], bool(n.attr("count_include_pad", 0))), np.ones(L, bool),
                            np.full(pads[j][1], bool(n.attr("count_include_pad", 0))), np.zeros(extra[j], bool)])
    o = s.shape[2 + j]
    cj = np.array([sum(valid[a * st[j] + t * dl[j]] for t in range(k[j])) for a in range(o)], dtype=np.float64)
    cnt = np.multiply.outer(cnt, cj)
  return (s / Tensor(cnt.reshape(1, 1, *cnt.shape).astype(x.dtype.np or np.float32), device=x.device, dtype=x.dtype)).cast(x.dtype)

@op("LpPool")
def _lppool(n: Node, i: list) -> Tensor:
  x = i[0]
  p = n.attr("p", 2)
  nd, k, st, dl, pads, extra = _pool_setup(n, x)
  xp = x.abs().pad(((0, 0), (0, 0), *[(a[0], a[1] + e) for a, e in zip(pads, extra)]))
  return (xp._pool(k, st, dl).pow(float(p)).sum(tuple(range(2 + nd, 2 + 2 * nd))).pow(1.0 / p)).cast(x.dtype)

@op("GlobalAveragePool")
def _gap(n: Node, i: list) -> Tensor:
  x = i[0]; return x.mean(tuple(range(2, x.ndim)), keepdim=True).cast(x.dtype)
@op("GlobalMaxPool")
def _gmp(n: Node, i: list) -> Tensor:
  x = i[0]; return x.max(tuple(range(2, x.ndim)), keepdim=True)
@op("GlobalLpPool")
def _glp(n: Node, i: list) -> Tensor:
  x = i[0]; p = float(n.attr("p", 2))
  return x.abs().pow(p).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1.0 / p).cast(x.dtype)

@op("LRN")
def _lrn(n: Node, i: list) -> Tensor:
  """x / (bias + alpha / size * sum of x^2 over the channel window [c - (size-1)//2, c + ceil((size-1)/2)]) ** beta."""
  x = i[0]
  size = int(n.attr("size"))
  alpha, beta, bias = n.attr("alpha", 1e-4), n.attr("beta", 0.75), n.attr("bias", 1.0)
  w = wide(x)
  sq = w * w
  lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
  C = x.shape[1]
  padded = sq.pad(((0, 0), (lo, hi), *[(0, 0)] * (x.ndim - 2)))
  s = None
  for k in range(size):
    part = padded.shrink(tuple((k, k + C) if j == 1 else None for j in range(x.ndim)))
    s = part if s is None else s + part
  return (w / (s * (alpha / size) + bias).pow(beta)).cast(x.dtype)
