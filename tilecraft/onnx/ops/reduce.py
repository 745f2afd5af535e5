"""ONNX reductions and ops built on them: Reduce* (axes as attribute or input, keepdims,
noop_with_empty_axes, empty reductions giving the op's identity), ArgMax/ArgMin (select_last_index),
TopK (ranks by pairwise comparison: ties keep the lower index first), CumSum and CumProd (exclusive, reverse),
the softmax family (opset < 13: over the flattened trailing dims), and the normalizations
(BatchNormalization in inference mode, InstanceNormalization, LayerNormalization, RMSNormalization, GroupNormalization,
LpNormalization, MeanVarianceNormalization). Contract: output dtypes follow the spec (indices int64)."""
from __future__ import annotations
import math
from typing import Any, Optional
from tilecraft.dtype import dtypes
from tilecraft.onnx.ops.common import const, ints, is_float, norm_axis, wide
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

def _axes(n: Node, x: Tensor, input_since: int) -> Optional[tuple[int, ...]]:
  """The reduced axes, or None for 'no reduction' (noop_with_empty_axes with no axes)."""
  if n.opset >= input_since: ax = ints(n.static(1)) if n.has(1) else []
  else: ax = list(n.attr("axes", []))
  if not ax:
    if n.attr("noop_with_empty_axes", 0): return None
    return tuple(range(x.ndim))
  return tuple(sorted({norm_axis(a, x.ndim) for a in ax}))

_IDENT = {"ReduceMax": -math.inf, "ReduceMin": math.inf, "ReduceSum": 0, "ReduceMean": math.nan, "ReduceProd": 1,
          "ReduceL1": 0, "ReduceL2": 0, "ReduceSumSquare": 0, "ReduceLogSum": -math.inf, "ReduceLogSumExp": -math.inf}

def _reduce(n: Node, i: list, since: int) -> Tensor:
  x = i[0]
  axes = _axes(n, x, since)
  keep = bool(n.attr("keepdims", 1))
  kind = n.op
  if axes is None:  # no reduction: the elementwise part only
    return {"ReduceL1": lambda: x.abs(), "ReduceL2": lambda: (x * x).sqrt() if is_float(x) else x.abs(),
            "ReduceSumSquare": lambda: x * x, "ReduceLogSum": lambda: x.log(), "ReduceLogSumExp": lambda: x}.get(kind, lambda: x)().cast(x.dtype)
  dt = x.dtype
  if any(x.shape[a] == 0 for a in axes):
    v = _IDENT[kind]
    if not dtypes.is_float(dt):
      if v == -math.inf: v = dtypes.min(dt)
      elif v == math.inf: v = dtypes.max(dt)
      elif v != v: raise unsupported(n, "mean of an empty integer set")
    shape = tuple(1 if j in axes else s for j, s in enumerate(x.shape)) if keep else tuple(s for j, s in enumerate(x.shape) if j not in axes)
    return Tensor.full(shape, v, dt, x.device)
  if kind == "ReduceSum": r = x.sum(axes, keep)
  elif kind == "ReduceMean": r = x.mean(axes, keep) if is_float(x) else (x.sum(axes, keep).cast(dtypes.float64) / x._count(axes)).cast(dt)  # (truncated, as C)
  elif kind == "ReduceMax": r = x.max(axes, keep)
  elif kind == "ReduceMin": r = x.min(axes, keep)
  elif kind == "ReduceProd": r = x.prod(axes, keep)
  elif kind == "ReduceL1": r = x.abs().sum(axes, keep)
  elif kind == "ReduceSumSquare": r = (x * x).sum(axes, keep)
  elif kind == "ReduceL2":
    r = (x * x).sum(axes, keep)
    r = r.sqrt() if is_float(x) else r.cast(dtypes.float64).sqrt().cast(dt)
  elif kind == "ReduceLogSum": r = x.sum(axes, keep).log()
  elif kind == "ReduceLogSumExp": r = x.logsumexp(axes, keep)
  else: raise unsupported(n)
  return r.cast(dt)

for _name in ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"):
  op(_name)(lambda n, i: _reduce(n, i, 18))
op("ReduceSum")(lambda n, i: _reduce(n, i, 13))

@op("ArgMax", "ArgMin")
def _argmax(n: Node, i: list) -> Tensor:
  x = i[0]
  a = norm_axis(n.attr("axis", 0), x.ndim)
  keep = bool(n.attr("keepdims", 1))
  fn = (lambda t: t.argmax(a, keep)) if n.op == "ArgMax" else (lambda t: t.argmin(a, keep))
  if n.attr("select_last_index", 0):
    return (x.shape[a] - 1 - fn(x.flip(a))).cast(dtypes.int64)
  return fn(x).cast(dtypes.int64)

@op("TopK")
def _topk(n: Node, i: list) -> list:
  x = i[0]
  k = int(ints(n.static(1))[0]) if n.opset >= 10 else int(n.attr("k"))
  a = norm_axis(n.attr("axis", -1), x.ndim)
  largest = n.attr("largest", 1)
  if not n.attr("sorted", 1): pass  # sorted output is a valid order for sorted=0
  L = x.shape[a]
  if is_float(x) and False: pass
  xt = x.transpose(a, -1)  # (..., L)
  xi = xt.unsqueeze(-1)  # element i on axis -2
  xj = xt.unsqueeze(-2)  # element j on axis -1
  better = (xj > xi) if largest else (xj < xi)
  ii = Tensor.arange(L, dtype=dtypes.int32, device=x.device)
  earlier_tie = (xj == xi) & (ii.reshape(1, L) < ii.reshape(L, 1))
  rank = (better | earlier_tie).cast(dtypes.int32).sum(-1).cast(dtypes.int32)  # (..., L): each element's place
  kk = Tensor.arange(k, dtype=dtypes.int32, device=x.device)
  sel = rank.unsqueeze(-1) == kk  # (..., L, k)
  vals = sel.where(xt.unsqueeze(-1), const(xt, 0)).sum(-2).cast(x.dtype) if x.dtype != dtypes.bool else sel.where(xt.unsqueeze(-1), False).max(-2)
  idx = sel.where(ii.reshape(L, 1).cast(dtypes.int64), 0).sum(-2).cast(dtypes.int64)
  return [vals.transpose(a, -1), idx.transpose(a, -1)]

@op("CumSum")
def _cumsum(n: Node, i: list) -> Tensor: return _running(n, i, product=False)

@op("CumProd", since=26)
def _cumprod(n: Node, i: list) -> Tensor: return _running(n, i, product=True)

def _running(n: Node, i: list, product: bool) -> Tensor:
  """CumSum / CumProd along the axis input, exclusive (shifted by one, the identity first) and/or reversed."""
  x = i[0]
  a = norm_axis(ints(n.static(1))[0], x.ndim)
  if n.attr("reverse", 0): x = x.flip(a)
  r = x.cumprod(a) if product else x.cumsum(a)
  if n.attr("exclusive", 0):
    p = [(0, 0)] * x.ndim; p[a] = (1, 0)
    sl = [None] * x.ndim; sl[a] = (0, x.shape[a])
    r = r.pad(p, value=1 if product else 0).shrink(tuple(sl))
  if n.attr("reverse", 0): r = r.flip(a)
  return r.cast(i[0].dtype)

def _coerce2d(n: Node, x: Tensor, fn: Any) -> Tensor:
  """Softmax-family ops: opset >= 13 along `axis` (default -1); before, over the dims from `axis` (default 1) on, flattened."""
  if n.opset >= 13: return fn(x, norm_axis(n.attr("axis", -1), x.ndim))
  a = norm_axis(n.attr("axis", 1), x.ndim) if x.ndim else 0
  lead = 1
  for s in x.shape[:a]: lead *= s
  return fn(x.reshape(lead, -1), 1).reshape(x.shape)

@op("Softmax")
def _softmax(n: Node, i: list) -> Tensor: return _coerce2d(n, i[0], lambda t, a: t.softmax(a))
@op("LogSoftmax")
def _logsoftmax(n: Node, i: list) -> Tensor: return _coerce2d(n, i[0], lambda t, a: t.log_softmax(a))
@op("Hardmax")
def _hardmax(n: Node, i: list) -> Tensor:
  def f(t: Tensor, a: int) -> Tensor:
    idx = t.argmax(a, keepdim=True)
    sh = [1] * t.ndim; sh[a] = t.shape[a]
    return (Tensor.arange(t.shape[a], dtype=dtypes.int64, device=t.device).reshape(tuple(sh)) == idx).cast(t.dtype)
  return _coerce2d(n, i[0], f)

# ---- normalizations -----------------------------------------------------------------------------------
def _bshape(t: Tensor, ndim: int) -> Tensor:
  """A per-channel vector (C,) shaped to broadcast against (N, C, ...) of ndim dims."""
  return t.reshape(t.shape[0], *([1] * (ndim - 2)))

@op("BatchNormalization")
def _batchnorm(n: Node, i: list) -> Tensor:
  x, scale, b, mean, var = i[:5]
  if n.attr("training_mode", 0) or (n.opset < 7 and not n.attr("is_test", 0)): raise unsupported(n, "training mode")
  if len([o for o in n.outputs if o]) > 1: raise unsupported(n, "running mean/var outputs (training)")
  if n.opset < 9 and not n.attr("spatial", 1): raise unsupported(n, "spatial=0")
  eps = n.attr("epsilon", 1e-5)
  w = wide(x)
  c = lambda t: _bshape(t.cast(w.dtype), x.ndim)  # noqa: E731
  y = (w - c(mean)) * (c(var) + eps).rsqrt() * c(scale) + c(b)
  return y.cast(x.dtype)

@op("InstanceNormalization")
def _instnorm(n: Node, i: list) -> Tensor:
  x, scale, b = i
  eps = n.attr("epsilon", 1e-5)
  w = wide(x)
  axes = tuple(range(2, x.ndim))
  y = (w - w.mean(axes, keepdim=True)) * (w.var(axes, keepdim=True) + eps).rsqrt()
  return (y * _bshape(scale.cast(w.dtype), x.ndim) + _bshape(b.cast(w.dtype), x.ndim)).cast(x.dtype)

@op("LayerNormalization", since=17)
def _layernorm(n: Node, i: list) -> list:
  x, scale = i[0], i[1]
  b = i[2] if len(i) > 2 else None
  a = norm_axis(n.attr("axis", -1), x.ndim)
  eps = n.attr("epsilon", 1e-5)
  if n.attr("stash_type", 1) != 1: raise unsupported(n, f"stash_type {n.attr('stash_type')}")
  axes = tuple(range(a, x.ndim))
  w = wide(x)
  mean = w.mean(axes, keepdim=True)
  inv = (w.var(axes, keepdim=True) + eps).rsqrt()
  y = (w - mean) * inv * scale.cast(w.dtype)
  if b is not None: y = y + b.cast(w.dtype)
  return [y.cast(x.dtype), mean, inv]

@op("RMSNormalization", since=23)
def _rmsnorm(n: Node, i: list) -> Tensor:
  x, scale = i[0], i[1]
  if n.attr("stash_type", 1) != 1: raise unsupported(n, f"stash_type {n.attr('stash_type')}")
  w = wide(x)
  y = w.rmsnorm(tuple(range(norm_axis(n.attr("axis", -1), x.ndim), x.ndim)), n.attr("epsilon", 1e-5))
  return (y * scale.cast(w.dtype)).cast(x.dtype)

@op("GroupNormalization", since=18)
def _groupnorm(n: Node, i: list) -> Tensor:
  x, scale, b = i
  g = int(n.attr("num_groups"))
  eps = n.attr("epsilon", 1e-5)
  if n.opset < 21: raise unsupported(n, "opset 18 GroupNormalization (per-group scale, deprecated)")
  N = x.shape[0]
  w = wide(x).reshape(N, g, -1)
  y = ((w - w.mean(2, keepdim=True)) * (w.var(2, keepdim=True) + eps).rsqrt()).reshape(x.shape)
  return (y * _bshape(scale.cast(y.dtype), x.ndim) + _bshape(b.cast(y.dtype), x.ndim)).cast(x.dtype)

@op("LpNormalization")
def _lpnorm(n: Node, i: list) -> Tensor:
  x = i[0]
  a, p = norm_axis(n.attr("axis", -1), x.ndim), n.attr("p", 2)
  if p == 1: d = x.abs().sum(a, keepdim=True)
  elif p == 2: d = (x * x).sum(a, keepdim=True).sqrt()
  else: raise unsupported(n, f"p={p}")
  return (d == 0).where(const(x, 0), x / d).cast(x.dtype)  # a zero norm gives 0, as the reference

@op("MeanVarianceNormalization")
def _mvn(n: Node, i: list) -> Tensor:
  x = i[0]
  axes = tuple(norm_axis(a, x.ndim) for a in n.attr("axes", [0, 2, 3]))
  m = x.mean(axes, keepdim=True)
  v = ((x - m) * (x - m)).mean(axes, keepdim=True)
  return ((x - m) / (v.sqrt() + 1e-9)).cast(x.dtype)
