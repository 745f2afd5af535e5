"""The search's action space: a fixed grid of Opts, the caps a candidate must respect, and the
kernels one action away from a kernel. Also how opts are written down for the cache and workers."""
from __future__ import annotations
import json, warnings
from typing import Any, Optional, Sequence
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.helpers import prod

def _make_actions() -> list[Opt]:
  acts: list[Opt] = []
  # UPCAST 6: the 6-row register tile of 16-register ISAs (AVX2), which the hand-coded matmul uses
  acts += [Opt(OptOps.UPCAST, ax, amt) for ax in range(6) for amt in (0, 2, 3, 4, 5, 6, 7, 8, 16)]
  acts += [Opt(OptOps.UNROLL, ax, amt) for ax in range(5) for amt in (0, 2, 3, 4, 7, 8, 16, 32)]
  acts += [Opt(OptOps.LOCAL, ax, amt) for ax in range(6) for amt in (2, 3, 4, 8, 16, 32)]
  acts += [Opt(OptOps.GROUP, ax, amt) for ax in range(3) for amt in (0, 4, 8, 16, 32)]
  acts += [Opt(OptOps.GROUPTOP, ax, amt) for ax in range(3) for amt in (8, 16, 32, 64, 128, 256)]
  # PADTO 6 and 8: a row axis to the register tile's multiple; 16 and 32: to vector widths and workgroups; 24 and 48:
  # columns to 3 vectors (AVX2's 4 x 3 matmul tile, heuristic_cpu.cpu_matmul_tile; 3 16-lane vectors)
  acts += [Opt(OptOps.PADTO, ax, amt) for ax in range(7) for amt in (6, 8, 16, 24, 32, 48)]
  acts += [Opt(OptOps.SWAP, ax, other) for ax in range(5) for other in range(ax + 1, 6)]
  acts += [Opt(OptOps.BLOCK, ax, amt) for ax in range(2) for amt in (64, 128, 256, 512, 1024)]  # CPU reduce blocking
  acts += [Opt(OptOps.PACK, buf, 0) for buf in range(1, 5)]  # CPU: pack input buffer `buf`'s tile (axis = argument number)
  acts += [Opt(OptOps.NOLOCALS)]
  return acts  # TC actions depend on the kernel: see tc_actions

ACTIONS: list[Opt] = _make_actions()
TC_OPTS = (0, 1, 2)

def tc_actions(kernel: Kernel) -> list[Opt]:
  """The TC actions for a kernel with no opts yet, on a target with tensor cores: every (N, M, reduce)
  candidate (a conv has up to 9, more with more axes) with every tc_opt. Empty where TC can't apply
  at all, so a kernel without the MUL->SUM pattern costs one check, not a refused try per action."""
  if kernel.applied_opts or not kernel.opts.tensor_cores: return []
  from tilecraft.codegen.tensor_cores import tc_choices
  try: n = len(tc_choices(kernel, max(TC_OPTS))[3])
  except KernelOptError: return []
  return [Opt(OptOps.TC, ax, tc_opt) for ax in range(n) for tc_opt in TC_OPTS]
_LOCAL_OPS = (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS)

def signature(k: Kernel) -> tuple:
  """Everything code generation depends on: two kernels with equal signatures render the same source."""
  return k.identity()

def _int_prod(xs: Sequence[Any]) -> Optional[int]:
  p = prod(xs)
  return p if isinstance(p, int) else None

def kernel_caps_ok(k: Kernel, max_upcast: int = 256, max_lanes: int = 1024, max_threads: Optional[int] = None) -> bool:
  """Register and thread caps: at most `max_upcast` output lanes (accumulators), `max_lanes` lanes with
  the unrolled reduce axes, and `max_threads` threads per workgroup (default: the renderer's limit, <= 1024)."""
  up = k.full_shape[k.first_upcast:]
  yellow = _int_prod([s for s, o in zip(up, k.output_shape[k.first_upcast:]) if s == o])
  lanes = _int_prod(up)
  if yellow is not None and yellow > max_upcast: return False
  if lanes is not None and lanes > max_lanes: return False
  if k.opts.has_local:
    if max_threads is None:
      lm = k.opts.local_max
      max_threads = min(1024, prod(lm)) if lm else 1024
    threads = _int_prod(k.full_shape[k.global_dims:k.first_reduce + k.group_for_reduces])
    if threads is not None and threads > max_threads: return False
  return True

def get_kernel_actions(kernel: Kernel, include_0: bool = True, max_upcast: int = 256, max_lanes: int = 1024,
                       max_threads: Optional[int] = None) -> dict[int, Kernel]:
  """Every kernel one action away: {i + 1: kernel with ACTIONS[i] applied} and {len(ACTIONS) + 1 + j:
  kernel with tc_actions(kernel)[j] applied}, plus {0: kernel} when include_0. Each is `copy()` +
  `apply_opt`; refusals, kernels over the caps (see kernel_caps_ok) and actions that change nothing
  or repeat another action's result are left out."""
  out: dict[int, Kernel] = {0: kernel} if include_0 else {}
  seen = {signature(kernel)}
  ren = kernel.opts
  for i, act in enumerate(ACTIONS + tc_actions(kernel)):
    if act.op in _LOCAL_OPS and not ren.has_local: continue
    if act.axis is not None and act.op not in (OptOps.SWAP, OptOps.TC) and act.real_axis(kernel) >= kernel.shape_len: continue
    k = kernel.copy()
    try: k.apply_opt(act, reason="beam search")
    except KernelOptError: continue
    except Exception as e:  # noqa: BLE001 - a bug in an opt: say so, and search on without it
      warnings.warn(f"search: {act} on {kernel.name} {kernel.applied_opts} raised {type(e).__name__}: {e} (a bug: opts may only "
                    "raise KernelOptError)", RuntimeWarning, stacklevel=2)
      continue
    if not kernel_caps_ok(k, max_upcast, max_lanes, max_threads): continue
    if (sig := signature(k)) in seen: continue
    seen.add(sig)
    out[i + 1] = k
  return out

def opt_wire(o: Opt) -> tuple: return (o.op.name, o.axis, o.amt)
def opt_unwire(t: Sequence) -> Opt: return Opt(OptOps[t[0]], t[1], t[2])
def opts_key(opts: Sequence[Opt]) -> str: return json.dumps([opt_wire(o) for o in opts])
def opts_from_key(s: str) -> list[Opt]: return [opt_unwire(t) for t in json.loads(s)]
