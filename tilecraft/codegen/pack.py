"""PACK (CPU): copy the tile of an input that the inner loops of a kernel read into a contiguous
stack array, once per iteration of the pack's scope loop, and read it from there.

The scope is the block loop when the reduce is blocked (BLOCK), else the outermost output loop;
the output loops nested inside the scope (the inner loops) must not move the buffer's address or
validity (stride 0, unmasked), so every inner iteration reads the same tile. The array holds the
buffer's values along the axes that do move them (the reduce axes inside the block and the
unrolled and upcast axes), row-major with the vector axis innermost; masked elements are stored
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

def output_loops(full_shape: tuple[sint, ...], first_reduce: int) -> list[int]:
  """The output axes that are loops on a CPU, outermost first (the lowering's nesting order)."""
  return [a for a in range(first_reduce) if full_shape[a] != 1]

def pack_inner_axes(full_shape: tuple[sint, ...], first_reduce: int, reduce_block: bool) -> list[int]:
  """The output loops nested inside the pack's scope loop."""
  loops = output_loops(full_shape, first_reduce)
  if reduce_block and len(loops) == 1: return loops  # the block loop runs outside the one output loop
  return loops[1:]

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
  inner = pack_inner_axes(full_shape, first_reduce, reduce_block)
  if not inner: return "PACK: no output loop runs inside the pack's scope, so nothing would reuse the packed tile"
  rs = st.real_strides()
  for a in inner:
    if not (rs[a] == 0 and not st.axis_is_masked(a)): return f"PACK: buffer {b.idx} varies along output axis {a}, whose loop runs inside the pack's scope"
  elems = prod(full_shape[a] for a in pack_axes(st, first_reduce, reduce_block))
  if not isinstance(elems, int): return f"PACK: buffer {b.idx}'s tile has a symbolic size"
  if elems * b.dtype.itemsize > PACK_MAX_BYTES:
    return f"PACK: buffer {b.idx}'s tile of {elems * b.dtype.itemsize} bytes is over CPU_PACK_MAX_BYTES ({PACK_MAX_BYTES})"
  return None
