"""View: one strided, offset, optionally masked window onto a flat buffer (API).

Element (i0, i1, ...) of a view reads memory at `offset + sum(i_k * strides[k])`; if a mask is set
and some i_k falls outside mask[k] = (begin, end), the element is invalid (loads give 0, stores
are skipped). Shapes, strides, offsets and masks may be symbolic (`sint`).
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
from tilecraft.helpers import prod
from tilecraft.shape.symbolic import Node, Variable, sint, sym_and, sym_lt, sym_sum, smax, smin, sym_vars

def _eq(a: sint, b: sint) -> bool:
  """Structural equality that never asks for the truth of a symbolic comparison."""
  return a == b if isinstance(a, int) == isinstance(b, int) else False

def _known_lt(a: sint, b: sint) -> Optional[bool]:
  """a < b if decidable from the ranges, else None."""
  r = sym_lt(a, b)
  return bool(r) if isinstance(r, int) else None

def strides_for_shape(shape: tuple[sint, ...]) -> tuple[sint, ...]:
  """Row-major strides; size-1 dims get stride 0."""
  strides: list[sint] = []
  acc: sint = 1
  for s in reversed(shape):
    strides.append(0 if _eq(s, 1) else acc)
    acc = acc * s
  return tuple(reversed(strides))

def _check_shape(shape: tuple) -> None:
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, Node)): raise TypeError(f"shape {shape} has a non-integer dimension {s!r}")
    if isinstance(s, int) and s < 0: raise ValueError(f"shape {shape} has a negative dimension")
    if isinstance(s, Node) and s.vmin < 0: raise ValueError(f"shape {shape} has a dimension {s} that may be negative")

@dataclass(frozen=True)
class View:
  shape: tuple[sint, ...]
  strides: tuple[sint, ...]
  offset: sint
  mask: Optional[tuple[tuple[sint, sint], ...]]
  contiguous: bool

  @staticmethod
  def create(shape: tuple[sint, ...], strides: Optional[tuple[sint, ...]] = None, offset: sint = 0,
             mask: Optional[tuple[tuple[sint, sint], ...]] = None) -> "View":
    """Build a view in canonical form (see module docstring)."""
    shape = tuple(shape)
    _check_shape(shape)
    strides = tuple(strides) if strides is not None else strides_for_shape(shape)
    if len(strides) != len(shape): raise ValueError(f"strides {strides} don't match shape {shape}")
    strides = tuple(0 if _eq(s, 1) else st for s, st in zip(shape, strides))
    if mask is not None:
      mask = tuple(mask)
      if len(mask) != len(shape): raise ValueError(f"mask {mask} doesn't match shape {shape}")
      if any(_known_lt(b, e) is False for b, e in mask):
        # nothing is valid: a canonical all-invalid view
        return View(shape, (0,) * len(shape), 0, ((0, 0),) * len(shape), False)
      if all(_eq(b, 0) and _eq(e, s) for (b, e), s in zip(mask, shape)): mask = None
      else:
        # a dim masked to exactly one element reads one address: fold it into the offset
        new_strides = list(strides)
        for i, ((b, e), st) in enumerate(zip(mask, strides)):
          if _eq(sym_sum((e, -b)) if isinstance(b, Node) or isinstance(e, Node) else e - b, 1) and not _eq(st, 0):
            offset, new_strides[i] = sym_sum((offset, b * st)), 0
        strides = tuple(new_strides)
    contiguous = mask is None and _eq(offset, 0) and strides == strides_for_shape(shape)
    return View(shape, strides, offset, mask, contiguous)

  # ---- queries ------------------------------------------------------------------------------------
  @property
  def size(self) -> sint: return prod(self.shape)
  def vars(self) -> set[Variable]:
    return sym_vars(self.shape) | sym_vars(self.strides) | sym_vars(self.offset) | sym_vars(tuple(x for m in (self.mask or ()) for x in m))

  def expr(self, idxs: tuple[sint, ...]) -> tuple[sint, sint]:
    """(memory index, valid) of the element at `idxs`."""
    idx = sym_sum([self.offset] + [i * st for i, st in zip(idxs, self.strides) if not _eq(st, 0)])
    if self.mask is None: return idx, 1
    conds: list[sint] = []
    for i, (b, e), s in zip(idxs, self.mask, self.shape):
      if not _eq(b, 0): conds.append(1 - sym_lt(i, b))
      if not _eq(e, s): conds.append(sym_lt(i, e))
    return idx, sym_and(*conds)

  # ---- movement ops -------------------------------------------------------------------------------
  def permute(self, order: tuple[int, ...]) -> "View":
    if sorted(order) != list(range(len(self.shape))): raise ValueError(f"permute {order} is not a permutation of {len(self.shape)} axes")
    return View.create(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset,
                       tuple(self.mask[i] for i in order) if self.mask is not None else None)

  def expand(self, new_shape: tuple[sint, ...]) -> "View":
    if len(new_shape) != len(self.shape): raise ValueError(f"expand {self.shape} -> {new_shape}: ranks differ")
    for s, ns in zip(self.shape, new_shape):
      if not _eq(s, ns) and not _eq(s, 1): raise ValueError(f"expand {self.shape} -> {new_shape}: only size-1 dims can expand")
    if any(_eq(s, 0) for s in self.shape) or any(_eq(s, 0) for s in new_shape):
      if not all(_eq(s, ns) for s, ns in zip(self.shape, new_shape)) and not any(_eq(s, 0) for s in new_shape):
        raise ValueError(f"expand {self.shape} -> {new_shape}: cannot expand an empty dim")
      return View.create(new_shape)
    mask = None
    if self.mask is not None:
      mask = tuple(m if _eq(s, ns) else ((0, ns) if not _eq(m[1], 0) else (0, 0)) for m, s, ns in zip(self.mask, self.shape, new_shape))
    return View.create(new_shape, self.strides, self.offset, mask)

  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> "View":
    if len(arg) != len(self.shape): raise ValueError(f"shrink {arg} doesn't match shape {self.shape}")
    for (b, e), s in zip(arg, self.shape):
      if _known_lt(b, 0) is not False or _known_lt(e, b) is not False or _known_lt(s, e) is not False:
        raise ValueError(f"shrink {arg} is out of bounds for shape {self.shape}")
    mask = None
    if self.mask is not None:
      mask = tuple((smax(sym_sum((mb, -b)), 0), smin(sym_sum((me, -b)), sym_sum((e, -b)))) for (mb, me), (b, e) in zip(self.mask, arg))
      mask = tuple((mb, smax(mb, me)) for mb, me in mask)
    offset = sym_sum([self.offset] + [b * st for (b, _), st in zip(arg, self.strides)])
    return View.create(tuple(sym_sum((e, -b)) for b, e in arg), self.strides, offset, mask)

  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> "View":
    if len(arg) != len(self.shape): raise ValueError(f"pad {arg} doesn't match shape {self.shape}")
    for b, e in arg:
      if _known_lt(b, 0) is not False or _known_lt(e, 0) is not False: raise ValueError(f"pad {arg} has a negative amount")
    if all(_eq(b, 0) and _eq(e, 0) for b, e in arg): return self
    new_shape = tuple(sym_sum((b, s, e)) for (b, e), s in zip(arg, self.shape))
    old_mask = self.mask if self.mask is not None else tuple((0, s) for s in self.shape)
    mask = tuple((sym_sum((mb, b)), sym_sum((me, b))) for (mb, me), (b, _) in zip(old_mask, arg))
    offset = sym_sum([self.offset] + [-b * st for (b, _), st in zip(arg, self.strides)])
    return View.create(new_shape, self.strides, offset, mask)

  def stride(self, mul: tuple[int, ...]) -> "View":
    """Take every |m|-th element along each axis; a negative m also flips the axis."""
    if len(mul) != len(self.shape): raise ValueError(f"stride {mul} doesn't match shape {self.shape}")
    if any(not isinstance(m, int) or m == 0 for m in mul): raise ValueError(f"stride {mul}: steps must be nonzero ints")
    shape, strides, offset, mask = list(self.shape), list(self.strides), self.offset, list(self.mask) if self.mask else None
    for i, m in enumerate(mul):
      s = shape[i]
      if m < 0:  # flip: element k reads old element s-1-k
        if isinstance(s, Node) or not _eq(strides[i], 0): offset = sym_sum((offset, (s - 1) * strides[i]))
        strides[i] = -strides[i]
        if mask is not None: mask[i] = (sym_sum((s, -mask[i][1])), sym_sum((s, -mask[i][0])))
        m = -m
      if m != 1:
        if isinstance(s, Node): raise ValueError(f"stride by {m} on symbolic dim {s} is not supported")
        shape[i], strides[i] = (s + m - 1) // m, strides[i] * m
        if mask is not None:
          b, e = mask[i]
          mask[i] = ((b + m - 1) // m, (e + m - 1) // m)
    return View.create(tuple(shape), tuple(strides), offset, tuple(mask) if mask is not None else None)

  def reshape(self, new_shape: tuple[sint, ...]) -> Optional["View"]:
    """The same elements as one view of `new_shape`, or None when one view can't express it."""
    new_shape = tuple(new_shape)
    _check_shape(new_shape)
    if new_shape == self.shape: return self
    old_size, new_size = prod(self.shape), prod(new_shape)
    if not _eq(sym_sum((old_size, -new_size)) if isinstance(old_size, Node) or isinstance(new_size, Node) else old_size - new_size, 0):
      raise ValueError(f"reshape {self.shape} -> {new_shape}: sizes {old_size} and {new_size} differ")
    if any(_eq(s, 0) for s in self.shape): return View.create(new_shape, (0,) * len(new_shape), 0, None if self.mask is None else ((0, 0),) * len(new_shape))
    if self.contiguous: return View.create(new_shape)
    # only size-1 dims added or removed: keep each real dim's stride and mask
    real_old = [i for i, s in enumerate(self.shape) if not _eq(s, 1)]
    real_new = [i for i, s in enumerate(new_shape) if not _eq(s, 1)]
    if [self.shape[i] for i in real_old] == [new_shape[i] for i in real_new]:
      strides = [0] * len(new_shape)
      mask: Optional[list] = None if self.mask is None else [(0, 1)] * len(new_shape)
      for o, n in zip(real_old, real_new):
        strides[n] = self.strides[o]
        if mask is not None: mask[n] = self.mask[o]  # type: ignore[index]
      if mask is not None and any(self.mask[i] != (0, 1) for i, s in enumerate(self.shape) if _eq(s, 1)):  # type: ignore[index]
        return None  # an invalid size-1 dim would be dropped
      return View.create(new_shape, tuple(strides), self.offset, tuple(mask) if mask is not None else None)
    if self.mask is not None: return None  # masked splits/merges are resolved by ShapeTracker.simplify
    # merge adjacent dims that are contiguous with each other into chunks of (size, innermost stride)
    chunks: list[list[sint]] = []
    for s, st in zip(self.shape, self.strides):
      if _eq(s, 1): continue
      if chunks and _eq(chunks[-1][1], st * s): chunks[-1] = [chunks[-1][0] * s, st]
      else: chunks.append([s, st])
    # split each chunk among consecutive new dims
    strides_out: list[sint] = []
    ci = 0
    rem: sint = chunks[0][0] if chunks else 1
    for ns in new_shape:
      if _eq(ns, 1): strides_out.append(0); continue
      if ci >= len(chunks): return None
      q, r = divmod(rem, ns) if isinstance(rem, int) and isinstance(ns, int) else (rem // ns, rem % ns)
      if not _eq(r, 0): return None
      strides_out.append(chunks[ci][1] * q)
      rem = q
      if _eq(rem, 1):
        ci += 1
        rem = chunks[ci][0] if ci < len(chunks) else 1
    if ci != len(chunks): return None
    return View.create(new_shape, tuple(strides_out), self.offset, None)
