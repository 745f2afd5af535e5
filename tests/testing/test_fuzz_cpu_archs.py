"""Differential fuzzing of the CPU (C via the host's C compiler) and LLVM devices at every CPU_ARCH
users have: x86-64 (SSE2), x86-64-v2 (SSE4.2), haswell (AVX2), znver3 (AVX2, AMD) and native. The
kernels are the corpus's masked and padded ones (gated loads and stores, the shapes gcc 12 and LLVM
miscompiled on AVX2 hosts), plus every corpus kernel with the hand-coded opts. An arch this host
can't execute is skipped with the reason (its code is built and inspected in tests/test_host.py)."""
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.host import _CODEGEN_FEATURES, _arch_target, find_c_compiler, missing_features
from tilecraft.testing.corpus import corpus, known_bug
from tilecraft.testing.fuzz import IsolatedRunner, check_opts, entry_inputs, fuzz_entry, prebuild

ARCHS = ("x86-64", "x86-64-v2", "haswell", "znver3", "native")
ENTRIES = corpus()
MASKED = [e for e in ENTRIES.values() if "masked" in e.tags and "image" not in e.tags]
N_PER_ENTRY = 4  # opt sequences per masked kernel, arch and device: 10 kernels x 5 archs x 2 devices -> 300+ pairs in all

def _skip_unless_runnable(arch: str) -> None:
  try: target = _arch_target(find_c_compiler(), arch)
  except (ValueError, RuntimeError) as e: pytest.skip(f"CPU_ARCH={arch}: {e}")
  if (missing := missing_features(target)): pytest.skip(f"this host can't execute CPU_ARCH={arch} (lacks {', '.join(missing)})")

def _skip_if_native_is_named(arch: str) -> None:
  """CPU_ARCH=native enables exactly the extensions a kernel can use of a named arch in ARCHS (znver3 on a
  Zen 3, haswell on a Haswell): the same code, already fuzzed under that name. (On hosts beyond the
  named ones, AVX-512 among them, native runs.)"""
  if arch != "native": return
  cc = find_c_compiler()
  codegen = lambda a: frozenset(f for f in _arch_target(cc, a).features if f.startswith(_CODEGEN_FEATURES))
  if (same := next((a for a in ARCHS if a != "native" and codegen(a) == codegen("native")), None)) is not None:
    pytest.skip(f"CPU_ARCH=native is {same} here (the same ISA extensions): fuzzed as {same}")

@pytest.fixture(scope="module")
def iso():
  with IsolatedRunner() as r: yield r

@pytest.mark.fuzz
@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("arch", ARCHS)
def test_masked_kernels_fuzzed_at_each_arch(arch, device, iso):
  _skip_unless_runnable(arch)
  _skip_if_native_is_named(arch)
  pairs, failures = 0, []
  with Context(CPU_ARCH=arch):
    for e in MASKED:
      if known_bug(e.name, device, "fuzz"): continue
      rep = fuzz_entry(e, N_PER_ENTRY, device, seed=ARCHS.index(arch), isolated=iso)
      pairs += rep.pairs
      if not rep.ok: failures.append(rep.summary())
  assert not failures, "\n".join(failures)
  assert pairs >= 2 * len(MASKED), f"only {pairs} (kernel, opts) pairs"

@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("arch", ARCHS)
def test_hand_coded_opts_at_each_arch(arch, device):
  """The heuristics' kernels for this arch's vector width, against the unoptimized kernel."""
  _skip_unless_runnable(arch)
  _skip_if_native_is_named(arch)
  bad = []
  with Context(CPU_ARCH=arch):
    tuned = {e.name: Kernel(e.ast, Device[device].renderer).hand_coded_optimizations().applied_opts
             for e in ENTRIES.values() if "image" not in e.tags and not known_bug(e.name, device, "fuzz")}
    prebuild([(ENTRIES[n].ast, o) for n, opts in tuned.items() for o in ([], opts)], device)  # one compiler run per batch
    for name, opts in tuned.items():
      if (err := check_opts(ENTRIES[name], opts, entry_inputs(ENTRIES[name]), device)) is not None: bad.append(f"{name} {opts}: {err}")
  assert not bad, "\n".join(bad)

PADS = [((2, 1), (1, 0), (0, 0)), ((0, 0), (3, 2), (1, 1)), ((1, 1), (0, 0), (5, 3)), ((0, 2), (2, 2), (0, 7))]

@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_pad_at_each_arch(arch):
  """Tensor.pad with a non-zero value: gcc 12.2 -O3 -march=haswell/znver3 turned its gated loads into
  wrongly permuted vmaskmov loads (20 of 100 elements wrong for the first case)."""
  _skip_unless_runnable(arch)
  rng = np.random.default_rng(0)
  with Context(CPU_ARCH=arch):
    for shape in ((1, 4, 5), (3, 7, 9)):
      a = rng.standard_normal(shape).astype(np.float32)
      for pads in PADS:
        for value in (-2.0, 0.0):
          np.testing.assert_array_equal(Tensor(a).pad(pads, value=value).numpy(), np.pad(a, pads, constant_values=value), err_msg=f"{shape} {pads} {value}")

@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("arch", ARCHS)
def test_whole_corpus_fuzzed_at_each_arch(arch, device):
  """The slow tier: every corpus kernel, 20 opt sequences each, at each arch."""
  _skip_unless_runnable(arch)
  with Context(CPU_ARCH=arch), IsolatedRunner() as iso:
    reps = [fuzz_entry(e, 20, device, seed=10 + ARCHS.index(arch), isolated=iso) for e in ENTRIES.values()
            if "image" not in e.tags and not known_bug(e.name, device, "fuzz")]
  bad = [r.summary() for r in reps if not r.ok]
  assert not bad, "\n".join(bad)
  assert sum(r.pairs for r in reps) >= 500
