"""The state lowering threads through its passes, and the kernel layout it is built from.

Lowering is a function of the optimized AST and the renderer (lowerer.py: lower_kernel). Everything
it knows about the kernel's axes comes from the AST: the shapes of its leaves give the full and the
output shape, the root's KernelInfo the regions (local, group, upcast counts) and the opts that
change how axes become loops (BLOCK, PACK, TC use, NOLOCALS). `KernelLayout` is that reading;
`LoweringState` adds the renderer's choices (the vector axis, thread ids or loops) and the mutable
state of one lowering: the index variable of every axis, the loops made so far, the memo of lowered
values. The passes (lowerer.py for loads, stores and arithmetic; lower_reduce.py, lower_wmma.py,
lower_image.py, lower_pack.py) are functions that take a LoweringState.

Axes become index variables of the one symbolic system: global axes are loops on a CPU (the
outermost runs in parallel) and group/thread ids on GPUs; reduce axes are loops; upcast and unrolled
axes are expanded into lanes. One upcast axis (the vector axis, contiguous in the output, or where
that one is gathered a strided one a packed input runs along) stays a vector: values along it are
single vector UOps (float4, float8, ...).
"""
from __future__ import annotations
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence
from tilecraft.codegen.lower_index import IndexUOps, _ceil, _subst
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, dtypes
from tilecraft.helpers import prod
from tilecraft.ops import INDEX, BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps
from tilecraft.renderer import Renderer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import And, Node, Sum, Variable, sint, sym_and, sym_lt

# blocked sums (LoweringState._blocked_sum_axis): loops of at least this many iterations, at most this
# many accumulators, blocks of at least this many iterations
BLOCKED_SUM_MIN, BLOCKED_SUM_MAX_ACCS, BLOCKED_SUM_BLOCK = 256, 4, 16
# a reduce's output axis the output is strided along may be the vector axis (LoweringState._strided_store_axes) where
# the reduce is at least this long (its lane-by-lane stores amortized); the switch is for A/B measurements
STRIDED_STORE_VECTORS, STRIDED_STORE_MIN_REDUCE = True, 64
VECTOR_LANES = (2, 4, 8, 16)  # the upcast lengths an axis may have to be the vector axis
# a vector accumulator's lanes are combined in halves, as vectors (lower_reduce.py: _horizontal); the switch is for A/B measurements
HORIZONTAL_VECTOR_STEPS = True
PARALLEL_MIN_WORK = 1 << 15  # CPU: a kernel's iterations (its full shape, lanes included) from which its outer loop runs in parallel

def vectors_along_strided_axis(out_rs: tuple, packed: list[tuple], others: list[tuple], contiguous: list[tuple[int, bool]], a: int,
                               reduce_axes: Sequence[int]) -> bool:
  """Whether output axis `a`, strided in the output (strides `out_rs`), may be a reduce's vector axis: every axis in
  `contiguous` (the output's contiguous upcast axes, at least one, each with whether its length could be vector
  lanes) either has a non-packed input gathered along it (a stride-2 conv's pixels) or can't be lanes (a 13-wide
  image row); an input laid out with `a` innermost moves along it (vector loads: a packed one, or one of `others`
  that runs contiguously along `a` and moves along one of `reduce_axes`, a reduce operand: a 1x1 conv's weight
  stored (Cin, Cout) at load); and the other reduce operands broadcast or run contiguously along it (the image's
  pixel). Inputs that don't move along the reduce (a bias; a residual, laid out as the output: gathered lane by
  lane, once per output after the reduce) may move along `a` in any way. Strides ignore validity. The one test for
  LoweringState._strided_store_axes (the optimized kernel) and heuristic_cpu.py's tiles (before opts)."""
  def operand(rs: tuple) -> bool: return any(rs[r] != 0 for r in reduce_axes)
  laid_out = any(rs[a] != 0 for rs in packed) or any(rs[a] == 1 and operand(rs) for rs in others)
  return bool(contiguous) and all(not lanes or any(rs[c] not in (0, 1) for rs in others) for c, lanes in contiguous) and \
    out_rs[a] != 1 and laid_out and all(rs[a] in (0, 1) or not operand(rs) for rs in others)

def const_sum_reduce(reduceops: list[LazyOp]) -> bool:
  """The kernel's reduce is a SUM of a masked constant (arange-style): lowering computes it in closed
  form unless its axes are unrolled (lower_reduce.py: _collapse_const_sum)."""
  if len(reduceops) != 1 or reduceops[0].op is not ReduceOps.SUM: return False
  src = reduceops[0].src[0]
  while src.op is UnaryOps.CAST: src = src.src[0]
  return src.op is BufferOps.CONST and src.arg.val is not INDEX

@dataclass(frozen=True)
class KernelLayout:
  """An optimized kernel's axes by region (global | local | group | reduce | unrolled | upcast), read
  off its AST: `full_shape` and `output_shape` from its leaves' views, the rest from its KernelInfo."""
  full_shape: tuple[sint, ...]
  output_shape: tuple[sint, ...]
  info: KernelInfo
  @property
  def shape_len(self) -> int: return len(self.full_shape)
  @property
  def first_upcast(self) -> int: return self.shape_len - self.info.upcasted
  @property
  def first_reduce(self) -> int:
    return next((i for i in range(self.first_upcast) if self.output_shape[i] != self.full_shape[i]), self.first_upcast)
  @property
  def global_dims(self) -> int: return self.first_reduce - self.info.local_dims
  @property
  def group_for_reduces(self) -> int: return self.info.group_for_reduces
  @property
  def upcast_in_mid_reduce_axes(self) -> list[int]:
    """UPCASTMID's (white) axes: group axes the output keeps (not reduced)."""
    return [j for j in range(self.first_reduce, self.first_reduce + self.group_for_reduces) if self.full_shape[j] == self.output_shape[j]]

def kernel_layout(ast: LazyOp) -> KernelLayout:
  """The layout of an optimized kernel AST (Kernel.get_optimized_ast). Every dim of the kernel is
  either 1 or one common size in every leaf (verify_ast), so the full shape is, per dim, the size any
  leaf has there other than 1; the output shape is output 0's."""
  if ast.op is not MetaOps.KERNEL or not isinstance(ast.arg, KernelInfo):
    raise ValueError(f"lowering needs an optimized kernel AST (a KERNEL with KernelInfo), got {ast.op} with {type(ast.arg).__name__}")
  shapes = [x.arg.st.shape for x in ast.lazyops if x.op in BufferOps]
  out = ast.src[0].arg.st.shape
  full = tuple(next((s[d] for s in shapes if s[d] != 1), 1) for d in range(len(out)))
  return KernelLayout(full, out, ast.arg)

def launch_dims(lay: KernelLayout, ren: Renderer) -> tuple[Optional[list[sint]], Optional[list[sint]]]:
  """Global and local launch sizes of a kernel of this layout (None on targets without workgroups)."""
  if not ren.has_local: return None, None
  fs, fr = lay.full_shape, lay.first_reduce
  gl = list(fs[:lay.global_dims])
  lc = list(fs[lay.global_dims:fr]) + list(fs[fr:fr + lay.group_for_reduces])
  if lay.info.dont_use_locals: return [prod(gl)] if gl else [1], None
  return (_fold_dims(gl, ren.global_max)[::-1] or [1]), (_fold_dims(lc, ren.local_max)[::-1] or [1])

def _fold_dims(dims: list[sint], maxes: Optional[tuple[int, ...]]) -> list[sint]:
  """Fold dims into at most len(maxes) (3) launch dims: the outermost extra dims merge into one. When
  a launch dim would exceed the target's limit for it (CUDA's grid y and z are at most 65535), fold
  into fewer dims: launch dim 0 (the innermost, listed last here) has the largest limit."""
  n = len(maxes) if maxes else 3
  while True:
    out = list(dims)
    while len(out) > n: out = [out[0] * out[1]] + out[2:]
    if not maxes or n == 1 or all(not isinstance(d, int) or d <= m for d, m in zip(reversed(out), maxes)): return out
    n -= 1

class LoweringState:
  """One kernel's lowering: its layout, the renderer, and what the passes build and share (index
  variables per axis, loops, accumulator numbers, the memo of lowered values). The passes change
  `idx_vars`, `mid` and `loop` for a sub-lowering and put them back."""
  def __init__(self, ast: LazyOp, ren: Renderer):
    self.ast, self.ren = ast, ren
    self.layout = lay = kernel_layout(ast)
    self.info = info = lay.info
    self.shape, self.output_shape = lay.full_shape, lay.output_shape
    n = lay.shape_len
    self.first_upcast, self.first_reduce, self.group, self.global_dims = lay.first_upcast, lay.first_reduce, info.group_for_reduces, lay.global_dims
    self.leaves: list[Any] = [x.arg for x in ast.lazyops if x.op in (BufferOps.LOAD, BufferOps.CONST)]
    self.outbufs: list[MemBuffer] = [x.arg for x in ast.src]
    self.reduceops: list[LazyOp] = [x for x in ast.lazyops if x.op in ReduceOps]
    self.red_axes = list(range(self.first_reduce + self.group, self.first_upcast))
    self.group_axes = list(range(self.first_reduce, self.first_reduce + self.group))
    # UPCASTMID's (white) axes: thread ids in a grouped reduce's first stage, lanes after it (`mid`)
    self.white = [a for a in lay.upcast_in_mid_reduce_axes if self.shape[a] != 1]
    self.mid: Optional[tuple[int, ...]] = None
    self.upcast_axes = list(range(self.first_upcast, n))
    self.magenta = [a for a in self.upcast_axes if self.shape[a] != self.output_shape[a]]
    self.vax = self._pick_vector_axis()
    # use 3 on a target without threads (CPU): the tensor core's lane axes are expanded lanes, not
    # loops, so one thread holds a whole warp and can stage its fragments through a stack array
    self.warp_axes: list[int] = self._warp_axes()
    self.lane_axes = self.warp_axes + [a for a in self.upcast_axes if a != self.vax]
    self.W = self.shape[self.vax] if self.vax is not None else 1
    self.vlane = Variable("_vlane", 0, self.W - 1) if self.vax is not None else None
    self.ix = IndexUOps()  # index expressions -> UOps
    self.varmap: dict[Variable, UOp] = self.ix.varmap
    self.idx_vars: list[sint] = [0] * n
    self.acc_count = 0
    self.memo: dict[Any, Any] = {}
    self.outer_range: Optional[UOp] = None  # innermost loop around the reduce (CPU global loops)
    self.block_axis: Optional[int] = self.first_reduce if info.reduce_block else None
    self.block_range: Optional[UOp] = None
    # the accumulators start from the earlier blocks' sums, unless their vector lanes are reduce lanes
    self.block_in_acc = self.vax is None or self.vax not in self.magenta
    # a dependent reduce (one that reads another reduce's result) runs its own loops over the reduce
    # axes: `loop` numbers the loops whose variables idx_vars holds now (0: the kernel's reduce loops)
    self.loop, self.loops = 0, 0
    self.prefetches: list[UOp] = []  # cache hints (prefetch_next): dependent loops (lowerer.py: lower_load), next blocks (lower_pack.py)
    self.loop_axes: list[int] = []  # CPU: the output axes that are loops, outermost first
    self.reduce_ranges: list[UOp] = []
    self._make_index_vars()
    self.thread_vars: list[sint] = list(self.idx_vars)  # the ids, also while `mid` sets the white axes
    self.base_vars: list[sint] = list(self.idx_vars)

  # ---- axes ---------------------------------------------------------------------------------------

  def _pick_vector_axis(self) -> Optional[int]:
    """The upcast axis kept as vector lanes: an output axis the output walks contiguously, an
    unrolled reduce axis (vector accumulators, one horizontal reduce after the loop), or a strided
    output axis a packed input runs along (_strided_store_axes). Among those, the one where the
    fewest inputs need gathers, then the most read contiguously."""
    if not self.ren.supports_float4: return None
    if any(not vectorizable_leaf(self.ren, b) for b in self.outbufs + self.leaves if not (isinstance(b, MemBuffer) and b.idx < 0)): return None
    if any(x.op is ReduceOps.WMMA for x in self.ast.lazyops): return None  # fragments are gathered lane by lane
    # a padded output axis (PADTO) still walks the output contiguously: its lanes past the end are gated stores
    out_rs = self.outbufs[0].st.real_strides(ignore_valid=True)
    ins = [b.st.real_strides() for b in dict.fromkeys(self.leaves) if isinstance(b, MemBuffer) and b.idx >= len(self.outbufs)]
    reduces = [r for r in self.ast.lazyops if r.op in ReduceOps]
    strided = self._strided_store_axes(out_rs, reduces)
    best: Optional[tuple] = None
    for a in self.upcast_axes:
      if self.shape[a] not in VECTOR_LANES: continue
      if a in strided:  # (vector loads from the packed arrays, no gathers; the one the ISA's vector width fits first)
        score: tuple = (0, strided[a], True, self.shape[a] == self.ren.vector_width, a)
        if best is None or score > best[0]: best = (score, a)
        continue
      if a in self.magenta:
        if self.group or not all(a in r.arg for r in reduces): continue
      elif out_rs[a] != 1: continue
      gathers = sum(1 for rs in ins if rs[a] not in (0, 1))
      contiguous = sum(1 for rs in ins if rs[a] == 1) + (a not in self.magenta)
      if a in self.magenta and not any(rs[a] == 1 for rs in ins): continue
      score = (-gathers, contiguous, a not in self.magenta, True, a)
      if best is None or score > best[0]: best = (score, a)
    return best[1] if best is not None else None

  def _strided_store_axes(self, out_rs: tuple, reduces: list[LazyOp]) -> dict[int, int]:
    """Upcast output axes the output is strided along that may still be the vector axis, each with the
    number of inputs laid out along it (packed, or a reduce operand contiguous along it): where every upcast
    axis the output is contiguous along has a non-packed input gathered along it (a stride-2 conv's pixels)
    and the reduce is at least STRIDED_STORE_MIN_REDUCE long, a reduce's output axis along which such an input
    moves (vector loads) and the other inputs broadcast or run contiguously (the image's pixel, a bias):
    vectors_along_strided_axis. The accumulators are vectors along it; the store after the reduce writes them
    lane by lane."""
    if not STRIDED_STORE_VECTORS or not reduces or self.group or len(self.outbufs) != 1: return {}
    red = prod(self.shape[a] for a in self.red_axes + self.magenta)
    if not isinstance(red, int) or red < STRIDED_STORE_MIN_REDUCE: return {}
    loads = [b for b in dict.fromkeys(self.leaves) if isinstance(b, MemBuffer) and b.idx >= len(self.outbufs)]
    packed = [b.st.real_strides(ignore_valid=True) for b in loads if b.idx in self.info.packed]
    others = [b.st.real_strides(ignore_valid=True) for b in loads if b.idx not in self.info.packed]
    contiguous = [(a, self.shape[a] in VECTOR_LANES) for a in self.upcast_axes if a not in self.magenta and out_rs[a] == 1]
    red_axes = self.red_axes + self.magenta
    return {a: sum(1 for rs in packed if rs[a] != 0) + sum(1 for rs in others if rs[a] == 1 and any(rs[r] != 0 for r in red_axes))
            for a in self.upcast_axes if a not in self.magenta and vectors_along_strided_axis(out_rs, packed, others, contiguous, a, red_axes)}

  def _warp_axes(self) -> list[int]:
    wmma = next((x for x in self.reduceops if x.op is ReduceOps.WMMA), None)
    if wmma is None or self.ren.has_local: return []
    info = wmma.arg[4]  # the WMMAInfo (codegen/tensor_cores.py: tc_reduce)
    return list(info.lanes) if info.use == 3 else []

  def _make_index_vars(self) -> None:
    shape = self.shape
    def var(name: str, s: sint) -> sint: return 0 if s == 1 else Variable(name, 0, _ceil(s) - 1)
    if not self.ren.has_local:
      # CPU: global axes are nested loops, the outermost parallel unless the kernel is too small
      # for waking the other cores to pay off
      work = prod(shape)
      parallel = not isinstance(work, int) or work >= PARALLEL_MIN_WORK
      parent: Optional[UOp] = None
      # BLOCK with one output loop (column sums: its tiles): the block loop goes outside it, so each
      # thread walks a block of rows across all its tiles (whole pages of each row, not a few lines)
      loops = self.loop_axes = [i for i in range(self.first_reduce) if not (isinstance(shape[i], int) and shape[i] == 1)]
      if self.block_axis is not None and len(loops) == 1: parent = self._make_block_range(None)
      first = True
      for i in range(self.first_reduce):
        if i in self.warp_axes: continue  # expanded lanes: set per lane (index)
        v = var(f"gidx{i}", shape[i])
        self.idx_vars[i] = v
        if isinstance(v, Variable):
          r = self.make_range(shape[i], parent, ("parallel" if first and parallel else "global", i))
          self.varmap[v] = r
          parent, first = r, False
          if self.block_axis is not None and self.block_range is None: parent = self._make_block_range(parent)
      if self.block_axis is not None and self.block_range is None: parent = self._make_block_range(parent)
      self.outer_range = parent
    else:
      self._make_gpu_ids(var)
    parent = self.outer_range
    split = self._blocked_sum_axis()
    self.reduce_ranges = []
    for i in self.red_axes:
      if i == self.block_axis: continue
      if split is not None and i == split[0]:
        # a blocked sum (see _blocked_sum_axis): the loop runs as nested loops, outermost first; the index
        # is their mixed-radix number, and every loop but the outermost is a block with an accumulator
        sizes = split[1]
        idx: sint = 0
        for j, size in enumerate(sizes):
          v = Variable(f"ridx{i}" + "b" * j, 0, size - 1)
          r = self.make_range(size, parent, ("reduce", i) if j == 0 else ("reduce", i, "block"))
          self.varmap[v] = r
          self.reduce_ranges.append(r)
          idx, parent = idx * size + v, r
        self.idx_vars[i] = idx
        continue
      v = var(f"ridx{i}", shape[i])
      self.idx_vars[i] = v
      if isinstance(v, Variable):
        r = self.make_range(shape[i], parent, ("reduce", i))
        self.varmap[v] = r
        self.reduce_ranges.append(r)
        parent = r

  def _blocked_sum_axis(self) -> Optional[tuple[int, list[int]]]:
    """(axis, loop sizes, outermost first) where a float SUM's innermost reduce loop should run as nested
    loops whose inner ones are blocks: each block adds its iterations in an accumulator of its own, then
    into the block around it. One accumulator over n iterations loses about n roundings' worth of
    precision (the mean of 30M floats of 0.1 was off by 2e-3); blocks of about n^(1/3) at two levels
    (n^(1/2) for shorter loops) cut that to a few n^(1/3), for one add per block. Only where there are
    few accumulators (each gets one per level) and nothing else shapes the reduce loops (grouped, BLOCK,
    tensor-core, packed and dependent reduces keep theirs). None where the loop stays as it is."""
    reduces = self.reduceops
    if len(reduces) != 1 or reduces[0].op is not ReduceOps.SUM or not dtypes.is_float(reduces[0].dtype): return None
    if self.group or self.block_axis is not None or self.info.tc_use or self.info.packed: return None
    if const_sum_reduce(self.reduceops): return None  # a count in closed form (lower_reduce: _collapse_const_sum) needs the plain loop
    axes = [i for i in self.red_axes if isinstance(self.shape[i], int) and self.shape[i] > 1]
    if not axes or axes[-1] != self.red_axes[-1]: return None
    a, n = axes[-1], self.shape[axes[-1]]
    if n < BLOCKED_SUM_MIN or prod(self.shape[x] for x in self.lane_axes if x not in self.magenta) > BLOCKED_SUM_MAX_ACCS: return None
    sizes: list[int] = []
    for levels in ((3, 2) if n >= BLOCKED_SUM_MIN ** 1.5 else (2,)):
      divs = [d for d in range(BLOCKED_SUM_BLOCK, n // BLOCKED_SUM_BLOCK + 1) if n % d == 0]
      if not divs: break
      target = n ** (1 / levels)
      b = min(divs, key=lambda d: max(d / target, target / d))  # the block nearest n^(1/levels)
      sizes.insert(0, b)
      n //= b
    return (a, [n] + sizes) if sizes else None

  def _make_block_range(self, parent: Optional[UOp]) -> UOp:
    """BLOCK: the loop over blocks of the reduce, inside the outermost output loop and around the
    other output loops (outside the output loop when there is only one); the accumulators live
    inside it (see lower_store)."""
    a = self.block_axis
    assert a is not None
    v = Variable(f"ridx{a}", 0, _ceil(self.shape[a]) - 1)
    self.idx_vars[a] = v
    r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), self.ix.sym_to_uop(self.shape[a], dtypes.int32)) + ((parent,) if parent is not None else ()),
            ("reduce", a))
    self.varmap[v] = self.block_range = r
    return r

  def make_range(self, size: sint, parent: Optional[UOp], arg: tuple) -> UOp:
    """A loop 0..size; its counter is 64-bit when the trip count doesn't fit in int32."""
    end = self.ix.sym_to_uop(size, dtypes.int32)
    return UOp(UOps.RANGE, end.dtype, (UOp.const(end.dtype, 0), end) + ((parent,) if parent is not None else ()), arg)

  def _make_gpu_ids(self, var: Callable[[str, sint], sint]) -> None:
    gl = list(range(self.global_dims))
    lc = list(range(self.global_dims, self.first_reduce)) + self.group_axes
    def ids(axes: list[int], prefix: str, maxes: Optional[tuple[int, ...]]) -> None:
      if not axes: return
      sizes = [self.shape[a] for a in axes]
      folded = _fold_dims(sizes, maxes) if not (prefix == "gidx" and self.info.dont_use_locals) else [prod(sizes)]
      # the first launch dim may hold several axes (outermost first): unravel it. Hardware dim 0
      # is the innermost axis (neighbouring threads touch neighbouring memory).
      n_first = len(axes) - len(folded) + 1
      for j, size in enumerate(folded):
        d = len(folded) - 1 - j
        kind = "global" if prefix == "gidx" and self.info.dont_use_locals else ("group" if prefix == "gidx" else "local")
        # ids are int unless the launch dim can exceed int32 (one flat global dim with NOLOCALS)
        sp = UOp(UOps.SPECIAL, dtypes.int64 if self.ix.needs_int64(size) else dtypes.int32, (),
                 (f"{prefix}{d}", size if isinstance(size, int) else self.ix.sym_to_uop(size, dtypes.int32), d, kind))
        spv = Variable(f"{prefix}{d}", 0, _ceil(size) - 1)
        self.varmap[spv] = sp
        mine = axes[:n_first] if j == 0 else [axes[n_first + j - 1]]
        acc: sint = spv
        for j, a in enumerate(reversed(mine)):
          s = self.shape[a]
          rest = len(mine) - 1 - j
          self.idx_vars[a] = acc % s if rest else acc
          acc = acc // s
    ids(gl, "gidx", self.ren.global_max)
    ids(lc, "lidx", self.ren.local_max)

  # ---- lanes --------------------------------------------------------------------------------------
  def lanes(self, inner: bool) -> list[tuple[int, ...]]:
    sizes = [self.shape[a] if (inner or a not in self.magenta) else 1 for a in self.lane_axes]
    return list(itertools.product(*[range(s) for s in sizes]))

  def index(self, st: ShapeTracker, lane: tuple[int, ...]) -> tuple[sint, sint]:
    # lanes differing only along axes the buffer ignores (stride 0, not in its mask: a conv's weights
    # along the output rows) share one index expression, computed once
    if (fixed := self.memo.get(("fixed", st))) is None:
      rs = st.real_strides()
      fixed = self.memo[("fixed", st)] = tuple(i for i, a in enumerate(self.lane_axes) if rs[a] == 0 and not st.axis_is_masked(a))
    if fixed: lane = tuple(0 if i in fixed else v for i, v in enumerate(lane))
    key = ("idx", st, lane, tuple(self.idx_vars))
    if (r := self.memo.get(key)) is not None: return r
    idxs = list(self.idx_vars)
    for a, v in zip(self.lane_axes, lane): idxs[a] = v
    if self.vax is not None: idxs[self.vax] = self.vlane
    # an axis the buffer doesn't span (size 1 in its view) indexes at 0
    idxs = [0 if s == 1 else i for s, i in zip(st.shape, idxs)]
    r = st.expr_idxs(tuple(idxs))
    self.memo[key] = r
    return r

  def vec_form(self, idx: sint, valid: sint, masked: bool = False) -> tuple[str, Any]:
    """How an access varies along the vector axis: ('scalar', (idx, valid)), ('vector', (base, valid))
    for unit stride, or ('gather', [(idx, valid)] per lane). `masked`: a unit-stride access whose
    validity varies by lane is ('masked', (base, valid, the gather's lanes)) instead."""
    if self.vlane is None: return "scalar", (idx, valid)
    v = self.vlane
    in_valid = isinstance(valid, Node) and v in valid.vars()
    in_idx = isinstance(idx, Node) and v in idx.vars()
    if not in_idx and not in_valid: return "scalar", (idx, valid)
    if _direct_unit_term(idx, v):
      base = idx - v
      if not in_valid: return "vector", (base, valid)
      if masked: return "masked", (base, valid, None)  # the lanes only if the caller falls back to them (lane_forms)
      per = self.lane_forms(base, valid)
    else:
      per = [(self.at_lane(idx, i), self.at_lane(valid, i)) for i in range(self.W)]
      # unit stride: lane i reads base + i for every lane (checked lane by lane, exactly)
      if not all(_is_zero(ix - (per[0][0] + i)) for i, (ix, _) in enumerate(per)): return "gather", per
      base = per[0][0]
      if not in_valid: return "vector", (base, valid)
    return ("masked", (base, valid, per)) if masked else ("gather", per)

  def lane_forms(self, base: sint, valid: sint) -> list[tuple[sint, sint]]:
    """(index, valid) of each lane of a unit-stride access at `base`."""
    return [(base + i, self.at_lane(valid, i)) for i in range(self.W)]

  def masked_gate(self, valid: sint) -> Optional[UOp]:
    """The bool-vector gate of a unit-stride access whose validity varies by lane: the lane-free
    conjuncts (a row mask) as one scalar splat, ANDed with the lane-dependent ones evaluated per lane
    (a column mask, the same in every iteration of the loops inside the one that sets it). None
    where the target has no masked vector loads."""
    if not self.ren.masked_loads: return None
    key = ("mgate", valid)
    if (r := self.memo.get(key)) is not None: return r
    assert self.vlane is not None
    parts = valid.nodes if isinstance(valid, And) else (valid,)
    free = sym_and(*[p for p in parts if not (isinstance(p, Node) and self.vlane in p.vars())])
    per_lane = sym_and(*[p for p in parts if isinstance(p, Node) and self.vlane in p.vars()])
    vb, lanes = dtypes.bool.vec(self.W), [self.at_lane(per_lane, i) for i in range(self.W)]
    if all(isinstance(m, int) for m in lanes) and len(set(lanes)) == 1: r = self.ix.sym_bool(sym_and(free, lanes[0]))  # one gate for all lanes
    else:
      r = UOp(UOps.VECTORIZE, vb, tuple(self.ix.sym_bool(m) for m in lanes))
      if free != 1: r = UOp.alu(BinaryOps.AND, r, UOp(UOps.VECTORIZE, vb, (self.ix.sym_bool(free),) * self.W))
    self.memo[key] = r
    return r

  def at_lane(self, x: sint, i: int) -> sint:
    """x with the vector lane variable set to i, memoized per conjunct (lanes and loads share most of a mask)."""
    if not isinstance(x, Node) or self.vlane not in x.vars(): return x
    key = ("lane", x, i)
    if (r := self.memo.get(key)) is None:
      r = self.memo[key] = sym_and(*[self.at_lane(n, i) for n in x.nodes]) if isinstance(x, And) else _subst(x, self.vlane, i)
    return r

  # ---- loads and stores -----------------------------------------------------------------------------
  def buf_uop(self, mb: MemBuffer) -> UOp:
    if mb.idx < 0: return UOp(UOps.DEFINE_LOCAL, mb.dtype.ptr(local=True), (), (f"temp{-mb.idx}", mb.st.real_size()))
    return UOp(UOps.DEFINE_GLOBAL, mb.dtype if isinstance(mb.dtype, ImageDType) else mb.dtype.ptr(), (), mb.idx)

  def prefetch_next(self, buf: UOp, idx: sint, rng: Optional[UOp], gate: sint = 1, ahead: int = 1) -> bool:
    """A PREFETCH (on targets with has_prefetch) of what address idx is `ahead` iterations later of loop rng (the
    next one by default), issued where the 0/1 expression gate holds; False (none) where idx doesn't move along that loop."""
    g = self.loop_var(rng) if self.ren.has_prefetch else None
    if g is None or not isinstance(idx, Node) or g not in idx.vars(): return False
    src = (buf, self.ix.sym_to_uop(_subst(idx, g, g + ahead), dtypes.int32))
    self.prefetches.append(UOp(UOps.PREFETCH, dtypes.void, src if gate == 1 else src + (self.ix.sym_bool(gate),)))
    return True

  def loop_var(self, rng: Optional[UOp]) -> Optional[Variable]:
    """The index variable that loop rng counts (None for no loop)."""
    return next((v for v, r in self.varmap.items() if r is rng), None) if rng is not None else None

  def load(self, buf: UOp, idx: sint, valid: sint, dtype: DType, barrier: Optional[UOp]) -> UOp:
    if valid == 0: return UOp.const(dtype, 0)
    src = (buf, self.ix.sym_to_uop(idx, dtypes.int32))
    if valid != 1: src += (self.ix.sym_bool(valid), UOp.const(dtype, 0))
    if barrier is not None: src += (barrier,)
    return UOp(UOps.LOAD, dtype, src)

  def earlier_blocks(self, lane: tuple[int, ...], width: int, identity: Any) -> UOp:
    """BLOCK: what the earlier blocks stored for this output lane (the reduce's `identity` in the first block:
    0 for a sum, the lowest value for a max). It starts the accumulator, or, where the accumulator's vector
    lanes are reduce lanes, is combined with it at the store."""
    assert self.block_range is not None
    mb: MemBuffer = self.ast.src[0].arg
    buf = self.buf_uop(mb)
    kind, data = self.vec_form(*self.index(mb.st, lane))
    later = UOp.alu(BinaryOps.CMPNE, self.block_range, UOp.const(dtypes.int32, 0))
    def load(idx: sint, valid: sint, dt: DType) -> UOp:
      gate = later if valid == 1 else UOp.alu(BinaryOps.AND, self.ix.sym_bool(valid), later)
      return UOp(UOps.LOAD, dt, (buf, self.ix.sym_to_uop(idx, dtypes.int32), gate, UOp.const(dt, identity)))
    if kind == "scalar": prev = load(*data, mb.dtype)
    elif kind == "vector": prev = load(*data, mb.dtype.vec(self.W))
    else: prev = UOp(UOps.VECTORIZE, mb.dtype.vec(self.W), tuple(load(ix, vl, mb.dtype) for ix, vl in data))
    if prev.dtype.count < width: prev = UOp(UOps.VECTORIZE, prev.dtype.vec(width), (prev,) * width)
    return prev

  def store(self, buf: UOp, idx: sint, valid: sint, v: UOp) -> UOp: return self.store_at(buf, self.ix.sym_to_uop(idx, dtypes.int32), valid, v)
  def store_at(self, buf: UOp, at: UOp, valid: sint, v: UOp) -> UOp:
    if buf.op is UOps.DEFINE_GLOBAL and self.group:  # after a grouped reduce, only the group's first thread writes
      valid = sym_and(valid, *[sym_lt(self.thread_vars[a], 1) for a in self.group_axes])
    src = (buf, at, v)
    if valid != 1: src += (self.ix.sym_bool(valid),)
    return UOp(UOps.STORE, dtypes.void, src)

  def where_zero(self, cond: UOp, c: UOp, dtype: DType) -> UOp: return UOp.alu(TernaryOps.WHERE, cond, c, UOp.const(dtype, 0))

  def vector_op_ok(self, op: Any, dt: DType) -> bool: return _vector_op_ok(self.ren, op, dt)
  @staticmethod
  def combine_alu(op: Any) -> Any:
    """The ALU op that combines two partial results of reduce op `op`."""
    return BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
  def combine(self, op: Any, a: UOp, b: UOp) -> UOp:
    """a and b combined by reduce op `op` (lane by lane where the target has no such vector op)."""
    alu = self.combine_alu(op)
    if a.dtype.count > 1 and not self.vector_op_ok(alu, a.dtype):
      return UOp(UOps.VECTORIZE, a.dtype, tuple(UOp.alu(alu, a.gep(i), b.gep(i)) for i in range(a.dtype.count)))
    return UOp.alu(alu, a, b)

# how a pass lowers an AST op it doesn't handle itself (a reduce's source): lowerer.py's lower_op,
# passed to the passes explicitly (they are below lowerer.py in the import graph)
LowerOp = Callable[[LoweringState, LazyOp, bool], dict[tuple, UOp]]

def _direct_unit_term(idx: sint, v: Variable) -> bool:
  """idx == v + (terms free of v)."""
  if idx == v: return True
  if not isinstance(idx, Sum): return False
  return all((t == v and c == 1) or (t != v and v not in t.vars()) for t, c in idx.terms) and any(t == v for t, _ in idx.terms)

def _is_zero(x: sint) -> bool: return isinstance(x, int) and x == 0

def _vectorizable(ren: Renderer, dt: DType) -> bool: return dt.scalar() in ren.vector_dtypes
def vectorizable_leaf(ren: Renderer, b: Any) -> bool:
  """Whether a kernel's buffer or constant leaves its kernel vectorizable: of a dtype the target has vectors of, or
  a bool constant (Tensor.cat's select of a piece, masked to the piece's range) where the target has lane masks.
  The one test for the lowering's vector axis and the heuristics' vector width (a concatenation's kernel was all
  scalar code: DenseNet-121's concat + BatchNorm + relu kernels 3.3x faster with it)."""
  return _vectorizable(ren, b.dtype) or (isinstance(b, ConstBuffer) and b.dtype == dtypes.bool and ren.vector_masks)
def _vector_op_ok(ren: Renderer, op: Any, dt: DType) -> bool:
  return dt.scalar() in ren.vector_dtypes and op in ren.vector_alu
