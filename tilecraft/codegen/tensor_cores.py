"""The TC opt: lay a MUL->SUM kernel out for a tensor core, and turn it back into an AST.

Which kernels and which layouts follow the reference (tinygrad 0.9.2), checked against kernels it
scheduled (testing/tc_reference.py): the patterns it matches (SUM(MUL(a, b)), SUM(CAST(MUL(a, b)))
for a core whose dtype_in differs from dtype_out, CAST(LOAD) operands from tc_opt 1, several reduce
axes from tc_opt 1, padding at tc_opt 2), core by core in the target's order, and its numbering of
the (N, M, K) axis choices (see _choices). tilecraft also accepts the frontend's half/bfloat16
matmul, SUM(MUL(CAST(LOAD), CAST(LOAD))) in float32, at tc_opt 0, and a reduce in a dtype with no
core accumulating in it on a core accumulating in a wider float (cast back once).

The instruction's product is exact (half x half and bfloat16 x bfloat16 fit in float32): for the
frontend's pattern that is the AST's meaning; for the reference's SUM(CAST(MUL(half, half))), whose
AST rounds each product to half, use 1 (and use 3) sum the exact products while use 2 and kernels
without TC compute what the AST says.

Applying TC picks an (N axis, M axis, reduce axis) triple, splits a tile of (N, M, K) off them and
cuts each tile dim into bits (axes of size 2). Every bit then takes the role the vendor's C layout
gives it: bit j of the lane id becomes a local axis (the lanes are the innermost local axes, lane
bit 0 innermost, so that linear thread id % threads is the lane), C's register bits become upcast
axes, and the K bits become unrolled reduce axes. With that, each thread computes exactly the C
elements the hardware gives its lane, so a plain MUL/SUM over the same shape (use 2) computes
what the instruction computes (use 1).

A and B are held in other layouts than C. For use 1 the operands' ShapeTrackers are permuted over
the tile bits: at kernel position "lane bit j" operand A' reads A's coordinate bit that the
vendor's A layout puts at lane bit j, and A's register bits sit at chosen upcast positions. A does
not depend on M (checked), so its M bits fill the positions A's layout doesn't use (replicated
lanes, unused registers) with stride 0. The WMMA then takes, per thread, A' at the register
positions, B' likewise, and the C fragment at C's register positions.
"""
from __future__ import annotations
import itertools
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional
from tilecraft.codegen.kernel_shape import KernelShape, TCState
from tilecraft.codegen.opt import KernelOptError, check as _check
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, UnaryOps
from tilecraft.renderer import TensorCore

# exact widenings: every value of the source is a value of the target
_WIDENS = {(dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.float32), (dtypes.float16, dtypes.float64),
           (dtypes.bfloat16, dtypes.float64), (dtypes.float32, dtypes.float64)}

# half/bfloat16 operands widened to float32: what the frontend's matmul and conv multiply (DESIGN 12:
# summed in float32), and exactly what a half/bfloat16 -> float core computes, so accepted at tc_opt 0
_CORE_WIDENS = {(dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.float32)}

def _is_load(x: LazyOp) -> bool: return x.op is BufferOps.LOAD and not x.src

def _reference_operand(x: LazyOp, dtype_in: DType, tc_opt: int) -> bool:
  """The reference's operands: a LOAD of dtype_in, or (tc_opt >= 1) a LOAD cast to dtype_in."""
  if _is_load(x): return x.dtype == dtype_in
  return tc_opt >= 1 and x.op is UnaryOps.CAST and x.arg == dtype_in and _is_load(x.src[0])

def _widened_load(x: LazyOp, tc_opt: int) -> Optional[LazyOp]:
  """tilecraft's own operands: the LOAD under a LOAD, under a half/bfloat16 LOAD widened to float32,
  or (tc_opt >= 1) under any CAST(LOAD) that widens exactly."""
  if _is_load(x): return x
  if x.op is UnaryOps.CAST and _is_load(x.src[0]) and (x.src[0].dtype, x.arg) in (_WIDENS if tc_opt >= 1 else _CORE_WIDENS): return x.src[0]
  return None

def _pick_core(tcs: list[TensorCore], dtype_in: DType, reduce_dtype: DType) -> Optional[TensorCore]:
  """The core for these dtypes: one accumulating in the reduce's dtype, else one accumulating in a
  wider float (the sum is then more exact than asked for, and cast back once at the end)."""
  exact = [tc for tc in tcs if tc.dtype_in == dtype_in and tc.dtype_out == reduce_dtype]
  wider = [tc for tc in tcs if tc.dtype_in == dtype_in and (reduce_dtype, tc.dtype_out) in _WIDENS]
  return (exact + wider + [None])[0]

def _own_match(k: KernelShape, mul: LazyOp, reduce_dtype: DType, tc_opt: int) -> tuple[TensorCore, tuple[LazyOp, LazyOp]] | str:
  """tilecraft's own pattern: SUM(MUL(a, b)) of LOADs, each maybe widened exactly, on the core taking
  the LOADs' dtype and accumulating in the reduce's dtype or a wider float. (core, the LOADs), or why not."""
  loads = [_widened_load(x, tc_opt) for x in mul.src]
  if any(x is None for x in loads): return "TC: the MUL's operands must be LOADs" + (" (or CASTs of LOADs)" if tc_opt >= 1 else " (tc_opt 1 allows CAST(LOAD))")
  la, lb = loads[0], loads[1]
  assert la is not None and lb is not None
  if la.dtype != lb.dtype: return f"TC: operands of different dtypes {la.dtype}, {lb.dtype}"
  tcs = list(k.opts.tensor_cores)
  if (tc := _pick_core(tcs, la.dtype, reduce_dtype)) is None:
    return f"TC: no tensor core on {type(k.opts).__name__} takes {la.dtype} -> {reduce_dtype} (has {', '.join(map(str, tcs))})"
  return tc, (la, lb)

def _match(k: KernelShape, tc_opt: int) -> tuple[TensorCore, LazyOp, tuple[LazyOp, LazyOp]]:
  """(core, the MUL, the instruction's operands for its two sources) or KernelOptError.

  The reference's patterns, core by core in the target's order: SUM(MUL(a, b)) for a core with
  dtype_in == dtype_out, SUM(CAST(MUL(a, b)) -> dtype_out) for one where they differ, a and b LOADs
  of dtype_in or (tc_opt >= 1) CASTs of LOADs to dtype_in. Before them, tilecraft's own for
  operands widened from a core's dtype_in (the frontend's half matmul: float32 products of half
  values, at tc_opt 0), so such a matmul runs on the half core, not on a float one (Metal) after
  converting; after them, its own for plain LOADs of a dtype no core accumulates in (half on CUDA)."""
  tcs = list(k.opts.tensor_cores)
  _check(bool(tcs), f"TC: {type(k.opts).__name__} has no tensor cores")
  _check(len(k.reduceops) == 1 and k.reduceops[0].op is ReduceOps.SUM, "TC: needs exactly one SUM reduce")
  r = k.reduceops[0]
  src = r.src[0]
  mul = src.src[0] if src.op is UnaryOps.CAST else src
  _check(mul.op is BinaryOps.MUL and len(mul.src) == 2,
         f"TC: the reduce must be SUM(MUL(a, b)) or SUM(CAST(MUL(a, b))), found SUM({src.op.name}{'(' + mul.op.name + ')' if mul is not src else ''})")
  if src is mul and any(x.op is UnaryOps.CAST for x in mul.src) and not isinstance(own := _own_match(k, mul, r.dtype, tc_opt), str):
    return own[0], mul, own[1]
  for tc in tcs:
    if (src is not mul) != (tc.dtype_in != tc.dtype_out) or (src is not mul and src.arg != tc.dtype_out): continue
    if all(_reference_operand(x, tc.dtype_in, tc_opt) for x in mul.src): return tc, mul, (mul.src[0], mul.src[1])
  _check(src is mul, f"TC: no core of {type(k.opts).__name__} takes SUM(CAST({src.arg}, MUL)) of these operands "
                     f"(the reference's pattern: a core with that dtype_out, operands LOADs of its dtype_in, or CASTs to it at tc_opt >= 1)")
  own = _own_match(k, mul, r.dtype, tc_opt)
  if isinstance(own, str): raise KernelOptError(own)
  return own[0], mul, own[1]

def _load_of(x: LazyOp) -> LazyOp: return x if _is_load(x) else x.src[0]

def tc_choices(k: KernelShape, tc_opt: int) -> tuple[TensorCore, LazyOp, LazyOp, list[tuple[int, int, int]]]:
  """(core, A operand, B operand, [(N axis, M axis, reduce axis), ...]) or KernelOptError."""
  tc, (a_src, _), (b_src, _), choices = _choices(k, tc_opt)
  return tc, a_src, b_src, choices

def _choices(k: KernelShape, tc_opt: int) -> tuple[TensorCore, tuple[LazyOp, LazyOp], tuple[LazyOp, LazyOp], list[tuple[int, int, int]]]:
  """(core, (A operand, what the instruction takes for it), the same for B, choices) or KernelOptError.

  The choices are numbered as the reference numbers them: N is an axis where the MUL's first
  operand is broadcast (stride 0), M one where the second is, K a reduce axis; choice 0 is the
  last of their product (last N, last M, last K), choice 1 the one before it, and so on. So the
  MUL's second operand is A (it varies along N, not along M) and its first is B."""
  tc, mul, ins = _match(k, tc_opt)
  red = list(range(k.first_reduce, k.shape_len))
  _check(tc_opt >= 1 or len(red) == 1, f"TC: {len(red)} reduce axes need tc_opt >= 1")
  _check(all(isinstance(s, int) for s in k.full_shape), "TC: not with symbolic shapes")
  s0, s1 = (k.sts[k.bufs.index(_load_of(x).arg)].real_strides() for x in mul.src)
  n_axes = [i for i in range(k.first_reduce) if s0[i] == 0]
  m_axes = [i for i in range(k.first_reduce) if s1[i] == 0]
  choices = list(itertools.product(n_axes, m_axes, red))[::-1]
  _check(bool(choices), "TC: no axis where the MUL's first operand is broadcast (N) and one where the second is (M)")
  return tc, (mul.src[1], ins[1]), (mul.src[0], ins[0]), choices

def apply_tc(k: KernelShape, axis: int, tc_opt: int, use: int) -> None:
  """Apply Opt(TC, axis, tc_opt) to kernel k (k is restored by apply_opt if this raises)."""
  _check(use in (1, 2, 3), f"TC: use_tensor_cores must be 1, 2 or 3, got {use!r}")
  _check(isinstance(tc_opt, int) and not isinstance(tc_opt, bool) and tc_opt in (0, 1, 2), f"TC: tc_opt must be 0, 1 or 2, got {tc_opt!r}")
  _check(k.local_dims == 0 and k.upcasted == 0 and k.group_for_reduces == 0 and not k.dont_use_locals, "TC must be the first opt")
  tc, (a_src, a_in), (b_src, b_in), choices = _choices(k, tc_opt)
  _check(isinstance(axis, int) and 0 <= axis < len(choices), f"TC: axis {axis} is not one of the {len(choices)} (N, M, reduce) choices")
  _check(use != 1 or k.opts.has_local, "TC: use 1 needs a target with workgroups (locals): the lanes are threads")
  # use 3 stages fragments through local memory; without workgroups one thread holds the whole warp
  # and stages through a stack array (see codegen/lower_wmma.py)
  _check(use != 3 or (k.opts.has_shared if k.opts.has_local else k.opts.stack_arrays),
         f"TC: use 3 needs local memory (or, without workgroups, thread-private arrays): {type(k.opts).__name__} has neither")
  n_ax, m_ax, k_ax = choices[axis]
  _check(n_ax != m_ax, f"TC: choice {axis} takes axis {n_ax} as both N and M (both operands are broadcast along it)")
  tiles = dict(zip((n_ax, m_ax, k_ax), tc.dims))
  for ax, t in tiles.items():
    if k.full_shape[ax] % t == 0: continue
    _check(tc_opt >= 2, f"TC: axis {ax} of size {k.full_shape[ax]} is not a multiple of {t} (tc_opt 2 pads)")
    # the reference's bound (its PADTO's): the axis must be more than a quarter of what it is padded to
    _check(k.full_shape[ax] > t // 4, f"TC: padding axis {ax} of size {k.full_shape[ax]} to {t} is 4x the work or more")
    k._padto(ax, t, broadcast_unmasked=True)
  sizes = tuple(k.full_shape[a] for a in (n_ax, m_ax, k_ax))
  # split each chosen axis into (outer, bit_hi, ..., bit_0)
  nbits = {ax: t.bit_length() - 1 for ax, t in tiles.items()}
  def split(shape: tuple) -> tuple:
    out: list = []
    for i, s in enumerate(shape):
      if i not in tiles: out.append(s); continue
      out += [1] * (nbits[i] + 1) if s == 1 else [s // tiles[i]] + [2] * nbits[i]
    return tuple(out)
  where: dict[str, int] = {}  # coordinate bit -> axis after the split
  new_ax: list[list[int]] = []
  pos = 0
  for i in range(k.shape_len):
    n = 1 + nbits.get(i, 0)
    new_ax.append(list(range(pos, pos + n)))
    if i in tiles:
      dim = "nmk"[(n_ax, m_ax, k_ax).index(i)]
      for b in range(nbits[i]): where[f"{dim}{b}"] = pos + n - 1 - b
    pos += n
  lay = tc.layout.c
  lane_bits = tuple(reversed(lay.lanes))  # outermost (highest lane bit) first
  up_bits = tuple(reversed(lay.regs)) + tuple(f"k{b}" for b in reversed(range(nbits[k_ax])))
  tc_pos = {where[b] for b in lane_bits + up_bits}
  outer = [p for i in range(k.first_reduce) for p in new_ax[i] if p not in tc_pos]
  reduce_outer = [p for i in range(k.first_reduce, k.shape_len) for p in new_ax[i] if p not in tc_pos]
  order = outer + [where[b] for b in lane_bits] + reduce_outer + [where[b] for b in up_bits]
  # the global axis each of N's and M's outer parts becomes (globals keep their order; size-1 ones go)
  outer_size = {i: (k.full_shape[i] // tiles[i] if i in tiles else k.full_shape[i]) for i in range(k.first_reduce)}
  kept = [i for i in range(k.first_reduce) if outer_size[i] != 1]
  nm_outer = tuple(kept.index(i) if i in kept else None for i in (n_ax, m_ax))
  k.reshape_and_permute(split, order)
  k.local_dims, k.upcasted = 0, len(up_bits)
  k.simplify_ones()  # drops the size-1 outer parts (so the lanes end right where the reduce starts)
  k.local_dims = len(lane_bits)
  assert k.local_dims == len(lane_bits) and k.upcasted == len(up_bits), "TC: a tile axis was dropped"
  k._check_threads(1)
  k.tensor_core = tc
  k.use_tensor_cores = use
  k.tensor_core_opts = TCState(tc, use, lane_bits, up_bits, a_src, b_src, k.reduceops[0].dtype, sizes, a_in, b_in, nm_outer)  # type: ignore[arg-type]

# ---- back to an AST --------------------------------------------------------------------------------

@dataclass(frozen=True)
class WMMAInfo:
  """How a WMMA's operands sit in the kernel: the axis of each register bit (bit 0 first) of A, B
  and C; the lane axes (outermost first); the K axes the instruction sums over."""
  tc: TensorCore
  a_regs: tuple[int, ...]
  b_regs: tuple[int, ...]
  c_regs: tuple[int, ...]
  lanes: tuple[int, ...]
  k_axes: tuple[int, ...]
  use: int
  def __repr__(self) -> str: return f"WMMAInfo({self.tc}, A regs {self.a_regs}, B regs {self.b_regs}, C regs {self.c_regs}, lanes {self.lanes}, use {self.use})"

def _operand_view(k: KernelShape, frag: Any, other_dim: str) -> tuple[list[int], tuple[int, ...]]:
  """(permutation of the kernel axes for this operand, axis of each of its register bits)."""
  st = k.tensor_core_opts
  assert st is not None, "no tensor core applied"
  lanes, ups = k.tc_axes()
  meaning = dict(zip(lanes, st.lane_bits)) | dict(zip(ups, st.up_bits))  # axis -> C/K coordinate bit
  at = {b: ax for ax, b in meaning.items()}
  want: dict[int, Optional[str]] = {ax: frag.lanes[len(lanes) - 1 - i] for i, ax in enumerate(lanes)}
  # register bits: at the upcast axis of the same coordinate bit if it is an upcast axis, else the first free one
  regs: list[int] = []
  for b in frag.regs:
    ax = at[b] if at[b] in ups and at[b] not in regs else next(a for a in ups if a not in regs and meaning[a] not in frag.regs)
    regs.append(ax)
  for ax, b in zip(regs, frag.regs): want[ax] = b
  fill = iter(sorted((ax for ax, b in meaning.items() if b[0] == other_dim), key=lambda a: a))
  perm = list(range(k.shape_len))
  for ax in lanes + ups:
    b = want.get(ax)
    perm[ax] = at[b] if b is not None else next(fill)
  assert sorted(perm) == list(range(k.shape_len)), f"TC: operand permutation {perm} is not a permutation"
  return perm, tuple(regs)

def _permute_loads(x: LazyOp, perm: list[int], memo: dict) -> LazyOp:
  if x in memo: return memo[x]
  if x.op is BufferOps.LOAD and not x.src: ret = LazyOp(BufferOps.LOAD, (), replace(x.arg, st=x.arg.st.permute(tuple(perm))))
  else: ret = LazyOp(x.op, tuple(_permute_loads(s, perm, memo) for s in x.src), x.arg)
  memo[x] = ret
  return ret

def tc_reduce(k: KernelShape, op: LazyOp, fix: Callable[[LazyOp], LazyOp]) -> LazyOp:
  """The optimized AST for the kernel's (TC) reduce; `fix` bakes the kernel's views into a subtree."""
  st = k.tensor_core_opts
  assert st is not None, "no tensor core applied"
  tc = st.tc
  axes = tuple(k.reduce_axes())
  if st.use == 2:
    a, b = fix(st.a_src), fix(st.b_src)
    if tc.dtype_out == st.reduce_dtype: return LazyOp(op.op, (fix(op.src[0]),), axes)
    mul = LazyOp(BinaryOps.MUL, (_cast(a, tc.dtype_out), _cast(b, tc.dtype_out)))
    return LazyOp(UnaryOps.CAST, (LazyOp(ReduceOps.SUM, (mul,), axes),), st.reduce_dtype)
  perm_a, a_regs = _operand_view(k, tc.layout.a, "m")
  perm_b, b_regs = _operand_view(k, tc.layout.b, "n")
  lanes, ups = k.tc_axes()
  meaning = dict(zip(ups, st.up_bits))
  c_regs = tuple(next(ax for ax in ups if meaning[ax] == bit) for bit in tc.layout.c.regs)
  k_axes = tuple(ax for ax in ups if meaning[ax][0] == "k")
  info = WMMAInfo(tc, a_regs, b_regs, c_regs, tuple(lanes), k_axes, st.use)
  assert st.a_in is not None and st.b_in is not None
  a = _permute_loads(fix(st.a_in), perm_a, {})
  b = _permute_loads(fix(st.b_in), perm_b, {})
  wmma = LazyOp(ReduceOps.WMMA, (a, b), (str(tc), tc.dims, tc.dtype_in, tc.dtype_out, info, axes))
  return wmma if tc.dtype_out == st.reduce_dtype else LazyOp(UnaryOps.CAST, (wmma,), st.reduce_dtype)

def _cast(x: LazyOp, dt: DType) -> LazyOp: return x if x.dtype == dt else LazyOp(UnaryOps.CAST, (x,), dt)
