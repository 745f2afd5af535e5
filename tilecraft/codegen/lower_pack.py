"""Lowering of PACK (see codegen/pack.py): the copy loop that fills a packed stack array inside the
pack's scope loop (the block loop, or the output loop pack.py picks for the buffer), and the loads
that read the array instead of the buffer.

The copy is a loop nest over the packed reduce axes (fresh loop variables) with the packed lane
axes unrolled into stores, inside the scope loop; a BARRIER over its stores orders every read of
the array after it (on a CPU that is only program order: the linearizer places the copy loop
before the inner loops that read it). The copy reads the buffer the ordinary way, gates included,
so a masked element is stored as 0. Functions of the LoweringState (lower_state.py).

Transposed copies. Where the array holds scalar lanes (no vector axis) and the buffer is contiguous
along the innermost packed reduce axis (a 1x1 conv's weights: each lane a row of K floats, the array
[K][lanes]), a lane-at-a-time copy reads one element from each of up to 32 rows per step: rows K
floats apart land in a few cache sets (K = 512: 2 KB apart, so 32 rows share 2 of L1's 64 sets) and
are evicted before their next element is read, so every element is an L2 (or memory) access. Such
copies go by blocks of V x V instead (V = 32 bytes of elements: 8 floats): V vector loads along
the reduce axis from V rows, each a whole run of one row, and V vector stores of the block's
columns (lanes i..i+V-1 of one reduce step), the transpose left to the compiler's shuffles. It is
taken only where it is exact: for every lane, step i of a block reads the element at base + i with
the validity of step 0 (checked on the index expressions), the reduce axis is a multiple of V and
the array's lanes are a multiple of V; elsewhere the lane-at-a-time copy stays.

Prefetching the next copy. The copy runs once per iteration of the pack's scope loop (a block of the
reduce under BLOCK, else a column tile), and its reads are the kernel's only memory traffic that misses
the caches (rows a whole row of the buffer apart: a new page per row, which the hardware prefetcher
doesn't follow). Where few row tiles reuse the tile (a matmul with a short M: 32 rows of a LLaMA MLP),
the copy is as long as the compute, and the two don't overlap. So the loop that reads the array also
asks (PREFETCH, on targets with has_prefetch) for the cache lines the next iteration's copy will read,
one hint per 64-byte line of the tile's row, spread evenly over the iteration: with t numbering the
repeats (the n_t iterations of the output loops inside the scope, and of reduce loops that don't move
the buffer) and r the copy's rows (the reduce loops that do, n_r of them), step t * n_r + r asks for
row (t * n_r + r) / n_t where n_t divides it, so each row is asked for once, every n_t steps. Where a
tile's row is narrower than a line (one 8-float AVX2 vector), the next tile starts in a line this one
read, so the hints are for the first later tile that starts in another line (two ahead): the fused
gate/up kernel below, AVX2, 1.03-1.20x over hints for the next tile (4 runs). The last iteration's hints
point past the tile (a hint never faults). Only where at most PREFETCH_MAX_REUSE row tiles read each
tile (PREFETCH_MAX_REUSE_WHOLE without BLOCK: the copy is a small part of more) and only for vector-lane arrays (a
matmul's column panel: a transposed copy's rows are contiguous runs the hardware prefetcher already
follows). Measured with hints against without, interleaved:
- SwiGLU's fused gate/up kernel (32x1024 @ two 1024x2816, no BLOCK: two reduces), 6 runs of 60 pairs: AVX-512
  (4 row tiles) 1.20-1.25x, AVX2 (8) 1.02-1.12x (1.13-1.19x with the two-ahead hints above, 4 runs); 64 rows:
  AVX-512 1.15x, AVX2 1.05x; 128 rows: AVX-512 1.08x.
- Matmuls without BLOCK read by 22-24 row tiles (AVX2): 128x3072x768 (22) 0.86-1.02x in 8 runs, 96x2048x2048 (24)
  1.00-1.09x in 5, so without BLOCK only up to PREFETCH_MAX_REUSE_WHOLE (16) row tiles.
- Blocked 32-128-row matmuls, these spread hints against the same hints repeated in every row tile (how they
  were issued before): AVX-512 0.97-1.15x, AVX2 1.06-1.37x.
- Past the limit, without BLOCK (the copy amortized over 32-128 row tiles): AVX2 0.79-0.98x, AVX-512 0.99-1.01x.
Without BLOCK, only for a buffer of at least pack.PREFETCH_MIN_BYTES (8 MB), one likely read from memory (a model's
weights): 1x1 convs in ResNet-50's, SqueezeNet's and Inception's shapes, whose image panels (activations of 0.8-3.2 MB
the kernel before wrote) come from cache, ran 0.90-1.02x with hints on AVX2 (4 of 5 at most 0.96x; 0.99-1.04x on AVX-512).
"""
from __future__ import annotations
import itertools
from typing import Optional
from tilecraft.codegen.lower_index import _subst
from tilecraft.codegen.lower_state import LoweringState, _is_zero
from tilecraft.codegen import pack
from tilecraft.codegen.pack import pack_axes, pack_inner_axes, pack_scope_axis
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.helpers import prod
from tilecraft.ops import BufferOps, MemBuffer
from tilecraft.shape.symbolic import Node, Variable, sint

PREFETCH_NEXT_COPY = True  # (the switch is for A/B measurements)
PREFETCH_MAX_REUSE = 24  # hints only where the loops inside the scope read the tile at most this often (see the module docstring)
PREFETCH_MAX_REUSE_WHOLE = 16  # the same without BLOCK (a whole panel's copy)
LINE_BYTES = 64

def _first_load(s: LoweringState, mb: MemBuffer) -> MemBuffer:
  """The buffer's first load in the AST: the one PACK checked, whose view lays out the array."""
  return next(x.arg for x in s.ast.lazyops if x.op is BufferOps.LOAD and x.arg.idx == mb.idx)

def _pack_layout(s: LoweringState, mb: MemBuffer) -> tuple[list[int], dict[int, int]]:
  """The packed axes (the vector axis last) and each one's stride in the array."""
  first = _first_load(s, mb)
  axes = pack_axes(first.st, s.first_reduce, s.info.reduce_block)
  if s.vax in axes: axes = [a for a in axes if a != s.vax] + [s.vax]
  strides, acc = {}, 1
  for a in reversed(axes):
    strides[a] = acc
    acc *= s.shape[a]
  return axes, strides

def _pack_offset(axes: list[int], strides: dict[int, int], vals: dict[int, sint]) -> sint:
  return sum((vals[a] * strides[a] for a in axes), start=0)

def _scope_range(s: LoweringState, first: MemBuffer) -> UOp:
  """The pack's scope loop (pack.py): the block loop under BLOCK, else an output loop."""
  if s.block_range is not None: return s.block_range
  return s.varmap[s.idx_vars[pack_scope_axis(first.st, s.shape, s.first_reduce)]]

def _pack(s: LoweringState, mb: MemBuffer) -> tuple[UOp, UOp]:
  """The packed array of buffer mb and the barrier after its copy loop (built once per buffer)."""
  key = ("pack", mb.idx)
  if (r := s.memo.get(key)) is not None: return r
  axes, strides = _pack_layout(s, mb)
  local = UOp(UOps.DEFINE_LOCAL, mb.dtype.ptr(local=True), (), (f"pack{mb.idx}", prod(s.shape[a] for a in axes)))
  first = _first_load(s, mb)
  scope = _scope_range(s, first)
  saved = list(s.idx_vars)
  try:
    # the buffer doesn't move along the inner loops (checked by PACK)
    for a in pack_inner_axes(first.st, s.shape, s.first_reduce, s.info.reduce_block): s.idx_vars[a] = 0
    stores = _transposed_copy(s, mb, local, axes, strides, scope)
    if stores is None: stores = _lane_copy(s, mb, local, axes, strides, scope)
  finally: s.idx_vars = saved
  barrier = UOp(UOps.BARRIER, dtypes.void, tuple(stores))
  s.memo[key] = (local, barrier)
  return local, barrier

def _copy_loops(s: LoweringState, axes: list[int], scope: UOp, chunk: Optional[tuple[int, int]] = None) -> dict[int, sint]:
  """The copy's loops over the packed reduce axes inside the scope loop (the other reduce axes index
  at 0); their variables set in idx_vars and returned. chunk (axis, V): that axis's loop steps over
  blocks of V (its variable numbers the blocks)."""
  parent, vals = scope, {}
  for a in s.red_axes:
    if a == s.block_axis: continue
    if a not in axes: s.idx_vars[a] = 0
    else:
      n = s.shape[a] // chunk[1] if chunk is not None and a == chunk[0] else s.shape[a]
      v = Variable(f"pblk{a}" if chunk is not None and a == chunk[0] else f"pidx{a}", 0, n - 1)
      parent = s.make_range(n, parent, ("reduce", a))
      s.varmap[v] = parent
      s.idx_vars[a] = vals[a] = v
  return vals

def _lane_copy(s: LoweringState, mb: MemBuffer, local: UOp, axes: list[int], strides: dict[int, int], scope: UOp) -> list[UOp]:
  """The copy lane by lane: per step of the reduce loops, one store per packed lane (a vector per
  lane where the array's innermost axis is the vector axis)."""
  vals = _copy_loops(s, axes, scope)
  lane_packed = [a in axes for a in s.lane_axes]
  sizes = [s.shape[a] if p else 1 for a, p in zip(s.lane_axes, lane_packed)]
  stores = []
  for lane in itertools.product(*[range(n) for n in sizes]):
    for a, x in zip(s.lane_axes, lane): vals[a] = x
    if s.vax in axes: vals[s.vax] = 0  # the base of a vector store
    at = _pack_offset(axes, strides, vals)
    v = _pack_value(s, mb, lane)
    if s.vax in axes and v.dtype.count == 1: v = UOp(UOps.VECTORIZE, mb.dtype.vec(s.W), (v,) * s.W)
    stores.append(s.store(local, at, 1, v))
  return stores

def _transposed_copy(s: LoweringState, mb: MemBuffer, local: UOp, axes: list[int], strides: dict[int, int], scope: UOp) -> Optional[list[UOp]]:
  """The copy by V x V blocks (see the module docstring), or None where it isn't exact."""
  V = min(32, 4 * s.ren.vector_width) // mb.dtype.itemsize
  if s.vax in axes or V < 2 or mb.dtype.scalar() not in s.ren.vector_dtypes or not s.ren.supports_float4: return None
  red = [a for a in s.red_axes if a != s.block_axis and a in axes]
  if not red or not isinstance(s.shape[red[-1]], int) or s.shape[red[-1]] % V: return None
  ra, lanes_n = red[-1], strides[red[-1]]
  if lanes_n % V: return None
  # each packed lane's offset in the array's run of lanes; they must fill it (0..lanes_n-1) exactly
  sizes = [s.shape[a] if a in axes else 1 for a in s.lane_axes]
  at_off: dict[int, tuple[int, ...]] = {}
  for lane in itertools.product(*[range(n) for n in sizes]):
    at_off[sum(x * strides[a] for a, x in zip(s.lane_axes, lane) if a in axes)] = lane
  if sorted(at_off) != list(range(lanes_n)): return None
  vals = _copy_loops(s, axes, scope, (ra, V))
  block = vals[ra]
  # per lane: the block's base index and validity, exact for every step i of the block
  src: dict[tuple[int, ...], tuple[sint, sint]] = {}
  for lane in at_off.values():
    per = []
    for i in range(V):
      s.idx_vars[ra] = block * V + i
      idx, valid = s.index(mb.st, lane)
      if s.vec_form(idx, valid)[0] != "scalar": return None
      per.append((idx, valid))
    if not all(_is_zero(ix - (per[0][0] + i)) and vl == per[0][1] for i, (ix, vl) in enumerate(per)): return None
    src[lane] = per[0]
  s.idx_vars[ra] = block * V
  vdt, buf = mb.dtype.vec(V), s.buf_uop(mb)
  base = _pack_offset([a for a in axes if a != ra and a in vals], strides, vals)
  stores = []
  for g in range(lanes_n // V):
    rows = [src[at_off[g * V + j]] for j in range(V)]
    loads = [s.load(buf, ix, vl, vdt, None) for ix, vl in rows]
    for i in range(V):
      col = tuple(UOp.const(mb.dtype, 0) if ld.op is UOps.CONST else ld.gep(i) for ld in loads)
      stores.append(s.store(local, base + (block * V + i) * lanes_n + g * V, 1, UOp(UOps.VECTORIZE, vdt, col)))
  return stores

def _pack_value(s: LoweringState, mb: MemBuffer, lane: tuple[int, ...]) -> UOp:
  """The buffer's value (a vector along the vector axis, if any) at the current index variables."""
  idx, valid = s.index(mb.st, lane)
  kind, data = s.vec_form(idx, valid)
  if kind == "scalar": return s.load(s.buf_uop(mb), *data, mb.dtype, None)
  if kind == "vector": return s.load(s.buf_uop(mb), *data, mb.dtype.vec(s.W), None)
  return UOp(UOps.VECTORIZE, mb.dtype.vec(s.W), tuple(s.load(s.buf_uop(mb), ix, vl, mb.dtype, None) for ix, vl in data))

def _prefetch_next_copy(s: LoweringState, mb: MemBuffer, axes: list[int], inner: bool) -> None:
  """The hints for the copy of mb in the next iteration of the pack's scope loop (see the module docstring), once per buffer."""
  key = ("pack_prefetch", mb.idx)
  if not PREFETCH_NEXT_COPY or not s.ren.has_prefetch or s.vax not in axes or key in s.memo: return
  s.memo[key] = True
  first = _first_load(s, mb)
  # without BLOCK only for a buffer large enough to come from memory (the copy of an activation the kernel before wrote,
  # from cache, took longer with hints)
  if s.block_range is None and (not isinstance(size := first.st.real_size(), int) or size * mb.dtype.itemsize < pack.PREFETCH_MIN_BYTES): return
  # one scope iteration's steps: t numbers the repeats, r the copy's rows (mixed-radix numbers of their loops)
  loops = [a for a in s.red_axes if a != s.block_axis]
  rows = [a for a in loops if a in axes]
  repeats = pack_inner_axes(first.st, s.shape, s.first_reduce, s.info.reduce_block) + [a for a in loops if a not in axes]
  if not all(isinstance(s.shape[a], int) for a in rows + repeats): return
  n_t, n_r = prod(s.shape[a] for a in repeats), prod(s.shape[a] for a in rows)
  if n_t > (PREFETCH_MAX_REUSE if s.block_range is not None else PREFETCH_MAX_REUSE_WHOLE): return
  def number(loop_axes: list[int]) -> sint: return sum((s.idx_vars[a] * prod(s.shape[b] for b in loop_axes[i + 1:]) for i, a in enumerate(loop_axes)), start=0)
  step = number(repeats) * n_r + number(rows)
  row = step // n_t  # the row this step asks for, where n_t divides the step
  sub = {s.idx_vars[a]: (row // prod(s.shape[b] for b in rows[i + 1:])) % s.shape[a] for i, a in enumerate(rows) if isinstance(s.idx_vars[a], Variable)}
  gate = (step % n_t) < 1 if n_t > 1 else 1
  scope = _scope_range(s, first)
  g = s.loop_var(scope)
  per_line = max(1, LINE_BYTES // mb.dtype.itemsize)
  starts: list[sint] = []
  for lane in s.lanes(inner):
    kind, data = s.vec_form(*s.index(mb.st, lane))
    if kind not in ("vector", "masked"): continue
    # one hint per line: a start a constant distance from one kept, inside its line, is covered
    if any(isinstance(d := data[0] - b, int) and 0 <= d < per_line for b in starts): continue
    at = data[0].substitute(sub) if isinstance(data[0], Node) and sub else data[0]
    # tiles narrower than a line (8 floats of AVX2): the next one starts in the line this one read, so ask for the
    # first later tile that starts in another line
    step_elems = _subst(data[0], g, g + 1) - data[0] if g is not None else None
    ahead = -(-per_line // step_elems) if isinstance(step_elems, int) and 0 < step_elems < per_line else 1
    if s.prefetch_next(s.buf_uop(mb), at, scope, gate, ahead): starts.append(data[0])

def lower_packed_load(s: LoweringState, mb: MemBuffer, inner: bool) -> dict[tuple, UOp]:
  local, barrier = _pack(s, mb)
  axes, strides = _pack_layout(s, mb)
  _prefetch_next_copy(s, mb, axes, inner)
  res = {}
  for lane in s.lanes(inner):
    vals: dict[int, sint] = {a: s.idx_vars[a] for a in axes}
    for a, x in zip(s.lane_axes, lane): vals[a] = x
    if s.vax in axes:
      vals[s.vax] = 0
      res[lane] = s.load(local, _pack_offset(axes, strides, vals), 1, mb.dtype.vec(s.W), barrier)
    else: res[lane] = s.load(local, _pack_offset(axes, strides, vals), 1, mb.dtype, barrier)
  return res
