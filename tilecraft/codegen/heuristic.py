"""Hand-coded optimizations: a fixed, explainable sequence of rules (API via Kernel methods).

Each applied Opt records the rule that chose it in `kernel.applied_opts_reasons`, so `show`
can explain a kernel. The rules adapt to the target: GPUs (locals, shared memory) get grouped
reduces and workgroups; CPUs get vector-width upcasts and register tiles.
"""
from __future__ import annotations
from typing import Any, Optional
from tilecraft.codegen import lower_state
from tilecraft.codegen.kernel_shape import KernelShape
from tilecraft.codegen.heuristic_cpu import (COLUMN_BLOCK, TILE_MAX_VECTORS, UNROLL_MAX_VECTORS, adopt_trial, cpu_matmul_tile, cpu_matvec, cpu_pad_vector_axis,
                                          cpu_third_reuse_cap, padded_lanes, cpu_transpose_tile, cpu_vecmat)
from tilecraft.codegen.opt import KernelOptError, Opt, OptOps, try_opt
from tilecraft.dtype import ImageDType, dtypes
from tilecraft.helpers import GPU_FILL, TC, TC_OPT, getenv, prod
from tilecraft.ops import BinaryOps, BufferOps, MemBuffer, ReduceOps, UnaryOps
from tilecraft.shape.symbolic import Node

def required_optimizations(k: KernelShape) -> KernelShape:
  """Opts a kernel can't run without: image outputs are written a whole texel (4 channels) at a time,
  so the output's unit-stride axis is upcast by 4, unless UPCASTMID already made it lanes of the
  reduce's second stage."""
  for i, ob in enumerate(k.outbufs):
    if not isinstance(ob.dtype, ImageDType): continue
    unit = k.sts[i].unit_stride_axes()
    if any(a in k.upcast_in_mid_reduce_axes or a >= k.first_upcast for a in unit): continue  # already whole texels per thread
    for axis in unit:
      if axis < k.first_reduce and isinstance(k.full_shape[axis], int) and k.full_shape[axis] % 4 == 0:
        try_opt(k, Opt(OptOps.UPCAST, axis, 4), f"image output {i}: write 4 channels (one texel) at once (required)")
        break
  return k

def _image_mid_reduce(k: KernelShape) -> bool:
  """An image output with a small output and a long reduce (GPUs): group the reduce, and keep the
  output's 4 channels as threads through the reduce (UPCASTMID), lanes only in its second stage."""
  ren = k.opts
  if not (isinstance(k.outbufs[0].dtype, ImageDType) and ren.has_local and ren.has_shared) or k.applied_opts or len(k.reduceops) != 1: return False
  if any(isinstance(s, Node) for s in k.full_shape) or k.first_reduce >= k.first_upcast or prod(k.full_shape[:k.first_reduce]) > 2048: return False
  unit = [a for a in k.sts[0].unit_stride_axes() if a < k.first_reduce]
  if len(unit) != 1 or k.full_shape[unit[0]] % 4: return False
  for amt in (16, 4):
    if try_opt(k, Opt(OptOps.GROUPTOP, 0, amt), f"image output, small output ({prod(k.full_shape[:k.first_reduce])}) with a long reduce: group the reduce by {amt}"):
      break
  else: return False
  if not try_opt(k, Opt(OptOps.UPCASTMID, unit[0], 4), "image output: its 4 channels are threads through the grouped reduce, one texel write after it"):
    return False
  return True

def _image_inputs(k: KernelShape) -> None:
  """Read image inputs a whole texel at a time: the unit-stride axis (by 4) of each image input
  becomes lanes (UPCAST on an output axis, UNROLL on a reduce axis)."""
  for i, b in enumerate(k.bufs):
    if not (isinstance(b, MemBuffer) and b.idx >= len(k.outbufs) and isinstance(b.dtype, ImageDType)): continue
    unit = [a for a in k.sts[i].unit_stride_axes() if isinstance(k.full_shape[a], int) and k.full_shape[a] % 4 == 0]
    if not unit or any(a >= k.first_upcast or a in k.upcast_in_mid_reduce_axes for a in unit): continue
    a = unit[0]
    if a < k.first_reduce: try_opt(k, Opt(OptOps.UPCAST, a, 4), f"image input {b.idx}: read a whole texel (4 channels along axis {a}) at once")
    elif a >= k.first_reduce + k.group_for_reduces:
      try_opt(k, Opt(OptOps.UNROLL, a - k.first_reduce, 4), f"image input {b.idx}: read a whole texel (4 channels along reduce axis {a}) at once")

def _vector_width(k: KernelShape) -> int:
  """Float lanes of the target's vectors: 16 with AVX-512, 8 with AVX2, else 4."""
  return k.opts.vector_width

def _output_vectorized(k: KernelShape) -> bool:
  """The output already has an upcast unit-stride axis of a multiple of 4 (an image's texel)."""
  return any(a >= k.first_upcast and isinstance(k.full_shape[a], int) and k.full_shape[a] % 4 == 0 for a in k.sts[0].unit_stride_axes())

def _gpu_matvec(k: KernelShape) -> Optional[tuple[int, int, int]]:
  """The reference's GPU matrix-vector rule: one SUM of MUL(a, b) of LOADs (or of the frontend's
  CAST(LOAD)s) where `a` is contiguous along the first reduce axis and not both operands are
  broadcast somewhere, with a global axis (a batch axis too) divisible into blocks of rows. Returns
  (threads per row, rows per workgroup, rows per thread) from the MV_* settings, or None."""
  threads, block, rows = getenv("MV_THREADS_PER_ROW", 8), getenv("MV_BLOCKSIZE", 4), getenv("MV_ROWS_PER_THREAD", 4)
  if not getenv("MV", 1) or not (threads > 1 or block > 1 or rows > 1) or len(k.full_shape) < 2: return None
  if len(k.reduceops) != 1 or k.reduceops[0].op is not ReduceOps.SUM or k.first_reduce >= k.shape_len: return None
  src = k.reduceops[0].src[0]
  if src.op is UnaryOps.CAST: src = src.src[0]
  if src.op is not BinaryOps.MUL: return None
  ops = [s.src[0] if s.op is UnaryOps.CAST else s for s in src.src]
  if any(s.op is not BufferOps.LOAD or s.src for s in ops): return None
  sts = [k.sts[k.bufs.index(s.arg)] for s in ops]
  strides = [st.real_strides() for st in sts]
  def broadcast(st: Any, rs: tuple) -> bool: return any(s != 1 and r == 0 for s, r in zip(st.shape, rs))
  if strides[0][k.first_reduce] != 1 or all(broadcast(st, rs) for st, rs in zip(sts, strides)): return None
  red = k.full_shape[k.first_reduce]
  if not isinstance(red, int) or red % threads or _gpu_matvec_axis(k, block * rows) is None: return None
  return threads, block, rows

def _not_scalar(st: Any) -> bool:
  """Whether an input varies at all: a scalar (one element for the whole kernel, loaded once) gives a register tile
  nothing to share. Counting one upcast ResNet-50's global average pool (its epilogue reads a scalar) by 16 x 8 x 4
  channels: 3.1x slower than 16, and 0.9 s of gcc. (Per-output loads outside the reduce still count: a padded average
  pool's per-pixel divisor shared by 16 channel lanes, and their independent accumulators, ran Inception v2's pools
  2x faster than without the tile.)"""
  return any(r != 0 for r in st.real_strides())

def _gpu_streaming_reduce(k: KernelShape) -> bool:
  """A reduce that reads each input element once (no input is shared between outputs: sums, means, norms, softmax's max
  and sum) is bound by memory, which a GPU only saturates with ~10^5 threads in flight. One thread per output (the
  layout below) left an H200 at 1/10 of torch: 4096 softmax rows were 1024 threads, a 64M sum's 256 partial sums 4096.
  So each output's reduce is split across a group of threads (16 up to 256): the smallest group that brings the kernel
  to GPU_FILL threads (helpers.py; 2^17 by default, where an H200 holds 132 SMs x 2048 = 270K at once), else the largest
  that divides the reduce. Where the innermost reduce axis is contiguous in every input, the group is along it (GROUP):
  a warp reads consecutive elements. Where instead the innermost output axis is (a column sum, a mean over a sequence
  of rows), a warp is 32 consecutive outputs (LOCAL) and the group splits the rows between warps (GROUPTOP, up to 32:
  1024 threads a workgroup); a group along such a reduce would read one column per warp, a sector per value."""
  if k.dont_use_locals or len(k.reduceops) != 1 or k.group_for_reduces or k.first_reduce >= k.first_upcast or k.const_sum_reduce() or \
      _output_vectorized(k) or k.tensor_core is not None:
    return False
  out_size, fill = prod(k.full_shape[:k.first_reduce]), int(GPU_FILL)
  red = prod(k.full_shape[k.first_reduce:k.first_upcast])
  if out_size >= fill or red < 256: return False
  ins = [st for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
  if not ins or any(st.real_strides()[a] == 0 and _not_scalar(st) for st in ins for a in range(k.first_reduce) if k.full_shape[a] != 1):
    return False  # (an input broadcast along an output axis is data reuse: a matmul-like kernel, the register tiles below)
  def pick(size: Any, amts: tuple[int, ...]) -> list[int]:  # the smallest group reaching `fill` threads first, else the largest
    return sorted((g for g in amts if isinstance(size, int) and size % g == 0), key=lambda g: (out_size * g < fill, g if out_size * g >= fill else -g))
  axis = k.first_upcast - 1
  if all(st.real_strides()[axis] in (0, 1) for st in ins):
    for amt in pick(k.full_shape[axis], (16, 32, 64, 128, 256)):
      if try_opt(k, Opt(OptOps.GROUP, axis - k.first_reduce, amt), f"a reduce reading each input once along contiguous rows, {out_size} outputs: "
                 f"{amt} threads share each ({out_size * amt} threads; a warp reads consecutive elements)"):
        return True
    return False
  col = k.first_reduce - 1
  if not all(st.real_strides()[col] in (0, 1) for st in ins) or not isinstance(k.full_shape[col], int) or k.full_shape[col] % 32: return False
  for amt in pick(k.full_shape[k.first_reduce], (2, 4, 8, 16, 32)):
    if try_opt(k, Opt(OptOps.GROUPTOP, 0, amt), f"a reduce reading each input once across contiguous outputs (a column sum), {out_size} outputs: "
               f"{amt} threads share each ({out_size * amt} threads)"):
      try_opt(k, Opt(OptOps.LOCAL, col, 32), "a warp reads 32 consecutive outputs of each row of the column reduce")
      return True
  return False

def _gpu_matvec_axis(k: KernelShape, rows: int) -> Any:
  """The first global axis divisible into blocks of `rows` rows."""
  return next((g for g in range(k.global_dims) if isinstance(k.full_shape[g], int) and k.full_shape[g] % rows == 0), None)

def _tensor_cores(k: KernelShape) -> bool:
  """Lay a matmul-shaped MUL->SUM out for the target's tensor core, trying tc_opt 0 up to the TC_OPT
  setting (more patterns, then padding) and each (N, M, reduce) axis choice in order; then the
  reference's extras: upcast what is left of M, then of N, by the largest of 5, 4, 3, 2 that divides
  it (instructions per warp reusing the A and B fragments), and make 4 (or 2) threads of what is
  left of N a workgroup axis (warps per workgroup)."""
  from tilecraft.codegen.tensor_cores import tc_choices
  use = int(TC)
  if not use or not k.opts.tensor_cores or k.applied_opts: return False
  for tc_opt in range(int(TC_OPT) + 1):
    try: tc, _, _, choices = tc_choices(k, tc_opt)
    except KernelOptError: continue
    for axis, (n, m, r) in enumerate(choices):
      if not k.apply_tensor_cores(use, axis=axis, tc_opt=tc_opt, reason=f"tensor cores: {tc} on the SUM of a MUL, N axis {n}, M axis {m}, "
                                                                       f"reduce axis {r} (choice {axis}, tc_opt {tc_opt}, use {use})"): continue
      outer = dict(zip("NM", k.tensor_core_opts.nm_outer))
      for name in "MN":
        if (ax := outer[name]) is None: continue
        size = k.full_shape[ax]
        amt = next((a for a in (5, 4, 3, 2) if isinstance(size, int) and size % a == 0), None)
        if amt is None or not try_opt(k, Opt(OptOps.UPCAST, ax, amt), f"tensor cores: {amt} instructions per warp along {name} (global axis {ax}: fragment reuse)"):
          continue
        if amt == size:  # the axis is gone: the global axes after it move down
          outer = {d: None if a == ax else (a - 1 if a is not None and a > ax else a) for d, a in outer.items()}
      if (n_ax := outer["N"]) is not None:
        for amt in (4, 2):
          if isinstance(k.full_shape[n_ax], int) and k.full_shape[n_ax] % amt == 0:
            try_opt(k, Opt(OptOps.LOCAL, n_ax, amt), f"tensor cores: {amt} warps per workgroup along N (global axis {n_ax})")
            break
      return True
  return False

def _vector_upcast(k: KernelShape) -> bool:
  """Whether an upcast output axis is contiguous in the output (the lowering makes its lanes vectors)."""
  out = k.sts[0].real_strides(ignore_valid=True)
  return any(out[a] == 1 and k.full_shape[a] == k.output_shape[a] and k.full_shape[a] != 1 for a in range(k.first_upcast, k.shape_len))

# Depthwise convs' rows of 7 (7^2 and 14^2 images), flushed single-kernel A/B (in-call where it says so): 5x5 at 14^2
# 1.37x (AVX-512) and 1.32x (AVX2); 5x5 at 7^2 1.6x and 1.33x; 3x3 at 14^2 1.10-1.12x (AVX-512); 3x3 at 7^2 1.15x and
# 1.12x; in-call, AVX-512: EfficientNet-B0's 5x5 1.26-1.68x, MobileNet-v2's 3x3 at 7^2 1.08-1.39x and at 14^2 0.95-1.21x
# (2 runs), ShuffleNet's 1.08-1.22x; a 2x2 max-pool's 4 taps 0.98x (not taken)
WINDOW_ROWS_OF_7 = True  # (a switch for A/B measurements)

def _reduce_vectors_instead(k: KernelShape, axis: int) -> bool:
  """CPU: whether the data-reuse tile along output axis `axis` should give way to vectors along the reduce: every
  input that moves along `axis` and the reduce runs contiguously along the innermost reduce axis (not along `axis`), and what
  doesn't move along it is broadcast over every output axis (a bias added before the reduce). Rows upcast there
  read each input as gathers, to save an L1 load of the bias per element: a layernorm of 128 x 256 with a bias
  and a residual fused in (BERT-like's) ran 3.3-4.9x slower than with vectors along its rows."""
  red = k.first_upcast - 1
  if red < k.first_reduce + k.group_for_reduces: return False
  ins = [st.real_strides() for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs) and _not_scalar(st)]
  streams = [rs for rs in ins if rs[axis] != 0 and rs[red] != 0]  # (inputs moving along axis only, a row's mean, are read once a row)
  return bool(streams) and all(rs[red] == 1 and rs[axis] != 1 for rs in streams) and \
    all(all(rs[a] == 0 for a in range(k.first_reduce)) for rs in ins if rs[axis] == 0)

def _pad_elementwise_axis(k: KernelShape, axis: int, vw: int, ren: Any) -> bool:
  """An elementwise kernel (CPU) whose contiguous output axis (its innermost) the vector width doesn't divide: pad that
  axis to the width (PADTO, masked lanes) and make it the vector, where padding adds at most 1/7, else to half the width
  on AVX-512 (padded_lanes: 49 -> 56; 24 takes 8 lanes unpadded, where the general rules took 4); True when applied.
  Left scalar, or at 4 lanes where 4 divides, such a kernel ran its math a lane at a time: exp over 1000 x 1001 7.5x
  faster padded on AVX-512 (2.4x on AVX2), sigmoid(x) * y over 8 x 50257 (a vocabulary's logits) 2.5x faster than 4
  lanes, a broadcast add over 1000 x 1001 3.5x (AVX2: the same; gcc vectorized the scalar loop), interleaved. A copy of
  one input (a pad: its validity a bool constant; ResNet-50's 64 x 114 x 114 pad before its max-pool 1.7-1.9x faster) may
  read through masked views; with more inputs no view may be masked along the padded axis: a selection between several
  inputs there (a concatenation's copy) gates each lane's load, which ran 1.5-2.3x slower as vectors than as 4 lanes in
  DenseNet-121 (measured while such kernels were still scalar code). A mask along another axis (the channel window of
  ZFNet's LRN) is one gate per row: its 96 x 109 x 109 LRN kernel, pow by exp2/log2, ran 22x faster padded."""
  size, mems = k.full_shape[axis], [(b, st) for b, st in zip(k.bufs, k.sts) if isinstance(b, MemBuffer)]
  if k.reduceops or axis != k.first_reduce - 1 or not isinstance(size, int) or size <= vw or size % vw == 0 or (lanes := padded_lanes(size, vw)) is None:
    return False
  if not all(b.dtype.scalar() in ren.vector_dtypes for b, _ in mems): return False
  def lane_gated(st: Any) -> bool:  # (a view masked along the padded axis, or masked behind a reshape: a gate per lane)
    return any(v.mask is not None for v in st.views) and (len(st.views) > 1 or st.views[-1].mask[axis] != (0, size))
  if len(mems) > 2 and any(lane_gated(st) for b, st in mems if b.idx >= len(k.outbufs)): return False
  trial = k.copy()
  if size % lanes and not try_opt(trial, Opt(OptOps.PADTO, axis, lanes), f"contiguous output axis {axis} ({size}) padded to a multiple of {lanes} lanes (masked)"):
    return False
  if not try_opt(trial, Opt(OptOps.UPCAST, axis, lanes), f"{lanes} lanes of the {'padded ' if size % lanes else ''}contiguous output axis {axis} per thread "
                                                         "(vector loads/stores)"): return False
  adopt_trial(k, trial)
  return True

def hand_coded_optimizations(k: KernelShape) -> KernelShape:
  # NOLOCALS=1 on a target with workgroups: no local axes, so no grouped reduces or tensor cores (their
  # threads are local ids) either; the rules below lay the kernel out over global ids only
  if getenv("NOLOCALS", 0) and k.opts.has_local and not k.dont_use_locals and k.local_dims == 0 and k.group_for_reduces == 0:
    try_opt(k, Opt(OptOps.NOLOCALS), "NOLOCALS=1: no local (workgroup) axes")
  image_grouped = _image_mid_reduce(k)
  required_optimizations(k)
  if image_grouped:
    _image_inputs(k)
    return k  # a grouped image reduce: the layout is set
  if _tensor_cores(k): return k
  if any(isinstance(s, Node) for s in k.full_shape): sym = True
  else: sym = False
  ren = k.opts
  gpu = ren.has_local and ren.has_shared

  # matrix-vector on GPUs (batched too): split each row's dot product across threads, several rows per group
  if gpu and not k.dont_use_locals and not sym and (mv := _gpu_matvec(k)) is not None:
    threads, block, rows = mv
    try_opt(k, Opt(OptOps.GROUP, 0, threads), "matvec: split each row's reduce across threads")
    try_opt(k, Opt(OptOps.LOCAL, mv_axis := _gpu_matvec_axis(k, block * rows), block), f"matvec: {block} rows (global axis {mv_axis}) per workgroup")
    try_opt(k, Opt(OptOps.UPCAST, mv_axis, rows), f"matvec: {rows} rows per thread")
    return k

  if gpu and not sym and int(GPU_FILL) > 0: _gpu_streaming_reduce(k)

  # small output, big reduce on GPUs: group the reduce so many threads share it. As the reference: at
  # most 2 output axes, not already written as vectors; 256 threads for an output of at most 32
  # elements, else 16 (more would leave too few groups to fill the GPU)
  if gpu and not k.dont_use_locals and k.reduceops and not sym and not k.const_sum_reduce() and k.first_reduce < k.first_upcast and \
      k.group_for_reduces == 0 and (out_size := prod(k.full_shape[:k.first_reduce])) <= 2048 and len(k.reduceops) == 1 and k.first_reduce <= 2 and not _output_vectorized(k):
    for amt in ((256, 16) if out_size <= 32 else (16,)):
      if try_opt(k, Opt(OptOps.GROUPTOP, 0, amt), f"small output ({out_size}) with a long reduce: group the reduce by {amt}"):
        break

  if sym: return k  # symbolic shapes: leave the layout alone (amounts must divide)
  _image_inputs(k)
  if gpu and k.group_for_reduces:
    # as the reference, a grouped reduce gets no more opts, except one tilecraft keeps for accuracy: a long
    # serial part of a float SUM is unrolled by 4 (4 accumulators per thread instead of one chain; the
    # lowering's blocked sums don't apply to grouped reduces): a float32 mean of 2^22 values on OPENCL is
    # 1.1e-5 off with one chain, 3.5e-6 with four
    ax = k.first_upcast - 1
    if k.first_reduce + k.group_for_reduces <= ax and k.reduceops[0].op is ReduceOps.SUM and dtypes.is_float(k.reduceops[0].dtype) and \
        not k.const_sum_reduce() and isinstance(size := k.full_shape[ax], int) and size > 32 and size % 4 == 0:
      try_opt(k, Opt(OptOps.UNROLL, ax - k.first_reduce, 4), "grouped float sum: 4 accumulators per thread along its serial part (accuracy)")
    return k

  # stack/cat: small masked output axes are upcast so each lane picks its source statically (GPUs: every
  # such axis while the lanes stay <= 49, innermost first, as the reference; CPUs: the first one). On CPUs the
  # register tiles and the padded vector axis come first: a padded conv's or pool's input is masked along its
  # short output axes too (a 7x7 image's rows), and taking such an axis whole left ResNet-50's 3x3 512->512 at
  # 7^2 to the scalar general rules (10x slower than its tile, AVX2)
  vw = _vector_width(k) if not gpu else 4
  if not gpu and (cpu_matmul_tile(k, vw) or cpu_matvec(k, vw) or cpu_vecmat(k, vw)): return k
  window = cpu_pad_vector_axis(k, vw) if not gpu else None
  window_axis = window.axis if window is not None else None
  masked = [axis for axis in range(k.first_reduce) if k.full_shape[axis] <= 7 and any(st.axis_is_masked(axis) for st in k.sts)]
  if gpu:
    to_upcast: list[int] = []
    for axis in masked:
      if prod(k.full_shape[k.first_upcast:]) * prod(k.full_shape[a] for a in to_upcast) * k.full_shape[axis] <= 49: to_upcast.append(axis)
    for axis in reversed(to_upcast): try_opt(k, Opt(OptOps.UPCAST, axis, 0), f"axis {axis} is small and masked (stack/cat): upcast it whole")
  for axis in masked if not gpu else []:
    if prod(k.full_shape[k.first_upcast:]) * k.full_shape[axis] <= 49:
      try_opt(k, Opt(OptOps.UPCAST, axis, 0), f"axis {axis} is small and masked (stack/cat): upcast it whole")
      break

  # CPU, or GPU with data reuse: upcast output axes that some input broadcasts (register tiles)
  tile_max = TILE_MAX_VECTORS * vw if not gpu else 32
  # a window reduce's vector row (a depthwise conv's) with an image of 7 or 14 rows takes 7 of them (4 and 3 divide neither):
  # one row was one chain of dependent FMAs per vector. Where the window has 9 taps or more, and the row is one vector or
  # the window 25 taps or more (a 3x3's chain of 9 under AVX2's 14-wide rows of 2 vectors: 14 accumulators on 16
  # registers, 0.87x): see WINDOW_ROWS_OF_7
  window_red = prod(k.full_shape[k.first_reduce:k.first_upcast])
  window_rows = [7] if window is not None and not gpu and WINDOW_ROWS_OF_7 and isinstance(window_red, int) and window_red >= 9 and \
    (prod(k.full_shape[k.first_upcast:]) <= vw or window_red >= 25) else []
  upcasted_reuse = 0
  while prod(k.full_shape[k.first_upcast:]) < tile_max and k.first_reduce > 0 and upcasted_reuse < (2 if gpu else 3) and \
      not (window is not None and window.whole_tile):
    third_cap = cpu_third_reuse_cap(k, vw) if upcasted_reuse == 2 and not gpu else None
    if upcasted_reuse == 2 and not gpu and third_cap is None: break
    best = None
    for axis in range(k.first_reduce - k.local_dims if gpu else k.first_reduce):
      if axis == window_axis: continue
      size = k.full_shape[axis]
      reuse = [st.real_strides()[axis] == 0 for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs) and _not_scalar(st)]
      if not any(reuse) or not k.reduceops: continue
      if not gpu and _reduce_vectors_instead(k, axis): continue
      out_contig = k.sts[0].real_strides(ignore_valid=True)[axis] == 1  # (a padded axis too)
      amts = ([vw, 8, 4] if out_contig and not gpu else [4, 3] + window_rows) if upcasted_reuse == 0 else ([8, 4] if not gpu else [4, 3]) if upcasted_reuse == 1 else \
        ([4, 2] if not gpu else [2])
      # a CPU tile with no vector lanes (no upcast output axis is contiguous in the output) holds one scalar register
      # per accumulator: at most 2 x vw of them (ZFNet's strided 5x5 conv with 25-wide rows took 4 x 8 x 4 = 128 on
      # output channels, spilled every one: 1.7 GFLOP/s, 20x slower than a padded vector tile)
      cap = tile_max if gpu or out_contig or _vector_upcast(k) else 2 * vw
      if third_cap is not None: cap = min(cap, third_cap)
      for amt in amts:
        if size % amt == 0 and prod(k.full_shape[k.first_upcast:]) * amt <= cap:
          score = (out_contig, amt, -axis) if upcasted_reuse < 2 else (size, -axis)  # the third: the longest axis left
          if best is None or score > best[0]: best = (score, axis, amt)
          break
    if best is None: break
    if not try_opt(k, Opt(OptOps.UPCAST, best[1], best[2]), f"data reuse: an input doesn't vary along axis {best[1]}, so a {best[2]}-wide register tile reuses each load"): break
    upcasted_reuse += 1

  # reduce unrolling: short reduces fully, long ones by the vector width along a contiguous input
  # (not for arange-style constant sums: those become a closed-form count without a loop)
  if k.first_reduce + k.group_for_reduces < k.first_upcast and not k.const_sum_reduce():
    ax = k.first_upcast - 1
    size = k.full_shape[ax]
    rel = ax - k.first_reduce
    ins = [st for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
    contiguous = any(st.real_strides()[ax] == 1 for st in ins)
    # (a window row's short reduce of 5 or 7 too, where rows were upcast besides it: the 5 taps of a 5x5 row under 7 rows
    # x 16 lanes 1.13-1.3x, under 4 rows x 2 vectors (28 wide) 1.15-1.22x faster, AVX-512; a whole-tile row (AVX2's 28 wide
    # as 4 vectors) 0.95-1.0x, so not there)
    window_taps = window is not None and not window.whole_tile and not gpu and WINDOW_ROWS_OF_7 and size <= 7
    if size <= 32 and prod(k.full_shape[k.first_upcast:]) * size <= (256 if gpu or (size > 4 and not window_taps) else max(1024, UNROLL_MAX_VECTORS * vw)) and \
        (k.upcasted == 0 or size <= 4 or window_taps):
      if try_opt(k, Opt(OptOps.UNROLL, rel, 0), f"short reduce of {size}: unroll it fully") and gpu and size <= 3 and \
          k.first_reduce + k.group_for_reduces < k.first_upcast and isinstance(s2 := k.full_shape[k.first_upcast - 1], int) and s2 <= 3:
        # as the reference: a second short reduce dim (a 3x3 window) is unrolled too
        try_opt(k, Opt(OptOps.UNROLL, k.first_upcast - 1 - k.first_reduce, 0), f"second short reduce of {s2}: unroll it fully")
    elif not contiguous and not gpu and k.first_reduce > 0 and k.sts[0].real_strides()[k.first_reduce - 1] == 1:
      pass  # column-style reduce: more output lanes per row visit beat unrolling the rows (below)
    else:
      # (half the width where the width doesn't divide the reduce, on AVX-512: argmax over 5000-long rows 1.7x faster as 8 lanes than 4)
      for amt in ([vw] + ([vw // 2] if vw >= 16 else []) if contiguous and k.upcasted == 0 and not gpu else []) + [4, 2]:
        if size % amt == 0 and prod(k.full_shape[k.first_upcast:]) * amt <= 512:
          if try_opt(k, Opt(OptOps.UNROLL, rel, amt), f"long reduce: unroll by {amt}" + (" (vector accumulators along a contiguous input)" if amt == vw else "")): break

  if not gpu and cpu_transpose_tile(k, vw): return k

  # no output axis upcast yet: vectorize the contiguous output axis
  if not any(k.full_shape[a] == k.output_shape[a] for a in range(k.first_upcast, k.shape_len)) and k.first_reduce > 0:
    unit = [a for a in k.sts[0].unit_stride_axes() if a < k.first_reduce]
    axis = unit[-1] if unit else k.first_reduce - 1
    # lanes of a dtype the target has no vectors for are scalar copies: a full vector width of them
    # only multiplies the code (and its generation time)
    simd = all(lower_state.vectorizable_leaf(ren, b) for b in k.bufs)
    # a row reduce whose vector lanes are already the unrolled reduce: 4 rows give 4 independent
    # accumulator chains, plenty for a memory-bound loop; more rows only add horizontal sums
    ins = [st for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
    vec_reduce = not gpu and any(st.real_strides()[a] == 1 for st in ins for a in range(k.first_upcast, k.shape_len) if k.full_shape[a] != k.output_shape[a])
    if gpu or not _pad_elementwise_axis(k, axis, vw, ren):
      for amt in ([vw, 4] if not gpu and simd and not vec_reduce else [4]):
        if isinstance(k.full_shape[axis], int) and k.full_shape[axis] % amt == 0:
          why = f"{amt} rows share the reduce loop (independent vector accumulators)" if vec_reduce else f"{amt} lanes of the contiguous output axis {axis} per thread (vector loads/stores)"
          if try_opt(k, Opt(OptOps.UPCAST, axis, amt), why): break
    # a reduce walking rows of the output's axis (e.g. column sums): read many cache lines per row
    if k.reduceops and not gpu and axis < k.first_reduce and k.first_reduce < k.first_upcast:
      # (not after a row reduce got vector accumulators along its contiguous rows: more rows would only spill them)
      if not any(st.real_strides()[k.first_upcast - 1] == 1 for st in ins) and not vec_reduce:
        for amt in (16, 8, 4):
          if isinstance(k.full_shape[axis], int) and k.full_shape[axis] % amt == 0 and prod(k.full_shape[k.first_upcast:]) * amt <= 256:
            if try_opt(k, Opt(OptOps.UPCAST, axis, amt), f"strided reduce: {amt}x more output columns per row read"): break
        # rows in blocks, each block walked across all of a thread's column tiles: a tile reads only a
        # few cache lines of each row (of each page), too few for the prefetcher; a block reads whole rows
        red = k.full_shape[k.first_reduce]
        if k.first_upcast - k.first_reduce == 1 and isinstance(red, int) and red > COLUMN_BLOCK and red % COLUMN_BLOCK == 0:
          try_opt(k, Opt(OptOps.BLOCK, 0, COLUMN_BLOCK), f"strided reduce: rows in blocks of {COLUMN_BLOCK}, each read across all column tiles (whole rows)")

  # GPU workgroups, as the reference: axes some buffer is broadcast along (expand axes) first, then
  # from the last; each takes the largest of 32 (axis 0 only), 16, 8, 4, 3, 2 that divides it with at
  # most 128 threads in all; the first 3 chosen become local axes
  if ren.has_local and not k.dont_use_locals and k.group_for_reduces == 0 and k.local_dims == 0:
    ranked = sorted(range(k.global_dims), key=lambda a: (not any(st.views[-1].strides[a] == 0 for st in k.sts), -a))
    to_local: list[tuple[int, int]] = []
    for axis in ranked:
      size, threads = k.full_shape[axis], prod(amt for _, amt in to_local)
      amt = next((x for x in [32] * (axis == 0) + [16, 8, 4, 3, 2] if isinstance(size, int) and size % x == 0 and threads * x <= 128), None)
      if amt is not None: to_local.append((axis, amt))
    gone = 0  # global axes a LOCAL took whole (the later ones move down)
    for axis, amt in sorted(to_local[:3]):
      whole = k.full_shape[axis - gone] == amt
      if try_opt(k, Opt(OptOps.LOCAL, axis - gone, amt), f"workgroup: {amt} threads along global axis {axis - gone}" +
              (" (an input is broadcast along it)" if any(st.views[-1].strides[axis - gone] == 0 for st in k.sts) else "")) and whole: gone += 1
  return k
