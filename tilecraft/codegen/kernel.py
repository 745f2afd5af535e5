"""The Kernel: one fused kernel AST plus the optimizations (Opts) that shape its iteration space (API).

Its state and shape algebra (views, regions global | local | group | reduce | unrolled | upcast,
the checks every opt shares) are kernel_shape.py's KernelShape; this file adds the opts, the
optimized AST and the way to a Program. Every Opt splits or moves axes between regions by reshaping
and permuting all ShapeTrackers at once; `apply_opt` either applies an Opt completely or raises
KernelOptError and changes nothing.
"""
from __future__ import annotations
from collections import defaultdict
from dataclasses import replace
from typing import Any, Optional
from tilecraft.dtype import ImageDType
from tilecraft.codegen.opt import KernelOptError, Opt, OptOps, check  # noqa: F401 - Opt, OptOps, KernelOptError: public here (API)
from tilecraft.codegen.pack import pack_refusal
from tilecraft.codegen.heuristic import hand_coded_optimizations, required_optimizations
from tilecraft.codegen.linearize import estimate_flops, linearize_uops
from tilecraft.codegen.kernel_shape import KernelShape
from tilecraft.codegen.lower_state import KernelLayout, launch_dims
from tilecraft.codegen.lowerer import lower_kernel
from tilecraft.codegen.tensor_cores import apply_tc, tc_reduce
from tilecraft.device import Device
from tilecraft.helpers import DEBUG, TC, TC_OPT, getenv
from tilecraft.ops import BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.renderer import Program, Renderer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable

_kernel_names: dict[str, dict[bytes, int]] = defaultdict(dict)

class Kernel(KernelShape):
  def __init__(self, ast: LazyOp, opts: Optional[Renderer] = None):
    super().__init__(ast, opts if opts is not None else Device[Device.DEFAULT].renderer)

  def copy(self) -> "Kernel":
    """An independent copy: opts applied to it never touch this kernel."""
    k = Kernel.__new__(Kernel)
    k.__dict__.update(self.__dict__)
    k.sts, k.bufs = list(self.sts), list(self.bufs)
    k.applied_opts, k.applied_opts_reasons = list(self.applied_opts), list(self.applied_opts_reasons)
    k.uops = None
    return k

  @property
  def name(self) -> str:
    """r/C/E prefix, output count when > 1, then the dims; unique per process for distinct ASTs."""
    prefix = "r" if self.reduceops else ("C" if all(x.op in (BufferOps.LOAD, BufferOps.STORE, MetaOps.KERNEL) for x in self.ast.lazyops) else "E")
    if len(self.outbufs) > 1: prefix += f"{len(self.outbufs)}"
    dims = "_".join(s.expr if isinstance(s, Variable) else str(s) if isinstance(s, int) else "S" for s in self.full_shape)
    base = f"{prefix}_{dims}" if dims else prefix
    seen = _kernel_names[base]
    n = seen.setdefault(self.ast.key, len(seen))
    return base if n == 0 else f"{base}n{n}"

  # ---- opts ---------------------------------------------------------------------------------------
  def apply_opt(self, opt: Opt, append_opt: bool = True, reason: str = "") -> None:
    """Apply `opt` or raise KernelOptError (and leave the kernel unchanged). Any other exception is
    a bug in the opt's code, not a refusal: it propagates as itself, the kernel still restored."""
    saved = self.__dict__.copy()
    try:
      self._apply_opt(opt)
      if self.packed: self._check_pack()  # later opts move the axes a pack relies on
    except BaseException:
      self.__dict__.clear(); self.__dict__.update(saved)
      raise
    if append_opt:
      self.applied_opts.append(opt)
      self.applied_opts_reasons.append(reason or "requested")

  def _apply_opt(self, opt: Opt) -> None:
    check(isinstance(opt, Opt) and isinstance(opt.op, OptOps), f"not an Opt: {opt!r}")
    check(not (self.applied_opts and opt.op is OptOps.TC), "TC must be the first opt")
    if opt.op is OptOps.TC:
      check(isinstance(opt.axis, int) and not isinstance(opt.axis, bool), f"TC: axis must be an int, got {opt.axis!r}")
      apply_tc(self, opt.axis, 0 if opt.amt is None else opt.amt, self._tc_use if self._tc_use is not None else int(TC))
      self._check_workgroup()
      return
    if opt.op is OptOps.NOLOCALS:
      check(self.opts.has_local, "NOLOCALS: target has no local (workgroup) dims")
      check(not self.dont_use_locals, "NOLOCALS already applied")
      check(self.local_dims == 0 and self.group_for_reduces == 0, "NOLOCALS can't be applied after locals are used")
      self.dont_use_locals = True
      return
    if opt.op is OptOps.PACK:
      self._pack(opt.axis, opt.amt)
      return
    check(opt.axis is not None and isinstance(opt.axis, int) and not isinstance(opt.axis, bool) and opt.axis >= 0,
          f"{opt.op.name}: axis must be a non-negative int, got {opt.axis!r}")
    axis = opt.real_axis(self)
    check(axis < self.shape_len, f"{opt.op.name}: axis {axis} is out of range for a kernel with {self.shape_len} dims")
    if opt.op is OptOps.SWAP:
      check(isinstance(opt.amt, int) and axis < opt.amt < self.global_dims, f"SWAP: needs axis < amt < global_dims ({self.global_dims}), got {axis}, {opt.amt}")
      order = list(range(self.shape_len))
      order[axis], order[opt.amt] = order[opt.amt], order[axis]
      self.reshape_and_permute(None, order)
      return
    size = self.full_shape[axis]
    check(isinstance(opt.amt, int) and not isinstance(opt.amt, bool) and opt.amt >= 0, f"{opt.op.name}: amount must be a non-negative int, got {opt.amt!r}")
    amt = opt.amt if opt.amt != 0 else size
    if opt.op is OptOps.PADTO:
      self._padto(axis, amt, broadcast_unmasked=axis < self.first_reduce)
      self._check_workgroup()
      return
    check(isinstance(size, int), f"{opt.op.name}: axis {axis} has symbolic size {size}")
    check(isinstance(amt, int) and amt > 1 if opt.op is not OptOps.LOCAL else amt >= 1, f"{opt.op.name}: amount {amt} must be > 1")
    check(size % amt == 0, f"{opt.op.name}: {amt} does not divide axis {axis} of size {size}")
    if opt.op is OptOps.LOCAL:
      check(self.opts.has_local, "LOCAL: target has no local (workgroup) dims")
      check(not self.dont_use_locals, "LOCAL: can't use locals after NOLOCALS")
      check(axis < self.global_dims, f"LOCAL: axis {axis} is not a global axis (global dims: {self.global_dims})")
      check(self._tc_thread_ok(axis), "LOCAL: axis is a tensor-core thread axis")
      # the tensor core's lanes stay the innermost local axes (linear thread id % threads = lane)
      lanes = len(self.tensor_core_opts.lane_bits) if self.tensor_core is not None else 0
      self._check_threads(amt)
      self.shift_to(axis, amt, insert_before=self.first_reduce - lanes)
      self.local_dims += 1
    elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      check(self.opts.has_local and self.opts.has_shared, f"{opt.op.name}: target has no local memory")
      check(not self.dont_use_locals, f"{opt.op.name}: can't group after NOLOCALS")
      check(self.first_reduce + self.group_for_reduces <= axis < self.first_upcast, f"{opt.op.name}: axis {axis} is not a reduce axis")
      check(len(self.reduceops) == 1, f"{opt.op.name}: grouping needs exactly one reduce, kernel has {len(self.reduceops)}")
      check(self.tensor_core is None, f"{opt.op.name}: can't group with tensor cores")
      self._check_shared(amt)
      self._check_threads(amt)
      self.shift_to(axis, amt, top=opt.op is OptOps.GROUPTOP, insert_before=self.first_reduce + self.group_for_reduces)
      self.group_for_reduces += 1
    elif opt.op is OptOps.BLOCK: self._block(axis, amt)
    elif opt.op is OptOps.UNROLL:
      check(axis < self.first_upcast, f"UNROLL: axis {axis} is already upcast")
      check(not (self.reduce_block and axis == self.first_reduce), "UNROLL: axis is the reduce's block axis (BLOCK)")
      # a group axis may be unrolled too (UNROLL counts from first_reduce): in part, it stays a group
      # axis with fewer threads; in full, it leaves the group region
      check(axis not in self.upcast_in_mid_reduce_axes, f"UNROLL: axis {axis} is an UPCASTMID (output) axis, not a reduce axis")
      check(amt <= 32, f"UNROLL: amount {amt} is over 32")
      if amt == size and axis < self.first_reduce + self.group_for_reduces: self.group_for_reduces -= 1
      self.shift_to(axis, amt, insert_before=None)
      self.upcasted += 1
      # a fully unrolled reduce axis leaves a size-1 remnant where it was: drop it here, as a reduce axis
      # (simplify_ones would count it in the local region when it sits right before first_reduce)
      if self.full_shape[axis] == 1: self.reshape_and_permute(lambda shape: tuple(shape[:axis]) + tuple(shape[axis + 1:]), None)
    elif opt.op is OptOps.UPCAST:
      check(axis < self.first_reduce, f"UPCAST: axis {axis} is a reduce axis (use UNROLL)")
      check(self._tc_thread_ok(axis), "UPCAST: axis is a tensor-core thread axis")
      check(amt <= 16, f"UPCAST: amount {amt} is over 16")
      self.shift_to(axis, amt, insert_before=None)
      self.upcasted += 1
    elif opt.op is OptOps.UPCASTMID:
      # image outputs only: a grouped reduce keeps 4 output channels per thread in the middle region
      check(isinstance(self.outbufs[0].dtype, ImageDType), "UPCASTMID: only for image outputs")
      check(self.group_for_reduces > 0, "UPCASTMID: needs a grouped reduce")
      check(axis < self.global_dims, f"UPCASTMID: axis {axis} is not a global axis")
      unit = [a for a in self.sts[0].unit_stride_axes() if a < self.first_reduce]
      check(unit == [axis], f"UPCASTMID: axis {axis} must be the output's only unit-stride axis (those are {unit})")
      check(amt == 4, "UPCASTMID: only by 4")
      self.shift_to(axis, amt, insert_before=self.first_reduce + self.group_for_reduces)
      self.group_for_reduces += 1
    else: raise KernelOptError(f"unknown opt {opt.op}")
    self.simplify_ones()
    self._check_workgroup()

  def _block(self, axis: int, amt: int) -> None:
    """BLOCK: split the reduce axis into (size/amt blocks, amt) and make the blocks the first reduce
    axis. The lowerer runs the block loop just inside the outermost output loop, so one block of
    the operands is reused across all the inner output tiles while it is in cache; each output
    element combines its partial result (a sum, or a max) with what the earlier blocks stored, and
    the last block applies the epilogue (what the kernel computes from the result) before its store."""
    check(not self.opts.has_local, "BLOCK: reduce blocking is for targets whose output axes are loops (CPU), not thread ids")
    check(not self.reduce_block, "BLOCK: the reduce is already blocked")
    check(self.first_reduce + self.group_for_reduces <= axis < self.first_upcast, f"BLOCK: axis {axis} is not a (serial) reduce axis")
    check(len(self.reduceops) == 1 and self.reduceops[0].op in (ReduceOps.SUM, ReduceOps.MAX), "BLOCK: needs exactly one SUM or MAX reduce")
    check(len(self.ast.src) == 1, "BLOCK: the kernel must have one output (partial sums are accumulated in it between blocks)")
    store, red = self.ast.src[0], self.reduceops[0]
    # an epilogue (bias, activation, residual) is applied in the last block only: the earlier blocks store
    # the bare partial sum, so the output must hold the reduce's dtype without rounding
    check(store.src[0] == red or (red in store.src[0].lazyops and store.arg.dtype == red.dtype),
          f"BLOCK: the output ({store.arg.dtype}) must hold the partial sums ({red.dtype}) between blocks")
    check(self.group_for_reduces == 0 and self.tensor_core is None, "BLOCK: not with grouped reduces or tensor cores")
    size = self.full_shape[axis]
    check(amt < size, f"BLOCK: a block of {amt} is the whole axis of {size}: nothing to block")
    self.shift_to(axis, size // amt, top=True, insert_before=self.first_reduce)
    self.reduce_block = True

  def _pack(self, idx: Any, amt: Any) -> None:
    """Opt(PACK, idx, 0): read input buffer `idx` (its kernel argument number) through a packed
    stack array (codegen/pack.py)."""
    check(not self.opts.has_local and self.opts.stack_arrays, "PACK: needs a target without workgroups that has stack arrays (CPU)")
    check(isinstance(idx, int) and not isinstance(idx, bool), f"PACK: axis must be an input buffer's argument number, got {idx!r}")
    check(amt in (0, None), f"PACK: amount must be 0, got {amt!r}")
    self._pack_buffer(idx)
    check(idx not in self.packed, f"PACK: buffer {idx} is already packed")
    self.packed = self.packed + (idx,)
    self._check_pack()

  def _pack_buffer(self, idx: int) -> tuple[MemBuffer, ShapeTracker]:
    """The input MemBuffer with kernel argument `idx` (the first one read) and its ShapeTracker."""
    for b, st in zip(self.bufs, self.sts):
      if isinstance(b, MemBuffer) and b.idx == idx and idx >= len(self.outbufs): return b, st
    raise KernelOptError(f"PACK: kernel has no input buffer {idx}")

  def _check_pack(self) -> None:
    """Every packed buffer still fits PACK's rules."""
    for idx in self.packed:
      why = pack_refusal(*self._pack_buffer(idx), self.full_shape, self.first_reduce, self.reduce_block,
                         self.tensor_core is not None or self.group_for_reduces != 0)
      check(why is None, why or "")

  def apply_tensor_cores(self, use_tensor_cores: int = 1, extra_opts: Optional[list[Opt]] = None, axis: int = 0, tc_opt: Optional[int] = None,
                         reason: str = "") -> bool:
    """Lay the kernel out for a tensor core (API): Opt(TC, axis, tc_opt), then `extra_opts`. Returns
    True when all of them applied; False, with the kernel unchanged, where the reference returns
    False: use_tensor_cores 0, a target without tensor cores, no matching pattern or axis choice,
    or an opt refused (the reason is printed at DEBUG >= 3). Raises ValueError only for invalid
    arguments. tc_opt None means the TC_OPT setting. (apply_opt(Opt(TC, ...)) itself raises
    KernelOptError when refused, as every opt does.)"""
    if not (isinstance(use_tensor_cores, int) and not isinstance(use_tensor_cores, bool) and use_tensor_cores in (0, 1, 2, 3)):
      raise ValueError(f"apply_tensor_cores: use_tensor_cores must be 0, 1, 2 or 3, got {use_tensor_cores!r}")
    if tc_opt is None: tc_opt = int(TC_OPT)
    if not (isinstance(tc_opt, int) and not isinstance(tc_opt, bool) and tc_opt in (0, 1, 2)):
      raise ValueError(f"apply_tensor_cores: tc_opt must be 0, 1 or 2, got {tc_opt!r}")
    if not (isinstance(axis, int) and not isinstance(axis, bool) and axis >= 0):
      raise ValueError(f"apply_tensor_cores: axis must be an int >= 0 (an (N, M, K) choice), got {axis!r}")
    if extra_opts is not None and not (isinstance(extra_opts, (list, tuple)) and all(isinstance(o, Opt) for o in extra_opts)):
      raise ValueError(f"apply_tensor_cores: extra_opts must be a list of Opts, got {extra_opts!r}")
    if not use_tensor_cores or not self.opts.tensor_cores: return False
    saved = self.__dict__.copy()
    saved_opts, saved_reasons = list(self.applied_opts), list(self.applied_opts_reasons)
    try:
      self._tc_use = use_tensor_cores
      try: self.apply_opt(Opt(OptOps.TC, axis, tc_opt), reason=reason or "requested")
      finally: self._tc_use = None
      for opt in extra_opts or []: self.apply_opt(opt, reason="requested with tensor cores")
    except BaseException as e:
      self.__dict__.clear(); self.__dict__.update(saved)
      self.applied_opts, self.applied_opts_reasons = saved_opts, saved_reasons
      if not isinstance(e, KernelOptError): raise
      if DEBUG >= 3: print(f"apply_tensor_cores(use {use_tensor_cores}, axis {axis}, tc_opt {tc_opt}): {e}")
      return False
    return True

  # ---- heuristics (implemented in heuristic.py) -----------------------------------------------------
  def required_optimizations(self) -> "Kernel":
    return required_optimizations(self)
  def hand_coded_optimizations(self) -> "Kernel":
    return hand_coded_optimizations(self)

  # ---- to AST / program ---------------------------------------------------------------------------
  def get_optimized_ast(self) -> LazyOp:
    """The AST with the optimized shapes baked in; a grouped reduce becomes two stages through a
    local buffer; the root carries KernelInfo."""
    memo: dict[LazyOp, LazyOp] = {}
    def fix(root: LazyOp) -> LazyOp:  # (an explicit stack: an AST may be deep; a reduce nests one call)
      stack: list[tuple[LazyOp, bool]] = [(root, False)]
      while stack:
        op, ready = stack.pop()
        if op in memo: continue
        if op.op in ReduceOps:
          if self.tensor_core is not None:
            memo[op] = tc_reduce(self, op, fix)
          else: memo[op] = self._fix_reduce(op, fix(op.src[0]))
        elif not ready:
          stack.append((op, True))
          stack.extend((s, False) for s in reversed(op.src) if s not in memo)
        elif op.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE):
          memo[op] = LazyOp(op.op, tuple([memo[s] for s in op.src]), replace(op.arg, st=self.sts[self.bufs.index(op.arg)]))
        else: memo[op] = LazyOp(op.op, tuple([memo[s] for s in op.src]), op.arg)
      return memo[root]
    stores = tuple(fix(s) for s in self.ast.src)
    return LazyOp(MetaOps.KERNEL, stores, self.kernel_info())

  def kernel_info(self) -> KernelInfo:
    """What the optimized AST's root says about the layout (with the leaves' views, all lowering reads)."""
    return KernelInfo(self.local_dims, self.upcasted, self.dont_use_locals, self.group_for_reduces, self.reduce_block,
                      self.use_tensor_cores if self.tensor_core is not None else 0, self.packed)

  def _fix_reduce(self, op: LazyOp, src: LazyOp) -> LazyOp:
    axes = tuple(self.reduce_axes())
    if not self.group_for_reduces: return LazyOp(op.op, (src,), axes)
    group = [i for i in range(self.first_reduce, self.first_reduce + self.group_for_reduces) if i in axes]
    stage1 = LazyOp(op.op, (src,), tuple(a for a in axes if a not in group))
    # partials per (local thread, group thread, upcast lane) go through local memory
    local_shape = tuple(1 if i < self.global_dims or (i in axes and i not in group) else s for i, s in enumerate(self.full_shape))
    local_buf = MemBuffer(-1, op.dtype, ShapeTracker.from_shape(local_shape))
    store = LazyOp(BufferOps.STORE, (stage1,), local_buf)
    load = LazyOp(BufferOps.LOAD, (store,), local_buf)
    return LazyOp(op.op, (load,), tuple(group))

  def linearize(self) -> "Kernel":
    """Lower the optimized AST for this kernel's renderer (lowering reads nothing else) and order its UOps."""
    self.uops = linearize_uops(lower_kernel(self.get_optimized_ast(), self.opts))
    return self

  def to_program(self, name_override: Optional[str] = None) -> Program:
    """Render this kernel for its renderer (API)."""
    name = name_override or self.name
    def render() -> str:
      self.linearize()
      return self.opts.render(name, self.uops)
    if getenv("RUN_PROCESS_REPLAY", 0):  # record for `tilecraft replay diff` (tilecraft.testing.replay), with the settings read (imported only then)
      from tilecraft.codegen.replay_record import render_and_record
      src = render_and_record(self, name, render)
    else: src = render()
    assert self.uops is not None
    if getenv("GRAPHUOPS", 0):  # a picture of the UOp graph (codegen/graph_uops.py, imported only then)
      from tilecraft.codegen.graph_uops import maybe_graph
      maybe_graph(self.uops, name)
    gs, ls = launch_dims(KernelLayout(self.full_shape, self.output_shape, self.kernel_info()), self.opts)
    vars_ = sorted(self.ast.vars() | {v for b in self.bufs if isinstance(b, ConstBuffer) and isinstance(b.val, Variable) for v in [b.val]},
                   key=lambda v: v.expr)
    mem = sum(b.dtype.itemsize * b.st.real_size() for b in dedup_by_idx(self.membufs) if b.idx >= 0)
    return Program(name, src, self.opts.device, gs, ls, self.uops, vars_, sorted({b.idx for b in self.membufs if b.idx >= 0}),
                   list(range(len(self.outbufs))), estimate_flops(self.uops), mem, tuple(self.applied_opts))

  def __repr__(self) -> str: return f"<Kernel {self.name} shape={self.full_shape} opts={self.applied_opts}>"

def dedup_by_idx(bufs: list[MemBuffer]) -> list[MemBuffer]:
  out: dict[int, MemBuffer] = {}
  for b in bufs:
    if b.idx not in out or b.st.real_size() > out[b.idx].st.real_size(): out[b.idx] = b
  return list(out.values())
