"""ShapeTracker: a stack of Views (API). The last view is the logical shape; each earlier view
reinterprets the flat index of the view after it. Movement ops apply to the last view; a reshape
one view can't express appends a new view, and `simplify()` merges views again whenever the
combined index is exactly one strided, masked view (decided by the symbolic simplifier).
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Optional
from tilecraft.helpers import prod
from tilecraft.shape.symbolic import And, Lt, Node, Sum, Variable, sint, sym_and, sym_div, sym_mod, sym_sum, unbind_all
from tilecraft.shape.view import View, _eq, strides_for_shape

def _axis_vars(shape: tuple[sint, ...], prefix: str = "_ax") -> list[sint]:
  """One Variable per axis (0 for size-1 axes) to analyse index expressions with."""
  out: list[sint] = []
  for i, s in enumerate(shape):
    if _eq(s, 1): out.append(0)
    else: out.append(Variable(f"{prefix}{i}", 0, (s if isinstance(s, int) else s.vmax) - 1))
  return out

def _linear_coeffs(idx: sint, axes: list[sint]) -> Optional[tuple[dict[Variable, sint], sint]]:
  """If idx == offset + sum(coeff_v * v) over the axis Variables (coeffs/offset free of them), return them."""
  axis_set = {v for v in axes if isinstance(v, Variable)}
  terms, const = (idx.terms, idx.const) if isinstance(idx, Sum) else ((((idx, 1),), 0) if isinstance(idx, Node) else ((), idx))
  coeffs: dict[Variable, sint] = {}
  offset: list[sint] = [const]
  for t, k in terms:
    if t in axis_set: coeffs[t] = k  # type: ignore[index]
    elif not (t.vars() & axis_set): offset.append(t * k)
    else: return None
  return coeffs, sym_sum(offset)

def _mask_from_valid(valid: sint, axes: list[sint], shape: tuple[sint, ...]) -> Optional[list[list[sint]]]:
  """If valid is a box (each condition bounds one axis Variable), return per-axis [begin, end)."""
  box = [[0, s] for s in shape]
  if valid == 1: return box
  if isinstance(valid, int): return [[0, 0] for _ in shape]
  pos = {v: i for i, v in enumerate(axes) if isinstance(v, Variable)}
  for c in (valid.nodes if isinstance(valid, And) else (valid,)):
    if isinstance(c, Lt) and c.a in pos: box[pos[c.a]][1] = c.b  # v < b
    elif isinstance(c, Sum) and c.const == 1 and len(c.terms) == 1 and c.terms[0][1] == -1 and isinstance(lt := c.terms[0][0], Lt) \
        and lt.a in pos: box[pos[lt.a]][0] = lt.b  # 1 - (v < b)  ==  v >= b
    else: return None
  return box

@dataclass(frozen=True)
class ShapeTracker:
  views: tuple[View, ...]

  @staticmethod
  def from_shape(shape: tuple[sint, ...]) -> "ShapeTracker": return ShapeTracker((View.create(tuple(shape)),))

  @property
  def shape(self) -> tuple[sint, ...]: return self.views[-1].shape
  @property
  def size(self) -> sint: return self.views[-1].size
  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous
  def __len__(self) -> int: return len(self.views)

  def vars(self) -> set[Variable]: return set().union(*[v.vars() for v in self.views])
  def unbind(self) -> tuple["ShapeTracker", dict[Variable, int]]:
    """Replace bound Variables by unbound ones (kernels are compiled for any value)."""
    var_vals: dict[Variable, int] = {}
    if not any(v.is_bound for v in self.vars()): return self, var_vals
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
    if idxs is None: idxs = tuple(_axis_vars(self.shape))
    idx, valid = self.views[-1].expr(tuple(idxs))
    for view in reversed(self.views[:-1]):
      # unravel the flat index into the earlier view's shape, then index that view
      sub: list[sint] = []
      acc: sint = 1
      for s in reversed(view.shape):
        sub.append(0 if _eq(s, 1) else sym_mod(sym_div(idx, acc), s))
        acc = acc * s
      idx, v2 = view.expr(tuple(reversed(sub)))
      valid = sym_and(valid, v2)
    return idx, valid

  def real_strides(self, ignore_valid: bool = False) -> tuple[Optional[sint], ...]:
    """Per-axis stride of the memory index; None where the axis enters non-linearly (or through the
    mask, unless ignore_valid)."""
    if len(self.views) == 1 and self.views[-1].mask is None: return self.views[-1].strides
    axes = _axis_vars(self.shape)
    idx, valid = self.expr_idxs(tuple(axes))
    terms = idx.terms if isinstance(idx, Sum) else (((idx, 1),) if isinstance(idx, Node) else ())
    direct = {t: k for t, k in terms if isinstance(t, Variable)}
    nonlinear: set[Variable] = set()
    for t, _ in terms:
      if not isinstance(t, Variable): nonlinear |= t.vars()
    masked = valid.vars() if isinstance(valid, Node) else set()
    out: list[Optional[sint]] = []
    for a in axes:
      if not isinstance(a, Variable): out.append(0)
      elif a in nonlinear or (not ignore_valid and a in masked): out.append(None)
      else: out.append(direct.get(a, 0))
    return tuple(out)

  def unit_stride_axes(self, ignore_valid: bool = False) -> list[int]:
    return [i for i, st in enumerate(self.real_strides(ignore_valid)) if isinstance(st, int) and st == 1]

  def axis_is_masked(self, axis: int) -> bool:
    _, valid = self.expr_idxs()
    v = _axis_vars(self.shape)[axis]
    return isinstance(valid, Node) and isinstance(v, Variable) and v in valid.vars()

  def real_size(self) -> int:
    """How many elements of the underlying buffer are touched (1 + the largest index read)."""
    if 0 in self.shape: return 0
    idx, valid = self.expr_idxs()
    if isinstance(valid, int) and valid == 0: return 0
    hi = idx if isinstance(idx, int) else idx.vmax
    return int(hi) + 1

  # ---- movement ops -------------------------------------------------------------------------------
  def _replace_last(self, v: View) -> "ShapeTracker": return ShapeTracker(self.views[:-1] + (v,))
  def permute(self, order: tuple[int, ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].permute(tuple(order)))
  def expand(self, shape: tuple[sint, ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].expand(tuple(shape)))
  def pad(self, arg: tuple[tuple[sint, sint], ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].pad(tuple(arg)))
  def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].shrink(tuple(arg)))
  def stride(self, mul: tuple[int, ...]) -> "ShapeTracker": return self._replace_last(self.views[-1].stride(tuple(mul)))
  def flip(self, axes: tuple[int, ...]) -> "ShapeTracker":
    return self.stride(tuple(-1 if i in axes else 1 for i in range(len(self.shape))))
  def reshape(self, shape: tuple[sint, ...]) -> "ShapeTracker":
    shape = tuple(shape)
    if (v := self.views[-1].reshape(shape)) is not None: return self._replace_last(v)
    return ShapeTracker(self.views + (View.create(shape),)).simplify()
  def reduce(self, axis: tuple[int, ...]) -> tuple[sint, ...]:
    """The shape after reducing `axis` (reduced dims become 1)."""
    return tuple(1 if i in axis else s for i, s in enumerate(self.shape))

  # ---- simplification -----------------------------------------------------------------------------
  def simplify(self) -> "ShapeTracker":
    """Merge the last two views while their composition is exactly one view."""
    st = self
    while len(st.views) >= 2 and (merged := _merge_views(st.views[-2], st.views[-1])) is not None:
      st = ShapeTracker(st.views[:-2] + (merged,))
    return st

  def __add__(self, other: "ShapeTracker") -> "ShapeTracker":
    """Compose: `other` reinterprets this tracker's logical shape."""
    st = self
    for v in other.views: st = ShapeTracker(st.views + (v,)).simplify()
    return st

@functools.lru_cache(maxsize=4096)
def _merge_views(v1: View, v2: View) -> Optional[View]:
  """One view equal to v2 over v1, or None. Decided by simplifying the composed index."""
  if v1.contiguous: return v2
  if any(isinstance(s, Node) for s in v2.shape + v1.shape): return None
  axes = _axis_vars(v2.shape)
  st = ShapeTracker((v1, v2))
  _, valid = st.expr_idxs(tuple(axes))
  box = _mask_from_valid(valid, axes, v2.shape)
  if box is None: return None
  if any(not isinstance(b, int) or not isinstance(e, int) for b, e in box): return None
  if any(b >= e for b, e in box):
    return View.create(v2.shape, mask=tuple((0, 0) for _ in v2.shape))
  # inside the valid box the index must be linear in the axes
  narrowed = [a if not isinstance(a, Variable) else (Variable(a.expr, b, e - 1) if (b, e) != (0, s) else a)
              for a, (b, e), s in zip(axes, box, v2.shape)]
  idx, _ = st.expr_idxs(tuple(narrowed))
  lin = _linear_coeffs(idx, narrowed)
  if lin is None: return None
  coeffs, offset = lin
  if any(not isinstance(c, int) for c in coeffs.values()) or not isinstance(offset, int): return None
  strides = tuple(coeffs.get(a, 0) if isinstance(a, Variable) else 0 for a in narrowed)  # type: ignore[call-overload]
  mask = None if all(b == 0 and e == s for (b, e), s in zip(box, v2.shape)) else tuple((b, e) for b, e in box)
  return View.create(v2.shape, strides, offset, mask)
