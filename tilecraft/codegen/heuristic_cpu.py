"""Hand-coded CPU layouts: register tiles, cache blocking and packing, the rules `heuristic.py`'s
`hand_coded_optimizations` asks first on a target without workgroups. Each rule applies its opts
with a reason (`try_opt`), on a trial copy where a later refusal would leave a half-applied tile, and
returns whether it laid the kernel out.

The tile the BEAM search finds for matmul on AVX-512: 8 output rows x 2 vectors of output columns,
16 vector accumulators (half the zmm registers). Each step of the reduce loads 2 vectors of B and
broadcasts 8 scalars of A. AVX2 has 16 ymm registers and no broadcast memory operand, so 8 x 2
accumulators + 2 B vectors + a broadcast don't fit (gcc spills 3 accumulators to the stack, whose
store-to-load chains then bound the loop): there the tile has 6 rows (12 accumulators, 15
registers, as in BLAS kernels for AVX2), the row axis padded (PADTO) to a multiple of 6 when the
padding is small. Matmul 1024 on one thread: 0.73x -> 0.91x of OpenBLAS. Long reduces run in
blocks (BLOCK) of CPU_REDUCE_BLOCK, with the output loops swapped so the block of B (block x 2
vectors, L1-sized) is reused by every row tile before moving on: this avoids re-reading B from L3
for every row tile, and the cache-set conflicts of a power-of-two row pitch.
"""
from __future__ import annotations
from typing import Any, NamedTuple, Optional
from tilecraft.codegen.kernel_shape import KernelShape
from tilecraft.codegen import lower_state, pack
from tilecraft.codegen.opt import Opt, OptOps, try_opt
from tilecraft.helpers import getenv, prod, round_up
from tilecraft.ops import BinaryOps, BufferOps, MemBuffer, ReduceOps, UnaryOps

def _is_matvec(k: KernelShape) -> Optional[tuple[int, int]]:
  """A SUM of MUL(LOAD, LOAD) where one operand doesn't vary along the output axis 0 (the operands may be
  CAST(LOAD): half/bfloat16 widened to the float32 accumulator)."""
  if len(k.reduceops) != 1 or k.reduceops[0].op is not ReduceOps.SUM or k.first_reduce != 1: return None
  src = k.reduceops[0].src[0]
  if src.op is UnaryOps.CAST: src = src.src[0]
  if src.op is not BinaryOps.MUL: return None
  ops = [s.src[0] if s.op is UnaryOps.CAST else s for s in src.src]
  if any(s.op is not BufferOps.LOAD for s in ops): return None
  idx = [k.bufs.index(s.arg) for s in ops]
  strides = [k.sts[i].real_strides() for i in idx]
  if any(st[0] == 0 and st[k.first_reduce] == 1 for st in strides) and any(st[0] != 0 for st in strides): return tuple(idx)  # type: ignore
  return None


TILE_ROWS, TILE_VECTORS = 8, 2
AVX2_WIDE_TILE = True  # 16 registers: 4 rows x 3 vectors where it fits (see cpu_matmul_tile); the switch is for A/B measurements
WIDE_VECTORS = 4  # one row's vectors of columns in the tile of several reduces of distinct inputs (16 registers)
TILE_ROWS_16_REGS = 6  # 16 vector registers (AVX2, AVX): 6 x 2 accumulators
COLUMN_BLOCK = 8  # rows per block of a column-style reduce (column sums), see hand_coded_optimizations
VECTOR_COLUMN_ROWS = (8, 7, 6)  # gathered rows of the vector-columns tile with 32 registers (_packed_tile_shape)

def _input_strides(k: KernelShape) -> list[tuple]:
  """Per input buffer that varies somewhere, its strides. A scalar broadcast to every element (a 0-d tensor: clip bounds, a
  learned scale) tells no axis from another; counted, it made every axis look broadcast by some input and denied the
  rows axis (an input broadcast along the rows must vary along the columns): a 1x1 conv with a ReLU6 of scalar
  bounds fell to the general rules, 1.8-2.9x slower (MobileNet-v2's 160 -> 960 at 7^2 and 96 -> 576 at 14^2, AVX-512, both
  opts in one process, caches flushed between runs)."""
  ins = [st.real_strides() for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
  return [rs for rs in ins if any(s != 0 for s in rs)]

def cpu_matmul_tile(k: KernelShape, vw: int) -> bool:
  """CPU kernels with one SUM reduce of a product in which an output axis `n` (the vector axis) and
  another output axis `m` (the rows) are each broadcast by some input (matmul, batched matmul, 1x1
  and strided convs): the rows x (2 vectors) register tile, then reduce blocking. True when the tile applied.
  `n` is the output's contiguous axis where the inputs moving along it move contiguously too (vector
  loads); where they don't, `n` is an axis whose operand PACK lays out contiguously (a strided conv's output
  channels: its pixels are stride 2 in the image; attention's score columns, k packed per head), and the
  tile is taken only if that pack applies (else its loads would be gathers)."""
  if not k.reduceops or any(r.op is not ReduceOps.SUM for r in k.reduceops) or k.upcasted or k.first_reduce < 2: return False
  for r in k.reduceops:  # (several: matmuls sharing an operand fused into one kernel, SwiGLU's x @ w1 and x @ w3)
    src = r.src[0]
    if src.op is UnaryOps.CAST: src = src.src[0]
    if src.op is not BinaryOps.MUL: return False
  if len(k.reduceops) > 1 and k.dependent_reduce(): return False
  ins, out = _input_strides(k), k.sts[0].real_strides()
  def reused(a: int) -> bool: return any(rs[a] == 0 for rs in ins) and any(rs[a] != 0 for rs in ins)
  def unit(a: int) -> bool: return all(rs[a] == 1 for rs in ins if rs[a] != 0)
  # several fused reduces (SwiGLU's x @ w1 and x @ w3) each keep their own accumulators and column vectors: one vector
  # of columns per reduce (rows: _tile_rows), else the accumulators spill (4 rows x 2 vectors x 2 reduces and their 4
  # column vectors on AVX2's 16 registers: SwiGLU's 32x1024x2816 1.4x faster as 4 x 1, 1 thread; 1.2x on AVX-512 as 8 x 1)
  cols = vw * (TILE_VECTORS if len(k.reduceops) == 1 else 1)
  def cols_fit(size: Any, c: int = cols) -> bool:  # a multiple of the tile's columns, or padded to one for at most 1/8 more work
    return isinstance(size, int) and size >= c and 8 * (round_up(size, c) - size) <= size
  def strided(a: int) -> bool:  # an input moves along a by more than 1 (padding masks aside)
    return any(st.real_strides(ignore_valid=True)[a] not in (0, 1) for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs))
  def rows_axis(n: int) -> Optional[int]:  # the input broadcast along m must vary along n
    return next((a for a in range(k.first_reduce - 1, -1, -1) if a != n and reused(a) and _tile_rows(k, k.full_shape[a], vw) is not None and
                 not any(rs[a] == 0 and rs[n] == 0 for rs in ins)), None)
  def short_axis(n: int, like: int) -> Optional[int]:  # another output axis of 2-7 steps (an image's rows) the inputs move along as along `like`
    return next((a for a in range(k.first_reduce - 1, -1, -1) if a not in (n, like) and out[a] != 0 and isinstance(k.full_shape[a], int) and
                 2 <= k.full_shape[a] <= 7 and all((rs[a] == 0) == (rs[like] == 0) for rs in ins)), None)
  red = prod(k.full_shape[k.first_reduce:k.first_upcast])
  if _laid_out_columns_tile(k, vw, ins, out, red): return True
  # (32 registers, one long reduce: columns that fill the 2-vector tile only when padded, by at most 1/3, a 7x7 image's 49
  # pixels -> 64, still take it: the pack of the other operand's panel and its 16 accumulators beat the transposed tile
  # below (8 pixel rows x 32 output channels, 3 accumulators spilled) by 1.21-1.29x on ResNet-50's 1x1 convs at 7^2,
  # 2048->512, 512->2048 and 1024->2048, AVX-512, interleaved)
  # (16 registers: the same 49 pixels are 4 tiles of 2 8-lane vectors, padded to 64, with 6 rows: ResNet-50's 1x1 convs at
  # 7^2 1.6x faster than 16 output channels x 8 pixels (16 accumulators, spilled), AVX2)
  def short_cols(size: Any) -> bool:
    return isinstance(red, int) and red >= 256 and k.first_upcast - k.first_reduce == 1 and isinstance(size, int) and \
      cols < size <= (2 if vw >= 16 else 4) * cols and 3 * (round_up(size, cols) - size) <= size
  n = next((a for a in range(k.first_reduce - 1, -1, -1) if out[a] == 1 and unit(a) and reused(a) and (cols_fit(k.full_shape[a]) or short_cols(k.full_shape[a]))), None)
  if n is not None and _cpu_short_rows_tile(k, n, vw, ins, reused): return True
  if n is not None and (m := rows_axis(n)) is not None:
    # (16 registers, several short reduces that share no input, e.g. a bottleneck's last 1x1 conv and its projection
    # shortcut summed in one kernel: one row of 4 vectors per reduce, not 4 rows of one: ResNet-50's 64->256 pair at 56^2
    # 1.5-1.68x, AVX2. Not with long reduces: two 32x1024 @ 1024x2816 matmuls of distinct inputs ran 0.74x as fast)
    if vw == 8 and len(k.reduceops) > 1 and isinstance(red, int) and red < 256 and _share_no_input(k) and \
        cols_fit(k.full_shape[n], WIDE_VECTORS * vw):
      return _apply_matmul_tile(k, n, m, vw, WIDE_VECTORS * vw, rows=1, why=" (reduces of distinct inputs: one row of wide columns each)")
    # (16 registers, one reduce, columns that fill 3 vectors padded by at most 1/32, rows by 4, and a 3-vector panel that
    # fits a pack whole: 4 rows x 3 vectors, 12 accumulators as in 6 x 2, but 3 loads and 4 broadcasts per 12 FMAs, not
    # 2 and 6. AVX2 code on this project's Zen 4, interleaved: 300x700x500 1.15-1.2x, 256x1024x1024 1.1x, 1024^3 1.09x,
    # 128x768x3072 1.00-1.11x (with bias + GELU 1.00-1.05x), 128x768x2304 1.12x (with bias 1.00x); ONNX models' kernels summed in
    # sequence (it takes their 1x1 convs at 56^2 and 28^2): ShuffleNet 1.10-1.26x, SqueezeNet 1.06-1.14x, ResNet-50,
    # DenseNet-121 and Inception v1 0.99-1.04x. Where the panel must be blocked
    # in blocks of 256 (128x3072x768) it measured 0.92x, and a 64^3 (columns 64 -> 72) 0.74x: neither takes it; blocks of
    # 1024 do pay, see _wide_panel_block)
    if vw == 8 and AVX2_WIDE_TILE and len(k.reduceops) == 1 and isinstance(size_n := k.full_shape[n], int) and 32 * ((-size_n) % (3 * vw)) <= size_n and \
        isinstance(size_m := k.full_shape[m], int) and size_m >= 4 and 32 * ((-size_m) % 4) <= size_m and isinstance(red, int) and \
        (block := _wide_panel_block(red, 3 * vw * k.bufs[0].dtype.itemsize, -(-size_m // 4))) is not None:
      return _apply_matmul_tile(k, n, m, vw, 3 * vw, rows=4, why=" (16 registers: 4 rows x 3 vectors)", block=block or None)
    return _apply_matmul_tile(k, n, m, vw, cols)
  if n is None and (one := _one_vector_columns(k, vw, cols, out, ins, reused, unit, rows_axis)) is not None:
    n, m, partner = one
    if partner is None: return _apply_matmul_tile(k, n, m, vw, vw, why=" (the columns are one vector)")
    return _apply_matmul_tile(k, n, m, vw, cols, why=f" (the columns are one vector; axis {partner} gives the second)", col_axis=partner)
  if n is None and len(k.reduceops) == 1 and (narrow := _narrow_columns(k, vw, cols, out, reused, unit, rows_axis)) is not None:
    n, m, lanes, count, rows = narrow
    return _apply_matmul_tile(k, n, m, lanes, lanes * count, rows=rows, why=f" (narrow columns: {count} vectors of {lanes})")

  # the packed tile, tried on a copy and kept only with its pack; not for short reduces (a 7x7 stem's 147:
  # there the pack and the padded image's row masks cost more than the strided vector loads, 4x slower measured)
  masked = any(st.axis_is_masked(a) for st in k.sts for a in range(k.shape_len))
  unpacked: Optional[tuple[int, int]] = None  # (n, m) of the first packed tile refused for its panel's size
  def packed_tile(t: KernelShape, n: int, m: int, block_outer: bool = False) -> bool:
    return _apply_matmul_tile(t, n, m, vw, cols, why=f" (the operand along axis {n} is strided: packed contiguously below{', in blocks' if block_outer else ''})",
                              rows=TILE_ROWS if out[m] == 1 else None, batched_pack=True, block_outer=block_outer)
  def gathered_rows(n: int) -> Optional[int]:  # strided rows (the vector of a transposed tile) that no tile fits: padded to 8 by <= 1/2
    return next((a for a in range(k.first_reduce - 1, -1, -1) if a != n and out[a] == 1 and strided(a) and reused(a) and
                 isinstance(s := k.full_shape[a], int) and 2 * (round_up(s, TILE_ROWS) - s) <= s and not any(rs[a] == 0 and rs[n] == 0 for rs in ins)), None)
  def packed_stem(n: int, m: int) -> bool:
    # 16 registers, gathered rows (a 7x7 stride-2 stem's, a reduce of 147): the weights packed as vectors of output channels,
    # a broadcast pixel each (8 x 2 vectors), beat the strided vector loads of the pixels under 12 broadcast weights: the
    # stems of ResNet-50, Inception v1 and ZFNet 1.51-1.65x in their calls, a 5x5 s2 conv of 8 channels 1.5x (AVX2; AVX-512's
    # tile there is as fast as this one, 0.93-0.98x). Where the column tiles (the parallel loop) are few and odd, 3 of them
    # kept one of 2 cores idle a third of the time: 0.83x on a 48-channel stem
    tiles = k.full_shape[n] // cols
    return vw < 16 and AVX2_PACKED_STEM and red >= 64 and out[m] == 1 and strided(m) and (tiles % 2 == 0 or tiles >= 8)
  for n in range(k.first_reduce - 1, -1, -1) if isinstance(red, int) else ():
    if unit(n) or not reused(n) or not isinstance(k.full_shape[n], int): continue
    if (m := rows_axis(n)) is None and (m := gathered_rows(n)) is None: continue
    # (a short reduce only where the vectors run along the packed operand, the output's contiguous axis, and nothing is
    # masked: attention's q @ k^T (a reduce of 64), k packed per head and column tile, 3.3x faster than the dot-product
    # tile on AVX-512, 1.65x on AVX2, BERT's 12x128x128x64)
    if red < 256 and (out[n] != 1 or masked) and not packed_stem(n, m): continue
    # (the rows here are the output's contiguous axis, along which the lowering makes the accumulators vectors unless the
    # rows are gathered and the columns run along the packed operand (lower_state.py: then vectors of the columns): 8
    # rows are one float8 per output channel, 6 have no vector type and rendered scalar accumulators, 3-5x slower
    # measured on 3x3 stride-2 convs with 17- and 30-wide outputs, AVX2, before the vectors of columns; so 8 rows,
    # padded, never 6. With vectors of columns AVX2 still takes 8, measured; 32 registers see _packed_tile_shape)
    trial = k.copy()
    if k.full_shape[n] % cols or not packed_tile(trial, n, m) or not trial.packed:
      if unpacked is None and k.full_shape[n] % cols == 0: unpacked = (n, m)
      # no pack (its panel over CPU_PACK_MAX_BYTES: a 3x3 conv of 512 channels), but the rows are strided, gathers in any tile, and
      # the columns' operand is broadcast (a scalar per column): the tile without the pack, one vector's worth of columns (2
      # spill on AVX-512, 5x slower). ResNet-50's 3x3 s2 512->512 at 14^2 1.24x (AVX-512) and 1.5x (AVX2) faster than the
      # padded-columns tile below. Only where one vector holds a whole output row (7 wide): with 14-wide rows (3x3 s2 256 at
      # 28^2) the padded-columns tile's 16-lane vectors along the row, the image packed, were 1.4x faster (AVX-512)
      # The image's other short axis (its 7 rows) is upcast whole too: each weight broadcast then serves the whole image, read
      # once instead of once per row (56-112 accumulators, spilled, still 1.15-1.18x faster on AVX-512 and 1.42-1.49x on AVX2)
      if strided(m) and _vector_columns_tile(k, n, m, vw, red): return True
      if not (out[m] == 1 and strided(m) and k.full_shape[m] <= TILE_ROWS and red >= 256 and k.full_shape[n] % vw == 0): continue
      trial = k.copy()
      if not _apply_matmul_tile(trial, n, m, vw, vw, why=f" (the operand along axis {n} is broadcast per column; rows strided; "
                                "2 vectors' panel too big to pack)", rows=TILE_ROWS, small=short_axis(n, m)): continue
    elif (shape := _packed_tile_shape(k, m, vw, cols, red, out[m] == 1, unit(m), strided(m), _vector_columns(k, n, m, trial.packed, red))) is not None:
      rows_alt, cols_alt, why_alt = shape
      other = k.copy()
      if _apply_matmul_tile(other, n, m, vw, cols_alt, why=f" (the operand along axis {n} is strided: packed contiguously below; {why_alt})",
                            rows=rows_alt, batched_pack=True) and other.packed: trial = other
    adopt_trial(k, trial)
    return True
  # a batched A @ B^T (q @ k^T) the packed tile above didn't take (B's panel refused, e.g. masked, or a row or column
  # count no tile fits): both operands contiguous along the reduce, B strided along the output's columns: dot
  # products, with vector accumulators along the reduce and a 4 x 2 tile of them (0.9 ms -> 0.6 ms on BERT's
  # 12x128x128x64 against the general rules, AVX2)
  red_ax = k.first_upcast - 1
  if k.first_upcast - k.first_reduce == 1 and isinstance(k.full_shape[red_ax], int) and k.full_shape[red_ax] % vw == 0 and \
      all(rs[red_ax] == 1 for rs in ins if rs[red_ax] != 0) and (dot := _cpu_dot_tile(k, vw, red_ax, reused, unit)): return dot
  # else the output's contiguous axis even with strided loads (the 7x7 stem: 1.9x faster than the general rules). A strided
  # vector load is vw scalar loads, so where the reduce is long enough to repay it (at least 64: a 7x7 stem's 147) the
  # tile takes one vector and twice the rows (12 on AVX2, 16 with 32 registers, padded by at most 1/8): half the loads
  # per FMA; ResNet-50's 7x7 stem 1.4x faster than 6 rows x 2 vectors (AVX2). (A 3x3 stride-2 conv of 3 channels, a
  # reduce of 27: no gain measured). With strided loads the one-vector tile needs the columns to fit one vector only: ResNet-50's stem
  # (112 columns, not a multiple of 2 x 16) took the general rules on AVX-512, 2.6x slower than this tile (1 thread)
  long_red = isinstance(red, int) and red >= 64
  n = next((a for a in range(k.first_reduce - 1, -1, -1) if out[a] == 1 and reused(a) and
            (cols_fit(k.full_shape[a]) or (long_red and strided(a) and cols_fit(k.full_shape[a], vw)))), None)
  if n is not None and (m := rows_axis(n)) is not None:
    rows, size = 2 * (TILE_ROWS_16_REGS if vw == 8 else TILE_ROWS), k.full_shape[m]  # (16 on AVX2 would spill)
    if long_red and 8 * ((-size) % rows) <= size:
      return _apply_matmul_tile(k, n, m, vw, vw, why=" (strided loads: one vector, twice the rows)", rows=rows)
    if cols_fit(k.full_shape[n]): return _apply_matmul_tile(k, n, m, vw, cols, why=" (strided loads)")
  # columns that aren't a multiple of half a vector (a padded conv's 55-, 27-, 13- or 7-wide rows), padded to the lanes
  # _odd_lanes picks: the tile's 2 vectors where that pads at most 1/4 (55 -> 64, 27 -> 32, 13 -> 16); else one vector
  # (7 -> 8) and, where another output axis the same operands move along is short (a 7x7 image's rows), that axis
  # whole with 2 rows, so each broadcast of the rows' operand (a weight) serves the whole image. Without this the
  # general rules upcast output channels into scalar tiles: SqueezeNet's 3x3 convs at 27^2 and 13^2 6-12x faster,
  # ResNet-50's 3x3 512->512 at 7^2 10x faster, measured (AVX2). 2 vectors beat one at 55^2, 27^2 and 13^2 by 10-25%;
  # at 7^2 the whole rows beat 6 rows x 1 vector by 1.3-1.5x (the 9.4 MB of weights are read once, not 7 times)
  n = next((a for a in range(k.first_reduce - 1, -1, -1) if out[a] == 1 and reused(a) and _odd_lanes(k.full_shape[a], vw)), None)
  if n is not None and (m := rows_axis(n)) is not None:
    # a row of at most 16 (14 on 16 registers) that no vector size divides (a 3x3 conv's 13- or 7-wide rows): one vector
    # of output channels over their packed weights x the whole row, a broadcast pixel each (the lowering's vectors along
    # the packed columns), unpadded. SqueezeNet's 3x3 64->256 and 48->192 at 13^2 1.2x faster than the padded tile below
    # (AVX-512); on AVX2 1.25-1.3x there, 1.33x on 256 -> 256 at 13^2, 1.27x on ResNet-50's 512 -> 512 at 7^2, 1.37-1.76x
    # on YOLO-like 512 -> 1024 and 1024 -> 1024 at 13^2 (WINO=0, interleaved)
    if _vector_columns_tile(k, m, n, vw, red, " (a row no vector divides: one vector of columns, packed, the row whole)"): return True
    size, lanes = k.full_shape[n], _odd_lanes(k.full_shape[n], vw)
    if 4 * (round_up(size, 2 * lanes) - size) <= size:
      # (half-width lanes on AVX-512 pad less only as one vector: where 2 of them pad to the same columns as one whole vector
      # (55 -> 64 either way), the whole vector it is, 16 lanes x 8 rows: SqueezeNet's 3x3 16->64 at 55^2 1.62x faster than
      # 6 rows x 2 half-width vectors (_tile_rows, given 8 lanes, counted 16 registers), 1.39x than 8 x 2, interleaved)
      if vw >= 16 and lanes < vw and round_up(size, 2 * lanes) == round_up(size, vw):
        return _apply_matmul_tile(k, n, m, vw, vw, why=" (padded columns: one whole vector, as wide as 2 half-width ones)")
      return _apply_matmul_tile(k, n, m, lanes, 2 * lanes, why=" (padded columns)")
    return _apply_matmul_tile(k, n, m, lanes, lanes, why=" (one vector of columns)", small=short_axis(m, n))
  # last resort: the packed tile refused above for its panel's size, with the reduce's outermost axis (a conv's input
  # channels) in blocks whose panel fits the pack. A 3x3 conv of 512 channels on AVX2 with 28-wide rows (which no other
  # tile takes: 28 is a multiple of half the vector) ran the general rules, 2.5-3.2x slower, 512 -> 512 and 512 -> 256 at
  # 28^2, interleaved. (Not before the other tiles: at 14^2 and 7^2 the padded-columns tile was 1.15-1.2x faster than it)
  if unpacked is not None:
    n, m = unpacked
    trial = k.copy()
    if packed_tile(trial, n, m, block_outer=True) and trial.packed:
      adopt_trial(k, trial)
      return True
  return False

LAID_OUT_VECTORS = 4   # vectors of output channels in the laid-out-columns tile (_laid_out_columns_tile)
LAID_OUT_ROWS = 7      # its pixels: odd, so the lowering never takes them for the vector axis (lower_state.py)
LAID_OUT_MIN_REDUCE = 256
LAID_OUT_MIN_REDUCE_PADDED = 64  # ... where vectors of the pixels would pad them by more than 1/8 (laid_out_min_reduce)

def laid_out_min_reduce(rows: int, vw: int) -> int:
  """The shortest reduce the laid-out-columns tile takes for `rows` output rows (pixels) on vw-lane vectors. Where vectors of
  the rows pad them by at most 1/8 (a 14x14 image's 196 -> 208) the padded tiles of the (Cout, Cin) weight were as fast
  below 256 (1x1 convs with a ReLU6 at 14^2, 32 -> 384 to 192 -> 1152: 0.85-1.07x; 64 -> 256 with a residual 0.69x);
  where they pad more (a 7x7 image's 49 -> 64), from 64: 64 -> 256 to 192 -> 1152 at 7^2 1.29-1.64x, 256 -> 1024
  1.22x (with a residual 1.23x), 32 -> 192 0.94x (AVX-512, interleaved)."""
  return LAID_OUT_MIN_REDUCE_PADDED if 8 * ((-rows) % vw) > rows else LAID_OUT_MIN_REDUCE

def _laid_out_columns_tile(k: KernelShape, vw: int, ins: list[tuple], out: tuple, red: Any) -> bool:
  """32 registers: a 1x1 conv whose weight is laid out with the output channels innermost (frontend/pointwise_layout.py:
  panels of 64): an output axis n (the output channels) strided in the output along which the one reduce operand
  moving along it runs contiguously, and the output's contiguous axis m (the pixels) a multiple of LAID_OUT_ROWS
  that vectors would pad (a 14x14 or 7x7 image's 196 or 49 pixels). The tile: LAID_OUT_VECTORS vectors of output
  channels x LAID_OUT_ROWS pixels, 28 accumulators, each pixel a broadcast feeding 4 FMAs;
  vector loads straight from the weight (the lowering's vectors along a strided axis), nothing packed or padded,
  the output stored lane by lane. Against the tiles for the model's (Cout, Cin) weight, AVX-512: ResNet-50's 1x1
  convs at 14^2 and 7^2 1.07-1.18x in the model's sequence (frontend/pointwise_layout.py); alone, with the weight
  a plain (Cin, Cout) transpose, a residual added in the epilogue (gathered lane by lane) cut the gain to 1.03-1.15x
  with an unstrided image and to 0.85-0.93x strided from 28^2 or 14^2. AVX2 (16 registers) has no such tile: 2
  vectors x 7 pixels ran 0.6-0.8x as fast as the (Cout, Cin) layout's tiles (CPU_ARCH=haswell)."""
  if vw < 16 or len(k.reduceops) != 1 or not isinstance(red, int) or red < LAID_OUT_MIN_REDUCE_PADDED: return False
  red_axes = range(k.first_reduce, k.first_upcast)
  operands = [rs for rs in ins if any(rs[r] != 0 for r in red_axes)]
  for n in range(k.first_reduce):
    size_n = k.full_shape[n]
    if out[n] in (0, 1) or not isinstance(size_n, int) or size_n % (LAID_OUT_VECTORS * vw): continue
    movers = [rs for rs in operands if rs[n] != 0]
    if len(movers) != 1 or movers[0][n] != 1: continue
    m = next((a for a in range(k.first_reduce) if a != n and out[a] == 1 and isinstance(size_m := k.full_shape[a], int) and
              size_m % LAID_OUT_ROWS == 0 and size_m % vw != 0 and movers[0][a] == 0 and any(rs[a] != 0 for rs in operands)), None)
    if m is None or red < laid_out_min_reduce(k.full_shape[m], vw) or not _vector_columns(k, n, m, (), red, LAID_OUT_ROWS): continue
    why = f" (the weight runs contiguously along axis {n}: {LAID_OUT_VECTORS} vectors of its columns x {LAID_OUT_ROWS} rows, unpadded)"
    if size_n == LAID_OUT_VECTORS * vw and m > n: m -= 1  # (axis n, upcast whole, goes)
    trial = k.copy()
    if not (try_opt(trial, Opt(OptOps.UPCAST, n, vw), f"matmul register tile: {vw} output columns (axis {n}) are one vector" + why) and
            try_opt(trial, Opt(OptOps.UPCAST, n, LAID_OUT_VECTORS), f"matmul register tile: {LAID_OUT_VECTORS} vectors of columns share each broadcast" + why) and
            try_opt(trial, Opt(OptOps.UPCAST, m, LAID_OUT_ROWS), f"matmul register tile: {LAID_OUT_ROWS} output rows (axis {m}), a broadcast each" + why)):
      continue
    adopt_trial(k, trial)
    return True
  return False

def _one_vector_columns(k: KernelShape, vw: int, cols: int, out: tuple, ins: list[tuple], reused: Any, unit: Any,
                        rows_axis: Any) -> Optional[tuple[int, int, Optional[int]]]:
  """(n, m, partner) where the output's contiguous axis n is exactly one vector, narrower than the tile's columns: a
  matmul with 16 output columns on AVX-512 (a classifier head, a LoRA down-projection), or weights laid out in panels
  of 16 columns, (n / 16, k, 16). `partner` is another output axis the inputs move along as along n (the panels),
  which gives the tile its other vectors of columns; None: one vector of columns. Without this the general rules
  took 32 rows x 1 vector (the accumulators spilled): x @ w of 1024x4096 @ 4096x16 5.2x slower than 8 rows, and the
  panel layout's 8x4096 @ (128, 4096, 16) 30x slower (vectors across the panels, gathers), AVX-512."""
  n = next((a for a in range(k.first_reduce - 1, -1, -1) if out[a] == 1 and unit(a) and reused(a) and k.full_shape[a] == vw < cols), None)
  if n is None or (m := rows_axis(n)) is None: return None
  partner = next((a for a in range(k.first_reduce - 1, -1, -1) if a not in (n, m) and out[a] != 0 and isinstance(k.full_shape[a], int) and
                  k.full_shape[a] % (cols // vw) == 0 and all((rs[a] == 0) == (rs[n] == 0) for rs in ins)), None)
  return n, m, partner

def _narrow_columns(k: KernelShape, vw: int, cols: int, out: tuple, reused: Any, unit: Any,
                    rows_axis: Any) -> Optional[tuple[int, int, int, int, int]]:
  """(n, m, lanes, count, rows) where the output's contiguous axis n is narrower than, or pads badly to, the tile the
  rules above take (24, 40, 72 or 80 columns on AVX-512; 12 or 20 on AVX2): `count` (at most 3) vectors of `lanes`
  (a whole vector, or a half one with 32 registers) x `rows` (8 with 32 registers; with 16, 6 for up to 2 vectors
  and 4 for 3), the widest such tile (at least 1.5 vectors or the whole row) that pads the row least: a multiple of 8
  by at most 1/4 with 32 registers; with 16, rows under 2 tiles' columns by at most 1/3. The general rules took 32
  rows of one vector on AVX-512 (spilled): 32 x 4096 @ 4096 x 24, 40, 72 and 80 ran 4.5-11x slower than this; on
  AVX2 they took 4-lane vectors: 100 x 2048 @ 2048 x 12 and x 20 1.8-2.7x slower."""
  n = next((a for a in range(k.first_reduce - 1, -1, -1) if out[a] == 1 and unit(a) and reused(a)), None)
  size = None if n is None else k.full_shape[n]
  regs32 = vw >= 16
  # (32 registers: a multiple of 8, padded by at most 1/4; 16: under 2 tiles' columns, padded by at most 1/3)
  if not isinstance(size, int) or size < 8 or (size % 8 if regs32 else size >= 2 * cols) or (m := rows_axis(n)) is None: return None
  def pad(w: int) -> int: return round_up(size, w) - size
  # (within 1/4 first, then the widest tile, then the least padding)
  best = max(((4 * pad(lanes * count) <= size, lanes * count, -pad(lanes * count), lanes, count) for lanes in ((vw, vw // 2) if regs32 else (vw,))
              for count in (1, 2, 3) if lanes * count >= min(size, 3 * vw // 2) and (4 if regs32 else 3) * pad(lanes * count) <= size), default=None)
  if best is None: return None
  lanes, count = best[3], best[4]
  rows = (TILE_ROWS if k.full_shape[m] % TILE_ROWS == 0 else _tile_rows(k, k.full_shape[m], vw)) if regs32 else \
    (TILE_ROWS_16_REGS if count <= 2 else 4)
  return None if rows is None else (n, m, lanes, count, rows)

def adopt_trial(k: KernelShape, trial: KernelShape) -> None:
  """Apply to k the opts (with their reasons) a trial copy of it took after k's own."""
  n = len(k.applied_opts)
  for o, why in zip(trial.applied_opts[n:], trial.applied_opts_reasons[n:]): k.apply_opt(o, reason=why)

def _vector_columns(k: KernelShape, n: int, m: int, packed: tuple[int, ...], red: Any, rows: int = 8) -> bool:
  """Whether the lowering makes the tile's columns (axis n, strided in the output) the vector axis, with the rows
  (axis m, `rows` of them upcast) the output's contiguous axis and `packed` the inputs the tile packs (or none, where
  a reduce operand runs contiguously along n: a weight laid out (Cin, Cout))
  (lower_state.py: vectors_along_strided_axis, the test the lowering makes on the optimized kernel)."""
  if not lower_state.STRIDED_STORE_VECTORS or not isinstance(red, int) or red < lower_state.STRIDED_STORE_MIN_REDUCE: return False
  loads = [(b.idx, st.real_strides(ignore_valid=True)) for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
  out = k.sts[0].real_strides(ignore_valid=True)
  return lower_state.vectors_along_strided_axis(out, [rs for i, rs in loads if i in packed], [rs for i, rs in loads if i not in packed],
                                                [(m, rows in lower_state.VECTOR_LANES)] if out[m] == 1 else [], n,
                                                [a for a in range(k.shape_len) if k.output_shape[a] != k.full_shape[a]])

ROW_ACCUMULATORS_16_REGS = 14  # the most vector accumulators of one tile row on 16 registers (the column vector and a broadcast besides)

def _vector_columns_tile(k: KernelShape, n: int, m: int, vw: int, red: Any,
                        why: str = " (rows gathered: one vector of columns, packed; 2 vectors' panel too big to pack)") -> bool:
  """A conv whose 2 vectors' panel of weights is too big to pack (256 or 512 channels x 3x3), its rows
  gathered (stride 2): one vector of output channels (the lowering's vectors along the packed columns, _vector_columns)
  x the whole output row (at most 16 accumulators), the weights packed, in blocks of the input channels where one
  vector's panel is too big as well, the kernel row unrolled. ResNet-50's 3x3 s2 256 at 28^2 (14-wide rows) 1.15x and
  512 at 14^2 (7-wide, blocks of 256) 1.23x faster than the tiles below (the image packed, or no pack), AVX-512,
  interleaved. The same tile serves contiguous rows no vector size divides (13 or 7 wide: the lowering takes vectors
  along the columns there too). 16 registers (AVX2) take rows of at most ROW_ACCUMULATORS_16_REGS: a 3x3 s2 512 ->
  512 conv from 14^2 1.2x and from 28^2 (14-wide rows) 1.9x faster than the tiles below, interleaved (WINO=0). Tried on a copy: kept
  only with its pack."""
  size_m, ci = k.full_shape[m], k.full_shape[k.first_reduce]
  movers = tuple(b.idx for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs) and st.real_strides(ignore_valid=True)[n] not in (0, 1))
  if not isinstance(size_m, int) or size_m > (2 * TILE_ROWS if vw >= 16 else ROW_ACCUMULATORS_16_REGS) or k.full_shape[n] % vw or \
      not _vector_columns(k, n, m, movers, red, size_m): return False
  trial = k.copy()
  gone = k.full_shape[n] == vw
  if not try_opt(trial, Opt(OptOps.UPCAST, n, vw), f"matmul register tile: {vw} output columns (axis {n}) are one vector" + why): return False
  if gone and m > n: m -= 1
  if not try_opt(trial, Opt(OptOps.UPCAST, m, 0), f"matmul register tile: all {size_m} rows (axis {m}), a broadcast each" + why): return False
  block = getenv("CPU_REDUCE_BLOCK", 256)
  if not _cpu_pack_columns(trial, "the whole reduce", batched_pack=True):
    if not (isinstance(ci, int) and ci > block and ci % block == 0 and try_opt(trial, Opt(OptOps.BLOCK, 0, block),
            f"the input channels ({ci}) in blocks of {block}, so one vector's panel of weights fits a pack")) or \
        not _cpu_pack_columns(trial, f"a block of {block}", batched_pack=True): return False
  _unroll_kernel_row(trial)
  adopt_trial(k, trial)
  return True

AVX2_GATHERED_ROWS_7 = True  # (a switch for A/B measurements)
AVX2_PACKED_STEM = True  # (a switch for A/B measurements)

def _packed_tile_shape(k: KernelShape, m: int, vw: int, cols: int, red: Any, rows_contiguous_in_output: bool, unit_rows: bool,
                       strided_rows: bool, vector_columns: bool) -> Optional[tuple[int, int, str]]:
  """The packed tile's (rows, columns, why) where they differ from 8 rows x `cols` (2 vectors), else None. The rows are
  the output's contiguous axis m, where the lowering makes each column's accumulator one vector of the rows, unless
  the rows are gathered (strided) and `vector_columns` (_vector_columns): then each row's accumulators are vectors of
  the columns."""
  size_m, one_reduce = k.full_shape[m], k.first_upcast - k.first_reduce == 1
  if not rows_contiguous_in_output: return None
  # Gathered rows, vector columns (a 3x3 stride-2 conv: vectors of output channels over the packed weights, a broadcast
  # pixel per row), 32 registers: 2 vectors x 6-8 rows, the count that pads the rows least (the larger on a tie: 28-wide
  # rows -> 7, 17 -> 6), not the 16 below (32 accumulators, spilled). On AVX-512, interleaved: 3x3 s2 64 and 128 at 56^2
  # (28-wide rows) 1.15-1.27x faster than 16 padded rows, 128 at 34^2 (17-wide) 1.25x faster than 8. (16 registers keep
  # 8 rows and the unrolled kernel row: 4-5 rows ran 0.8-1.1x as fast, AVX2; a 1x1 conv's single reduce keeps its rules below:
  # with stride 2 from 14^2 to 7-wide rows, 1024 -> 64 and -> 512, 7 rows x 2 vectors ran 0.6x as fast as 8 x 1)
  if strided_rows and vector_columns and vw >= 16 and not one_reduce and isinstance(size_m, int):
    rows = min(VECTOR_COLUMN_ROWS, key=lambda r: (round_up(size_m, r), -r))
    return rows, cols, f"{rows} gathered rows, each a broadcast to 2 vectors of columns"
  # 16 registers: 7 such rows where 7 pads them less than 8 (28- and 14-wide rows: 14 accumulators, not 8 padded rows'
  # 16, spilled): 3x3 s2 128 at 56^2 1.07-1.14x, 256 at 28^2 1.07-1.18x faster, AVX2, caches flushed, interleaved
  if strided_rows and vector_columns and vw < 16 and not one_reduce and isinstance(size_m, int) and AVX2_GATHERED_ROWS_7 and \
      round_up(size_m, 7) < round_up(size_m, TILE_ROWS):
    return 7, cols, "7 gathered rows, each a broadcast to 2 vectors of columns (14 accumulators)"
  # With 32 registers and contiguous rows that pad to a whole vector by at most 1/8 (a 14x14 image's 196 pixels -> 208), the
  # rows are one vector (16 pixels) and the columns one vector's worth: 16 accumulators, each broadcast feeding 16 lanes;
  # ResNet-50's 1x1 convs at 14^2 (256->1024, 1024->256, 512->1024) 1.18-1.21x faster than 8 rows x 32 or x 16 columns,
  # AVX-512, interleaved. (49 pixels -> 64 is no faster this way: they take the padded 2-vector tile of cpu_matmul_tile.)
  # Strided rows padded to a whole vector by at most 1/7 (a 3x3 stride-2 conv's 28-wide output rows -> 32) take 16 rows
  # with the 2 vectors of columns: ResNet-50's 3x3 s2 128 at 56^2 1.15x faster than 8 rows (1.22x without its epilogue),
  # interleaved; with one vector of columns it was no faster (0.97x).
  if vw >= 16 and isinstance(size_m, int) and size_m > vw:
    if unit_rows and one_reduce and 8 * ((-size_m) % vw) <= size_m: return vw, vw, f"{vw} contiguous rows are one vector, one vector's worth of columns"
    if strided_rows and 7 * ((-size_m) % vw) <= size_m: return vw, cols, f"{vw} strided rows are one vector"
  # Otherwise each of the tile's columns is one vector accumulator of the 8 rows, fed by a broadcast: 2 vectors' worth of
  # columns (32 on AVX-512) is 32 accumulators + the rows' vector + a broadcast, more than the 32 registers: gcc spills
  # 3 accumulators (a store-to-load chain each per step). Where the reduce is long (>= 1024: the 2-vector panel is
  # >= 128 KB, read from L2) the columns are one vector's worth (16 accumulators on AVX-512); with 16 registers (AVX2)
  # only where the rows are contiguous loads: strided rows (a stride-2 1x1 conv) are gathers, which 16 columns share.
  # Measured, 1 thread, AVX-512: ResNet-50's 1x1 s2 1024->2048 at 14^2 1.9x faster, 1x1 2048->512 at 7^2 1.2x; AVX2:
  # 1x1 2048->512 at 7^2 1.24x. (Shorter reduces: 1x1 s2 256->512 at 28^2 0.9x with 16 columns. Not with a kernel window:
  # a 3x3 conv's unrolled row is 3 vectors of rows per step, which 32 columns share; 3x3 s2 128 at 56^2 0.85x with 16)
  if red >= 1024 and one_reduce and (vw >= 16 or unit_rows): return TILE_ROWS, vw, "one vector's worth of columns: 2 would spill accumulators"
  return None

SHORT_ROWS_MIN_BYTES = 1 << 20  # the short-rows tile's column operand at least this big (bigger than L2: read from memory)
SHORT_ROWS_BLOCK = 16  # reduce steps per block of the short-rows tile (row streams of the column operand in flight)
SHORT_ROWS_SPLIT_32_REGS = 12  # with 32 vector registers, this many rows (up to 16) and more are 2 row tiles of the short-rows tile
SHORT_ROWS_MAX = 24  # the short-rows tile's most rows (17-24: 4 row tiles)
SHORT_ROWS_SPLIT_MIN_ROW_BYTES = 2048  # the short-rows tile splits its rows only where the column operand's rows are this long
SHORT_ROWS_LONG_REDUCE = 2048  # see _cpu_short_rows_tile: 24 rows on 32 registers, and 5-8 rows as 2 tiles on 16, only with a reduce this long
AVX2_SHORT_ROWS_SPLIT = True  # (a switch for A/B measurements)

def _cpu_short_rows_tile(k: KernelShape, n: int, vw: int, ins: list[tuple], reused: Any) -> bool:
  """A matmul whose row operand has only a few rows (a decode batch: 8 x 4096 @ 4096 x 2048), too few to repay
  packing the column operand, which is then read from memory once, as a stream. All the rows are the tile (2
  vectors of columns up to 8 rows; with 32 registers one vector for 9-11 rows; 12-16 rows with 32 registers and 9-16
  with 16 are 2 row tiles, 17-24 rows 4, a count they don't divide padded, see below), so one output loop is left
  (the column tiles) besides the row tiles', and the long reduce runs in blocks of SHORT_ROWS_BLOCK steps with that
  loop inside the block loop (BLOCK): each thread walks its share of SHORT_ROWS_BLOCK whole rows of the column operand at a time (a few
  contiguous streams the prefetcher follows), adding each block into the output (the rows x columns of partial
  sums stay in cache). A tile walking the whole reduce down one tile of columns touches a new page every step
  (one row of the operand): 3-10x slower measured (8, 4, 2 and 12 rows; 4 and 12 took the general rules).
  Blocks of 32 or 64 were 1.5-3x slower than 16 (more row streams at once). Only for one reduce axis of at least
  CPU_REDUCE_BLOCK steps, a column operand of at least SHORT_ROWS_MIN_BYTES, and where no other output axis reuses
  an operand (a batch of such products sharing the column operand is left to the ordinary tile). Tried on a copy:
  kept only if the block applies."""
  red = [a for a in range(k.first_reduce, k.first_upcast)]
  if len(k.reduceops) != 1 or len(red) != 1 or not isinstance(size := k.full_shape[red[0]], int) or size < getenv("CPU_REDUCE_BLOCK", 256): return False
  block = next((b for b in (SHORT_ROWS_BLOCK, SHORT_ROWS_BLOCK // 2) if size % b == 0), None)
  if block is None: return False
  cands = [a for a in range(k.first_reduce) if a != n and reused(a)]
  if len(cands) != 1 or not isinstance(rows := k.full_shape[m := cands[0]], int) or any(rs[m] == 0 and rs[n] == 0 for rs in ins): return False
  # (16 registers, 9-16 rows: 12 rows x 1 vector measured 1.9x slower than 6 x 2, 16 x 1 spills: two row tiles of half the rows
  # each, outermost, so the block loop runs inside each; the parallel loop is then those 2 row tiles, each thread
  # streaming the column operand for its half: 1.2-1.45x faster than the packed 4 x 2 tile on 16 x 4096 @ 4096 x 1024)
  # (odd counts padded to an even one: 11 rows 8x faster as 2 x 6 padded than the general rules' tile, AVX2)
  # (32 registers, 12-16 rows: the same 2 row tiles, each 6-8 rows x 2 vectors; all the rows x 1 vector takes a broadcast
  # per FMA (load-bound), and 16 rows took the ordinary tile, its column tiles walking the operand a page a step. Measured
  # on AVX-512, interleaved, K x N operand hot in L3 | read from memory (4 such products in turn): 16 x 4096 @ 4096 x 1024
  # 1.43x | 1.34x, 16 x 1024 @ 1024 x 4096 1.6x, 12 x 4096 @ 4096 x 1024 1.7x (12 x 1), 15 rows 1.8x, 14 x 2048 @ 2048 x
  # 2048 1.9x from memory; 16 x 2048 @ 2048 x 1024 0.88x hot but 1.85x from memory, 12 x 1024 @ 1024 x 2304 0.97x from
  # memory. 9-11 rows keep rows x 1: 10 and 9 as 2 tiles of 5 ran 0.77-0.83x from memory)
  # (17-24 rows: 4 row tiles of 5-6 rows x 2 vectors, 2 per thread, each thread streaming the operand twice. Against the
  # general rules, interleaved, operand hot | from memory: AVX2 24 x 4096 @ 4096 x 1024 1.48x, 24 x 2048 @ 2048 x 1024 1.28x
  # from memory, 24 x 1024 @ 1024 x 2304 1.06x | 1.13x, 20 rows 2.2x; AVX-512 20 x 1024 @ 1024 x 2304 1.45x, 18 x 2048 @
  # 2048 x 2048 1.54x, 24 x 4096 @ 4096 x 1024 1.42x. Not 24 rows on 32 registers with a reduce under SHORT_ROWS_LONG_REDUCE:
  # there 3 whole 8 x 2 tiles share each packed panel, which stays in L2 (24 x 1024 @ 1024 x 2304 0.86x hot with 4 tiles;
  # 25-32 rows on AVX2 as 4-8 row tiles ran 0.8-1.0x)
  # (16 registers, 5-8 rows and a reduce of at least SHORT_ROWS_LONG_REDUCE: 2 row tiles of 3-4 rows x 2 vectors, not 8 x 2
  # (16 accumulators, spilled), each thread streaming the operand, both at once (one read from memory serves both through
  # L3): AVX2, caches flushed, interleaved, 8 x 4096 @ 4096 x 2048 1.28x, x 1024 1.56x, x 4096 1.06x, 8 x 2048 @ 2048 x
  # 2048 1.29x; with shorter reduces 0.83-1.29x (8 x 768 @ 768 x 3072 0.83x, 8 x 1024 @ 1024 x 4096 0.91-1.02x))
  if vw < 16 and 5 <= rows <= TILE_ROWS and size >= SHORT_ROWS_LONG_REDUCE and AVX2_SHORT_ROWS_SPLIT: tiles = 2
  elif rows <= TILE_ROWS or (vw >= 16 and rows < SHORT_ROWS_SPLIT_32_REGS): tiles = 1
  elif rows <= 2 * TILE_ROWS: tiles = 2
  elif rows <= SHORT_ROWS_MAX and not (vw >= 16 and rows % TILE_ROWS == 0 and size < SHORT_ROWS_LONG_REDUCE): tiles = 4
  else: return False
  tile = -(-rows // tiles)
  # (16 registers, tiles of 7-8 rows: 2 vectors too, 14-16 accumulators, some spilled, still fewer loads per FMA than one
  # vector's broadcast each: 16 x K @ K x N as 2 tiles of 8 x 2 against 8 x 1, interleaved, AVX2: 16x2048x1024 1.22x,
  # 16x1024x4096 1.28x, 16x4096x4096 1.14x, 16x4096x1024 1.04x; 14 rows (7 x 2) 1.03-1.35x, 15 (padded to 8 x 2) 1.16x)
  vecs = 2 if tile <= TILE_ROWS else 1
  if tile < 2 or tile * vecs > 16: return False
  size_n = k.full_shape[n]
  # (the column operand must outgrow the L2 cache, SHORT_ROWS_MIN_BYTES: 8 x 512 @ 512 x 256, 0.5 MB, measured 0.82x with the blocks)
  col_bytes = max((b.dtype.itemsize for b, st in zip(k.bufs, k.sts) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs) and
                   st.real_strides()[m] == 0 and st.real_strides()[n] != 0), default=0) * size * (size_n if isinstance(size_n, int) else 0)
  if col_bytes < SHORT_ROWS_MIN_BYTES: return False
  # (row tiles streaming the whole operand each: only where its rows are long enough to stream; with rows of 256 B to 1 KB
  # (16 x 4096 @ 4096 x 64..256) the ordinary tile's column strips were 1.1-1.37x faster on AVX2 and AVX-512)
  if tiles > 1 and col_bytes // size < SHORT_ROWS_SPLIT_MIN_ROW_BYTES: return False
  if not isinstance(size_n, int) or size_n < vecs * vw or 8 * (round_up(size_n, vecs * vw) - size_n) > size_n: return False
  trial = k.copy()
  why = f" (short-rows tile: all {rows} rows of a long reduce's row operand)"
  if size_n % (vecs * vw) and not try_opt(trial, Opt(OptOps.PADTO, n, vecs * vw), f"short-rows tile: pad the {size_n} columns (axis {n}) to a "
                                                                                 f"multiple of the tile's {vecs * vw} (masked lanes)"): return False
  if not try_opt(trial, Opt(OptOps.UPCAST, n, vw), f"matmul register tile: {vw} output columns (axis {n}) are one vector" + why): return False
  if trial.full_shape[n] == 1 or size_n == vw: return False  # (the columns are one vector: no column tiles to share out)
  if tile == rows:
    if not try_opt(trial, Opt(OptOps.UPCAST, m, 0), f"short-rows tile: all {rows} rows (axis {m}) share each vector load of the column operand"): return False
    if m < n: n -= 1  # (the rows' axis is gone: the later axes move down)
  elif m != 0 or (rows % tile and not try_opt(trial, Opt(OptOps.PADTO, m, tile), f"short-rows tile: pad the {rows} rows (axis {m}) to "
                                                                              f"{tiles} row tiles of {tile} (masked)")) or \
      not try_opt(trial, Opt(OptOps.UPCAST, m, tile), f"short-rows tile: {tile} rows (axis {m}) share each vector load of the column "
                                                               f"operand; its {tiles} row tiles are the outer (parallel) loop"): return False
  if vecs == 2 and not try_opt(trial, Opt(OptOps.UPCAST, n, 2), f"short-rows tile: 2 vectors of columns share each broadcast ({rows}x2 accumulators)"):
    return False
  if not try_opt(trial, Opt(OptOps.BLOCK, 0, block), f"short-rows tile: the reduce of {size} in blocks of {block}, the column tiles inside each "
                                                    f"block (each thread streams {block} whole rows of the column operand at a time)"): return False
  adopt_trial(k, trial)
  return True

def padded_lanes(size: int, vw: int) -> Optional[int]:
  """Vector lanes for a contiguous axis of `size` that the vector width doesn't divide, where padding it to them (masked
  lanes) adds at most 1/7: the width, else half of it on AVX-512 (49 -> 56 as 8 lanes, not 64). None where neither does.
  (Softmax over the 1000 classes of 8 x 1000 x 49, the axis before the last: its reduce 6.3x and its elementwise
  kernel 3.5x faster at 8 padded lanes than scalar, AVX-512, interleaved; AVX2 already took 8.)"""
  for lanes in ((vw, vw // 2) if vw >= 16 else (vw,)):
    if 7 * (round_up(size, lanes) - size) <= size: return lanes
  return None

def _odd_lanes(size: Any, vw: int) -> Optional[int]:
  """Vector lanes for an output axis of `size` that is not a multiple of half the vector width (where it is, the
  general rules run half-width vectors unpadded): the width, or half of it on AVX-512 where that pads less
  (55 -> 56, not 64), if padding to it adds at most 1/3 of the work (27 -> 32, 13 -> 16, 7 -> 8, 25 -> 32; not 11 -> 16).
  None otherwise. (ZFNet's strided 5x5 conv has 25-wide rows: without a tile the general rules' scalar one ran 7-20x
  slower than the padded vectors, AVX-512.)"""
  if not isinstance(size, int) or size % (vw // 2) == 0: return None
  lanes = vw // 2 if vw >= 16 and round_up(size, vw // 2) < round_up(size, vw) else vw
  return lanes if 3 * (round_up(size, lanes) - size) <= size else None

def _cpu_dot_tile(k: KernelShape, vw: int, red_ax: int, reused: Any, unit: Any) -> bool:
  """The dot-product tile (see _cpu_matmul_tile): the reduce unrolled by the vector width, 4 rows x 2
  columns of vector accumulators. Only where the columns' operand is strided along them."""
  n = k.first_reduce - 1
  m = next((a for a in range(n - 1, -1, -1) if reused(a)), None)
  if not reused(n) or unit(n) or m is None or not all(isinstance(k.full_shape[a], int) for a in (m, n)): return False
  if k.full_shape[m] % 4 or k.full_shape[n] % 2: return False
  if not try_opt(k, Opt(OptOps.UNROLL, red_ax - k.first_reduce, vw), f"dot-product tile: {vw}-lane vector accumulators along the contiguous reduce "
                                                                     f"(axis {n}'s operand is strided along the output)"): return False
  try_opt(k, Opt(OptOps.UPCAST, m, 4), f"dot-product tile: 4 rows (axis {m}) share each load of the other operand")
  try_opt(k, Opt(OptOps.UPCAST, n, 2), f"dot-product tile: 2 columns (axis {n}) share each load of the rows ({4 * 2} vector accumulators)")
  return True

AVX2_WIDE_BLOCKS = (1024, 512)  # reduce blocks for the 4 x 3 tile where its whole panel doesn't fit a pack, largest first

def _wide_panel_block(red: int, row_bytes: int, row_tiles: int) -> Optional[int]:
  """The AVX2 4 x 3 tile's reduce blocking: 0 where its whole panel (red rows of row_bytes) fits a pack, else, where more
  than STREAMED_PANEL_ROW_TILES row tiles read it, the first of AVX2_WIDE_BLOCKS that divides red and whose panel fits,
  else None (not that tile). Against the 6 x 2 tile, AVX2 code, interleaved: blocks of 256 (the default) 0.92x on
  128x3072x768; blocks of 1024: 128x3072x768 1.04-1.09x (with a bias 0.98-1.03x), 256x3072x768 1.03-1.13x, 128x4096x1024
  1.12-1.14x, 512x4096x1024 1.06-1.11x; with fewer row tiles, whose panels are streamed in blocks of 256 with prefetch
  hints, 64x3072x768 0.99x and 32x4096x1024 0.92x."""
  if red * row_bytes <= pack.PACK_MAX_BYTES: return 0
  if row_tiles <= STREAMED_PANEL_ROW_TILES: return None
  return next((b for b in AVX2_WIDE_BLOCKS if red % b == 0 and b < red and b * row_bytes <= pack.PACK_MAX_BYTES), None)

def _apply_matmul_tile(k: KernelShape, n: int, m: int, vw: int, cols: int, why: str = "", small: Optional[int] = None, rows: Optional[int] = None,
                       batched_pack: bool = False, col_axis: Optional[int] = None, block_outer: bool = False, block: Optional[int] = None) -> bool:
  """The register tile on vector axis n and row axis m (padded where they need it), then reduce blocking. With
  one vector of columns (cols == vw), a `small` output axis (at most 7, one the operands move along as they do
  along n) is upcast whole in place of the second vector, with 2 rows. `rows` overrides _tile_rows; `batched_pack`: see
  _cpu_pack_columns. `col_axis`: the axis whose steps are the tile's other vectors of columns, where n is one vector.
  `block_outer`, `block`: see _cpu_block_reduce."""
  if rows is None: rows = _tile_rows(k, k.full_shape[m], vw) if small is None else 2
  assert rows is not None
  if k.full_shape[n] % (cols if col_axis is None else vw) and not try_opt(k, Opt(OptOps.PADTO, n, cols), f"matmul register tile: pad the {k.full_shape[n]} columns (axis {n}) to a "
                                          f"multiple of the tile's {cols} (masked lanes): full vectors, no scalar remainder"): return False
  gone = k.full_shape[n] == vw  # (an upcast that takes an axis whole removes it: the later axes move down)
  if not try_opt(k, Opt(OptOps.UPCAST, n, vw), f"matmul register tile: {vw} output columns (axis {n}) are one vector" + why): return False
  if gone: m, small, col_axis = (a - 1 if a is not None and a > n else a for a in (m, small, col_axis))
  if cols == vw and small is not None:
    if not try_opt(k, Opt(OptOps.UPCAST, small, 0), f"matmul register tile: all {k.full_shape[small]} steps of the short axis {small} (the image's "
                                                 f"rows) in place of a second vector: each broadcast of the other operand serves all of them"):
      rows = _tile_rows(k, k.full_shape[m], vw) or 2
    elif m > small: m -= 1
  if k.full_shape[m] % rows and not try_opt(k, Opt(OptOps.PADTO, m, rows), f"matmul register tile: pad the {k.full_shape[m]} rows (axis {m}) to a multiple of {rows}"):
    rows = TILE_ROWS if k.full_shape[m] % TILE_ROWS == 0 else 0
  axes = k.first_reduce
  if rows > 1 and try_opt(k, Opt(OptOps.UPCAST, m, rows), f"matmul register tile: {rows} output rows (axis {m}) share each vector load") and \
      k.first_reduce < axes:  # (the rows were taken whole, a decode batch's 8: the later axes move down)
    n, col_axis = (a - 1 if a is not None and m < a else a for a in (n, col_axis))
  if cols != vw:
    try_opt(k, Opt(OptOps.UPCAST, n if col_axis is None else col_axis, cols // vw), f"matmul register tile: {cols // vw} vectors of columns share each broadcast ({max(rows, 1)}x{cols // vw} accumulators"
                                                + (f" per reduce, {len(k.reduceops)} reduces)" if len(k.reduceops) > 1 else ")"))
  # (columns already laid out in panels (col_axis): packing them only copies, 0.8-0.9x measured on SwiGLU's and GPT-2's QKV shapes, AVX-512)
  if col_axis is None: _cpu_block_reduce(k, batched_pack, block_outer, block)
  else: _column_tiles_outermost(k, "each panel of the column operand is read by the row tiles in turn")
  _unroll_kernel_row(k)
  return True

def _unroll_kernel_row(k: KernelShape) -> None:
  """A conv's kernel-width axis (the innermost of several reduce axes, at most 7) unrolled, so the tile's loop body is
  the whole kernel row."""
  last = k.first_upcast - 1
  if k.first_upcast - k.first_reduce >= 2 and isinstance(k.full_shape[last], int) and k.full_shape[last] <= 7:
    try_opt(k, Opt(OptOps.UNROLL, last - k.first_reduce, 0), f"matmul register tile: the short innermost reduce axis ({k.full_shape[last]}) unrolled fully")

def _share_no_input(k: KernelShape) -> bool:
  """Whether no buffer is loaded by two of k's reduces."""
  seen: set[int] = set()
  for r in k.reduceops:
    idxs = {x.arg.idx for x in r.lazyops if x.op is BufferOps.LOAD}
    if idxs & seen: return False
    seen |= idxs
  return True

def _tile_rows(k: KernelShape, size: Any, vw: int) -> Optional[int]:
  """Output rows of the matmul register tile for a row axis of `size`: 8, or 6 with 16 vector
  registers (8-lane vectors on x86: AVX2/AVX) where 6 divides the axis or padding it to a multiple
  of 6 adds at most 1/32 of the work; else 8 where 8 divides it (4 with 16 registers: 8 x 2 accumulators spill,
  SwiGLU's 32x2816x1024 1.3x and a 16x4096x1024 matmul 1.2x faster as 4 x 2, AVX2, 1 thread); else 6 (AVX2) where padding adds at most
  1/16; else 8 where padding to a multiple of 8 adds at most 1/7 (a strided 1x1 conv's 7-pixel rows: 7 rows
  unpadded measured 3x slower than 8 padded, AVX2), 4 of them with 16 registers as where 8 divides (the Winograd
  matmuls' 49 tiles -> 52: 1.15-1.68x faster than 8 rows x 2 vectors, spilled, in five models, AVX2); None
  when no tile fits. A kernel of several fused reduces (each its own accumulators) takes 16 // reduces rows with 32
  registers, 8 // reduces with 16 (one vector of columns each)."""
  if not isinstance(size, int): return None
  if len(k.reduceops) > 1:  # (one vector of columns each: 16 accumulators in all with 32 registers, 8 with 16)
    rows = (16 if vw >= 16 else 8) // len(k.reduceops)
    return rows if rows >= 2 and size % rows == 0 else None
  if vw == 8 and (size % TILE_ROWS_16_REGS == 0 or (-size) % TILE_ROWS_16_REGS * 32 <= size):
    return TILE_ROWS_16_REGS
  if size % TILE_ROWS == 0: return TILE_ROWS if vw != 8 else TILE_ROWS // 2
  # (AVX2, where 8 doesn't divide either: 6 rows padded by at most 1/16, as ShuffleNet's grouped 1x1 convs of 34 and
  # 68 output channels per group need: 8 rows padded 34 -> 40 is over the 1/7 bound, 68 -> 72 spills 16 accumulators)
  if vw == 8 and (-size) % TILE_ROWS_16_REGS * 16 <= size: return TILE_ROWS_16_REGS
  if 7 * ((-size) % TILE_ROWS) <= size: return TILE_ROWS if vw != 8 else TILE_ROWS // 2
  # (32 registers, where 8 rows would pad by more than 1/7: 6 rows padded by at most 1/16. ShuffleNet's grouped 1x1
  # convs of 34 output channels per group (34 -> 36) 1.9x faster than the general rules' tile, AVX-512, interleaved)
  return TILE_ROWS_16_REGS if (-size) % TILE_ROWS_16_REGS * 16 <= size else None

def _cpu_block_reduce(k: KernelShape, batched_pack: bool = False, block_outer: bool = False, block: Optional[int] = None) -> None:
  """Cache blocking for a register-tiled kernel: the column tiles become the outer (parallel) loop
  and the column operand's panel (the whole reduce x one tile of columns) is packed into a
  contiguous stack array (PACK), read from L1/L2 by every row tile. Where the panel is too big for
  a pack, the reduce runs in blocks (BLOCK) and each block's panel is packed (or, if that fails,
  just stays in cache while every row tile uses it). A panel that only 1 or 2 row tiles read isn't copied (see
  _cpu_pack_columns, and below for blocks). `block_outer`: a reduce of several axes (a conv's input channels and kernel
  window) may block its outermost one, kept only where each block's panel is then packed (see cpu_matmul_tile's last resort).
  `block`: the block size, where the tile asks for one (else CPU_REDUCE_BLOCK, 256)."""
  block = block or getenv("CPU_REDUCE_BLOCK", 256)
  red = [a for a in range(k.first_reduce, k.first_upcast)]
  blockable = bool(red) and isinstance(size := k.full_shape[red[0]], int) and size > block and size % block == 0
  streamed = blockable and size >= STREAMED_PANEL_BLOCKS * block and _streamed_panel(k) and try_opt(k.copy(), Opt(OptOps.BLOCK, 0, block), "probe")
  if not streamed and _cpu_pack_columns(k, "the whole reduce", batched_pack): return
  if not blockable: return
  if k.global_dims < 2 or (len(red) > 1 and not block_outer): return
  if len(red) > 1:
    trial = k.copy()
    if try_opt(trial, Opt(OptOps.BLOCK, 0, block), f"the outermost reduce axis ({size}, the rest inside each block) in blocks of {block}, so one "
                                                  "tile's panel fits a pack") and _cpu_pack_columns(trial, f"a block of {block}", batched_pack): adopt_trial(k, trial)
    return
  if not try_opt(k, Opt(OptOps.BLOCK, 0, block), f"long reduce ({size}): run it in blocks of {block}, each reused by all row tiles from cache"): return
  cols = _column_tile_axis(k)
  if cols is not None and (row_tiles := _row_tiles(k)) is not None and row_tiles <= 2:
    # a block's panel that only 1 or 2 row tiles read (a decode batch: 16 x 4096 @ 4096 x 1024) isn't worth
    # a copy; the block's reduce unrolled by 4 instead (1.23x over packing, interleaved, AVX-512; the one
    # tile BEAM changed on that shape)
    if cols > 0: try_opt(k, Opt(OptOps.SWAP, 0, cols), f"column tiles (axis {cols}) outermost: a block of the column operand is read by the row tiles in turn")
    try_opt(k, Opt(OptOps.UNROLL, 1, 4), f"only {row_tiles} row tile(s) read each block (no pack): its reduce unrolled by 4")
    return
  if _cpu_pack_columns(k, f"a block of {block}"): return
  _column_tiles_outermost(k, "a block of the column operand is reused by every row tile")

STREAMED_PANEL_ROW_TILES = 16  # at most this many row tiles per panel: its copy is a large part of their compute (see _streamed_panel)
STREAMED_PANEL_BLOCKS = 3  # at least this many blocks (the first block's copy isn't prefetched, the last block's hints are wasted)

def _streamed_panel(k: KernelShape) -> bool:
  """Whether a column panel that fits a pack whole should still be packed a block at a time: where only 3 to
  STREAMED_PANEL_ROW_TILES row tiles read it (a 32-row MLP: 8 tiles of 4 rows), copying the panel from memory is a large
  part of their compute, and the hints for the next block's lines (PREFETCH, lower_pack.py) overlap the copy with the
  compute better than those for the next whole panel (the whole panel with its hints against blocks, interleaved: AVX2
  1.21-1.54x, 4 shapes; AVX-512 1.01-1.32x, 3 shapes). The whole panel packed without hints vs blocks of 256 with them:
  - AVX2: 32x2816x1024 1.14-1.15x, 32x4096x1024 1.14x, 48x2048x2048 1.05x, 32x3072x768 1.08x, 32x768x3072 (3 blocks)
    0.96-1.01x; 64x4096x512 (11 row tiles) 1.17x, 64x2816x1024 (11) 1.14x; 96x2048x2048 (24) 0.97x, so not past 16;
  - AVX-512 (where the panel fits whole): 48x2048x2048 1.26x, 32x3072x768 1.25x, 32x768x3072 1.02-1.19x; 12 row tiles:
    96x2048x2048 1.08x, 96x2048x1000 0.99x; 16: 128x1024x3072 1.07x, 128x768x3072 1.03x, 128x2048x1024 1.04x.
  (MxKxN: M rows, a reduce of K, N columns.)"""
  return k.opts.has_prefetch and (row_tiles := _row_tiles(k)) is not None and 2 < row_tiles <= STREAMED_PANEL_ROW_TILES

def _column_tiles_outermost(k: KernelShape, why: str) -> None:
  """The column tiles (at least 8) as the outer, parallel loop, so one panel of the column operand serves every row tile in turn."""
  cols = _column_tile_axis(k)
  if cols is not None and cols > 0 and k.full_shape[cols] >= 8: try_opt(k, Opt(OptOps.SWAP, 0, cols), f"column tiles (axis {cols}) outermost: {why}")

def _row_tiles(k: KernelShape) -> Optional[int]:
  """How many row tiles read each panel of the column operand: the output loops' iterations besides the column tiles' (None
  where there is no column tile axis or a size is symbolic)."""
  cols = _column_tile_axis(k)
  n = prod(k.full_shape[a] for a in range(k.global_dims) if a != cols) if cols is not None else None
  return n if isinstance(n, int) else None

def _column_tile_axis(k: KernelShape) -> Optional[int]:
  """A global axis along which the row operand (broadcast along the vector axis) is broadcast too: the column tiles
  (not a batch of the column operand where another axis qualifies, see _column_axes)."""
  return _column_axes(k)[0]

def _column_axes(k: KernelShape) -> tuple[Optional[int], list[int]]:
  """(the column tiles' axis, the shared batches): the global axes along which the row operand (broadcast along the
  vector axis) is broadcast too, the first that isn't a shared batch, else the first; and the shared batches, those
  along which the column operand steps past its whole panel over the reduce (a batch of images sharing a conv's
  weights). A 1x1 conv at batch 4 took its batch as the column tiles, so its image panel wasn't packed and the batch
  stayed the outer loop of row tiles each walking all pixels; with the pixel tiles just inside the batch and the panel
  packed (_cpu_pack_columns), interleaved, AVX-512 | AVX2: 256 -> 64 at 56^2 1.21x | 1.1x, 64 -> 256 1.04x | 1.09x,
  2048 -> 512 at 7^2 1.07x | 1.49x, 512 -> 128 at 28^2 (batch 8) 1.02x."""
  ins, vec = _input_strides(k), k.first_upcast
  rows_op = [rs for rs in ins if rs[vec] == 0]
  cands = [a for a in range(k.global_dims) if rows_op and all(rs[a] == 0 for rs in rows_op) and any(rs[a] != 0 for rs in ins)]
  red = range(k.first_reduce, k.first_upcast)
  def batch(a: int) -> bool:  # (strides of None, a masked or non-linear view: not a batch)
    movers = [rs for rs in ins if rs[vec] != 0 and rs[a] != 0]  # (the column operands moving along a)
    if not movers or not all(isinstance(rs[x], int) for rs in movers for x in (a, *red)) or not all(isinstance(k.full_shape[r], int) for r in red): return False
    return all(abs(rs[a]) > sum(abs(rs[r]) * (k.full_shape[r] - 1) for r in red) for rs in movers)
  batches = [a for a in cands if batch(a)]
  return next((a for a in cands if a not in batches), cands[0] if cands else None), batches

def _cpu_pack_columns(k: KernelShape, what: str, batched_pack: bool = False) -> bool:
  """Column tiles outermost, then PACK the input that doesn't vary along the row tiles, if the rules
  (codegen/pack.py: the pack's size, nothing varying inside its scope) allow; tried on a copy so a
  refusal leaves the kernel as it was. With `batched_pack` (the packed tile, whose column operand is strided along the
  vectors), where the operand also moves along an outer loop (a batch) the column tiles go just inside that loop."""
  cols, batches = _column_axes(k)
  if cols is None or k.global_dims < 2: return False
  batched_pack = batched_pack or any(b < cols for b in batches)  # (a batch of images sharing the weights: see _column_axes)
  # the column tiles outermost; with batched_pack, where the column operand also moves along an outer loop (a batch:
  # attention's k per head) that loop stays outside, the column tiles just inside it (the pack's scope is then the
  # column loop inside each batch iteration, codegen/pack.py). (Not for operands already contiguous along the vectors:
  # packing v in attention's probs @ v per head, 16 row tiles per pack, measured 0.9x; a 32x64x64x64 batched matmul
  # 0.65x on AVX2)
  for pos in range(cols + 1 if batched_pack else 1):
    trial, opts = k.copy(), []
    if pos < cols:
      where = "outermost" if pos == 0 else f"at loop {pos}, inside the loops the column operand moves along"
      opts.append((Opt(OptOps.SWAP, pos, cols), f"column tiles (axis {cols}) {where}: one panel of the column operand serves every row tile"))
      if not try_opt(trial, *opts[-1]): continue
    for b, st in zip(trial.bufs, trial.sts):  # every column operand (fused matmuls sharing the row operand have one each); not a bias
      if not isinstance(b, MemBuffer) or b.idx < len(k.outbufs) or all(st.real_strides()[a] == 0 for a in range(trial.first_reduce, trial.first_upcast)): continue
      if try_opt(trial, Opt(OptOps.PACK, b.idx, 0), "probe"):
        opts.append((Opt(OptOps.PACK, b.idx, 0), f"pack buffer {b.idx}'s panel ({what} x the tile's columns) contiguously: "
                                                   "no cache-set conflicts or page walks from its row pitch"))
    packed = [o.axis for o, _ in opts if o.op is OptOps.PACK]
    if not packed: continue
    vec = trial.first_upcast
    if not batched_pack and (row_tiles := _row_tiles(trial)) is not None and row_tiles <= 2 and \
        all(st.real_strides(ignore_valid=True)[vec] == 1 for b, st in zip(trial.bufs, trial.sts) if isinstance(b, MemBuffer) and b.idx in packed):
      # a panel of vector loads (contiguous along the vectors) that only 1 or 2 row tiles read: not worth the copy; the column
      # tiles still go outermost, so the panel stays in L1 between its row tiles. SqueezeNet's squeeze convs (16 output
      # channels at 55^2 from 64 and 128 channels) 1.1-1.25x in the model's sequence (both builds of the model alternating in
      # one process, 60 calls each, 25th percentiles; the medians ranged 0.86-1.4x), AVX-512. (A gathered panel, a Winograd
      # input transform's windows, is still copied: gathering it again for the second row tile was 2-9% slower.)
      return all(try_opt(k, o, why + f" (only {row_tiles} row tile(s) read it: no pack, it stays in L1 between them)")
                 for o, why in opts if o.op is not OptOps.PACK)
    return all(try_opt(k, o, why) for o, why in opts)
  return False

def cpu_third_reuse_cap(k: KernelShape, vw: int) -> Optional[int]:
  """A third reuse upcast (by 4, else 2) on CPUs, e.g. four output rows of a conv sharing each weight broadcast and the
  shifted image rows: None where it isn't taken, else the most lanes the tile may hold after it. Taken with at most 8
  vector accumulators so far; measured on conv 3x3 64->64 56^2: 4 rows beat 2 by 5-15% on AVX2 and AVX-512, even where
  the 32 accumulators spill some (TILE_MAX_VECTORS bounds it). With a reduce shorter than SHORT_REDUCE (a stem's 3
  input channels x 3x3 = 27) there are too few FMAs per step to carry spills: the tile stays within
  SHORT_REDUCE_TILE_VECTORS. MobileNet-v2's 3x3 s2 3->32 stem 1.34x faster hot and 1.7x with the caches flushed (as in
  a model's call) without the 4 rows that made 32 accumulators on AVX-512; VGG-19's first conv (3->64 at 224^2)
  1.0-1.03x without the third upcast's second row vector; AVX2's 8 accumulators there stay."""
  upcast = prod(s for s, o in zip(k.full_shape[k.first_upcast:], k.output_shape[k.first_upcast:]) if s == o)
  if not isinstance(upcast, int) or upcast > 8 * vw or k.first_upcast - k.first_reduce < 1: return None
  red = prod(k.full_shape[k.first_reduce:k.first_upcast])
  short = isinstance(red, int) and red * prod(s for s, o in zip(k.full_shape[k.first_upcast:], k.output_shape[k.first_upcast:]) if s != o) < SHORT_REDUCE
  return SHORT_REDUCE_TILE_VECTORS * vw if short else TILE_MAX_VECTORS * vw

SHORT_REDUCE, SHORT_REDUCE_TILE_VECTORS = 64, 8

# CPU register tiles are bounded in vectors of the target's width: 32 accumulators (256 lanes on
# AVX2, 512 on AVX-512), and 128 vector operations per step of an unrolled short reduce
TILE_MAX_VECTORS, UNROLL_MAX_VECTORS = 32, 128

WINDOW_MAX = 49  # the longest reduce _cpu_pad_vector_axis takes for a window (a 7x7 pool)
# (the switches are for A/B measurements)
AVX2_WINDOW_ROWS = True  # 16 registers: windows' rows of half-vector multiples padded to whole vectors
HALF_LANE_WINDOW_ROWS = True  # 32 registers: depthwise rows of half-vector multiples as half-width vectors, the row whole
WINDOW_ROW_MAX_VECTORS = 8  # the most half-width vectors of such a row
WHOLE_ROW_VECTORS = 7  # the most vectors of a depthwise row of whole vectors taken as its tile (1: not taken)
# 16 registers: a pool's image row (no input broadcast along it: nothing else in registers) of up to this many whole
# vectors is taken whole, as up to WINDOW_ROW_MAX_VECTORS padded ones: 3x3 s2 max-pools to 55- and 56-wide rows
# (SqueezeNet's, ResNet-50's) 1.37-1.63x faster alone, 1.06-1.41x in the calls of five models, than one vector a step,
# AVX2; ShuffleNet's 24-channel one 0.93-0.97x (2 runs). Not a global pool's channels (its input moves along them by a
# whole image: 4-6 vectors of gathers ran 0.86-0.94x)
POOL_ROW_VECTORS = 7  # (1: not taken; a switch for A/B measurements)
WINDOW_ROW_TILE_16_REGS = 3  # 16 registers: a window's vector row of this many vectors is its whole register tile (WindowRow)

def _shared_along_other_axes(k: KernelShape, a: int, ins: list[tuple]) -> bool:
  """Whether an input moving along output axis a is broadcast along another output axis: a conv of few input channels
  (a reduce short enough to count as a window) reads each image load for every output channel, which a register tile
  across the channels reuses and a tile of the row alone would forgo. A depthwise conv's or a pool's inputs aren't."""
  return any(rs[a] != 0 and any(rs[b] == 0 and k.full_shape[b] != 1 for b in range(k.first_reduce) if b != a) for rs in ins)

class WindowRow(NamedTuple):
  """What cpu_pad_vector_axis made of a window reduce's contiguous output axis: the axis (its index before the row was
  upcast whole), and whether the row is the whole register tile, with no rows besides. On 16 registers a row of
  WINDOW_ROW_TILE_16_REGS vectors or more is (the data-reuse upcasts would add 2-4 of the output's rows: depthwise 3x3
  and 5x5 convs with 20-, 27- and 28-wide rows 1.2-1.6x faster without them, AVX2, interleaved; with rows of 2 vectors
  the rows upcast by 4 were as fast as none); on 32 registers a row of more than 4 vectors (only half-width ones make
  one: HALF_LANE_WINDOW_ROWS). Not where the channels share an input (_shared_along_other_axes): there the reuse
  rules' tile across them comes first."""
  axis: int
  whole_tile: bool

def cpu_pad_vector_axis(k: KernelShape, vw: int) -> Optional[WindowRow]:
  """Pad a reduce kernel's contiguous output axis (PADTO, masked lanes) so the rules below run full vectors on it;
  returns the axis when it made it a window reduce's vector row (the register-tile rules leave that axis alone), and
  whether that row is the whole tile (WindowRow).
  - A multiple of half the vector width but not of the width (a conv's 56-wide rows on AVX-512) would run
    half-width vectors: padded to the width where that adds at most 1/7 more work. The padded lanes' loads
    are masked (one masked vector load per row), their stores skipped; conv 3x3 64->64 56^2 on AVX-512:
    30% less time.
  - Not a multiple of half the width, in a window reduce (pooling, depthwise conv: a reduce of at most
    WINDOW_MAX): nothing divides it, so without padding it stays scalar. Padded to the lanes _odd_lanes picks
    (at most 1/4 more work) and made one vector of them here (the reuse rules below need an input broadcast
    along it, which pooling has not). ShuffleNet's depthwise 3x3 at 14^2 and SqueezeNet's 3x3 max-pools
    (55^2, 27^2, 13^2): 4-10x faster measured (AVX2). The row is then the tile on that axis: a short
    argmax (an index input broadcast along it) got 3 more reuse upcasts there, 512 scalar int
    accumulators and a 50 s gcc compile.
  - Neither, in a column reduce (every input contiguous along the axis): padded to the width where that adds at most 1/7."""
  if not k.reduceops or k.upcasted: return None
  out = k.sts[0].real_strides()
  red = prod(k.full_shape[k.first_reduce:k.first_upcast])
  ins = _input_strides(k)
  for a in range(k.first_reduce):
    size = k.full_shape[a]
    if out[a] != 1 or not isinstance(size, int): continue
    window = isinstance(red, int) and red <= WINDOW_MAX
    reused = any(rs[a] == 0 for rs in ins)  # (an input broadcast along the row: the tile rules take it; a pool has none)
    alone = not _shared_along_other_axes(k, a, ins)  # (a pool, a depthwise conv: no tile across channels to keep)
    # (an image row: an input the window moves over moves along it by 1 or 2, masks aside; not a global pool's channels)
    loads = [st.real_strides(ignore_valid=True) for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
    image_row = any(isinstance(rs[a], int) and 0 < abs(rs[a]) <= 2 and any(rs[r] != 0 for r in range(k.first_reduce, k.first_upcast)) for rs in loads)
    if size % vw == 0:
      # a depthwise conv's row of whole vectors: up to WHOLE_ROW_VECTORS of them are the tile, no output rows besides (the
      # reuse rules took one vector x 8 rows). With the caches flushed, as in a model's call: 3x3 at 112^2 1.31x (AVX-512)
      # and 2.0x (AVX2), at 56^2 1.44x and from 112^2 with stride 2 2.26x (AVX2); MobileNet-v2's and EfficientNet-B0's in their
      # calls 1.03-1.71x (AVX-512, 3 runs) and 1.09-1.70x (AVX2)
      # (only an image row: a squeeze-and-excitation's small matvec, its weight moving along the output channels by a whole
      # row, is no window row: 0.5-0.9x as this tile)
      pool_row = window and not reused and image_row and vw < 16 and POOL_ROW_VECTORS > 1  # (see POOL_ROW_VECTORS)
      if not (window and reused and image_row and alone and WHOLE_ROW_VECTORS > 1) and not pool_row: continue
      count = next((c for c in range(POOL_ROW_VECTORS if pool_row else WHOLE_ROW_VECTORS, 1, -1) if (size // vw) % c == 0), 1)
      if count == 1 or not try_opt(k, Opt(OptOps.UPCAST, a, vw), f"window reduce: {vw} lanes of the contiguous output axis {a} are one vector"): continue
      try_opt(k, Opt(OptOps.UPCAST, a, count if count < size // vw else 0), f"window reduce: {count} vectors of the row per iteration, the whole tile")
      return WindowRow(a, True)
    half = size % (vw // 2) == 0
    # (a row reduce whose inputs run along the reduce, not along this axis, takes its vectors along the reduce: padding
    # the rows only masks every load; argmax over 1000 x 5000 1.4x slower padded, AVX-512)
    if half and not window and not any(rs[a] == 1 and any(rs[r] != 0 for r in range(k.first_reduce, k.first_upcast)) for rs in ins):
      return None
    # (16 registers: a window's row of at most 4 whole vectors, a depthwise conv's too, is padded to them in the branch below:
    # 28-wide rows of depthwise 3x3 and 5x5 convs, stride 1 and 2, 1.23-2.8x faster than the general rules' 4 x 4 scalars
    # of 4 lanes, a 3x3 s2 max-pool 1.1x, AVX2, interleaved; EfficientNet-B0's 5x5 s2 144 ch to 28^2 3.6x)
    short_row = vw < 16 and AVX2_WINDOW_ROWS and alone and round_up(size, vw) // vw <= 4
    # (32 registers: a depthwise conv's row of a multiple of 8 but not 16 (56 wide) as half-width vectors, the row whole (7
    # of them) and no rows besides, not padded to 16 lanes under 8 rows x 4 vectors (32 accumulators): MobileNet-v2's 3x3
    # at 56^2 1.2-1.28x, its 3x3 s2 from 112^2 1.35-1.42x faster, AVX-512, interleaved; a max-pool there was as fast either way)
    half_row = vw >= 16 and HALF_LANE_WINDOW_ROWS and half and window and reused and alone and size // (vw // 2) <= WINDOW_ROW_MAX_VECTORS
    if half and not (window and (short_row if vw < 16 else not reused or half_row)):
      if vw < 16 or not reused or 7 * round_up(size, vw) > 8 * size: return None
      try_opt(k, Opt(OptOps.PADTO, a, vw), f"contiguous output axis {a} ({size}) padded to a multiple of the vector width {vw} (masked lanes): full-width vectors")
    elif window and (lanes := vw // 2 if half else _odd_lanes(size, vw)) is not None:
      # (half-width lanes where whole vectors make a row of at most 4 that the row upcast below takes whole: SqueezeNet's
      # 3x3 s2 max-pool to 55-wide rows 1.25x faster as 4 x 16 lanes than 7 x 8, AVX-512; a pool's rows of a multiple
      # of 8 (ResNet-50's 56-wide) took the general rules' 4 lanes: 1.83x faster as 4 x 16, 1.67x as 8 lanes)
      if lanes < vw and not half_row and round_up(size, vw) // vw <= 4 and 3 * (round_up(size, vw) - size) <= size: lanes = vw
      if (size % lanes == 0 or try_opt(k, Opt(OptOps.PADTO, a, lanes), f"window reduce: contiguous output axis {a} ({size}) padded to a multiple of {lanes} (masked lanes)")) and \
          try_opt(k, Opt(OptOps.UPCAST, a, lanes), f"window reduce: {lanes} lanes of the contiguous output axis {a} are one vector"):
        whole = 2 <= (rest := round_up(size, lanes) // lanes) <= (WINDOW_ROW_MAX_VECTORS if half_row or (vw < 16 and not reused and image_row and POOL_ROW_VECTORS > 1) else 4) and \
          try_opt(k, Opt(OptOps.UPCAST, a, 0), f"window reduce: all {rest} vectors of the row per iteration (1.4-1.6x faster than one on "
                                               "SqueezeNet's pools and ShuffleNet's depthwise 3x3 at 14^2, AVX2)")
        return WindowRow(a, alone and whole and rest >= (WINDOW_ROW_TILE_16_REGS if vw < 16 else 5))
    elif not window and not half and not reused and all(rs[a] == 1 for rs in ins) and (lanes := padded_lanes(size, vw)) is not None:
      # a column reduce (every input contiguous along the output's axis: a sum over the rows of a 1001 x 999 matrix) whose
      # columns no vector divides was scalar code: padded, the general rules vectorize the columns and block the rows
      # (11-15x faster, AVX-512); half-width lanes are made the vector here (the general rules try the width, then 4)
      if try_opt(k, Opt(OptOps.PADTO, a, lanes), f"column reduce: contiguous output axis {a} ({size}) padded to a multiple of {lanes} (masked lanes)") \
          and lanes < vw:
        try_opt(k, Opt(OptOps.UPCAST, a, lanes), f"column reduce: {lanes} padded lanes of the contiguous output axis {a} are one vector")
    return None
  return None

def cpu_matvec(k: KernelShape, vw: int) -> bool:
  """CPU matrix-vector: each row's dot product runs on vector accumulators along the contiguous
  reduce, and 8 rows share each load of the vector: one pass over the matrix, 8 independent
  accumulator chains (enough to hide the FMA latency) and 8 streams for the prefetcher."""
  if (mv := _is_matvec(k)) is None or k.upcasted: return False
  red = k.full_shape[k.first_reduce]
  if k.first_upcast - k.first_reduce != 1 or not isinstance(red, int) or red % vw or k.full_shape[0] % TILE_ROWS: return False
  if not any(k.sts[i].real_strides()[k.first_reduce] == 1 and k.sts[i].real_strides()[0] != 0 for i in mv): return False  # rows must be contiguous
  if not try_opt(k, Opt(OptOps.UNROLL, 0, vw), f"matvec: {vw}-lane vector accumulators along each contiguous row"): return False
  try_opt(k, Opt(OptOps.UPCAST, 0, TILE_ROWS), f"matvec: {TILE_ROWS} rows share each load of the vector ({TILE_ROWS} independent accumulators)")
  return True

VECMAT_VECTORS = 8  # vector accumulators of a vector-matrix product's column tile
VECMAT_BLOCK = 8  # reduce steps per block of a vector-matrix product over a matrix from memory (rows of it streamed at once per thread)

def cpu_vecmat(k: KernelShape, vw: int) -> bool:
  """CPU vector-matrix (x @ W with one row of x: a classifier head at batch 1): the output axis is
  contiguous in W and x is broadcast along it. Each thread takes VECMAT_VECTORS vectors of columns
  (4 cache lines of each W row on AVX2) and walks all of W's rows: 8 independent accumulators, whole
  cache lines, one pass over W. The columns are padded (masked lanes) to the tile where that adds at
  most 1/8. fc 2048->1000 on AVX2: 2.5-3x faster than the general rules' one-vector tiles."""
  if len(k.reduceops) != 1 or k.reduceops[0].op is not ReduceOps.SUM or k.upcasted or k.first_reduce != 1: return False
  if k.first_upcast - k.first_reduce != 1: return False
  src = k.reduceops[0].src[0]
  if src.op is UnaryOps.CAST: src = src.src[0]
  if src.op is not BinaryOps.MUL or any(s.op is not BufferOps.LOAD for s in src.src): return False
  ins, size, cols = _input_strides(k), k.full_shape[0], VECMAT_VECTORS * vw
  if k.sts[0].real_strides()[0] != 1 or not isinstance(size, int) or size < cols or 8 * (round_up(size, cols) - size) > size: return False
  if not (any(rs[0] == 0 and rs[1] != 0 for rs in ins) and any(rs[0] == 1 and rs[1] not in (0, 1) for rs in ins)): return False
  if size % cols and not try_opt(k, Opt(OptOps.PADTO, 0, cols), f"vector-matrix: pad the {size} columns to a multiple of {cols} (masked lanes)"): return False
  if not try_opt(k, Opt(OptOps.UPCAST, 0, vw), f"vector-matrix: {vw} columns (contiguous in the matrix) are one vector"): return False
  try_opt(k, Opt(OptOps.UPCAST, 0, VECMAT_VECTORS), f"vector-matrix: {VECMAT_VECTORS} vectors of columns per thread share each broadcast of x "
                                                 f"({VECMAT_VECTORS} independent accumulators, whole cache lines of each matrix row)")
  # a matrix read from memory (at least SHORT_ROWS_MIN_BYTES, a long reduce): the reduce in blocks of VECMAT_BLOCK with the
  # column tiles inside, as the short-rows tile does (each thread streams whole rows of the matrix): 1 x 4096 @ 4096 x 4096
  # (64 MB) 1.6-3.8x faster on AVX-512 and AVX2; fc 2048 -> 1000 (8 MB, from L3 here) unchanged. Only with at least 4 column
  # tiles: with 1 or 2 the threads already read whole rows (4096 x 128: 0.87-0.93x with the blocks)
  # (blocks of 8, not the short-rows tile's 16: 8 row streams per thread, interleaved, AVX-512 | AVX2: 768 x 50176 (a
  # GPT-2 head, 154 MB) 1.26x | 1.25x, 4096 x 8192 1.10x | 1.14x, 4096 x 4096 1.16x | 1.27x, 2048 x 4096 1.06x | 1.06x,
  # 2048 x 2048 and 2048 x 1000 (from L3) 0.98-1.08x; blocks of 4 were 0.9-1.02x of 8. The short-rows tile keeps 16:
  # with 2-8 rows, 8 was 1.0-1.23x on matrices from memory but 0.57-0.83x on 4-16 MB ones)
  red = k.full_shape[k.first_upcast - 1]
  mat = max((b.dtype.itemsize for b, rs in zip((b for b in k.bufs if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)), ins) if rs[0] == 1), default=0) * \
    size * (red if isinstance(red, int) else 0)
  tiles = k.full_shape[0] if k.first_reduce == 1 else 1
  if isinstance(red, int) and red >= getenv("CPU_REDUCE_BLOCK", 256) and mat >= SHORT_ROWS_MIN_BYTES and isinstance(tiles, int) and tiles >= 4:
    for block in (VECMAT_BLOCK, VECMAT_BLOCK // 2):
      if red % block == 0 and try_opt(k, Opt(OptOps.BLOCK, 0, block), f"vector-matrix: a matrix of {mat >> 20} MB: the reduce of {red} in blocks of "
                                                                     f"{block}, the column tiles inside each block (each thread streams whole rows)"): break
  return True

def cpu_transpose_tile(k: KernelShape, vw: int) -> bool:
  """An elementwise kernel (a copy with an epilogue) whose output is contiguous along one axis and an input along
  another (a transpose: Winograd's NHWC -> NCHW output copy, a permute): a T x T tile of both axes (T = the vector
  width, 8 on AVX2, 16 on AVX-512), the output's axis padded to T where that adds at most 1/3 (27 -> 32), so each
  input row of T elements is one contiguous load and each output row one store. Without it the output's axis took
  the lanes alone, every lane a load from another row, or nothing at all where its size fits no vector: SqueezeNet's
  128 x 27 x 27 copy (channels-last in) 2.2x faster as a padded tile, ResNet-50's 64 x 3136 3.1x as a 16 x 16 tile
  (the tile BEAM found), AVX-512, interleaved. True when the tile applied."""
  if k.reduceops or k.upcasted or k.first_reduce < 2 or len(k.outbufs) != 1: return False
  out = k.sts[0].real_strides(ignore_valid=True)
  a = next((x for x in range(k.first_reduce) if out[x] == 1), None)
  if a is None or not isinstance(size_a := k.full_shape[a], int): return False
  # the transposed input: unmasked (a concatenation's piece, gated per element, is slower as a tile, and its
  # unrolled gates made DenseNet-121's 16 x 16 tiles take 1-8 s each to compile)
  ins = [st.real_strides(ignore_valid=True) for st, b in zip(k.sts, k.bufs)
         if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs) and all(v.mask is None for v in st.views)]
  b = next((x for x in range(k.first_reduce) if x != a and any(rs[x] == 1 and rs[a] not in (0, 1) for rs in ins)), None)
  if b is None or not isinstance(size_b := k.full_shape[b], int): return False
  tile = next((t for t in (vw, 8) if size_b % t == 0 and size_b > t), None)
  if tile is None or size_a < tile // 2 or 3 * ((-size_a) % tile) > size_a: return False
  trial = k.copy()
  if size_a % tile and not try_opt(trial, Opt(OptOps.PADTO, a, tile), f"transpose tile: pad the output's contiguous axis {a} ({size_a}) to {tile}"):
    return False
  if not try_opt(trial, Opt(OptOps.UPCAST, b, tile), f"transpose tile: {tile} steps of axis {b}, along which an input is contiguous (one load per row)"):
    return False
  if not try_opt(trial, Opt(OptOps.UPCAST, a, tile), f"transpose tile: {tile} lanes of the output's contiguous axis {a} (one store per row)"):
    return False
  adopt_trial(k, trial)
  return True
