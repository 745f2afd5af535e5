"""Shape arguments of the Tensor frontend: normalizing them and broadcasting."""
from __future__ import annotations
from typing import Any
import numpy as np
from tilecraft.shape.symbolic import Node, sint

def norm_shape(shape: Any) -> tuple:
  """A shape given as f(2, 3) or f((2, 3)) as a tuple of ints / symbolic dims (TypeError otherwise)."""
  if len(shape) == 1 and isinstance(shape[0], (list, tuple)): shape = tuple(shape[0])
  if type(shape) is tuple and all(type(s) is int for s in shape): return shape
  out = tuple(int(s) if isinstance(s, (int, np.integer)) else s for s in shape)
  for s in out:
    if not isinstance(s, (int, Node)): raise TypeError(f"shape {out} has a non-integer dimension {s!r}")
  return out

def pair(x: Any) -> tuple[int, int]:
  """An int or a 2-sequence (kernel size, stride, padding, dilation) as a pair."""
  if isinstance(x, (int, np.integer)): return (int(x), int(x))
  return tuple(int(v) if isinstance(v, np.integer) else v for v in x)  # type: ignore[return-value]

def same_dim(a: sint, b: sint) -> bool:
  if isinstance(a, int) and isinstance(b, int): return a == b
  return (a - b) == 0 if not isinstance(a - b, Node) else False

def broadcast_shape(a: tuple, b: tuple) -> tuple:
  """numpy broadcasting of two shapes (ValueError naming the clashing dim)."""
  if a == b: return a
  n = max(len(a), len(b))
  pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
  out = []
  for i, (x, y) in enumerate(zip(pa, pb)):
    if x == y or (isinstance(y, int) and y == 1): out.append(x)
    elif isinstance(x, int) and x == 1: out.append(y)
    else: raise ValueError(f"shapes {a} and {b} can't be broadcast together (dim {i - n} is {x} vs {y})")
  return tuple(out)

def _plain(x: Any) -> bool:
  """x is an int (not a bool, numpy int or symbolic dim) or a tuple of such, nested."""
  return type(x) is int or (type(x) is tuple and all(_plain(y) for y in x))

def memo_views(fn: Any) -> Any:
  """Memoize a Tensor method made of movement ops only (`fn(self, *args)` is a view of self's base):
  its result is a function of self's view and the arguments, so a user's loop, which calls it with
  the same ones on every call, gets the view in one lookup instead of a dozen movement ops. Only
  concrete views with plain-int arguments are memoized (a bound Variable compares equal to any other
  binding of it; 3.0 == 3 but isn't a valid size), and only results that are a view of self's base."""
  cache: dict[tuple, Any] = {}
  def memoized(self: Any, *args: Any) -> Any:
    lb = self.lazydata
    if not (lb.st.concrete and _plain(args)): return fn(self, *args)
    key = (lb.st, args)
    if (st := cache.get(key)) is not None: return type(self)(lb._view(st))
    out = fn(self, *args)
    if out.lazydata.base is lb.base:
      if len(cache) >= 1024: cache.clear()
      cache[key] = out.lazydata.st
    return out
  memoized.__name__, memoized.__qualname__, memoized.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
  memoized.cache = cache  # type: ignore[attr-defined]
  return memoized
