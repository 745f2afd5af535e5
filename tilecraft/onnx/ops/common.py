"""Helpers shared by the op modules: dtypes, scalars as tensors of a given dtype, axis normalization,
and the where-based exact gather along an axis with (runtime) integer indices."""
from __future__ import annotations
from typing import Any, Optional, Sequence
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.tensor import Tensor

def const(x: Tensor, v: Any, dtype: Optional[DType] = None) -> Tensor:
  """A 0-d tensor of value v in x's dtype (or dtype) on x's device."""
  return Tensor(v, dtype=dtype or x.dtype, device=x.device)

def ints(a: Optional[np.ndarray]) -> list[int]:
  return [] if a is None else [int(v) for v in np.asarray(a).reshape(-1)]

def norm_axis(a: int, ndim: int) -> int:
  if not -max(ndim, 1) <= a < max(ndim, 1): raise ValueError(f"axis {a} out of range for {ndim} dims")
  return a % max(ndim, 1)

def is_float(t: Tensor) -> bool: return dtypes.is_float(t.dtype)

def wide(x: Tensor) -> Tensor:
  """x in the float dtype a composite op computes in: float64 stays, narrower (float16, bfloat16, ints) -> float32."""
  return x if x.dtype == dtypes.float64 else x.cast(dtypes.float32)

def arange_along(n: int, axis: int, ndim: int, device: str, dtype: DType = dtypes.int64) -> Tensor:
  """arange(n) shaped to broadcast along `axis` of an ndim-dims tensor."""
  shape = [1] * ndim
  shape[axis] = n
  return Tensor.arange(n, dtype=dtype, device=device).reshape(tuple(shape))

def static_scalar(n: Any, i: int, what: str, default: Any = None) -> Any:
  """Input i of node n as a Python number read at build time (an int for integer dtypes): `default` where the input is
  absent or empty (optional scalar inputs may be given as empty tensors); more than one value is NotImplementedError."""
  from tilecraft.onnx.registry import unsupported
  v = n.static(i) if n.has(i) else None
  if v is None or np.asarray(v).size == 0: return default
  a = np.asarray(v)
  if a.size != 1: raise unsupported(n, f"{what} of shape {a.shape} (a scalar)")
  return int(a.reshape(())) if a.dtype.kind in "iub" else float(a.reshape(()))

def at(x: Tensor, j: int) -> Tensor:
  """x[j] along the first axis, as a view (a step of a sequence, a direction's weights)."""
  return x.shrink(((j, j + 1),) + (None,) * (x.ndim - 1)).reshape(x.shape[1:])

def wrap_index(idx: Tensor, n: int) -> Tensor:
  """Negative indices count from the end (int64)."""
  idx = idx.cast(dtypes.int64)
  return (idx < 0).where(idx + n, idx)

def select_sum(mask: Tensor, x: Tensor, axis: int) -> Tensor:
  """sum over `axis` of where(mask, x, 0): with a one-hot mask, an exact gather (nan/inf elsewhere don't leak)."""
  dt = x.dtype
  if dt == dtypes.bool: return mask.where(x, False).max(axis)
  out = mask.where(x, const(x, 0)).sum(axis)
  return out.cast(dt) if out.dtype != dt else out

def gather_axis(x: Tensor, idx: Tensor, axis: int) -> Tensor:
  """numpy.take(x, idx, axis) for runtime indices (already wrapped to 0..n-1): a one-hot select."""
  n = x.shape[axis]
  pre, post = x.shape[:axis], x.shape[axis + 1:]
  ishape = idx.shape
  xb = x.reshape(*pre, *([1] * len(ishape)), n, *post)
  oh = idx.reshape(*([1] * len(pre)), *ishape, 1) == Tensor.arange(n, dtype=dtypes.int64, device=x.device)
  oh = oh.reshape(*([1] * len(pre)), *ishape, n, *([1] * len(post)))
  return select_sum(oh, xb, len(pre) + len(ishape))

def take_static(x: Tensor, idx: Sequence[int], axis: int) -> Tensor:
  """x at the known indices idx along axis (views and a cat: exact, no compute)."""
  if len(idx) == 0:
    return Tensor.full(x.shape[:axis] + (0,) + x.shape[axis + 1:], 0, x.dtype, x.device)
  parts, i = [], 0
  idx = list(idx)
  while i < len(idx):
    j = i + 1
    while j < len(idx) and idx[j] == idx[j - 1] + 1: j += 1  # runs of consecutive indices are one shrink
    sl = [None] * x.ndim
    sl[axis] = (idx[i], idx[j - 1] + 1)
    parts.append(x.shrink(tuple(sl)))
    i = j
  return parts[0] if len(parts) == 1 else cat_exact(parts, axis)

def cat_exact(parts: Sequence[Tensor], axis: int) -> Tensor:
  """Concatenate along axis, exactly for every value (-0.0 and bools too): Tensor.cat selects each piece
  in its own range. Zero-length pieces are left out."""
  return parts[0] if len(parts) == 1 else Tensor.cat(*parts, axis=axis)
