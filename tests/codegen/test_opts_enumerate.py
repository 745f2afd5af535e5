"""Exhaustive UPCAST/UNROLL: for every corpus kernel, every valid sequence of up to 3 opts from the
grid axes 0..shape_len-1 x amounts {0 (whole axis), 2, 3, 4, 7, 8} gives the unoptimized result.

Sequences reaching the same kernel state (the same program) are checked once, and programs with the
same source are run once. Kernels whose depth-3 space is big (matmul 16^3, the convs) check depth
<= 2 in the default tier and the rest of depth 3 in the slow tier."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt
from tilecraft.device import Device, DeviceUnavailable
from tilecraft.engine.corpus import corpus, known_bug
from tilecraft.engine.fuzz import FuzzFailure, IsolatedRunner, _Checker, entry_inputs, enumerate_opts, shrink

ENTRIES = corpus()
DEVICES = ("CPU", "OPENCL")
DEFAULT_MAX_STATES = 200  # a depth-3 space bigger than this is split: depth <= 2 default, depth 3 slow

def _device_or_skip(device: str) -> str:
  try: Device[device]
  except DeviceUnavailable as e: pytest.skip(f"{device} can't be opened here: {e}")
  return device

def _params() -> list:
  return [pytest.param(name, d, id=f"{d}-{name}",
                       marks=[pytest.mark.xfail(strict=True, reason=r)] if (r := known_bug(name, d, "enumerate")) else [])
          for d in DEVICES for name in ENTRIES]

@pytest.fixture(scope="module")
def iso():
  with IsolatedRunner() as r: yield r

def _check_all(name: str, device: str, seqs: list[list[Opt]], iso: IsolatedRunner) -> tuple[int, list[FuzzFailure]]:
  e = ENTRIES[name]
  inputs = entry_inputs(e)
  checker = _Checker(e, inputs, device, 64, iso)
  fails = []
  for opts in seqs:
    if (f := checker.check(opts)) is not None: fails.append(f)
  if fails: fails[0].minimal_opts = shrink(e, fails[0].opts, device, inputs, isolated=iso)
  return len(checker.srcs), fails

def _report(name: str, n: int, fails: list[FuzzFailure]) -> str:
  return f"{name}: {len(fails)} of {n} opt sequences fail; first:\n{fails[0]}\nothers: " + \
         "; ".join(f"{f.opts} ({f.kind})" for f in fails[1:6])

def _space(name: str, device: str) -> tuple[list[list[Opt]], list[list[Opt]]]:
  """(sequences for the default tier, the rest for the slow tier)."""
  seqs = [o for o, _ in enumerate_opts(Kernel(ENTRIES[name].ast, opts=Device[device].renderer), max_len=3)[0]]
  if len(seqs) <= DEFAULT_MAX_STATES: return seqs, []
  return [o for o in seqs if len(o) <= 2], [o for o in seqs if len(o) > 2]

@pytest.mark.parametrize("name,device", _params())
def test_upcast_unroll_exhaustive(name: str, device: str, iso: IsolatedRunner):
  _device_or_skip(device)
  default, _ = _space(name, device)
  _, fails = _check_all(name, device, default, iso)
  assert not fails, _report(name, len(default), fails)

@pytest.mark.slow
@pytest.mark.parametrize("name,device", _params())
def test_upcast_unroll_exhaustive_depth3_big(name: str, device: str, iso: IsolatedRunner):
  _device_or_skip(device)
  _, rest = _space(name, device)
  if not rest: pytest.skip(f"{name}: its whole depth-3 space runs in the default tier")
  _, fails = _check_all(name, device, rest, iso)
  assert not fails, _report(name, len(rest), fails)

def test_enumeration_dedups_and_is_complete():
  """enumerate_opts reaches every state once: on the 16^3 matmul, UPCAST(0,4)+UPCAST(1,4) is found
  once even though it is reachable in two orders, and every found sequence replays to its state."""
  e = ENTRIES["matmul_16x16x16"]
  k = Kernel(e.ast, opts=Device["CPU"].renderer)
  seqs, valid = enumerate_opts(k, max_len=2)
  assert valid > len(seqs) > 0
  states = set()
  for opts, kk in seqs:
    k2 = k.copy()
    for o in opts: k2.apply_opt(o)
    assert (tuple(k2.sts), k2.upcasted) == (tuple(kk.sts), kk.upcasted)
    states.add((tuple(kk.sts), kk.upcasted, kk.local_dims, kk.group_for_reduces))
  assert len(states) == len(seqs)
