"""PACK (CPU): copy the tile of an input that the inner loops of a kernel read into a contiguous
stack array, once per iteration of the pack's scope loop, and read it from there.

The scope is the block loop when the reduce is blocked (BLOCK), else the outermost output loop;
the output loops nested inside the scope (the inner loops) must not move the buffer's address or
validity (stride 0, unmasked), so every inner iteration reads the same tile. The array holds the
buffer's values along the axes that do move them (the reduce axes inside the block and the
unrolled and upcast axes), row-major with the vector axis innermost; masked elements are stored
as 0, the value a masked load gives. For matmul's column operand this turns a block of rows
4 KB apart (cache-set conflicts, a new page per row) into one L1-sized contiguous run.
"""
from __future__ import annotations
from typing import Any
from tilecraft.codegen.opt import KernelOptError, check
from tilecraft.dtype import ImageDType
from tilecraft.helpers import getenv, prod
from tilecraft.ops import MemBuffer

PACK_MAX_BYTES = getenv("CPU_PACK_MAX_BYTES", 256 * 1024)  # a private array per thread, on its stack

def output_loops(k: Any) -> list[int]:
  """The output axes that are loops on a CPU, outermost first (the lowerer's nesting order)."""
  return [a for a in range(k.first_reduce) if k.full_shape[a] != 1]

def pack_inner_axes(k: Any) -> list[int]:
  """The output loops nested inside the pack's scope loop."""
  loops = output_loops(k)
  if k.reduce_block and len(loops) == 1: return loops  # the block loop runs outside the one output loop
  return loops[1:]

def pack_buffer(k: Any, idx: int) -> tuple[MemBuffer, Any]:
  """The input MemBuffer with kernel argument `idx` and its ShapeTracker."""
  for b, st in zip(k.bufs, k.sts):
    if isinstance(b, MemBuffer) and b.idx == idx and idx >= len(k.outbufs): return b, st
  raise KeyError(idx)

def pack_axes(k: Any, idx: int) -> list[int]:
  """The axes along which the packed array varies: inner-reduce, unrolled and upcast axes that move
  the buffer's address or validity, the vector axis (if any) last."""
  _, st = pack_buffer(k, idx)
  rs = st.real_strides()
  block = k.first_reduce if k.reduce_block else None
  return [a for a in range(k.first_reduce, k.shape_len) if a != block and st.shape[a] != 1 and not (rs[a] == 0 and not st.axis_is_masked(a))]

def check_pack(k: Any) -> None:
  """Every packed buffer still fits the rules (after PACK and after every later opt)."""
  for idx in k.packed:
    b, st = pack_buffer(k, idx)
    check(not isinstance(b.dtype, ImageDType), f"PACK: buffer {idx} is an image")
    check(k.tensor_core is None and k.group_for_reduces == 0, "PACK: not with tensor cores or grouped reduces")
    check(bool(output_loops(k)), "PACK: the kernel has no output loop to be the pack's scope")
    inner = pack_inner_axes(k)
    check(bool(inner), "PACK: no output loop runs inside the pack's scope, so nothing would reuse the packed tile")
    rs = st.real_strides()
    for a in inner:
      check(rs[a] == 0 and not st.axis_is_masked(a), f"PACK: buffer {idx} varies along output axis {a}, whose loop runs inside the pack's scope")
    elems = prod(k.full_shape[a] for a in pack_axes(k, idx))
    check(isinstance(elems, int), f"PACK: buffer {idx}'s tile has a symbolic size")
    check(elems * b.dtype.itemsize <= PACK_MAX_BYTES, f"PACK: buffer {idx}'s tile of {elems * b.dtype.itemsize} bytes is over CPU_PACK_MAX_BYTES ({PACK_MAX_BYTES})")

def apply_pack(k: Any, idx: Any, amt: Any) -> None:
  """Opt(PACK, idx, 0): pack input buffer `idx` (its kernel argument number)."""
  check(not k.opts.has_local and getattr(k.opts, "stack_arrays", False), "PACK: needs a target without workgroups that has stack arrays (CPU)")
  check(isinstance(idx, int) and not isinstance(idx, bool), f"PACK: axis must be an input buffer's argument number, got {idx!r}")
  check(amt in (0, None), f"PACK: amount must be 0, got {amt!r}")
  try: pack_buffer(k, idx)
  except KeyError: raise KernelOptError(f"PACK: kernel has no input buffer {idx}") from None
  check(idx not in k.packed, f"PACK: buffer {idx} is already packed")
  k.packed = k.packed + (idx,)
  check_pack(k)
