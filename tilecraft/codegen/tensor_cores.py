"""The TC opt: lay a MUL->SUM kernel out for a tensor core, and turn it back into an AST.

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
from typing import Any, Optional
from tilecraft.codegen.opt import check as _check
from tilecraft.dtype import DType, dtypes
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, UnaryOps

# exact widenings: every value of the source is a value of the target
_WIDENS = {(dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.float32), (dtypes.float16, dtypes.float64),
           (dtypes.bfloat16, dtypes.float64), (dtypes.float32, dtypes.float64)}

@dataclass(frozen=True)
class TCState:
  """What the TC opt laid out, kept on the kernel (`tensor_core_opts`). Positions are relative to
  their region: lanes are the last `len(lane_bits)` local axes, the TC upcast axes the first
  `len(up_bits)` upcast axes; later opts never insert axes inside either run."""
  tc: Any
  use: int
  lane_bits: tuple[str, ...]   # C-coordinate bit of each lane axis, outermost first
  up_bits: tuple[str, ...]     # coordinate bit of each TC upcast axis, outermost first
  a_src: LazyOp                # the MUL operands feeding A and B (LOAD or CAST(LOAD)), as in the original AST
  b_src: LazyOp
  reduce_dtype: DType          # the original reduce's dtype (dtype_out may be wider: the result is cast back)
  axis_sizes: tuple[int, int, int]  # padded N, M, K sizes of the chosen axes (for show/debug)

# half/bfloat16 operands widened to float32: what the frontend's matmul and conv multiply (DESIGN 12:
# summed in float32), and exactly what a half/bfloat16 -> float core computes, so accepted at tc_opt 0
_CORE_WIDENS = {(dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.float32)}

def _operand_load(x: LazyOp, tc_opt: int) -> Optional[LazyOp]:
  """The LOAD under an operand: LOAD itself, a half/bfloat16 LOAD widened to float32, or (tc_opt >= 1)
  any CAST(LOAD) that widens exactly."""
  if x.op is BufferOps.LOAD and not x.src: return x
  if x.op is UnaryOps.CAST and x.src[0].op is BufferOps.LOAD and not x.src[0].src and \
     (x.src[0].dtype, x.arg) in (_WIDENS if tc_opt >= 1 else _CORE_WIDENS):
    return x.src[0]
  return None

def _pick_core(tcs: list, dtype_in: DType, reduce_dtype: DType) -> Any:
  """The core for these dtypes: one accumulating in the reduce's dtype, else one accumulating in a
  wider float (the sum is then more exact than asked for, and cast back once at the end)."""
  exact = [tc for tc in tcs if tc.dtype_in == dtype_in and tc.dtype_out == reduce_dtype]
  wider = [tc for tc in tcs if tc.dtype_in == dtype_in and (reduce_dtype, tc.dtype_out) in _WIDENS]
  return (exact + wider + [None])[0]

def tc_choices(k: Any, tc_opt: int) -> tuple[Any, LazyOp, LazyOp, list[tuple[int, int, int]]]:
  """(core, A operand, B operand, [(N axis, M axis, reduce axis), ...]) or KernelOptError."""
  tcs = list(getattr(k.opts, "tensor_cores", None) or [])
  _check(bool(tcs), f"TC: {type(k.opts).__name__} has no tensor cores")
  _check(len(k.reduceops) == 1 and k.reduceops[0].op is ReduceOps.SUM, "TC: needs exactly one SUM reduce")
  r = k.reduceops[0]
  mul = r.src[0]
  _check(mul.op is BinaryOps.MUL and len(mul.src) == 2, f"TC: the reduce must be a SUM of a MUL, found {mul.op.name}")
  loads = [_operand_load(s, tc_opt) for s in mul.src]
  _check(all(x is not None for x in loads), "TC: the MUL's operands must be LOADs" + (" (or widening CASTs of LOADs)" if tc_opt >= 1 else " (tc_opt 1 allows CAST(LOAD))"))
  la, lb = loads[0], loads[1]
  assert la is not None and lb is not None
  _check(la.dtype == lb.dtype, f"TC: operands of different dtypes {la.dtype}, {lb.dtype}")
  tc = _pick_core(tcs, la.dtype, r.dtype)
  _check(tc is not None, f"TC: no tensor core on {type(k.opts).__name__} takes {la.dtype} -> {r.dtype} (has {', '.join(map(str, tcs))})")
  red = list(range(k.first_reduce, k.shape_len))
  _check(tc_opt >= 1 or len(red) == 1, f"TC: {len(red)} reduce axes need tc_opt >= 1")
  _check(all(isinstance(s, int) for s in k.full_shape), "TC: not with symbolic shapes")
  sa, sb = k.sts[k.bufs.index(la.arg)].real_strides(), k.sts[k.bufs.index(lb.arg)].real_strides()
  n_axes = [i for i in range(k.first_reduce) if sb[i] == 0 and sa[i] != 0]
  m_axes = [i for i in range(k.first_reduce) if sa[i] == 0 and sb[i] != 0]
  choices = list(itertools.product(n_axes, m_axes, red))
  _check(bool(choices), "TC: no axis pair where A varies and B is broadcast (and the other way round)")
  return tc, mul.src[0], mul.src[1], choices

def apply_tc(k: Any, axis: int, tc_opt: int, use: int) -> None:
  """Apply Opt(TC, axis, tc_opt) to kernel k (k is restored by apply_opt if this raises)."""
  _check(use in (1, 2, 3), f"TC: use_tensor_cores must be 1, 2 or 3, got {use!r}")
  _check(isinstance(tc_opt, int) and not isinstance(tc_opt, bool) and tc_opt in (0, 1, 2), f"TC: tc_opt must be 0, 1 or 2, got {tc_opt!r}")
  _check(k.local_dims == 0 and k.upcasted == 0 and k.group_for_reduces == 0 and not k.dont_use_locals, "TC must be the first opt")
  tc, a_src, b_src, choices = tc_choices(k, tc_opt)
  _check(isinstance(axis, int) and 0 <= axis < len(choices), f"TC: axis {axis} is not one of the {len(choices)} (N, M, reduce) choices")
  _check(use != 1 or k.opts.has_local, "TC: use 1 needs a target with workgroups (locals): the lanes are threads")
  # use 3 stages fragments through local memory; without workgroups one thread holds the whole warp
  # and stages through a stack array (see codegen/lower_wmma.py)
  _check(use != 3 or (k.opts.has_shared if k.opts.has_local else getattr(k.opts, "stack_arrays", False)),
         f"TC: use 3 needs local memory (or, without workgroups, thread-private arrays): {type(k.opts).__name__} has neither")
  n_ax, m_ax, k_ax = choices[axis]
  tiles = dict(zip((n_ax, m_ax, k_ax), tc.dims))
  before = [k.full_shape[a] for a in (n_ax, m_ax, k_ax)]
  for ax, t in tiles.items():
    if k.full_shape[ax] % t == 0: continue
    _check(tc_opt >= 2, f"TC: axis {ax} of size {k.full_shape[ax]} is not a multiple of {t} (tc_opt 2 pads)")
    k._padto(ax, t, broadcast_unmasked=True)
  sizes = tuple(k.full_shape[a] for a in (n_ax, m_ax, k_ax))
  _check(sizes[0] * sizes[1] * sizes[2] <= 4 * before[0] * before[1] * before[2], f"TC: padding {tuple(before)} to {sizes} is more than 4x the work")
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
  k.reshape_and_permute(split, order)
  k.local_dims, k.upcasted = 0, len(up_bits)
  k.simplify_ones()  # drops the size-1 outer parts (so the lanes end right where the reduce starts)
  k.local_dims = len(lane_bits)
  assert k.local_dims == len(lane_bits) and k.upcasted == len(up_bits), "TC: a tile axis was dropped"
  k._check_threads(1)
  k.tensor_core = tc
  k.use_tensor_cores = use
  k.tensor_core_opts = TCState(tc, use, lane_bits, up_bits, a_src, b_src, k.reduceops[0].dtype, sizes)

def tc_axes(k: Any) -> tuple[list[int], list[int]]:
  """The kernel axes of the TC lanes (outermost first) and of the TC upcast bits, right now."""
  st: TCState = k.tensor_core_opts
  lanes = list(range(k.first_reduce - len(st.lane_bits), k.first_reduce))
  ups = list(range(k.first_upcast, k.first_upcast + len(st.up_bits)))
  return lanes, ups

# ---- back to an AST --------------------------------------------------------------------------------

@dataclass(frozen=True)
class WMMAInfo:
  """How a WMMA's operands sit in the kernel: the axis of each register bit (bit 0 first) of A, B
  and C; the lane axes (outermost first); the K axes the instruction sums over."""
  tc: Any
  a_regs: tuple[int, ...]
  b_regs: tuple[int, ...]
  c_regs: tuple[int, ...]
  lanes: tuple[int, ...]
  k_axes: tuple[int, ...]
  use: int
  def __repr__(self) -> str: return f"WMMAInfo({self.tc}, A regs {self.a_regs}, B regs {self.b_regs}, C regs {self.c_regs}, lanes {self.lanes}, use {self.use})"

def _operand_view(k: Any, frag: Any, other_dim: str) -> tuple[list[int], tuple[int, ...]]:
  """(permutation of the kernel axes for this operand, axis of each of its register bits)."""
  st: TCState = k.tensor_core_opts
  lanes, ups = tc_axes(k)
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

def tc_reduce(k: Any, op: LazyOp, fix: Any) -> LazyOp:
  """The optimized AST for the kernel's (TC) reduce; `fix` bakes the kernel's views into a subtree."""
  st: TCState = k.tensor_core_opts
  tc = st.tc
  axes = tuple(k.reduce_axes())
  a, b = fix(st.a_src), fix(st.b_src)
  if st.use == 2:
    if tc.dtype_out == st.reduce_dtype: return LazyOp(op.op, (fix(op.src[0]),), axes)
    mul = LazyOp(BinaryOps.MUL, (_cast(a, tc.dtype_out), _cast(b, tc.dtype_out)))
    return LazyOp(UnaryOps.CAST, (LazyOp(ReduceOps.SUM, (mul,), axes),), st.reduce_dtype)
  perm_a, a_regs = _operand_view(k, tc.layout.a, "m")
  perm_b, b_regs = _operand_view(k, tc.layout.b, "n")
  lanes, ups = tc_axes(k)
  meaning = dict(zip(ups, st.up_bits))
  c_regs = tuple(next(ax for ax in ups if meaning[ax] == bit) for bit in tc.layout.c.regs)
  k_axes = tuple(ax for ax in ups if meaning[ax][0] == "k")
  info = WMMAInfo(tc, a_regs, b_regs, c_regs, tuple(lanes), k_axes, st.use)
  a = _permute_loads(_strip_cast(a), perm_a, {})
  b = _permute_loads(_strip_cast(b), perm_b, {})
  wmma = LazyOp(ReduceOps.WMMA, (a, b), (str(tc), tc.dims, tc.dtype_in, tc.dtype_out, info, axes))
  return wmma if tc.dtype_out == st.reduce_dtype else LazyOp(UnaryOps.CAST, (wmma,), st.reduce_dtype)

def _cast(x: LazyOp, dt: DType) -> LazyOp: return x if x.dtype == dt else LazyOp(UnaryOps.CAST, (x,), dt)
def _strip_cast(x: LazyOp) -> LazyOp: return x.src[0] if x.op is UnaryOps.CAST else x
