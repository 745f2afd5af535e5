"""ShapeTracker: a stack of Views (API). The last view is the logical shape; each earlier view
reinterprets the flat index of the view after it. Movement ops apply to the last view; a reshape
one view can't express appends a new view, and `simplify()` merges views again whenever the
combined index is exactly one strided, masked view (decided by the symbolic simplifier).
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional
from tilecraft.shape.symbolic import And, Lt, Node, Prod, Sum, Variable, sint, sym_and, sym_div, sym_mod, sym_sum, unbind_all
from tilecraft.shape.view import View, _all_ints, _all_invalid, _eq

_AX = "_st_ax"  # prefix of the per-axis Variables used to analyse index expressions
_CLAMP = "_st_clamp"  # prefix of expr_idxs's stand-ins for masked indices (see _clamped_idx)

def _axis_vars(shape: tuple[sint, ...], box: Optional[tuple[tuple[sint, sint], ...]] = None) -> tuple[sint, ...]:
  """One Variable per axis (0 for size-1 axes), ranging over the axis or over box[axis] (int bounds)."""
  out: list[sint] = []
  for i, s in enumerate(shape):
    lo, hi = 0, (s if isinstance(s, int) else s.vmax) - 1
    if box is not None and isinstance(box[i][0], int) and isinstance(box[i][1], int): lo, hi = max(lo, box[i][0]), min(hi, box[i][1] - 1)
    if _eq(s, 1) or hi < lo: out.append(0 if _eq(s, 1) else lo)
    else: out.append(Variable(f"{_AX}{i}", lo, hi))
  return tuple(out)

def _clamped_idx(view: View, idxs: tuple[sint, ...], back: dict[Node, sint]) -> sint:
  """`view`'s memory index at `idxs`, to be unravelled into an earlier view, with each masked dim's
  index replaced by a stand-in Variable whose range is that index's range cut to the mask (recorded in
  `back`, substituted back at the end). The unravelling's div/mod then simplify by the range a valid
  element has: a conv's padded row (x in [0, 64), valid below 56) shifted by its window offset stays
  below the padded image's pitch, so it needn't wrap. Exact wherever the element is valid; where it
  isn't, the index is never used (loads read 0, stores are skipped) and the earlier views' validity is
  ANDed with this view's false one."""
  if view.mask is None: return view.index(idxs)
  clamped = list(idxs)
  for d, (i, (b, e)) in enumerate(zip(idxs, view.mask)):
    if not isinstance(i, Node) or not isinstance(b, int) or not isinstance(e, int): continue
    lo, hi = max(i.vmin, b), min(i.vmax, e - 1)
    if lo > hi or (lo, hi) == (i.vmin, i.vmax): continue
    t = Variable(f"{_CLAMP}{len(back)}", lo, hi)
    # (i may hold an earlier view's stand-ins: `back` maps straight to the caller's indices)
    back[t], clamped[d] = i.substitute(back) if back else i, t
  return view.index(tuple(clamped))

def _terms(x: sint) -> tuple[tuple[Node, int], ...]:
  if isinstance(x, Sum): return x.terms
  return ((x, 1),) if isinstance(x, Node) else ()

def _linear_coeffs(idx: sint, axes: tuple[sint, ...]) -> tuple[dict[Variable, sint], set[Variable], sint]:
  """Split idx into sum(coeff_v * v) over the axis Variables (coeffs free of them), the axes that
  enter any other way (non-linearly), and the rest (the offset)."""
  axis_set = {v for v in axes if isinstance(v, Variable)}
  coeffs: dict[Variable, sint] = {}
  nonlinear: set[Variable] = set()
  offset: list[sint] = [idx.const if isinstance(idx, Sum) else (idx if isinstance(idx, int) else 0)]
  for t, k in _terms(idx):
    if t in axis_set: coeffs[t] = sym_sum((coeffs.get(t, 0), k))  # type: ignore[index]
    elif not (tv := t.vars() & axis_set): offset.append(t * k)
    elif isinstance(t, Prod) and len(tv) == 1 and ((t.a in axis_set and not (t.b.vars() & axis_set)) or (t.b in axis_set and not (t.a.vars() & axis_set))):
      a, other = (t.a, t.b) if t.a in axis_set else (t.b, t.a)  # axis * (something free of the axes)
      coeffs[a] = sym_sum((coeffs.get(a, 0), other * k))  # type: ignore[index]
    elif (aff := _affine_in_one(t, tv)) is not None:
      a, slope, at0 = aff
      coeffs[a] = sym_sum((coeffs.get(a, 0), slope * k))
      offset.append(at0 * k)
    else: nonlinear |= tv
  return coeffs, nonlinear, sym_sum(offset)

_AFFINE_MAX_VALUES = 32

def _affine_in_one(t: Node, tv: set[Variable]) -> Optional[tuple[Variable, int, int]]:
  """A term of one small-range axis Variable (and nothing else) that is affine over that range,
  e.g. `(v+2)%3` for v in [0, 1]: (v, slope, value at v=0), found by evaluating every value."""
  if len(tv) != 1 or t.vars() != tv: return None
  v = next(iter(tv))
  if v.vmax - v.vmin + 1 > _AFFINE_MAX_VALUES: return None
  vals = [t.substitute({v: x}) for x in range(v.vmin, v.vmax + 1)]
  if not all(isinstance(x, int) for x in vals): return None
  slope = vals[1] - vals[0] if len(vals) > 1 else 0
  if any(vals[i] != vals[0] + slope * i for i in range(len(vals))): return None
  return v, slope, vals[0] - slope * v.vmin

def _mask_from_valid(valid: sint, axes: tuple[sint, ...], shape: tuple[sint, ...]) -> Optional[list[list[sint]]]:
  """If valid is a box (each condition bounds one axis Variable), return per-axis [begin, end)."""
  box: list[list[sint]] = [[0, s] for s in shape]
  if isinstance(valid, int): return box if valid else [[0, 0] for _ in shape]
  pos = {v: i for i, v in enumerate(axes) if isinstance(v, Variable)}
  for c in (valid.nodes if isinstance(valid, And) else (valid,)):
    if isinstance(c, Lt) and c.a in pos:  # v < b
      i = pos[c.a]
      box[i][1] = c.b if _eq(box[i][1], shape[i]) else min(box[i][1], c.b)  # type: ignore[type-var]
    elif isinstance(c, Sum) and c.const == 1 and len(c.terms) == 1 and c.terms[0][1] == -1 and isinstance(lt := c.terms[0][0], Lt) \
        and lt.a in pos:  # 1 - (v < b)  ==  v >= b
      i = pos[lt.a]
      box[i][0] = max(box[i][0], lt.b)  # type: ignore[type-var]
    elif len(cv := c.vars()) == 1 and (v := next(iter(cv))) in pos and v.vmax - v.vmin < _AFFINE_MAX_VALUES:
      # a condition on one small-range axis, e.g. (9-v)//5 < 1: find the values where it holds
      ok = [x for x in range(v.vmin, v.vmax + 1) if c.substitute({v: x})]
      if ok and ok != list(range(ok[0], ok[-1] + 1)): return None
      i = pos[v]
      box[i] = [max(box[i][0], ok[0]), min(box[i][1], ok[-1] + 1)] if ok else [0, 0]  # type: ignore[type-var]
    else: return None
  return box

def _view_max_index(v: View) -> sint:
  """The largest memory index a valid element of `v` reads (v is not all-invalid)."""
  box = v.mask if v.mask is not None else tuple((0, s) for s in v.shape)
  hi: sint = v.offset
  for st, (b, e) in zip(v.strides, box):
    if _eq(st, 0): continue
    if isinstance(st, int): hi = sym_sum((hi, st * (e - 1) if st > 0 else st * b))
    else: return (v.expr(_axis_vars(v.shape, box))[0])  # symbolic stride: bound by range analysis
  return hi

_shaped: dict[tuple, "ShapeTracker"] = {}  # int shape -> from_shape's result
_moved: dict[tuple, "ShapeTracker"] = {}  # (op name, tracker, argument) -> result, for concrete trackers and int arguments

def _memoized(fn: Callable) -> Callable:
  """Movement ops are pure: on a concrete tracker with an int argument the result is memoized, as the
  frontend repeats the same ones on every call of a user's function. (Symbolic ones are not: a bound
  Variable compares equal to any other binding of it.)"""
  name = fn.__name__
  @functools.wraps(fn)
  def op(self: "ShapeTracker", arg: Any) -> "ShapeTracker":
    if not isinstance(arg, ShapeTracker): arg = tuple(arg)
    if not (self.concrete and (arg.concrete if isinstance(arg, ShapeTracker) else _all_ints(arg))): return fn(self, arg)
    key = (name, self, arg)
    if (hit := _moved.get(key)) is None:
      if len(_moved) >= 4096: _moved.clear()
      hit = _moved[key] = fn(self, arg)
    return hit
  return op

@dataclass(frozen=True)
class ShapeTracker:
  views: tuple[View, ...]
  def __hash__(self) -> int:  # computed once, like View's (and likewise kept out of pickles)
    if (h := self.__dict__.get("_hash")) is None: h = self.__dict__["_hash"] = hash(self.views)
    return h
  def __getstate__(self) -> dict: return {k: v for k, v in self.__dict__.items() if k != "_hash"}

  @staticmethod
  def from_shape(shape: tuple[sint, ...]) -> "ShapeTracker":
    shape = tuple(shape)
    if not _all_ints(shape): return ShapeTracker((View.create(shape),))
    # int shapes are memoized like View.create's: every new LazyBuffer asks for one
    if (hit := _shaped.get(shape)) is None:
      if len(_shaped) >= 4096: _shaped.clear()
      hit = _shaped[shape] = ShapeTracker((View.create(shape),))
    return hit

  @property
  def shape(self) -> tuple[sint, ...]: return self.views[-1].shape
  @property
  def size(self) -> sint: return self.views[-1].size
  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous
  def __len__(self) -> int: return len(self.views)

  def vars(self) -> set[Variable]: return set() if self.concrete else set().union(*[v.vars() for v in self.views])
  def unbind(self) -> tuple["ShapeTracker", dict[Variable, int]]:
    """Replace bound Variables by unbound ones (kernels are compiled for any value)."""
    var_vals: dict[Variable, int] = {}
    if self.concrete or not any(v.is_bound for v in self.vars()): return self, var_vals
    def ub(x: sint) -> sint:
      y, vals = unbind_all(x)
      var_vals.update(vals)
      return y
    views = tuple(View.create(tuple(ub(s) for s in v.shape), tuple(ub(s) for s in v.strides), ub(v.offset),
                              tuple((ub(b), ub(e)) for b, e in v.mask) if v.mask else None) for v in self.views)
    return ShapeTracker(views), var_vals

  # ---- index expressions --------------------------------------------------------------------------
  def expr_idxs(self, idxs: Optional[tuple[sint, ...]] = None) -> tuple[sint, sint]:
    """(flat memory index, valid) for the element at `idxs` (default: one Variable per axis)."""
    if idxs is None: idxs = _axis_vars(self.shape)
    if len(idxs) != len(self.shape): raise ValueError(f"expr_idxs got {len(idxs)} indices for shape {self.shape}")
    later = self.views[-1]
    back: dict[Node, sint] = {}
    idx = _clamped_idx(later, tuple(idxs), back) if len(self.views) > 1 else later.index(tuple(idxs))
    valid = later.valid(tuple(idxs))
    for n, view in enumerate(reversed(self.views[:-1])):
      if isinstance(valid, int) and not valid: break
      # unravel the flat index into the earlier view's shape, then index that view
      sub: list[sint] = []
      acc: sint = 1
      for s in reversed(view.shape):
        sub.append(0 if _eq(s, 1) else sym_mod(sym_div(idx, acc), s))
        acc = acc * s
      sub.reverse()
      idx = _clamped_idx(view, tuple(sub), back) if n < len(self.views) - 2 else view.index(tuple(sub))
      valid = sym_and(valid, view.valid(tuple(sub)))
    if back:  # the clamped stand-ins back to the indices they stand for
      idx, valid = (x.substitute(back) if isinstance(x, Node) else x for x in (idx, valid))
    return idx, valid

  @functools.cached_property
  def concrete(self) -> bool: return all(v.concrete for v in self.views)

  def real_strides(self, ignore_valid: bool = False) -> tuple[Optional[sint], ...]:
    """Per-axis stride of the memory index; None where the axis enters non-linearly (or through the
    mask, unless ignore_valid). A number is exact: one step along the axis moves the address by it."""
    return (_real_strides_cached if self.concrete else _real_strides)(self, ignore_valid)

  def unit_stride_axes(self, ignore_valid: bool = False) -> list[int]:
    return [i for i, st in enumerate(self.real_strides(ignore_valid)) if isinstance(st, int) and st == 1]

  def axis_is_masked(self, axis: int) -> bool:
    """Whether the validity of an element depends on its index along `axis`."""
    return _masked_axes(self)[axis]

  def real_size(self) -> int:
    """How many elements of the underlying buffer are touched: 1 + the largest index a valid element
    reads (an upper bound when views or shapes are symbolic), 0 when nothing is valid."""
    return _real_size(self)

  # ---- movement ops -------------------------------------------------------------------------------
  def _replace_last(self, v: View, simplify: bool = False) -> "ShapeTracker":
    st = ShapeTracker(self.views[:-1] + (v,))
    return st.simplify() if len(st.views) > 1 and (simplify or v.is_all_invalid) else st
  @_memoized
  def permute(self, order: tuple[int, ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].permute(tuple(order)))
  @_memoized
  def expand(self, shape: tuple[sint, ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].expand(tuple(shape)))
  @_memoized
  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].pad(tuple(arg)))
  # shrinking and striding select fewer elements, which can make the views mergeable
  @_memoized
  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].shrink(tuple(arg)), True)
  @_memoized
  def stride(self, mul: tuple[int, ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].stride(tuple(mul)), True)
  def flip(self, axes: tuple[int, ...]) -> "ShapeTracker":
    axes = tuple(axes)
    if any(not isinstance(a, int) or not 0 <= a < len(self.shape) for a in axes): raise ValueError(f"flip axes {axes} out of range for shape {self.shape}")
    return self.stride(tuple(-1 if i in axes else 1 for i in range(len(self.shape))))
  @_memoized
  def reshape(self, shape: tuple[sint, ...]) -> "ShapeTracker":
    shape = tuple(shape)
    if (v := self.views[-1].reshape(shape)) is not None: return self._replace_last(v, True)
    return ShapeTracker(self.views + (View.create(shape),)).simplify()
  def reduce(self, axis: tuple[int, ...]) -> tuple[sint, ...]:
    """The shape after reducing `axis` (reduced dims become 1)."""
    return tuple(1 if i in axis else s for i, s in enumerate(self.shape))

  # ---- simplification -----------------------------------------------------------------------------
  def simplify(self) -> "ShapeTracker":
    """Merge the last two views while their composition is exactly one view."""
    if len(self.views) >= 2 and any(v.is_all_invalid for v in self.views): return ShapeTracker((_all_invalid(self.shape),))
    st = self
    while len(st.views) >= 2 and (merged := (_merge_views_cached if st.views[-2].concrete and st.views[-1].concrete else _merge_views)(
        st.views[-2], st.views[-1])) is not None:
      st = ShapeTracker(st.views[:-2] + (merged,))
    return st

  @_memoized
  def __add__(self, other: "ShapeTracker") -> "ShapeTracker":
    """Compose: `other` reinterprets this tracker's logical shape."""
    st = self
    for v in other.views: st = ShapeTracker(st.views + (v,)).simplify()
    return st

# ---- cached analyses (the optimizer asks these many times for the same trackers) ------------------
# Analyses whose result may hold Variables are cached only for concrete trackers: Variables compare
# equal whatever value they are bound to, so a cached result could carry another call's bound values.

@functools.lru_cache(maxsize=4096)
def _default_expr(st: ShapeTracker) -> tuple[sint, sint]: return st.expr_idxs(_axis_vars(st.shape))

@functools.lru_cache(maxsize=4096)
def _masked_axes(st: ShapeTracker) -> tuple[bool, ...]:
  if len(st.views) == 1:
    v = st.views[0]
    if v.mask is None: return (False,) * len(v.shape)
    return tuple(not (_eq(b, 0) and _eq(e, s)) for (b, e), s in zip(v.mask, v.shape))
  axes = _axis_vars(st.shape)
  _, valid = _default_expr(st)
  vs = valid.vars() if isinstance(valid, Node) else set()
  return tuple(isinstance(a, Variable) and a in vs for a in axes)

def _real_strides(st: ShapeTracker, ignore_valid: bool) -> tuple[Optional[sint], ...]:
  last = st.views[-1]
  if len(st.views) == 1:
    if last.mask is None or ignore_valid: return last.strides
    return tuple(None if m else s for s, m in zip(last.strides, _masked_axes(st)))
  # analyse the index over the last view's valid box: there it is exact for every valid element
  axes = _axis_vars(st.shape, last.mask)
  idx, _ = st.expr_idxs(axes)
  coeffs, nonlinear, _ = _linear_coeffs(idx, axes)
  masked = _masked_axes(st)
  out: list[Optional[sint]] = []
  for i, a in enumerate(axes):
    if not isinstance(a, Variable): out.append(0)
    elif a in nonlinear or (not ignore_valid and masked[i]): out.append(None)
    else: out.append(coeffs.get(a, 0))
  return tuple(out)

@functools.lru_cache(maxsize=4096)
def _real_size(st: ShapeTracker) -> int:
  if any(v.is_all_invalid for v in st.views) or any(_eq(s, 0) for s in st.shape): return 0
  # the first view addresses the buffer: its valid elements bound what is touched
  hi = _view_max_index(st.views[0])
  if len(st.views) > 1:
    idx, _ = st.expr_idxs(_axis_vars(st.shape, st.views[-1].mask))
    hi2 = idx if isinstance(idx, int) else idx.vmax
    hi = min(hi if isinstance(hi, int) else hi.vmax, hi2)
  # a valid element's index is >= 0, so a bound below 0 means no element is valid
  return max(0, int(hi if isinstance(hi, int) else hi.vmax) + 1)

def _merge_views(v1: View, v2: View) -> Optional[View]:
  """One view equal to v2 over v1, or None. Decided by simplifying the composed index."""
  if v1.contiguous: return v2
  if v2.contiguous and _eq(v1.size, v2.size) and (r := v1.reshape(v2.shape)) is not None: return r
  if v2.is_all_invalid or v1.is_all_invalid: return _all_invalid(v2.shape)
  if any(isinstance(s, Node) for s in v2.shape + v1.shape): return None
  axes = _axis_vars(v2.shape)
  st = ShapeTracker((v1, v2))
  _, valid = st.expr_idxs(axes)
  if isinstance(valid, int) and not valid: return _all_invalid(v2.shape)
  if not v2.shape and not isinstance(valid, int): return None
  box = _mask_from_valid(valid, axes, v2.shape)
  if box is None: return None
  if any(not isinstance(b, int) or not isinstance(e, int) for b, e in box): return None
  if any(b >= e for b, e in box): return _all_invalid(v2.shape)
  # inside the valid box the index must be linear in the axes
  narrowed = _axis_vars(v2.shape, tuple((b, e) for b, e in box))
  idx, _ = st.expr_idxs(narrowed)
  coeffs, nonlinear, offset = _linear_coeffs(idx, narrowed)
  if nonlinear or any(not isinstance(c, int) for c in coeffs.values()) or not isinstance(offset, int): return None
  # (an axis narrowed to one value is an int in `narrowed`: its address is already in the offset)
  strides = tuple(coeffs.get(a, 0) if isinstance(a, Variable) else 0 for a in narrowed)  # type: ignore[call-overload]
  # (a 0-d view that got here is valid: its mask is None, since () would mean all-invalid)
  return View.create(v2.shape, strides, offset, tuple((b, e) for b, e in box) if v2.shape else None)

_real_strides_cached = functools.lru_cache(maxsize=4096)(_real_strides)
_merge_views_cached = functools.lru_cache(maxsize=4096)(_merge_views)
