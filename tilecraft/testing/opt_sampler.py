"""Random and exhaustive valid opt sequences for a kernel, for the fuzzer and the opt tests.

Candidates are drawn from FUZZ_OPS x axes x AMOUNTS (amounts include non-divisors and amounts past
the opts' limits, axes one past the end) and applied to copies of the kernel: each is either
refused with KernelOptError, leaving the kernel unchanged, or applied; anything else is a bug that
the sequence reports.

  random_opts(kernel, rng, max_opts) -> OptSequence (a list of Opts, with .refusals and .error)
  enumerate_opts(kernel, ops, amounts, max_len) -> every distinct kernel state reachable
  try_opt(kernel, opt) -> (kernel copy with opt applied | None, error | None)
  grow_opts(kernel, rng, max_opts) -> OptSequence that fills workgroups (the launch-limits property)
"""
from __future__ import annotations
import traceback
from typing import Optional, Sequence
import numpy as np
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.dtype import ImageDType
from tilecraft.helpers import prod

FUZZ_OPS = (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.PADTO, OptOps.SWAP, OptOps.NOLOCALS, OptOps.BLOCK,
            OptOps.PACK, OptOps.UPCASTMID)
_OP_WEIGHTS = np.array([4, 4, 2, 1, 1, 2, 1, 0.5, 1, 2, 0.5])
# amounts include non-divisors and amounts over the opts' limits (16 for UPCAST, 32 for UNROLL)
AMOUNTS = (0, 1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 33, 64)

def _kernel_state(k: Kernel) -> tuple:
  """What an opt may change; used to check copy() independence and refusal atomicity."""
  return k.identity() + (tuple(k.applied_opts),)  # applied_opts last: enumerate_opts keys states on the rest

class OptSequence(list):
  """A list of valid Opts found by random_opts, with the number of refused candidates and, when a
  candidate raised something other than KernelOptError (or broke an invariant), that error."""
  refusals: int = 0
  error: Optional[tuple[Opt, str]] = None
  tc_use: int = 0  # use_tensor_cores of its TC opt (0: none)

REGROUP = 0.4  # chance that a candidate on an already grouped reduce is another GROUP/GROUPTOP

def random_opt(k: Kernel, rng: np.random.Generator) -> Opt:
  if k.group_for_reduces and rng.random() < REGROUP: op = OptOps.GROUP if rng.random() < 0.5 else OptOps.GROUPTOP
  else:
    # UPCASTMID (last) only for image outputs: elsewhere it is always refused, and leaving it out keeps
    # the sequences other kernels get for a seed the same
    n = len(FUZZ_OPS) if any(isinstance(b.dtype, ImageDType) for b in k.outbufs) else len(FUZZ_OPS) - 1
    op = FUZZ_OPS[rng.choice(n, p=_OP_WEIGHTS[:n] / _OP_WEIGHTS[:n].sum())]
  # (without local memory every GROUP is refused whatever its axis: those are drawn the plain way)
  if op in (OptOps.GROUP, OptOps.GROUPTOP) and k.opts.has_local and k.opts.has_shared and rng.random() < 0.8: return _group_opt(k, op, rng)
  if op is OptOps.NOLOCALS: return Opt(op)
  axis = int(rng.integers(0, k.shape_len + 1))  # one past the end now and then: must be refused
  if op is OptOps.SWAP: return Opt(op, axis, int(rng.integers(0, k.shape_len + 1)))
  if op is OptOps.PACK:  # the axis is a buffer's argument number (an output's or one past the last now and then: refused)
    return Opt(op, int(rng.integers(0, max(b.idx for b in k.membufs) + 2)), 0 if rng.random() < 0.9 else int(AMOUNTS[rng.integers(len(AMOUNTS))]))
  if op is OptOps.UPCASTMID: return Opt(op, axis, 4 if rng.random() < 0.8 else int(AMOUNTS[rng.integers(len(AMOUNTS))]))  # valid only by 4
  return Opt(op, axis, int(AMOUNTS[rng.integers(len(AMOUNTS))]))

def _group_opt(k: Kernel, op: OptOps, rng: np.random.Generator) -> Opt:
  """A GROUP/GROUPTOP likely to apply, also on a reduce already grouped (a multi-stage local
  reduction): the axis counts from the first ungrouped reduce axis (one past the last now and then),
  the amount mostly divides it (0: the whole axis)."""
  n = k.first_upcast - k.first_reduce - k.group_for_reduces
  axis = int(rng.integers(0, max(n, 0) + 1))
  size = k.full_shape[k.first_reduce + k.group_for_reduces + axis] if axis < n else None
  divisors = [a for a in AMOUNTS if a > 1 and isinstance(size, int) and size % a == 0] + [0]
  return Opt(op, axis, int(rng.choice(divisors)) if rng.random() < 0.8 else int(AMOUNTS[rng.integers(len(AMOUNTS))]))

def try_opt(k: Kernel, opt: Opt, use: Optional[int] = None) -> tuple[Optional[Kernel], Optional[str]]:
  """Apply opt to a copy of k: (new kernel, None) if valid, (None, None) if refused, (None, error)
  if it raised anything but KernelOptError or broke copy()/refusal invariants. `use`: the
  use_tensor_cores of a TC opt (default: the TC setting)."""
  before = _kernel_state(k)
  kc = k.copy()
  try:
    if opt.op is OptOps.TC and use is not None:  # (apply_tensor_cores answers False where apply_opt refuses)
      if not kc.apply_tensor_cores(use, axis=opt.axis, tc_opt=opt.amt): raise KernelOptError(f"{opt} with use {use} refused")
    else: kc.apply_opt(opt)
  except KernelOptError:
    if _kernel_state(kc) != before: return None, f"{opt} was refused but left the kernel changed"
    return None, None
  except Exception as e:  # noqa: BLE001  (any other exception is a bug)
    return None, f"apply_opt({opt}) raised {type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
  if _kernel_state(k) != before: return None, f"applying {opt} to a copy() changed the original kernel"
  return kc, None

def lanes(k: Kernel) -> int:
  """Values per thread the upcast/unrolled axes expand into (what code size and compile time follow)."""
  return int(prod(s for s in k.full_shape[k.first_upcast:] if isinstance(s, int)))

def random_opts(kernel: Kernel, rng: np.random.Generator, max_opts: int = 4, max_lanes: Optional[int] = 256, tc: float = 0.5,
                tc_use: Optional[int] = None) -> OptSequence:
  """A random sequence of 1..max_opts valid Opts for `kernel` (which is not modified): candidates
  are drawn from FUZZ_OPS x axes x AMOUNTS and applied to copies; refused ones are counted. On a
  target with tensor cores, with probability `tc` the first candidate is a random TC opt (use
  `tc_use`, default the TC setting; the sequence's `tc_use` says which: replay it with that TC setting). Valid
  opts that would unroll more than max_lanes values per thread are skipped (not refusals): such
  kernels take seconds to compile each and would eat the fuzzing budget."""
  seq = OptSequence()
  target = int(rng.integers(1, max_opts + 1))
  k = kernel
  if not kernel.applied_opts and kernel.opts.tensor_cores and rng.random() < tc:
    # tensor cores (only as the first opt): a random (N, M, reduce) choice and tc_opt
    from tilecraft.codegen.tensor_cores import tc_choices
    try: n = len(tc_choices(k, 2)[3])
    except KernelOptError: n = 1
    opt = Opt(OptOps.TC, int(rng.integers(0, n + (rng.random() < 0.1))), int(rng.integers(0, 3)))
    kc, err = try_opt(k, opt, use=tc_use)
    if err is not None:
      seq.error = (opt, err)
      seq.kernel = k  # type: ignore[attr-defined]
      return seq
    if kc is None: seq.refusals += 1
    else:
      seq.append(opt)
      seq.tc_use = kc.use_tensor_cores
      k = kc
  image_out = any(isinstance(b.dtype, ImageDType) for b in kernel.outbufs)
  if not kernel.applied_opts and image_out and k.reduceops and rng.random() < 0.4:
    # an image output's mid-reduce upcast needs a grouped reduce first: try the pair (either may be refused)
    unit = [a for a in k.sts[0].unit_stride_axes() if a < k.first_reduce] or [0]
    for opt in (Opt(OptOps.GROUPTOP if rng.random() < 0.5 else OptOps.GROUP, 0, int(rng.choice([2, 3, 4, 8, 16]))),
                Opt(OptOps.UPCASTMID, unit[-1] if rng.random() < 0.8 else int(rng.integers(0, k.shape_len)), 4)):
      kc, err = try_opt(k, opt)
      if err is not None:
        seq.error = (opt, err)
        break
      if kc is None: seq.refusals += 1; continue  # noqa: E702
      seq.append(opt)
      k = kc
  for _ in range(8 * target):
    if len(seq) >= target or seq.error: break
    opt = random_opt(k, rng)
    kc, err = try_opt(k, opt)
    if err is not None:
      seq.error = (opt, err)
      break
    if kc is None: seq.refusals += 1; continue  # noqa: E702
    if max_lanes is not None and lanes(kc) > max_lanes: continue
    seq.append(opt)
    k = kc
  if image_out and not seq.error:  # whatever the opts did, finish with what image outputs require (whole texels)
    kc = k.copy()
    try: kc.required_optimizations()
    except Exception as e:  # noqa: BLE001  (required_optimizations only tries opts: anything raised is a bug)
      seq.error = (Opt(OptOps.UPCAST, 0, 4), f"required_optimizations raised {type(e).__name__}: {e}")
    else:
      seq += kc.applied_opts[len(k.applied_opts):]
      k = kc
  seq.kernel = k  # type: ignore[attr-defined]
  return seq

def enumerate_opts(kernel: Kernel, ops: Sequence[OptOps] = (OptOps.UPCAST, OptOps.UNROLL), amounts: Sequence[int] = (0, 2, 3, 4, 7, 8),
                   max_len: int = 3) -> tuple[list[tuple[list[Opt], Kernel]], int]:
  """Every valid sequence of up to max_len opts from ops x axes (0..shape_len-1) x amounts, applied
  breadth first. Sequences reaching a kernel state already seen (same trackers and region counts:
  the same program) are pruned. Returns ([(opts, kernel)] for each distinct state, the number of
  valid sequences before pruning)."""
  def key(k: Kernel) -> tuple: return _kernel_state(k)[:-1]
  seen = {key(kernel)}
  out: list[tuple[list[Opt], Kernel]] = []
  frontier: list[tuple[list[Opt], Kernel]] = [([], kernel)]
  valid = 0
  for _ in range(max_len):
    nxt: list[tuple[list[Opt], Kernel]] = []
    for opts, k in frontier:
      for op in ops:
        for axis in range(k.shape_len):
          for amt in amounts:
            opt = Opt(op, axis, amt)
            kc, err = try_opt(k, opt)
            if err is not None: raise RuntimeError(f"{opts + [opt]}: {err}")
            if kc is None: continue
            valid += 1
            if (kk := key(kc)) in seen: continue
            seen.add(kk)
            nxt.append((opts + [opt], kc))
    out += nxt
    frontier = nxt
  return out, valid

# amounts that grow a kernel toward the targets' limits (threads, local memory): divisors, largest most often
_GROW_OPS = (OptOps.LOCAL, OptOps.UPCAST, OptOps.GROUPTOP, OptOps.GROUP, OptOps.UNROLL, OptOps.PADTO)
_GROW_WEIGHTS = np.array([4, 3, 2, 1, 1, 0.5])
_GROW_AMOUNTS = (2, 3, 4, 8, 16, 32, 64, 128, 256)

def grow_opts(kernel: Kernel, rng: np.random.Generator, max_opts: int = 6, max_lanes: Optional[int] = 256, tc: float = 0.5,
              tc_use: int = 1) -> OptSequence:
  """A random valid opt sequence biased to what fills a workgroup (LOCAL, GROUP, UPCAST with large
  divisor amounts), for the launch property: whatever apply_opt accepts must launch. On a target with
  tensor cores, with probability `tc` the first opt is TC with use `tc_use`. Like random_opts, a
  candidate that raises anything but KernelOptError ends the sequence with `.error`."""
  seq = OptSequence()
  k = kernel
  if kernel.opts.tensor_cores and not kernel.applied_opts and rng.random() < tc:
    opt = Opt(OptOps.TC, int(rng.integers(0, 2)), int(rng.integers(0, 3)))
    kc, err = try_opt(k, opt, use=tc_use)
    if err is not None: seq.error = (opt, err)
    elif kc is not None: seq.append(opt); seq.tc_use, k = tc_use, kc  # noqa: E702
  for _ in range(6 * max_opts):
    if len(seq) >= max_opts or seq.error: break
    op = _GROW_OPS[rng.choice(len(_GROW_OPS), p=_GROW_WEIGHTS / _GROW_WEIGHTS.sum())]
    if op in (OptOps.GROUP, OptOps.GROUPTOP): lo, hi = 0, k.first_upcast - k.first_reduce - k.group_for_reduces
    elif op is OptOps.UNROLL: lo, hi = 0, k.first_upcast - k.first_reduce
    else: lo, hi = 0, k.first_reduce if op is not OptOps.PADTO else k.first_upcast
    if hi <= lo: continue
    axis = int(rng.integers(lo, hi))
    real = axis + {OptOps.GROUP: k.first_reduce + k.group_for_reduces, OptOps.GROUPTOP: k.first_reduce + k.group_for_reduces,
                   OptOps.UNROLL: k.first_reduce}.get(op, 0)
    size = k.full_shape[real] if real < k.shape_len else None
    amts = [a for a in _GROW_AMOUNTS if isinstance(size, int) and (op is OptOps.PADTO or size % a == 0)] or [2]
    amt = int(amts[-1 - min(int(rng.geometric(0.5)) - 1, len(amts) - 1)])  # the largest most often
    opt = Opt(op, axis, amt)
    kc, err = try_opt(k, opt)
    if err is not None: seq.error = (opt, err); break  # noqa: E702
    if kc is None: seq.refusals += 1; continue  # noqa: E702
    if max_lanes is not None and lanes(kc) > max_lanes: continue
    seq.append(opt)
    k = kc
  seq.kernel = k  # type: ignore[attr-defined]
  return seq
