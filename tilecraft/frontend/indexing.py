"""Indexing and joining Tensor methods (a mixin of Tensor): __getitem__ with ints, slices (any
step), None and Ellipsis as one shrink + stride + reshape of views; cat and stack as a chain of
selects over padded views (each piece taken in its own range, so every value, -0.0 too, is kept)."""
from __future__ import annotations
import functools
from typing import TYPE_CHECKING, Any
import numpy as np
from tilecraft.dtype import dtypes, least_upper_dtype
if TYPE_CHECKING: from tilecraft.tensor import Tensor

class _joins:
  """A join of tensors callable both ways: `Tensor.cat(a, b)` and `a.cat(b)` (the tensor it is called on
  is the first piece). A plain staticmethod would take `a.cat(b)` as `cat(b)` and silently drop `a`."""
  def __init__(self, fn: Any): self.fn, self.__doc__ = fn, fn.__doc__
  def __get__(self, obj: Any, cls: Any = None) -> Any: return self.fn if obj is None else functools.partial(self.fn, obj)

class IndexingOps:
  __slots__ = ()
  def __getitem__(self: Tensor, idx: Any) -> Tensor:
    if not isinstance(idx, tuple): idx = (idx,)
    if any(i is Ellipsis for i in idx):
      if sum(1 for i in idx if i is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis")
      pos = next(j for j, i in enumerate(idx) if i is Ellipsis)
      n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
      idx = idx[:pos] + (slice(None),) * (self.ndim - n_real) + idx[pos + 1:]
    if sum(1 for i in idx if i is not None) > self.ndim: raise IndexError(f"too many indices for a tensor of {self.ndim} dims")
    x, dim, squeeze = self, 0, []
    shrink, strides = [], []
    for i in idx:
      if i is None: continue
      s = self.shape[dim]
      if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
        j = int(i) + (s if i < 0 else 0)
        if not 0 <= j < s: raise IndexError(f"index {i} is out of bounds for axis {dim} with size {s}")
        shrink.append((j, j + 1)); strides.append(1); squeeze.append(dim)
      elif isinstance(i, slice):
        start, stop, step = i.indices(s)
        if step > 0: lo, hi = start, max(start, stop)
        else: lo, hi = (stop + 1, start + 1) if start > stop else (0, 0)
        shrink.append((lo, hi)); strides.append(step)
      elif isinstance(i, type(self)): raise NotImplementedError("indexing with a Tensor (gather) is not supported yet")
      else: raise TypeError(f"unsupported index {i!r}")
      dim += 1
    shrink += [(0, s) for s in self.shape[dim:]]
    strides += [1] * (self.ndim - dim)
    x = x.shrink(shrink)
    if any(st != 1 for st in strides):
      # a negative step walks from the end of the kept range
      x = x._mv("stride", tuple(strides))
    # drop integer-indexed dims, insert None dims
    out_shape, d = [], 0
    for i in idx:
      if i is None: out_shape.append(1); continue
      if d not in squeeze: out_shape.append(x.shape[d])
      d += 1
    out_shape += list(x.shape[d:])
    return x.reshape(tuple(out_shape))

  @_joins
  def cat(*ts: Tensor, axis: int = 0) -> Tensor:
    """The tensors joined along `axis` (`Tensor.cat(a, b, axis=1)` or `a.cat(b, axis=1)`)."""
    if not ts: raise ValueError("cat needs at least one tensor")
    return ts[0].cat_(*ts[1:], axis=axis)
  def cat_(self: Tensor, *others: Tensor, axis: int = 0) -> Tensor:
    ts = (self,) + others
    a = self._axis(axis)
    for t in ts:
      if t.ndim != self.ndim or any(s != o for i, (s, o) in enumerate(zip(t.shape, self.shape)) if i != a):
        raise ValueError(f"cat: shapes {[t.shape for t in ts]} differ outside axis {a}")
    dt = least_upper_dtype(*[t.dtype for t in ts])
    total = sum(t.shape[a] for t in ts)
    if (nonempty := [t for t in ts if t.shape[a] != 0]): ts = tuple(nonempty)
    out, off = None, 0
    for t in ts:
      p = [(0, 0)] * self.ndim
      p[a] = (off, total - off - t.shape[a])
      piece = t.cast(dt).pad(p)
      # each piece selected in its own range (a constant True padded with False, no buffer): exact for
      # every value, where a sum of zero-padded pieces would turn -0.0 into 0.0
      out = piece if out is None else self.full(t.shape, True, dtypes.bool, t.device).pad(p).where(piece, out)
      off += t.shape[a]
    return out  # type: ignore[return-value]
  @_joins
  def stack(*ts: Tensor, axis: int = 0) -> Tensor:
    """The tensors stacked along a new `axis` (`Tensor.stack(a, b)` or `a.stack(b)`)."""
    if not ts: raise ValueError("stack needs at least one tensor")
    a = axis + ts[0].ndim + 1 if axis < 0 else axis
    return ts[0].unsqueeze(a).cat_(*[t.unsqueeze(a) for t in ts[1:]], axis=a)
