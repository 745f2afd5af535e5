"""Hand-coded optimizations: a fixed, explainable sequence of rules (API via Kernel methods).

Each applied Opt records the rule that chose it in `kernel.applied_opts_reasons`, so `show`
can explain a kernel. The rules adapt to the target: GPUs (locals, shared memory) get grouped
reduces and workgroups; CPUs get vector-width upcasts and register tiles.
"""
from __future__ import annotations
from typing import Any, Optional
from tilecraft.dtype import ImageDType
from tilecraft.helpers import TC, TC_OPT, getenv, prod
from tilecraft.ops import BinaryOps, BufferOps, MemBuffer, ReduceOps, UnaryOps
from tilecraft.shape.symbolic import Node

def _try(k: Any, opt: Any, reason: str) -> bool:
  from tilecraft.codegen.kernel import KernelOptError
  try: k.apply_opt(opt, reason=reason)
  except KernelOptError: return False
  return True

def required_optimizations(k: Any) -> Any:
  """Opts a kernel can't run without: image outputs are written 4 channels at a time."""
  from tilecraft.codegen.kernel import Opt, OptOps
  if isinstance(k.outbufs[0].dtype, ImageDType):
    unit = k.sts[0].unit_stride_axes()
    for axis in unit:
      if axis < k.first_upcast and isinstance(k.full_shape[axis], int) and k.full_shape[axis] % 4 == 0:
        _try(k, Opt(OptOps.UPCAST, axis, 4), "image output: write 4 channels at once (required)")
        break
  return k

def _vector_width(k: Any) -> int:
  """Float lanes of the target's vectors: 16 with AVX-512, 8 with AVX2, else 4."""
  return getattr(k.opts, "vector_width", 4)

def _is_matvec(k: Any) -> Optional[tuple[int, int]]:
  """A SUM of MUL(LOAD, LOAD) where one operand doesn't vary along the output axis 0."""
  if len(k.reduceops) != 1 or k.reduceops[0].op is not ReduceOps.SUM or k.first_reduce != 1: return None
  src = k.reduceops[0].src[0]
  if src.op is UnaryOps.CAST: src = src.src[0]
  if src.op is not BinaryOps.MUL or any(s.op is not BufferOps.LOAD for s in src.src): return None
  idx = [k.bufs.index(s.arg) for s in src.src]
  strides = [k.sts[i].real_strides() for i in idx]
  if any(st[0] == 0 and st[k.first_reduce] == 1 for st in strides) and any(st[0] != 0 for st in strides): return tuple(idx)  # type: ignore
  return None

def _tensor_cores(k: Any) -> bool:
  """Lay a matmul-shaped MUL->SUM out for the target's tensor core, trying tc_opt 0 up to the TC_OPT
  setting (more patterns, then padding) and each (N, M, reduce) axis choice in order; then a 2x2
  register tile of instructions per warp where the outer axes divide (A and B fragments reused)."""
  from tilecraft.codegen.kernel import KernelOptError, Opt, OptOps
  from tilecraft.codegen.tensor_cores import tc_choices
  use = int(TC)
  if not use or not getattr(k.opts, "tensor_cores", None) or k.applied_opts: return False
  for tc_opt in range(int(TC_OPT) + 1):
    try: tc, _, _, choices = tc_choices(k, tc_opt)
    except KernelOptError: continue
    for axis, (n, m, r) in enumerate(choices):
      try: k.apply_tensor_cores(use, axis=axis, tc_opt=tc_opt, reason=f"tensor cores: {tc} on the SUM of a MUL, N axis {n}, M axis {m}, "
                                                                     f"reduce axis {r} (choice {axis}, tc_opt {tc_opt}, use {use})")
      except KernelOptError: continue
      for ax in range(min(k.global_dims, 2)):
        _try(k, Opt(OptOps.UPCAST, ax, 2), f"tensor cores: 2 instructions per warp along global axis {ax} (fragment reuse)")
      return True
  return False

def hand_coded_optimizations(k: Any) -> Any:
  from tilecraft.codegen.kernel import Opt, OptOps
  required_optimizations(k)
  if _tensor_cores(k): return k
  if any(isinstance(s, Node) for s in k.full_shape): sym = True
  else: sym = False
  ren = k.opts
  gpu = ren.has_local and ren.has_shared

  # matrix-vector on GPUs: split each row's dot product across threads, several rows per group
  if gpu and not sym and _is_matvec(k) is not None:
    threads, block, rows = getenv("MV_THREADS_PER_ROW", 8), getenv("MV_BLOCKSIZE", 4), getenv("MV_ROWS_PER_THREAD", 4)
    if k.full_shape[0] % (block * rows) == 0 and k.full_shape[k.first_reduce] % threads == 0:
      _try(k, Opt(OptOps.GROUP, 0, threads), "matvec: split each row's reduce across threads")
      _try(k, Opt(OptOps.LOCAL, 0, block), "matvec: several rows per workgroup")
      _try(k, Opt(OptOps.UPCAST, 0, rows), "matvec: several rows per thread")
      return k

  # small output, big reduce on GPUs: group the reduce so many threads share it
  if gpu and k.reduceops and not sym and not k.const_sum_reduce() and k.first_reduce < k.first_upcast and \
      prod(k.full_shape[:k.first_reduce]) <= 2048 and len(k.reduceops) == 1:
    for amt in (256, 16):
      if _try(k, Opt(OptOps.GROUPTOP, 0, amt), f"small output ({prod(k.full_shape[:k.first_reduce])}) with a long reduce: group the reduce by {amt}"):
        break

  if sym: return k  # symbolic shapes: leave the layout alone (amounts must divide)

  # stack/cat: small masked output axes are upcast so each lane picks its source statically
  for axis in range(k.first_reduce):
    if k.full_shape[axis] <= 7 and any(st.axis_is_masked(axis) for st in k.sts) and prod(k.full_shape[k.first_upcast:]) * k.full_shape[axis] <= 49:
      _try(k, Opt(OptOps.UPCAST, axis, 0), f"axis {axis} is small and masked (stack/cat): upcast it whole")
      break

  vw = _vector_width(k) if not gpu else 4
  # CPU, or GPU with data reuse: upcast output axes that some input broadcasts (register tiles)
  upcasted_reuse = 0
  while prod(k.full_shape[k.first_upcast:]) < (256 if not gpu else 32) and k.first_reduce > 0 and upcasted_reuse < 2:
    best = None
    for axis in range(k.first_reduce - k.local_dims if gpu else k.first_reduce):
      size = k.full_shape[axis]
      reuse = [st.real_strides()[axis] == 0 for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
      if not any(reuse) or not k.reduceops: continue
      out_contig = k.sts[0].real_strides()[axis] == 1
      amts = ([vw, 8, 4] if out_contig and not gpu else [4, 3]) if upcasted_reuse == 0 else ([8, 4] if not gpu else [4, 3])
      for amt in amts:
        if size % amt == 0 and prod(k.full_shape[k.first_upcast:]) * amt <= (256 if not gpu else 32):
          score = (out_contig, amt, -axis)
          if best is None or score > best[0]: best = (score, axis, amt)
          break
    if best is None: break
    if not _try(k, Opt(OptOps.UPCAST, best[1], best[2]), f"data reuse: an input doesn't vary along axis {best[1]}, so a {best[2]}-wide register tile reuses each load"): break
    upcasted_reuse += 1

  # reduce unrolling: short reduces fully, long ones by the vector width along a contiguous input
  # (not for arange-style constant sums: those become a closed-form count without a loop)
  if k.first_reduce + k.group_for_reduces < k.first_upcast and not k.const_sum_reduce():
    ax = k.first_upcast - 1
    size = k.full_shape[ax]
    rel = ax - k.first_reduce
    ins = [st for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
    contiguous = any(st.real_strides()[ax] == 1 for st in ins)
    if size <= 32 and prod(k.full_shape[k.first_upcast:]) * size <= 256 and (k.upcasted == 0 or size <= 4):
      _try(k, Opt(OptOps.UNROLL, rel, 0), f"short reduce of {size}: unroll it fully")
    elif not contiguous and not gpu and k.first_reduce > 0 and k.sts[0].real_strides()[k.first_reduce - 1] == 1:
      pass  # column-style reduce: more output lanes per row visit beat unrolling the rows (below)
    else:
      for amt in ([vw] if contiguous and k.upcasted == 0 and not gpu else []) + [4, 2]:
        if size % amt == 0 and prod(k.full_shape[k.first_upcast:]) * amt <= 512:
          if _try(k, Opt(OptOps.UNROLL, rel, amt), f"long reduce: unroll by {amt}" + (" (vector accumulators along a contiguous input)" if amt == vw else "")): break

  # no output axis upcast yet: vectorize the contiguous output axis
  if not any(k.full_shape[a] == k.output_shape[a] for a in range(k.first_upcast, k.shape_len)) and k.first_reduce > 0:
    unit = [a for a in k.sts[0].unit_stride_axes() if a < k.first_reduce]
    axis = unit[-1] if unit else k.first_reduce - 1
    for amt in ([vw, 4] if not gpu else [4]):
      if isinstance(k.full_shape[axis], int) and k.full_shape[axis] % amt == 0:
        if _try(k, Opt(OptOps.UPCAST, axis, amt), f"{amt} lanes of the contiguous output axis {axis} per thread (vector loads/stores)"): break
    # a reduce walking rows of the output's axis (e.g. column sums): read many cache lines per row
    if k.reduceops and not gpu and axis < k.first_reduce and k.first_reduce < k.first_upcast:
      ins = [st for st, b in zip(k.sts, k.bufs) if isinstance(b, MemBuffer) and b.idx >= len(k.outbufs)]
      if not any(st.real_strides()[k.first_upcast - 1] == 1 for st in ins):
        for amt in (16, 8, 4):
          if isinstance(k.full_shape[axis], int) and k.full_shape[axis] % amt == 0 and prod(k.full_shape[k.first_upcast:]) * amt <= 256:
            if _try(k, Opt(OptOps.UPCAST, axis, amt), f"strided reduce: {amt}x more output columns per row read"): break

  # GPU workgroups: up to 3 local axes, at most 128 threads
  if ren.has_local and not k.dont_use_locals and k.group_for_reduces == 0:
    threads = 1
    for axis in reversed(range(k.global_dims)):
      if k.local_dims >= 3: break
      size = k.full_shape[axis]
      for amt in (32, 16, 8, 4, 2):
        if isinstance(size, int) and size % amt == 0 and threads * amt <= 128:
          if _try(k, Opt(OptOps.LOCAL, axis, amt), f"workgroup: {amt} threads along global axis {axis}"):
            threads *= amt
            break
  return k
