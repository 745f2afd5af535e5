"""ONNX scatter ops: ScatterElements (and the deprecated Scatter, its reduction-less form) and ScatterND, with every
reduction the spec has (none, add, mul, max, min). Contract: the result is data with each update combined into the
position its index names; several updates to one position combine under the reduction, and under "none" the last
one in index order wins (the spec leaves duplicates undefined there; numpy assignment and onnxruntime keep the last).
Indices may be negative (counted from the end); one out of range is an IndexError naming the node (guarded on the
host before the kernels run). Computed as a select per output position over the updates of its row (a one-hot
compare fused into a reduce, nothing the size of the one-hot is stored): exact for every dtype, cost output x
updates-per-row. ScatterND flattens its indexed leading axes into one and scatters whole trailing slices along it."""
from __future__ import annotations
import math
from tilecraft.dtype import dtypes
from tilecraft.onnx.ops.common import const, norm_axis, wrap_index
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

REDUCTIONS = ("none", "add", "mul", "max", "min")

def _reduction(n: Node) -> str:
  r = n.attr("reduction", "none")
  if r not in REDUCTIONS: raise unsupported(n, f"reduction {r!r} (one of {', '.join(REDUCTIONS)})")
  return r

def scatter_along(data: Tensor, idx: Tensor, upd: Tensor, axis: int, reduction: str) -> Tensor:
  """data with upd[j] combined into data at j's coordinates, axis replaced by idx[j] (idx: int64, already in range;
  idx and upd of one shape, each axis but `axis` at most data's)."""
  nd, L = data.ndim, data.shape[axis]
  J = upd.shape[axis]
  if J == 0 or math.prod(upd.shape) == 0: return data
  # the updates' axis last, then one more for the output position along the axis: (..., J, L)
  perm = [k for k in range(nd) if k != axis] + [axis]
  ip, up = idx.permute(*perm).unsqueeze(-1), upd.permute(*perm).unsqueeze(-1)
  eq = ip == Tensor.arange(L, dtype=dtypes.int64, device=data.device)
  hit = eq.cast(dtypes.int32).sum(-2) > 0
  dt = data.dtype
  lowest = False if dt == dtypes.bool else -math.inf if dtypes.is_float(dt) else dtypes.min(dt)
  if reduction == "none":
    # the last update (in index order) to each position: its position along J is the largest that hits. It is taken
    # with a MAX over a one-hot (-0.0 and nan stay what they are; a SUM from +0 would turn -0.0 into 0.0)
    j = Tensor.arange(J, dtype=dtypes.int32, device=data.device).reshape(J, 1)
    last = eq.where(j, const(j, -1)).max(-2)
    part = (eq & (j == last.unsqueeze(-2))).where(up, const(up, lowest)).max(-2)
  elif reduction == "add": part = eq.where(up, const(up, 0)).sum(-2).cast(dt)
  elif reduction == "mul": part = eq.where(up, const(up, 1)).prod(-2).cast(dt)
  elif reduction == "max": part = eq.where(up, const(up, lowest)).max(-2)
  else: part = eq.where(up, const(up, math.inf if dtypes.is_float(dt) else dtypes.max(dt))).min(-2)
  # back to data's axis order, padded out to data's shape where the updates cover less of an axis
  inv = [perm.index(k) for k in range(nd)]
  part, hit = part.permute(*inv), hit.permute(*inv)
  pad = tuple((0, data.shape[k] - part.shape[k]) for k in range(nd))
  if any(p for _, p in pad):
    part = part.pad(pad, value={"mul": 1}.get(reduction, 0) if dt != dtypes.bool else False)
    hit = hit.pad(pad, value=False)
  if reduction == "add": return hit.where((data + part).cast(dt), data)  # (a -0.0 nothing adds to stays -0.0)
  if reduction == "mul": return (data * part).cast(dt)
  if reduction == "max": return hit.where(data.maximum(part), data).cast(dt)
  if reduction == "min": return hit.where(data.minimum(part), data).cast(dt)
  return hit.where(part, data)

@op("ScatterElements", "Scatter")
def _scatter_elements(n: Node, i: list) -> Tensor:
  data, idx, upd = i
  a = norm_axis(n.attr("axis", 0), data.ndim)
  if tuple(idx.shape) != tuple(upd.shape): raise unsupported(n, f"indices of shape {idx.shape} for updates of shape {upd.shape} (they must match)")
  if idx.ndim != data.ndim or any(idx.shape[k] > data.shape[k] for k in range(data.ndim) if k != a):
    raise unsupported(n, f"indices of shape {idx.shape} for data of shape {data.shape}")
  n.check_indices(1, data.shape[a], a)
  return scatter_along(data, wrap_index(idx, data.shape[a]), upd, a, _reduction(n))

@op("ScatterND")
def _scatter_nd(n: Node, i: list) -> Tensor:
  data, idx, upd = i
  k = idx.shape[-1]
  if not 1 <= k <= data.ndim: raise unsupported(n, f"indices' last axis of {k} for data of rank {data.ndim}")
  lead, rest = data.shape[:k], data.shape[k:]
  if tuple(upd.shape) != tuple(idx.shape[:-1]) + tuple(rest):
    raise unsupported(n, f"updates of shape {upd.shape}: indices {idx.shape} into data {data.shape} need {tuple(idx.shape[:-1]) + tuple(rest)}")
  lin, stride = None, 1
  for m in range(k - 1, -1, -1):
    n.check_indices(1, lead[m], m, column=m)
    c = wrap_index(idx[..., m], lead[m]) * stride
    lin = c if lin is None else lin + c
    stride *= lead[m]
  J = math.prod(idx.shape[:-1])
  flat = lin.reshape(J, *([1] * len(rest))).expand(J, *rest)
  out = scatter_along(data.reshape(math.prod(lead), *rest), flat, upd.reshape(J, *rest), 0, _reduction(n))
  return out.reshape(*data.shape)
