"""Opts: the optimizations a Kernel applies to its iteration space. They live apart
from kernel.py so the heuristics and tensor-core code can name them without importing the Kernel;
`tilecraft.codegen.kernel` re-exports them (API)."""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Optional, Protocol

class _Axes(Protocol):
  """What Opt.real_axis reads of a Kernel (named so opt.py needs no import of kernel.py, even for annotations)."""
  first_reduce: int
  group_for_reduces: int

class OptOps(Enum):
  TC = auto(); UPCAST = auto(); UPCASTMID = auto(); UNROLL = auto(); LOCAL = auto()  # noqa: E702
  GROUP = auto(); GROUPTOP = auto(); NOLOCALS = auto(); PADTO = auto(); SWAP = auto()  # noqa: E702
  BLOCK = auto()  # CPU reduce blocking: the reduce runs in blocks of amt, an outer loop accumulating in the output
  PACK = auto()  # CPU: copy the tile of input buffer `axis` the inner loops read into a contiguous stack array (codegen/pack.py)
  def __lt__(self, x: "OptOps") -> bool: return self.value < x.value

class KernelOptError(Exception):
  """An Opt that can't be applied to this kernel; the message names the rule it breaks (API)."""

def check(cond: bool, msg: str) -> None:
  if not cond: raise KernelOptError(msg)

def try_opt(k: Any, opt: "Opt", reason: str) -> bool:
  """Apply opt to kernel k with the reason a heuristic chose it; False (k unchanged) where k refuses it."""
  try: k.apply_opt(opt, reason=reason)
  except KernelOptError: return False
  return True

@dataclass(frozen=True, order=True)
class Opt:
  """One optimization (API). `amt=0` means the whole axis. UNROLL and BLOCK axes count from first_reduce;
  GROUP/GROUPTOP from first_reduce + group_for_reduces; all others are absolute."""
  op: OptOps
  axis: Optional[int] = None
  amt: Optional[int] = None
  def __repr__(self) -> str: return f"Opt(op={self.op}, axis={self.axis}, amt={self.amt})"
  def real_axis(self, k: _Axes) -> int:
    if self.axis is None or self.op is OptOps.PACK: return -1
    if self.op in (OptOps.UNROLL, OptOps.BLOCK): return k.first_reduce + self.axis
    if self.op in (OptOps.GROUP, OptOps.GROUPTOP): return k.first_reduce + k.group_for_reduces + self.axis
    return self.axis
