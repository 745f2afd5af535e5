"""Every kernel the differential fuzzer runs on emulated CUDA (AMD) renders to CUDA C that compiles
for sm_80 and sm_90 (HIP that compiles for gfx1100, with VALU instructions in the assembly), and
every Metal kernel passes the structural checks. Kernels are built with the real renderers (so the
opt sampler draws the same sequences as on the emulator and opts respect the target's limits) and
compiled in batches, cached on disk. Where a compiler is missing these tests skip, but in CI
they fail: CI must have the compilers (conftest.py here)."""
import functools
import pytest
from tilecraft.testing.gpu_compile import compile_in_chunks, coverage, fuzzed_kernels, unique_programs

CHUNKS = 2  # batches per (target, arch)
pytestmark = pytest.mark.xdist_group("gpu_compile")  # one worker renders each target's programs once (~5 s a target)

@functools.lru_cache(maxsize=None)
def programs(target):
  return unique_programs(fuzzed_kernels(target))

def test_batches_cover_the_gpu_paths():
  for target in ("CUDA", "AMD"):
    cov = coverage(programs(target))
    assert cov["opts"] >= {"LOCAL", "GROUP", "GROUPTOP", "NOLOCALS", "PADTO", "UPCAST", "UNROLL"}, (target, cov)
    assert all(cov[k] for k in ("local", "barrier", "half", "bfloat16", "vector_load", "vars")), (target, cov)
    assert len(programs(target)) >= 400, target

@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_compiles(arch, chunk, cuda_compiler_ok):
  from tilecraft.runtime.cuda import CUDACompiler
  cubin = compile_in_chunks([p for _, _, p in programs("CUDA")], CUDACompiler(arch), chunk, CHUNKS)
  assert cubin[:4] == b"\x7fELF", "a cubin is an ELF file"

@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_hip_compiles(chunk, hip_clang_ok):
  from tilecraft.runtime.hip import HIPCompiler
  asm = compile_in_chunks([p for _, _, p in programs("AMD")], HIPCompiler(), chunk, CHUNKS).decode()
  assert ".amdgcn_target" in asm and "gfx1100" in asm and "v_" in asm
  n = len(programs("AMD")[chunk::CHUNKS])
  assert asm.count(".amdhsa_kernel ") == n, "one kernel descriptor per kernel"

def test_metal_structure():
  from tilecraft.runtime.metal import metal_problems
  items = unique_programs(fuzzed_kernels("METAL"))
  assert len(items) >= 400
  bad = [(name, opts, metal_problems(p.src)) for name, opts, p in items if metal_problems(p.src)]
  assert not bad, bad[:3]

@pytest.mark.parametrize("target", ["CUDA", "AMD"])
def test_same_kernels_as_the_emulator_fuzz(target):
  """The emulated target draws the same opt sequences as its real renderer (same capabilities, same
  seeds), so the kernels compiled above are the ones the emulator's fuzz test runs."""
  from tilecraft import Context
  from tilecraft.device import Device, DeviceUnavailable
  from tilecraft.testing.corpus import corpus
  from tilecraft.testing.fuzz import _seeded, sample_opt_sequences
  from tilecraft.testing.gpu_compile import EMULATOR_FUZZ
  try: Device["PYTHON"]
  except DeviceUnavailable as e: pytest.skip(f"no PYTHON emulator here: {e}")
  seed, n = EMULATOR_FUZZ[target]
  mine = {}
  for name, opts, _ in fuzzed_kernels(target):
    mine.setdefault(name, []).append(opts)
  with Context(EMULATE=target):
    for name in list(mine)[::7]:
      seqs, _, _ = sample_opt_sequences(corpus()[name], _seeded(seed, name, "opts"), n, "PYTHON")
      assert [[]] + [list(s) for s in seqs] == mine[name], name
