"""The Kernel's state and its shape algebra: the views of every buffer, the region counters, and
the checks every opt shares (kernel.py's Kernel adds the opts themselves and the way to a Program).

The kernel keeps one ShapeTracker per buffer, plus an input/output pair per reduce, all of one rank.
Its axes are always ordered by region:

  global | local | group (grouped reduce) | reduce | unrolled reduce | upcast
  blue     cyan    green                   red      magenta           yellow

The TC opt (tensor_cores.py) works on this state and is typed with `KernelShape`: kernel.py imports
tensor_cores.py, so naming `Kernel` there would make codegen/ import itself in a circle.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Optional
from tilecraft.codegen.lower_state import const_sum_reduce
from tilecraft.codegen.opt import Opt, check
from tilecraft.dtype import DType
from tilecraft.helpers import dedup, prod, round_up
from tilecraft.ops import UNSAFE_PAD_OPS, BufferOps, LazyOp, MemBuffer, ReduceOps, verify_ast
from tilecraft.renderer import Renderer, TensorCore
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Node, sint

@dataclass(frozen=True)
class TCState:
  """What the TC opt laid out, kept on the kernel (`tensor_core_opts`). Positions are relative to
  their region: lanes are the last `len(lane_bits)` local axes, the TC upcast axes the first
  `len(up_bits)` upcast axes; later opts never insert axes inside either run."""
  tc: TensorCore
  use: int
  lane_bits: tuple[str, ...]   # C-coordinate bit of each lane axis, outermost first
  up_bits: tuple[str, ...]     # coordinate bit of each TC upcast axis, outermost first
  a_src: LazyOp                # the MUL operands feeding A and B, as in the original AST (A is the MUL's second operand)
  b_src: LazyOp
  reduce_dtype: DType          # the original reduce's dtype (dtype_out may be wider: the result is cast back)
  axis_sizes: tuple[int, int, int]  # padded N, M, K sizes of the chosen axes (for show/debug)
  a_in: Optional[LazyOp] = None  # what the instruction takes for A and B (dtype_in): the operand, or the LOAD under a widening CAST
  b_in: Optional[LazyOp] = None
  nm_outer: tuple[Optional[int], Optional[int]] = (None, None)  # right after the TC opt: the global axes left of N and M (None: all in the tile)

class KernelShape:
  """A kernel's views and region counters, starting from the AST with reduce axes last (no opts).
  What opts do is the Kernel's (codegen/kernel.py): `copy`, `apply_opt` and `apply_tensor_cores` are
  declared here so the heuristics (codegen/heuristic.py, which kernel.py imports) take a typed KernelShape."""
  def copy(self) -> KernelShape: raise NotImplementedError("Kernel.copy (codegen/kernel.py)")
  def apply_opt(self, opt: Opt, append_opt: bool = True, reason: str = "") -> None: raise NotImplementedError("Kernel.apply_opt (codegen/kernel.py)")
  def apply_tensor_cores(self, use_tensor_cores: int = 1, extra_opts: Optional[list[Opt]] = None, axis: int = 0, tc_opt: Optional[int] = None,
                         reason: str = "") -> bool: raise NotImplementedError("Kernel.apply_tensor_cores (codegen/kernel.py)")
  def __init__(self, ast: LazyOp, opts: Renderer):
    self.opts: Renderer = opts
    self.ast = ast
    self._ast_sts = verify_ast(ast)
    self.reduceops: list[LazyOp] = dedup([x for x in ast.lazyops if x.op in ReduceOps])
    self.outbufs: list[MemBuffer] = [x.arg for x in ast.src]
    leaves = [x.arg for x in ast.lazyops if x.op in (BufferOps.LOAD, BufferOps.CONST)]
    self.bufs: list[Any] = dedup(self.outbufs + leaves)
    # virtual trackers at each reduce's input and output keep the reduce axes known
    self.sts: list[ShapeTracker] = [b.st for b in self.bufs]
    for r in self.reduceops:
      self.sts.append(ShapeTracker.from_shape(self._ast_sts[r.src[0]].shape))
      self.sts.append(ShapeTracker.from_shape(self._ast_sts[r].shape))
    self.local_dims, self.upcasted, self.group_for_reduces = 0, 0, 0
    self.dont_use_locals = False
    # BLOCK applied: the first reduce axis counts blocks of the reduce; on a CPU its loop runs just
    # inside the outermost output loop and each block adds to what the previous ones stored
    self.reduce_block = False
    self.packed: tuple[int, ...] = ()  # input buffers (argument numbers) read through a packed stack array (PACK)
    self.tensor_core: Optional[TensorCore] = None
    self.tensor_core_opts: Optional[TCState] = None
    self.use_tensor_cores: int = 0
    self._tc_use: Optional[int] = None  # use_tensor_cores for a TC opt applied now (None: the TC setting)
    self.applied_opts: list[Opt] = []
    self.applied_opts_reasons: list[str] = []
    self.uops: Optional[list] = None
    # put reduce axes last, then drop size-1 axes and merge what can be merged
    reduce_axes = [i for i, (o, f) in enumerate(zip(self.output_shape, self.full_shape)) if o != f]
    self.reshape_and_permute(None, [i for i in range(self.shape_len) if i not in reduce_axes] + reduce_axes)
    self.simplify_ones()
    self.simplify_merge_adjacent()

  def identity(self) -> tuple:
    """The kernel's identity for its AST and renderer: everything an opt may change that code
    generation depends on (the views, the region counts, BLOCK, PACK, the tensor core and its use),
    and nothing else (not the opts that led there). Two kernels of one AST with equal identities
    render the same source; the search dedups candidates by it, the opt sampler checks copy()
    independence and refusal atomicity with it."""
    return (tuple(self.sts), tuple(self.bufs), self.local_dims, self.upcasted, self.group_for_reduces, self.dont_use_locals, self.reduce_block,
            self.packed, self.tensor_core, self.use_tensor_cores)

  # ---- shape bookkeeping --------------------------------------------------------------------------
  @property
  def membufs(self) -> list[MemBuffer]: return [b for b in self.bufs if isinstance(b, MemBuffer)]
  @property
  def shape_len(self) -> int: return len(self.sts[0].shape)
  @property
  def full_shape(self) -> tuple[sint, ...]:
    return self.sts[len(self.bufs)].shape if self.reduceops else self.sts[0].shape
  @property
  def output_shape(self) -> tuple[sint, ...]: return self.sts[0].shape
  @property
  def first_upcast(self) -> int: return self.shape_len - self.upcasted
  @property
  def first_reduce(self) -> int:
    for i in range(self.first_upcast):
      if self.output_shape[i] != self.full_shape[i]: return i
    return self.first_upcast
  @property
  def global_dims(self) -> int: return self.first_reduce - self.local_dims
  @property
  def upcast_in_mid_reduce_axes(self) -> list[int]:
    return [j for j in range(self.first_reduce, self.first_reduce + self.group_for_reduces) if self.full_shape[j] == self.sts[0].shape[j]]
  def reduce_axes(self) -> list[int]:
    """Every axis the reduce runs over (group, red and unrolled axes)."""
    return [i for i in range(self.first_reduce, self.shape_len) if self.output_shape[i] != self.full_shape[i]]
  def upcasted_axis(self, i: int) -> list[tuple[sint, Optional[sint], bool]]:
    """(size, stride in buffer i, is a reduce axis) for each upcast axis."""
    st = self.sts[i]
    return [(s, stride, fs != os) for s, stride, fs, os in zip(st.shape[self.first_upcast:], st.real_strides()[self.first_upcast:],
                                                               self.full_shape[self.first_upcast:], self.output_shape[self.first_upcast:])]
  def float4_axis(self, i: int) -> list[int]:
    """Upcast axes (relative to first_upcast) along which buffer i is contiguous in groups of 4."""
    st = self.sts[i]
    return [x - self.first_upcast for x in st.unit_stride_axes() if x >= self.first_upcast and st.shape[x] % 4 == 0]

  def colors(self) -> list[str]:
    c = ["blue"] * self.global_dims if not self.dont_use_locals else ["BLUE"] * self.global_dims
    c += ["cyan"] * self.local_dims
    c += ["white" if i in self.upcast_in_mid_reduce_axes else "green" for i in range(self.first_reduce, self.first_reduce + self.group_for_reduces)]
    c += ["red"] * (self.first_upcast - (self.first_reduce + self.group_for_reduces))
    c += ["magenta" if self.full_shape[i] != self.output_shape[i] else "yellow" for i in range(self.first_upcast, self.shape_len)]
    return c
  def colored_shape(self, pad: Optional[int] = None, dense: bool = False) -> str:
    codes = {"blue": 34, "BLUE": 94, "cyan": 36, "green": 32, "white": 37, "red": 31, "magenta": 35, "yellow": 33}
    parts = [f"\x1b[{codes[c]}m{(str(s) if dense else f'{str(s):>4}')}\x1b[0m" for s, c in zip(self.full_shape, self.colors())]
    out = " ".join(parts) if not dense else "_".join(parts)
    return out

  def reshape_and_permute(self, new_shape_fxn: Any, axis: Optional[list[int]]) -> None:
    new_sts = []
    for st in self.sts:
      if new_shape_fxn is not None: st = st.reshape(tuple(new_shape_fxn(st.shape)))
      if axis is not None: st = st.permute(tuple(axis))
      new_sts.append(st)
    self.sts = new_sts

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: Optional[int] = None) -> None:
    """Split `amount` off `axis` (inner part, or outer if top) and move it before `insert_before`."""
    if insert_before is None: insert_before = self.shape_len
    move_axis = axis if top else axis + 1
    if move_axis < insert_before: insert_before += 1
    def split(shape: tuple) -> tuple:
      s = shape[axis]
      parts = (1, 1) if s == 1 else ((amount, s // amount) if top else (s // amount, amount))
      return shape[:axis] + parts + shape[axis + 1:]
    order = list(range(self.shape_len + 1))
    order.insert(insert_before, move_axis)
    order.pop(move_axis + (1 if insert_before <= move_axis else 0))
    self.reshape_and_permute(split, order)

  def simplify_ones(self) -> bool:
    """Drop axes of size 1 everywhere, keeping the region counters right."""
    if self.shape_len == 0: return False
    all_ones = [s == 1 for s in self.full_shape]
    self.local_dims -= sum(all_ones[self.first_reduce - self.local_dims:self.first_reduce])
    self.upcasted -= sum(all_ones[self.first_upcast:])
    self.reshape_and_permute(lambda shape: [x for i, x in enumerate(shape) if not all_ones[i]], None)
    return any(all_ones)

  def simplify_merge_adjacent(self) -> None:
    """Merge neighbouring axes that every buffer walks contiguously (same region only)."""
    if self.shape_len == 0: return
    i = 0
    while i < self.shape_len - 1:
      if (i < self.first_reduce) != (i + 1 < self.first_reduce) or i + 1 >= self.first_upcast: i += 1; continue
      merged = []
      full = self.full_shape
      for st in self.sts:
        a, b = st.shape[i], st.shape[i + 1]
        if a == 1 and b == 1: merged.append(st.reshape(st.shape[:i] + (1,) + st.shape[i + 2:])); continue
        if a != full[i] or b != full[i + 1]:  # a broadcast side: expand it so the merged dim has the full size
          if not ((a == 1 or a == full[i]) and (b == 1 or b == full[i + 1])): break
          st = st.expand(st.shape[:i] + (full[i], full[i + 1]) + st.shape[i + 2:])
        v = st.views[-1].reshape(st.shape[:i] + (full[i] * full[i + 1],) + st.shape[i + 2:])
        if v is None: break
        merged.append(ShapeTracker(st.views[:-1] + (v,)))
      else:
        self.sts = merged
        continue
      i += 1

  # ---- checks every opt shares ---------------------------------------------------------------------
  def _check_workgroup(self) -> None:
    """After any opt: later opts grow what earlier ones fit in (LOCAL, UPCAST and PADTO grow a grouped
    reduce's staging buffer; PADTO of a local or group axis adds threads)."""
    if self.group_for_reduces or self.use_tensor_cores == 3: self._check_shared(1)
    if self.local_dims or self.group_for_reduces: self._check_threads(1)

  def _check_threads(self, amt: int) -> None:
    threads = prod(self.full_shape[self.global_dims:self.first_reduce + self.group_for_reduces]) * amt
    check(isinstance(threads, int) and threads <= self.opts.max_threads,
          f"a workgroup of {threads} threads is over the target's limit of {self.opts.max_threads}")
    if self.opts.local_max: check(amt <= max(self.opts.local_max), f"{amt} threads in one dim is over the target's local_max {self.opts.local_max}")

  def _tc_thread_ok(self, axis: int) -> bool:
    """False for the axes a tensor core laid out (its lanes and its register/K bits)."""
    if self.tensor_core is None: return True
    lanes, ups = self.tc_axes()
    return axis not in lanes and axis not in ups

  def _check_shared(self, amt: int) -> None:
    """Everything the kernel keeps in local memory, with `amt` more threads on the next group axis, must
    fit in the target's shared_max: a grouped reduce's staging buffer (locals x group x upcast partials,
    of the reduce's dtype) and TC use 3's fragment staging (see _tc_staging_bytes)."""
    nbytes: Any = 0
    if self.group_for_reduces or amt > 1:
      upcast = prod(s for s, o in zip(self.full_shape[self.first_upcast:], self.output_shape[self.first_upcast:]) if s == o)
      elems = prod(self.full_shape[self.first_reduce - self.local_dims:self.first_reduce + self.group_for_reduces]) * amt * upcast
      nbytes = elems * self.reduceops[0].dtype.itemsize
    nbytes += self._tc_staging_bytes()
    check(isinstance(nbytes, int) and nbytes <= self.opts.shared_max, f"local memory of {nbytes} bytes is over the target's shared_max {self.opts.shared_max}")

  def _tc_staging_bytes(self) -> int:
    """TC use 3 on a target with workgroups (codegen/lower_wmma.py: _emulate_wmma): per warp, one A and
    one B local buffer of threads x registers, doubled when a serial reduce loop alternates halves, for
    every combination of the upcast/unrolled axes added after the TC (each is emulated on its own)."""
    if self.use_tensor_cores != 3 or self.tensor_core is None or not self.opts.has_local: return 0
    tc, st = self.tensor_core, self.tensor_core_opts
    assert st is not None
    lanes = prod(self.full_shape[self.first_reduce - len(st.lane_bits):self.first_reduce])
    warps = prod(self.full_shape[self.global_dims:self.first_reduce]) // lanes
    halves = 2 if self.first_upcast > self.first_reduce else 1
    calls = prod(self.full_shape[self.first_upcast + len(st.up_bits):])
    return int(warps * tc.threads * (tc.layout.a.n_regs + tc.layout.b.n_regs) * tc.dtype_in.itemsize * halves * calls)

  def _padto(self, axis: int, amt: int, broadcast_unmasked: bool = False) -> None:
    """Pad `axis` to a multiple of amt; the padding is masked (reads 0, stores skipped). With
    broadcast_unmasked, a buffer that doesn't depend on the axis stays unmasked along it."""
    check(not any(isinstance(s, Node) for st in self.sts for s in st.shape), "PADTO: not with symbolic shapes")
    check(axis < self.first_upcast, f"PADTO: axis {axis} is upcast")
    check(self._tc_thread_ok(axis), "PADTO: axis is a tensor-core axis")
    size = self.full_shape[axis]
    assert isinstance(size, int)
    if axis >= self.first_reduce:
      check(all(r.op is ReduceOps.SUM for r in self.reduceops), "PADTO: padding a reduce axis needs SUM reduces (MAX would see the padding)")
      for r in self.reduceops:
        check(not any(x.op in UNSAFE_PAD_OPS for x in r.src[0].lazyops), "PADTO: the reduce is fed by an op with f(0) != 0 (unsafe to pad)")
      check(not self.dependent_reduce(), "PADTO: a reduce reads another reduce's result (the padding would not add 0: (0 - mean)^2 != 0)")
    new = round_up(size, amt)
    check(amt > 1, "PADTO: amount must be > 1")
    check(new <= 4 * size, f"PADTO: padding {size} to {new} is more than 4x the work")
    if new == size: return
    def pad(n: int, st: ShapeTracker) -> ShapeTracker:
      if st.shape[axis] == 1: return st
      # (only loads: a store broadcast along the axis would let a padded lane overwrite a real element)
      if broadcast_unmasked and n >= len(self.outbufs) and st.real_strides()[axis] == 0:
        one = st.shrink(tuple((0, 1) if i == axis else (0, s) for i, s in enumerate(st.shape)))
        return one.expand(tuple(new if i == axis else s for i, s in enumerate(st.shape)))
      return st.pad(tuple((0, new - size) if i == axis else (0, 0) for i in range(len(st.shape))))
    self.sts = [pad(n, st) for n, st in enumerate(self.sts)]

  def dependent_reduce(self) -> bool:
    """Some reduce reads another reduce's result, broadcast over the same axes (softmax's
    sum(exp(x - max(x))), a variance around the mean): the lowering runs a second loop over the
    reduce axes after the first one (see lower_reduce.py)."""
    return any(x.op in ReduceOps for r in self.reduceops for x in r.src[0].lazyops)

  def const_sum_reduce(self) -> bool:
    """The kernel's reduce is a SUM of a masked constant (arange-style): lowering computes it in
    closed form unless its axes are unrolled, so heuristics leave those axes alone."""
    return const_sum_reduce(self.reduceops)

  def tc_axes(self) -> tuple[list[int], list[int]]:
    """The kernel axes of the TC lanes (outermost first) and of the TC upcast bits, right now."""
    st = self.tensor_core_opts
    assert st is not None, "tc_axes: no tensor core applied"
    lanes = list(range(self.first_reduce - len(st.lane_bits), self.first_reduce))
    ups = list(range(self.first_upcast, self.first_upcast + len(st.up_bits)))
    return lanes, ups
