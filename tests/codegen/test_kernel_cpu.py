"""Every corpus kernel, unoptimized, on every device that opens here, against its numpy reference
(and every var_vals of symbolic kernels, from one compiled program)."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.testing.corpus import corpus, known_bug
from tilecraft.testing.fuzz import IsolatedRunner, check_opts, compare_outputs, entry_inputs, get_program

ENTRIES = corpus()
DEVICES = ("CPU", "OPENCL")

def _params(check: str) -> list:
  out = []
  for d in DEVICES:
    for name in ENTRIES:
      reason = known_bug(name, d, check)
      out.append(pytest.param(name, d, id=f"{d}-{name}", marks=[pytest.mark.xfail(strict=True, reason=reason)] if reason else []))
  return out

@pytest.fixture(scope="module")
def iso():
  # kernels run in a worker process: one that corrupts memory fails its test instead of killing pytest
  with IsolatedRunner() as r: yield r

@pytest.mark.slow
@pytest.mark.parametrize("name,device", _params("noopt"))
def test_corpus_kernel_matches_numpy(name: str, device: str, iso: IsolatedRunner):
  """Slow tier: in the default tier, tests/testing/test_fuzz.py::test_fuzz_corpus_entry checks exactly
  this first (the unoptimized kernel of every corpus entry on CPU, OPENCL and LLVM, the same seeded
  inputs, every var_vals, against numpy) before it fuzzes the entry."""
  e = ENTRIES[name]
  f = check_opts(e, [], entry_inputs(e), device, isolated=iso)
  assert f is None, str(f)

SYMBOLIC = [n for n, e in ENTRIES.items() if e.ast.vars()]

def test_corpus_has_symbolic_kernels():
  assert len(SYMBOLIC) >= 3 and all(len(ENTRIES[n].var_vals) >= 3 for n in SYMBOLIC)

@pytest.mark.parametrize("name,device", [p for p in _params("noopt") if p.values[0] in SYMBOLIC])
def test_symbolic_kernel_compiles_once(name: str, device: str, iso: IsolatedRunner):
  """One program (one source, one binary) serves every bound value of the Variables."""
  e = ENTRIES[name]
  p = get_program(e.ast, [], device)
  assert {v.expr for v in p.vars} == {v.expr for v in e.ast.vars()}
  assert Kernel(e.ast, opts=Device[device].renderer).to_program(name_override=p.name).src == p.src, "rendering must be deterministic"
  inputs = entry_inputs(e)
  iso.close()  # a fresh worker, so its counters start at 0
  for vi, vv in enumerate(e.var_vals):
    got = iso.run(e, [], inputs, device, vi)
    with np.errstate(all="ignore"): want = e.reference(inputs, vv)
    assert (msg := compare_outputs(got, want, e.ast, e.rtol, e.atol)) is None, f"{vv}: {msg}"
  programs, compiles = iso.worker_stats
  assert (programs, compiles) == (1, 1), f"{len(e.var_vals)} bound values took {programs} renders and {compiles} compiles"
