"""Movement Tensor methods (a mixin of Tensor): reshape, permute, expand, pad, shrink, flip and the
ones made of them. Each is a view of the same data (a new ShapeTracker over the same base: no copy,
no kernel), checked numpy's way first; the views fold into the loads of whatever kernel reads them."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union
import numpy as np
from tilecraft.dtype import dtypes
from tilecraft.engine.lazy import lazy_const
from tilecraft.frontend.shapes import broadcast_shape as _broadcast_shape, norm_shape as _shape, same_dim as _same
from tilecraft.helpers import prod
from tilecraft.shape.symbolic import Node, sint
if TYPE_CHECKING: from tilecraft.tensor import Tensor

class MovementOps:
  __slots__ = ()
  def reshape(self, *shape: Any) -> Tensor:
    shape = _shape(shape)
    if sum(1 for s in shape if isinstance(s, int) and s == -1) > 1: raise ValueError(f"reshape {shape}: at most one -1")
    if -1 in [s for s in shape if isinstance(s, int)]:
      known = prod(s for s in shape if not (isinstance(s, int) and s == -1))
      if known == 0 or self.numel() % known != 0: raise ValueError(f"cannot reshape {self.shape} into {shape}")
      shape = tuple(self.numel() // known if isinstance(s, int) and s == -1 else s for s in shape)
    if any(isinstance(s, int) and s < 0 for s in shape): raise ValueError(f"reshape {shape}: negative dimension")
    if not _same(prod(shape), self.numel()): raise ValueError(f"cannot reshape tensor of shape {self.shape} ({self.numel()} elements) into {shape}")
    return self._mv("reshape", shape) if shape != self.shape else self
  def view(self, *shape: Any) -> Tensor: return self.reshape(*shape)
  def flatten(self, start_dim: int = 0) -> Tensor:
    start_dim = self._axis(start_dim) if self.ndim else 0
    return self.reshape(self.shape[:start_dim] + (prod(self.shape[start_dim:]),))
  def permute(self, *order: Any) -> Tensor:
    n = self.ndim
    order = tuple([self._axis(a, n) for a in _shape(order)])
    if sorted(order) != list(range(n)): raise ValueError(f"permute {order} is not a permutation of {n} axes")
    return self._mv("permute", order) if order != tuple(range(n)) else self
  def transpose(self, a: int = -2, b: int = -1) -> Tensor:
    order = list(range(self.ndim))
    a, b = self._axis(a), self._axis(b)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))
  def expand(self, *shape: Any) -> Tensor:
    shape = _shape(shape)
    shape = tuple(s if not (isinstance(s, int) and s == -1) else o for s, o in zip(shape, (1,) * (len(shape) - self.ndim) + self.shape))
    try: ok = len(shape) >= self.ndim and _broadcast_shape(self.shape, shape) == shape
    except ValueError: ok = False
    if not ok: raise ValueError(f"can't expand shape {self.shape} to {shape}: only size-1 (or new leading) dims can grow")
    return self._expand_to(shape)
  def pad(self, padding: Sequence[tuple[sint, sint]], value: Union[int, float, bool] = 0) -> Tensor:
    """numpy-style: one (before, after) pair per axis."""
    for p in padding:
      if len(p) != 2 or not all(isinstance(x, (int, np.integer, Node)) and not isinstance(x, bool) for x in p):
        raise TypeError(f"pad widths must be (before, after) pairs of integers, got {tuple(padding)}")
    padding = tuple((int(b), int(a)) if isinstance(b, (int, np.integer)) and isinstance(a, (int, np.integer)) else (b, a) for b, a in padding)
    if len(padding) != self.ndim: raise ValueError(f"pad needs {self.ndim} (before, after) pairs, got {len(padding)}")
    for (b, a), s in zip(padding, self.shape):
      if isinstance(b, int) and isinstance(a, int) and isinstance(s, int) and min(b, 0) + min(a, 0) < -s:
        raise ValueError(f"pad {padding} of shape {self.shape}: negative widths remove {-min(b, 0) - min(a, 0)} elements from an axis of {s}")
    if any((isinstance(x, int) and x < 0) for p in padding for x in p): return self._pad_negative(padding, value)
    if all(p == (0, 0) for p in padding): return self
    if 0 in self.shape:  # (a symbolic dim never equals an int)
      return type(self).full(tuple(s + b + a for s, (b, a) in zip(self.shape, padding)), value, self.dtype, self.device)
    ret = self._mv("pad", padding)
    if value == 0: return ret
    mask = type(self)(lazy_const(True, dtypes.bool, self.device, self.shape))._mv("pad", padding)
    return mask.where(ret, type(self)(value, dtype=self.dtype, device=self.device))  # the fill takes the tensor's dtype, as in np.pad
  def _pad_negative(self, padding: tuple, value: Union[int, float, bool]) -> Tensor:
    shrink = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(padding, self.shape))
    return self.shrink(shrink).pad(tuple((max(0, b), max(0, a)) for b, a in padding), value)
  def shrink(self, arg: Sequence[Optional[tuple[sint, sint]]]) -> Tensor:
    if len(arg) != self.ndim: raise ValueError(f"shrink needs {self.ndim} (begin, end) pairs for shape {self.shape}, got {tuple(arg)}")
    arg = tuple(a if a is not None else (0, s) for a, s in zip(arg, self.shape))
    for (b, e), s in zip(arg, self.shape):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise ValueError(f"shrink {arg} is out of range for shape {self.shape}")
    return self._mv("shrink", arg) if any(a != (0, s) for a, s in zip(arg, self.shape)) else self
  def flip(self, axis: Any) -> Tensor:
    axes = {self._axis(a) for a in (axis if isinstance(axis, (list, tuple)) else (axis,))}
    return self._mv("stride", tuple(-1 if i in axes else 1 for i in range(self.ndim))) if axes else self
  def squeeze(self, axis: Optional[int] = None) -> Tensor:
    if axis is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    a = self._axis(axis)
    if self.shape[a] != 1: return self
    return self.reshape(self.shape[:a] + self.shape[a + 1:])
  def unsqueeze(self, axis: int) -> Tensor:
    if not -self.ndim - 1 <= axis <= self.ndim: raise IndexError(f"unsqueeze: axis {axis} is out of range for a new axis of a tensor of {self.ndim} dims")
    a = axis + self.ndim + 1 if axis < 0 else axis
    return self.reshape(self.shape[:a] + (1,) + self.shape[a:])
  def _axis(self, a: int, ndim: Optional[int] = None) -> int:
    n = self.ndim if ndim is None else ndim
    if type(a) is int and 0 <= a < n: return a
    if not isinstance(a, (int, np.integer)) or not -max(n, 1) <= a < max(n, 1): raise IndexError(f"axis {a} is out of range for a tensor of {n} dims")
    return int(a) % max(n, 1)
