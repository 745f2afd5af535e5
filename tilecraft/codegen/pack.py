"""PACK (CPU): copy the tile of an input that the inner loops of a kernel read into a contiguous
stack array, once per iteration of the pack's scope loop, and read it from there.

The scope is the block loop when the reduce is blocked (BLOCK); else the innermost output loop
along which the buffer moves (its address or validity), or the outermost output loop where it moves
along none: a batched operand (attention's k, moving along the batch and column loops) is packed
once per column tile of each batch, inside the batch loop. The output loops nested inside the scope
(the inner loops) must not move the buffer (stride 0, unmasked), so every inner iteration reads the
same tile, and there must be at least one of them (else nothing reuses the tile); every output
loop outside the scope must move it (else each of its iterations would pack the same tile again).
The array holds the buffer's values along the axes that do move them (the reduce axes inside the
block and the unrolled and upcast axes), row-major with the vector axis innermost; masked elements are stored
as 0, the value a masked load gives. For matmul's column operand this turns a block of rows
4 KB apart (cache-set conflicts, a new page per row) into one L1-sized contiguous run.

These are functions of the kernel's shape and the buffer's view: the Kernel applies and re-checks
the opt (kernel.py: _pack, _check_pack), the lowering (lower_pack.py) builds the array.
"""
from __future__ import annotations
from typing import Optional
from tilecraft.dtype import ImageDType
from tilecraft.helpers import getenv, prod
from tilecraft.ops import MemBuffer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import sint

PACK_MAX_BYTES = getenv("CPU_PACK_MAX_BYTES", 256 * 1024)  # a private array per thread, on its stack
# the copy's source is taken to come from memory (a model's weights) where the buffer spans at least this much; smaller
# ones are likely in cache (activations the kernel before wrote). lower_pack.py prefetches a whole panel's copy only then
PREFETCH_MIN_BYTES = 8 << 20

def output_loops(full_shape: tuple[sint, ...], first_reduce: int) -> list[int]:
  """The output axes that are loops on a CPU, outermost first (the lowering's nesting order)."""
  return [a for a in range(first_reduce) if full_shape[a] != 1]

def _moves(st: ShapeTracker, rs: tuple, a: int) -> bool:
  return not (rs[a] == 0 and not st.axis_is_masked(a))

def pack_scope_axis(st: ShapeTracker, full_shape: tuple[sint, ...], first_reduce: int) -> Optional[int]:
  """Without BLOCK: the output axis whose loop is the pack's scope (see the module docstring); None
  where the kernel has no output loop."""
  loops = output_loops(full_shape, first_reduce)
  rs = st.real_strides()
  moving = [a for a in loops if _moves(st, rs, a)]
  return moving[-1] if moving else (loops[0] if loops else None)

def pack_inner_axes(st: ShapeTracker, full_shape: tuple[sint, ...], first_reduce: int, reduce_block: bool) -> list[int]:
  """The output loops nested inside the pack's scope loop, for the buffer read through `st`."""
  loops = output_loops(full_shape, first_reduce)
  if reduce_block: return loops if len(loops) == 1 else loops[1:]  # (the block loop runs outside a single output loop, else after the first)
  scope = pack_scope_axis(st, full_shape, first_reduce)
  return [] if scope is None else loops[loops.index(scope) + 1:]

def pack_axes(st: ShapeTracker, first_reduce: int, reduce_block: bool) -> list[int]:
  """The axes along which the packed array of the buffer read through `st` varies: inner-reduce,
  unrolled and upcast axes that move the buffer's address or validity, the vector axis (if any) last."""
  rs = st.real_strides()
  block = first_reduce if reduce_block else None
  return [a for a in range(first_reduce, len(st.shape)) if a != block and st.shape[a] != 1 and not (rs[a] == 0 and not st.axis_is_masked(a))]

def pack_refusal(b: MemBuffer, st: ShapeTracker, full_shape: tuple[sint, ...], first_reduce: int, reduce_block: bool, tc_or_grouped: bool) -> Optional[str]:
  """Why input buffer b, read through st, can't be packed (None: it can) in a kernel of this shape,
  with tensor cores or a grouped reduce or neither (tc_or_grouped). Checked after PACK and after
  every later opt (they move the axes a pack relies on)."""
  if isinstance(b.dtype, ImageDType): return f"PACK: buffer {b.idx} is an image"
  if tc_or_grouped: return "PACK: not with tensor cores or grouped reduces"
  if not output_loops(full_shape, first_reduce): return "PACK: the kernel has no output loop to be the pack's scope"
  inner = pack_inner_axes(st, full_shape, first_reduce, reduce_block)
  if not inner:
    if reduce_block: return "PACK: no output loop runs inside the pack's scope, so nothing would reuse the packed tile"
    scope, rs = pack_scope_axis(st, full_shape, first_reduce), st.real_strides()
    where = f" (buffer {b.idx} varies along output axis {scope}, the innermost loop)" if scope is not None and _moves(st, rs, scope) else ""
    return f"PACK: no output loop runs inside the pack's scope{where}, so nothing would reuse the packed tile"
  rs = st.real_strides()
  for a in inner:
    if _moves(st, rs, a): return f"PACK: buffer {b.idx} varies along output axis {a}, whose loop runs inside the pack's scope"
  if not reduce_block:
    loops = output_loops(full_shape, first_reduce)
    for a in loops[:loops.index(pack_scope_axis(st, full_shape, first_reduce))]:
      if not _moves(st, rs, a):
        return f"PACK: buffer {b.idx} doesn't vary along output axis {a}, whose loop runs outside the pack's scope: each of its iterations would pack the same tile again"
  elems = prod(full_shape[a] for a in pack_axes(st, first_reduce, reduce_block))
  if not isinstance(elems, int): return f"PACK: buffer {b.idx}'s tile has a symbolic size"
  if elems * b.dtype.itemsize > PACK_MAX_BYTES:
    return f"PACK: buffer {b.idx}'s tile of {elems * b.dtype.itemsize} bytes is over CPU_PACK_MAX_BYTES ({PACK_MAX_BYTES})"
  return None
