"""Exhaustive UPCAST/UNROLL: for every corpus kernel, every valid sequence of up to 3 opts from the
grid axes 0..shape_len-1 x amounts {0 (whole axis), 2, 3, 4, 7, 8} gives the unoptimized result
(and the numpy reference). Sequences reaching the same kernel state (the same program) are checked
once. The default tier covers the part that compiles fast (see DEFAULT_*), the slow tier the rest:
together they are the whole space."""
import pytest
from tilecraft.codegen.kernel import Kernel, Opt
from tilecraft.device import Device
from tilecraft.testing.corpus import corpus, known_bug
from tilecraft.testing.fuzz import FuzzFailure, IsolatedRunner, _Checker, entry_inputs, shrink
from tilecraft.testing.opt_sampler import enumerate_opts, lanes

ENTRIES = corpus()
DEVICES = ("CPU", "OPENCL")
# The default tier keeps to what compiles fast: at most DEFAULT_MAX_LANES unrolled values per thread
# (a whole 7x9 bf16 kernel unrolled into 63 scalar exp2f chains takes gcc ~2 s, 1225-lane matmuls ~10 s;
# the random fuzz's sequences reach 256 lanes in the default tier), depth <= 2 where the depth-3 space is bigger than
# DEFAULT_MAX_STATES (matmul 16^3, the convs), depth 1 on OpenCL (PoCL takes 1-3s per kernel), and an
# even spread of DEFAULT_MAX_CHECKED sequences where more remain.
# The slow tier checks everything else.
DEFAULT_MAX_STATES = 200
DEFAULT_MAX_LANES = 16
DEFAULT_MAX_LEN = {"CPU": 3, "OPENCL": 1}
# sequences per kernel and device (the suite's time is mostly their compiles); the random fuzz
# (tests/testing/test_fuzz.py) covers the same space in the default tier, so this tier samples it thinly
# (on OPENCL every PoCL compile takes 0.3-3 s cold: its whole space is in the slow tier, and the
# default tier's OPENCL fuzz covers it thinly)
DEFAULT_MAX_CHECKED = {"CPU": 8, "OPENCL": 0}

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
  iso.prebuild(e, [checker.base] + seqs, device)  # one compiler run for the lot
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
  found = enumerate_opts(Kernel(ENTRIES[name].ast, opts=Device[device].renderer), max_len=3)[0]
  default = [o for o, k in found if lanes(k) <= DEFAULT_MAX_LANES and len(o) <= DEFAULT_MAX_LEN.get(device, 1)]
  if len(default) > DEFAULT_MAX_STATES: default = [o for o in default if len(o) <= 2]
  # at most DEFAULT_MAX_CHECKED sequences (an even spread over the space) in the default tier
  if (cap := DEFAULT_MAX_CHECKED[device]) == 0: default = []
  elif len(default) > cap: default = default[::-(-len(default) // cap)]
  chosen = {tuple(o) for o in default}
  return default, [o for o, _ in found if tuple(o) not in chosen]

@pytest.mark.parametrize("name,device", [p for p in _params() if DEFAULT_MAX_CHECKED[p.values[1]]])
def test_upcast_unroll_exhaustive(name: str, device: str, iso: IsolatedRunner):
  default, _ = _space(name, device)
  _, fails = _check_all(name, device, default, iso)
  assert not fails, _report(name, len(default), fails)

@pytest.mark.slow
@pytest.mark.parametrize("name,device", _params())
def test_upcast_unroll_exhaustive_rest(name: str, device: str, iso: IsolatedRunner):
  _, rest = _space(name, device)
  if not rest: pytest.skip(f"{name}: its whole space runs in the default tier")
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
