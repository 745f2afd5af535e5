"""View: one strided, offset, optionally masked window onto a flat buffer (API).

Element (i0, i1, ...) of a view reads memory at `offset + sum(i_k * strides[k])`; if a mask is set
and some i_k falls outside mask[k] = (begin, end), the element is invalid (loads give 0, stores
are skipped). Shapes, strides, offsets and masks may be symbolic (`sint`).

Canonical form (what `View.create` returns):
- a size-1 dim has stride 0;
- a mask is clipped to the shape (int bounds) and a full mask is None;
- a dim whose mask keeps exactly one element has stride 0 (its address is folded into the offset);
- a view with no valid element (an empty dim or an empty mask range) is the all-invalid view:
  strides 0, offset 0, mask (0, 0) on every dim; with no dims (shape ()), mask () (an unmasked
  view's mask is None, so () can only mean "invalid": a 0-d view of an all-invalid one stays invalid);
- `contiguous` is True exactly for unmasked row-major views at offset 0.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Optional
from tilecraft.helpers import prod
from tilecraft.shape.symbolic import Node, Variable, sint, sym_and, sym_lt, sym_mod, sym_sum, smax, smin, sym_vars

def _eq(a: sint, b: sint) -> bool:
  """Structural equality that never asks for the truth of a symbolic comparison."""
  if isinstance(a, int) and isinstance(b, int): return a == b
  if isinstance(a, int) or isinstance(b, int): return False
  return a == b

def _diff(a: sint, b: sint) -> sint: return a - b if isinstance(a, int) and isinstance(b, int) else sym_sum((a, -b if isinstance(b, int) else b * -1))

def _known_lt(a: sint, b: sint) -> Optional[bool]:
  """a < b if decidable from the ranges, else None."""
  if isinstance(a, int) and isinstance(b, int): return a < b
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

def _all_invalid(shape: tuple[sint, ...]) -> "View":
  return View(shape, (0,) * len(shape), 0, ((0, 0),) * len(shape), False)

_INT_TYPES = {int, type(None)}

def _all_ints(x: object) -> bool:
  """x is None, an int (not a bool) or a tuple of those, all the way down."""
  if type(x) is not tuple: return type(x) is int or x is None
  types = set(map(type, x))  # (a flat tuple is checked without a Python-level loop)
  if types <= _INT_TYPES: return True
  return tuple in types and types - {tuple} <= _INT_TYPES and all(_all_ints(y) for y in x if type(y) is tuple)

_created: dict[tuple, "View"] = {}  # (shape, strides, offset, mask) of ints -> View.create's result

@dataclass(frozen=True)
class View:
  shape: tuple[sint, ...]
  strides: tuple[sint, ...]
  offset: sint
  mask: Optional[tuple[tuple[sint, sint], ...]]
  contiguous: bool
  # the hash is computed once: views are keys of the movement-op memo, hash-consing and the schedule cache
  # (kept out of pickles: hashes of symbolic views are per process)
  def __hash__(self) -> int:
    if (h := self.__dict__.get("_hash")) is None: h = self.__dict__["_hash"] = hash((self.shape, self.strides, self.offset, self.mask, self.contiguous))
    return h
  def __getstate__(self) -> dict: return {k: v for k, v in self.__dict__.items() if k != "_hash"}

  @staticmethod
  def create(shape: tuple[sint, ...], strides: Optional[tuple[sint, ...]] = None, offset: sint = 0,
             mask: Optional[tuple[tuple[sint, sint], ...]] = None) -> "View":
    """Build a view in canonical form (see module docstring)."""
    shape = tuple(shape)
    if strides is not None: strides = tuple(strides)
    if mask is not None: mask = tuple((b, e) for b, e in mask)
    # views of plain ints are memoized: the frontend and the scheduler rebuild the same ones on every call
    # (symbolic ones are not: a bound Variable compares equal to any other binding of it)
    key = (shape, strides, offset, mask)
    if not _all_ints(key): return View._create(shape, strides, offset, mask)
    if (hit := _created.get(key)) is None:
      if len(_created) >= 4096: _created.clear()
      hit = _created[key] = View._create(shape, strides, offset, mask)
    return hit
  @staticmethod
  def _create(shape: tuple[sint, ...], strides: Optional[tuple[sint, ...]], offset: sint, mask: Optional[tuple[tuple[sint, sint], ...]]) -> "View":
    _check_shape(shape)
    strides = tuple(strides) if strides is not None else strides_for_shape(shape)
    if len(strides) != len(shape): raise ValueError(f"strides {strides} don't match shape {shape}")
    if any(_eq(s, 0) for s in shape): return _all_invalid(shape)
    strides = tuple(0 if _eq(s, 1) else st for s, st in zip(shape, strides))
    if mask is not None:
      mask = tuple((b, e) for b, e in mask)
      if len(mask) != len(shape): raise ValueError(f"mask {mask} doesn't match shape {shape}")
      if not mask: return _all_invalid(shape)  # a 0-d view's mask is None (valid) or () (invalid)
      # clip int bounds to the shape
      mask = tuple((max(b, 0) if isinstance(b, int) else b, min(e, s) if isinstance(e, int) and isinstance(s, int) else e)
                   for (b, e), s in zip(mask, shape))
      if any(_known_lt(b, e) is False for b, e in mask): return _all_invalid(shape)
      if all(_eq(b, 0) and _eq(e, s) for (b, e), s in zip(mask, shape)): mask = None
      else:
        # a dim masked to exactly one element reads one address: fold it into the offset
        new_strides = list(strides)
        for i, ((b, e), st) in enumerate(zip(mask, strides)):
          if not _eq(st, 0) and _eq(_diff(e, b), 1):
            offset, new_strides[i] = sym_sum((offset, b * st)), 0
        strides = tuple(new_strides)
    contiguous = mask is None and _eq(offset, 0) and all(_eq(a, b) for a, b in zip(strides, strides_for_shape(shape)))
    return View(shape, strides, offset, mask, contiguous)

  # ---- queries ------------------------------------------------------------------------------------
  @property
  def size(self) -> sint: return prod(self.shape)
  @property
  def is_all_invalid(self) -> bool:
    """True when no element is valid (canonical form: every mask range is (0, 0))."""
    return self.mask is not None and (not self.mask or any(_known_lt(b, e) is False for b, e in self.mask))
  @functools.cached_property
  def concrete(self) -> bool:
    """No symbolic shape, stride, offset or mask."""
    return isinstance(self.offset, int) and all(isinstance(x, int) for x in self.shape + self.strides) and \
      (self.mask is None or all(isinstance(x, int) for m in self.mask for x in m))
  def vars(self) -> set[Variable]:
    return sym_vars(self.shape) | sym_vars(self.strides) | sym_vars(self.offset) | sym_vars(tuple(x for m in (self.mask or ()) for x in m))

  def expr(self, idxs: tuple[sint, ...]) -> tuple[sint, sint]:
    """(memory index, valid) of the element at `idxs`."""
    return self.index(idxs), self.valid(idxs)
  def index(self, idxs: tuple[sint, ...]) -> sint:
    """The memory index of the element at `idxs` (whether or not it is valid)."""
    if len(idxs) != len(self.shape): raise ValueError(f"{len(idxs)} indices for a view of shape {self.shape}")
    return sym_sum([self.offset] + [i * st for i, st in zip(idxs, self.strides) if not _eq(st, 0)])
  def valid(self, idxs: tuple[sint, ...]) -> sint:
    """Whether the element at `idxs` is valid (1, 0, or a condition)."""
    if self.mask is None: return 1
    if not self.mask: return 0  # the 0-d all-invalid view
    conds: list[sint] = []
    for i, (b, e), s in zip(idxs, self.mask, self.shape):
      if not _eq(b, 0): conds.append(1 - sym_lt(i, b))
      if not _eq(e, s): conds.append(sym_lt(i, e))
    return sym_and(*conds)

  # ---- movement ops -------------------------------------------------------------------------------
  def permute(self, order: tuple[int, ...]) -> "View":
    order = tuple(order)
    if any(isinstance(o, bool) or not isinstance(o, int) for o in order) or sorted(order) != list(range(len(self.shape))):
      raise ValueError(f"permute {order} is not a permutation of {len(self.shape)} axes")
    return View.create(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset,
                       tuple(self.mask[i] for i in order) if self.mask is not None else None)

  def expand(self, new_shape: tuple[sint, ...]) -> "View":
    new_shape = tuple(new_shape)
    if len(new_shape) != len(self.shape): raise ValueError(f"expand {self.shape} -> {new_shape}: ranks differ")
    _check_shape(new_shape)
    for s, ns in zip(self.shape, new_shape):
      if not _eq(s, ns) and not _eq(s, 1): raise ValueError(f"expand {self.shape} -> {new_shape}: only size-1 dims can expand")
    if self.is_all_invalid or any(_eq(s, 0) for s in new_shape): return _all_invalid(new_shape) if new_shape else self
    mask = None
    if self.mask is not None:
      mask = tuple(m if _eq(s, ns) else (0, ns) for m, s, ns in zip(self.mask, self.shape, new_shape))
    return View.create(new_shape, self.strides, self.offset, mask)

  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> "View":
    arg = tuple((b, e) for b, e in arg)
    if len(arg) != len(self.shape): raise ValueError(f"shrink {arg} doesn't match shape {self.shape}")
    for (b, e), s in zip(arg, self.shape):
      if _known_lt(b, 0) is not False or _known_lt(e, b) is not False or _known_lt(s, e) is not False:
        raise ValueError(f"shrink {arg} is out of bounds for shape {self.shape}")
    new_shape = tuple(_diff(e, b) for b, e in arg)
    if self.is_all_invalid: return _all_invalid(new_shape)
    mask = None
    if self.mask is not None:
      mask = tuple((smax(_diff(mb, b), 0), smin(_diff(me, b), _diff(e, b))) for (mb, me), (b, e) in zip(self.mask, arg))
      mask = tuple((mb, smax(mb, me)) for mb, me in mask)
    offset = sym_sum([self.offset] + [b * st for (b, _), st in zip(arg, self.strides)])
    return View.create(new_shape, self.strides, offset, mask)

  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> "View":
    arg = tuple((b, e) for b, e in arg)
    if len(arg) != len(self.shape): raise ValueError(f"pad {arg} doesn't match shape {self.shape}")
    for b, e in arg:
      if _known_lt(b, 0) is not False or _known_lt(e, 0) is not False: raise ValueError(f"pad {arg} has a negative amount")
    if all(_eq(b, 0) and _eq(e, 0) for b, e in arg): return self
    new_shape = tuple(sym_sum((b, s, e)) for (b, e), s in zip(arg, self.shape))
    if self.is_all_invalid: return _all_invalid(new_shape)
    old_mask = self.mask if self.mask is not None else tuple((0, s) for s in self.shape)
    mask = tuple((sym_sum((mb, b)), sym_sum((me, b))) for (mb, me), (b, _) in zip(old_mask, arg))
    offset = sym_sum([self.offset] + [-b * st for (b, _), st in zip(arg, self.strides)])
    return View.create(new_shape, self.strides, offset, mask)

  def stride(self, mul: tuple[int, ...]) -> "View":
    """Take every |m|-th element along each axis; a negative m also flips the axis."""
    mul = tuple(mul)
    if len(mul) != len(self.shape): raise ValueError(f"stride {mul} doesn't match shape {self.shape}")
    if any(isinstance(m, bool) or not isinstance(m, int) or m == 0 for m in mul): raise ValueError(f"stride {mul}: steps must be nonzero ints")
    shape, strides, offset = list(self.shape), list(self.strides), self.offset
    mask = list(self.mask) if self.mask is not None else None
    for i, m in enumerate(mul):
      s = shape[i]
      if m != 1 and isinstance(s, Node) and m != -1: raise ValueError(f"stride by {m} on symbolic dim {s} is not supported")
      if m < 0:  # flip: element k reads old element s-1-k
        if not _eq(strides[i], 0): offset = sym_sum((offset, (s - 1) * strides[i]))
        strides[i] = -strides[i]
        if mask is not None: mask[i] = (_diff(s, mask[i][1]), _diff(s, mask[i][0]))
        m = -m
      if m != 1:
        shape[i], strides[i] = (s + m - 1) // m, strides[i] * m
        if mask is not None:
          b, e = mask[i]
          mask[i] = ((b + m - 1) // m, (e + m - 1) // m)
    if self.is_all_invalid: return _all_invalid(tuple(shape))
    return View.create(tuple(shape), tuple(strides), offset, tuple(mask) if mask is not None else None)

  def reshape(self, new_shape: tuple[sint, ...]) -> Optional["View"]:
    """The same elements as one view of `new_shape`, or None when one view can't express it."""
    new_shape = tuple(new_shape)
    _check_shape(new_shape)
    if len(new_shape) == len(self.shape) and all(_eq(a, b) for a, b in zip(new_shape, self.shape)): return self
    old_size, new_size = prod(self.shape), prod(new_shape)
    if not _eq(_diff(old_size, new_size), 0):
      raise ValueError(f"reshape {self.shape} -> {new_shape}: sizes {old_size} and {new_size} differ")
    if self.is_all_invalid or any(_eq(s, 0) for s in self.shape) or any(_eq(s, 0) for s in new_shape): return _all_invalid(new_shape)
    if self.contiguous: return View.create(new_shape)
    # results are cached only for concrete views: Variables compare equal whatever value they are bound
    # to, so a cached symbolic view could carry another call's bound values
    return (_reshape_cached if self.concrete and all(isinstance(s, int) for s in new_shape) else _reshape_groups)(self, new_shape)

# ---- reshape: match old and new dims in groups of equal size, merge each old group, split it ----------

def _smaller(a: sint, b: sint) -> Optional[bool]:
  """Whether a is a proper part of b (True), b of a (False), or undecidable (None); a != b."""
  if isinstance(a, int) and isinstance(b, int): return a < b
  try:
    if _eq(sym_mod(b, a), 0): return True
    if _eq(sym_mod(a, b), 0): return False
  except ZeroDivisionError: pass
  return None

def _merge_group(dims: list[tuple[sint, sint, Optional[tuple[sint, sint]]]]) -> Optional[tuple[sint, Optional[tuple[sint, sint]], sint]]:
  """Merge consecutive dims (size, stride, mask range or None) into one: (stride, mask range or None
  for all valid, offset change), or None when their valid elements aren't one strided interval."""
  if all(m is None for _, _, m in dims):
    for (_, st, _), (s2, st2, _) in zip(dims, dims[1:]):
      if not _eq(st, st2 * s2): return None
    return dims[-1][1], None, 0
  if not all(isinstance(x, int) for s, st, m in dims for x in (s, st) + (m or ())): return None
  shape = [s for s, _, _ in dims]
  masks = [m if m is not None else (0, s) for s, _, m in dims]
  # the valid box is one interval of the flattened index iff the dims before some q keep one element
  # each, dim q any range, and the dims after q are full
  q = next((k for k, (b, e) in enumerate(masks) if e - b != 1), len(dims))
  if any(m != (0, s) for m, s in zip(masks[q + 1:], shape[q + 1:])): return None
  for k in range(q, len(dims) - 1):
    if dims[k][1] != dims[k + 1][1] * shape[k + 1]: return None
  stride = dims[-1][1] if q < len(dims) else 0
  # place values of each dim in the flattened index
  place, acc = [0] * len(dims), 1
  for k in range(len(dims) - 1, -1, -1): place[k], acc = acc, acc * shape[k]
  base = sum(masks[k][0] * place[k] for k in range(q))
  lo, hi = (base + masks[q][0] * place[q], base + masks[q][1] * place[q]) if q < len(dims) else (base, base + 1)
  # address of a valid element: offset + sum_{k<q} b_k*st_k + stride*(flat - base)
  doff = sum(masks[k][0] * dims[k][1] for k in range(q)) - stride * base
  return stride, ((lo, hi) if (lo, hi) != (0, acc) else None), doff

def _split_group(sizes: list[sint], stride: sint, rng: Optional[tuple[sint, sint]]) -> Optional[tuple[list[sint], Optional[list[tuple[sint, sint]]]]]:
  """Split one dim (stride, valid range or None) into `sizes`: (strides, masks or None), or None
  when the valid range isn't a box in the new dims."""
  strides: list[sint] = []
  acc: sint = stride
  for s in reversed(sizes):
    strides.append(acc)
    acc = acc * s
  strides.reverse()
  if rng is None: return strides, None
  if not all(isinstance(x, int) for x in list(sizes) + list(rng)): return None
  lo, last = rng[0], rng[1] - 1
  dlo, dhi = [], []
  for s in reversed(sizes):
    dlo.append(lo % s); dhi.append(last % s)  # noqa: E702
    lo, last = lo // s, last // s
  dlo.reverse(); dhi.reverse()  # noqa: E702
  p = next((k for k in range(len(sizes)) if dlo[k] != dhi[k]), len(sizes))
  if any(dlo[k] != 0 or dhi[k] != sizes[k] - 1 for k in range(p + 1, len(sizes))): return None
  masks = [(dlo[k], dhi[k] + 1) if k <= p else (0, sizes[k]) for k in range(len(sizes))]
  return strides, masks

def _reshape_groups(v: View, new_shape: tuple[sint, ...]) -> Optional[View]:
  old = [(s, st, None if v.mask is None or (_eq(v.mask[i][0], 0) and _eq(v.mask[i][1], s)) else v.mask[i])
         for i, (s, st) in enumerate(zip(v.shape, v.strides)) if not _eq(s, 1)]
  new = [i for i, s in enumerate(new_shape) if not _eq(s, 1)]
  strides: list[sint] = [0] * len(new_shape)
  mask: list[tuple[sint, sint]] = [(0, s) for s in new_shape]
  masked, offset = False, v.offset
  i = j = 0
  while i < len(old) or j < len(new):
    if i >= len(old) or j >= len(new): return None
    gi, gj = [old[i]], [new[j]]
    i, j = i + 1, j + 1
    osz, nsz = gi[0][0], new_shape[gj[0]]
    while not _eq(osz, nsz):
      sm = _smaller(osz, nsz)
      if sm is None: return None
      if sm:
        if i >= len(old): return None
        gi.append(old[i]); osz = osz * old[i][0]; i += 1  # noqa: E702
      else:
        if j >= len(new): return None
        gj.append(new[j]); nsz = nsz * new_shape[new[j]]; j += 1  # noqa: E702
    if (merged := _merge_group(gi)) is None: return None
    stride, rng, doff = merged
    if (split := _split_group([new_shape[k] for k in gj], stride, rng)) is None: return None
    offset = sym_sum((offset, doff)) if not _eq(doff, 0) else offset
    for k, st in zip(gj, split[0]): strides[k] = st
    if split[1] is not None:
      masked = True
      for k, m in zip(gj, split[1]): mask[k] = m
  return View.create(new_shape, tuple(strides), offset, tuple(mask) if masked else None)

_reshape_cached = functools.lru_cache(maxsize=8192)(_reshape_groups)
