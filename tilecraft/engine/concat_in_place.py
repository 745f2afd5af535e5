"""Concatenations written in place: a schedule pass after the kernels are built (engine/schedule.py).

`Tensor.cat` selects each piece from a padded view of it, so scheduling it realizes every piece in a
buffer of its own and then copies them all into the result with one more kernel (a model's fire modules, inception
blocks and dense blocks pay a read and a write of every concatenated value). Where that copy kernel
only gathers whole pieces, and each piece's values are made by a kernel of this schedule that nothing
else reads, the piece's kernel stores straight into its slice of the result instead, and the copy
kernel is dropped.

What the pass rewrites, all of it checked on the built schedule items:
- the copy kernel: one STORE of a contiguous, unmasked view of its output, whose value picks each element
  from one of its LOADs (Tensor.cat's chain of selects, or a sum of zero-padded pieces), all of the
  same dtype, each LOAD the piece's contiguous buffer padded along one axis
  (the same axis for all); the pieces' ranges on that axis are disjoint and cover it. The value may
  be an elementwise function of that selection whose other leaves are unmasked constants (a relu of the
  concatenation: ShuffleNet's units); each piece's kernel then stores that function of its own value;
- every axis before the concat axis has size 1, so each slice is one contiguous run of the output
  (its store view is the piece's own contiguous view plus an offset);
- each piece: a distinct buffer, written by exactly one earlier kernel of one STORE and one output
  value, read by no other item, not an output the caller asked for and not forced to be realized.
The rewritten piece kernels store through the output's view shrunk to their slice; the last of them
(in schedule order) marks the output realized, the others mark nothing. The pieces' LazyBuffers stay
unrealized (with no buffer): a later use of one recomputes it. Anything else is left as it was."""
from __future__ import annotations
from dataclasses import replace
from typing import Any, Optional
from tilecraft.dtype import ImageDType
from tilecraft.helpers import prod
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, TernaryOps, UnaryOps
from tilecraft.shape.shapetracker import ShapeTracker

def _pieces(value: LazyOp) -> Optional[list[LazyOp]]:
  """The LOADs the value picks its elements from, or None if it is anything else than a concatenation
  of them: a chain of selects `WHERE(True in the piece's range, piece, rest)` (Tensor.cat: the
  condition is a constant masked exactly as the piece's load), or a tree of ADDs of zero-padded pieces."""
  out, stack = [], [value]
  while stack:
    x = stack.pop()
    if x.op is BinaryOps.ADD: stack.extend(x.src)
    elif x.op is TernaryOps.WHERE:
      cond, piece, rest = x.src
      if cond.op is not BufferOps.CONST or cond.arg.val is not True or piece.op is not BufferOps.LOAD: return None
      if len(cond.arg.st.views) != 1 or len(piece.arg.st.views) != 1 or cond.arg.st.views[0].mask != piece.arg.st.views[0].mask: return None
      out.append(piece)
      stack.append(rest)
    elif x.op is BufferOps.LOAD: out.append(x)
    else: return None
  return out

_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)

def _may_select(x: LazyOp) -> bool:
  """A cheap test before _pieces: the top of a chain of selects or of a sum of loads."""
  if x.op is TernaryOps.WHERE: return x.src[0].op is BufferOps.CONST and x.src[0].arg.val is True
  return x.op is BinaryOps.ADD and all(y.op in (BinaryOps.ADD, BufferOps.LOAD) for y in x.src)

def _selection(value: LazyOp) -> Optional[tuple[LazyOp, list[LazyOp]]]:
  """(the concatenation, its LOADs) the stored value is an elementwise function of: the value itself, or an
  elementwise op tree whose leaves are that one concatenation and unmasked constants (a relu of it), else None.
  (Walked with a stack: an epilogue may be thousands of ops deep.)"""
  if (loads := _pieces(value)) is not None: return (value, loads) if len(loads) >= 2 else None
  found: Optional[tuple[LazyOp, list[LazyOp]]] = None
  seen: set[int] = set()
  stack = [value]
  while stack:
    x = stack.pop()
    if id(x) in seen: continue
    seen.add(id(x))
    if x.op is BufferOps.CONST:
      if not (all(v.mask is None for v in x.arg.st.views) and isinstance(x.arg.val, (bool, int, float))): return None
    elif _may_select(x) and (ps := _pieces(x)) is not None and len(ps) >= 2:
      if found is not None and found[0] is not x: return None  # (two concatenations)
      found = (x, ps)
    elif isinstance(x.op, _ELEMENTWISE): stack.extend(x.src)
    else: return None
  return found

def _with_piece(value: LazyOp, selection: LazyOp, piece_value: LazyOp, shape: tuple) -> LazyOp:
  """value with the concatenation replaced by one piece's own value, over that piece's kernel shape."""
  done: dict[int, LazyOp] = {id(selection): piece_value}
  stack = [value]
  while stack:
    x = stack[-1]
    if id(x) in done: stack.pop(); continue
    if x.op is BufferOps.CONST:
      done[id(x)] = LazyOp(BufferOps.CONST, (), replace(x.arg, st=ShapeTracker.from_shape((1,) * len(shape)).expand(shape)))
      stack.pop(); continue
    if (todo := [y for y in x.src if id(y) not in done]): stack.extend(todo); continue
    done[id(x)] = LazyOp(x.op, tuple(done[id(y)] for y in x.src), x.arg)
    stack.pop()
  return done[id(value)]

def _slices(ast: LazyOp) -> Optional[tuple[int, list[tuple[int, int, int]], LazyOp]]:
  """For a copy kernel that only gathers padded pieces, maybe under an elementwise epilogue: (the concat
  axis, [(its LOAD's buffer index, begin, end)], the concatenation within the stored value), else None."""
  if ast.op is not MetaOps.KERNEL or len(ast.src) != 1: return None
  store = ast.src[0]
  out: MemBuffer = store.arg
  shape = out.st.shape
  if isinstance(out.dtype, ImageDType) or out.idx != 0 or out.st != ShapeTracker.from_shape(shape) or not all(isinstance(s, int) for s in shape): return None
  if (sel := _selection(store.src[0])) is None: return None
  selection, loads = sel
  axis: Optional[int] = None
  got = []
  for ld in loads:
    mb: MemBuffer = ld.arg
    if mb.dtype != out.dtype or len(mb.st.views) != 1 or (mask := mb.st.views[0].mask) is None: return None
    cut = [a for a, (b, e) in enumerate(mask) if (b, e) != (0, shape[a])]
    if len(cut) != 1 or (axis is not None and cut[0] != axis): return None
    axis = cut[0]
    b, e = mask[axis]
    piece = tuple(e - b if a == axis else s for a, s in enumerate(shape))
    pad = tuple((b, shape[a] - e) if a == axis else (0, 0) for a in range(len(shape)))
    if mb.st != ShapeTracker.from_shape(piece).pad(pad): return None  # the piece's own buffer, contiguous
    got.append((mb.idx, b, e))
  assert axis is not None
  if len({idx for idx, _, _ in got}) != len(got): return None  # one buffer in two slices (a.cat(a)): its kernel can store only one
  if prod(shape[:axis]) != 1: return None  # (a slice is one contiguous run of the output only then)
  spans = sorted((b, e) for _, b, e in got)
  if spans[0][0] != 0 or spans[-1][1] != shape[axis] or any(e != b2 for (_, e), (b2, _) in zip(spans, spans[1:])): return None
  return axis, got, selection

def write_concats_in_place(items: list[Any], requested: list[Any]) -> list[Any]:
  """items (ScheduleItems) with every concatenation this pass can write in place written so (see the
  module's docstring); `requested` are the LazyBuffers the caller asked for."""
  asked = {id(b) for b in requested} | {id(b.base) for b in requested}
  for x, si in enumerate(items):
    if si is None or si.var_vals or len(si.outputs) != 1 or (found := _slices(si.ast)) is None: continue
    axis, got, selection = found
    out_st: ShapeTracker = si.ast.src[0].arg.st
    rewrites: dict[int, Any] = {}
    for idx, b, e in got:
      buf = si.bufs[idx]
      writers = [j for j, o in enumerate(items[:x]) if o is not None and o.bufs and o.bufs[0] is buf]
      readers = [j for j, o in enumerate(items) if o is not None and j != x and any(bb is buf for bb in (o.bufs[1:] if j in writers else o.bufs))]
      if len(writers) != 1 or readers or sum(bb is buf for bb in si.bufs) != 1: break
      w = items[writers[0]]
      if w.ast.op is not MetaOps.KERNEL or len(w.ast.src) != 1 or len(w.outputs) != 1 or w.var_vals: break
      lb = w.outputs[0]
      if id(lb) in asked or lb.forced_realize: break
      wst: ShapeTracker = w.ast.src[0].arg.st
      region = tuple((b, e) if a == axis else (0, s) for a, s in enumerate(out_st.shape))
      piece = tuple(e2 - b2 for b2, e2 in region)
      if wst != ShapeTracker.from_shape(piece).reshape(wst.shape): break  # (stored whole and contiguous)
      st = out_st.shrink(region).reshape(wst.shape)
      value = _with_piece(si.ast.src[0].src[0], selection, w.ast.src[0].src[0], wst.shape)  # (the epilogue, if any, on the piece)
      store = LazyOp(BufferOps.STORE, (value,), replace(w.ast.src[0].arg, st=st))
      rewrites[writers[0]] = (w, LazyOp(MetaOps.KERNEL, (store,)), lb)
    else:
      last = max(rewrites)
      for j, (w, ast, lb) in rewrites.items():
        items[j] = replace(w, ast=ast, bufs=(si.bufs[0],) + tuple(w.bufs[1:]), outputs=si.outputs if j == last else ())
        if lb.base.buffer is w.bufs[0]: lb.base.buffer = None  # (never allocated: nothing holds it)
      items[x] = None
  return [si for si in items if si is not None]
