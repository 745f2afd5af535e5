"""CPU_ARCH: the -march CPU kernels are built for, and the vector width the heuristics assume."""
import shutil, subprocess
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.host import cpu_arch, cpu_target
from op_checks import require_arch

def _host_has(flag: str) -> bool:
  """Whether the CPU running this process has `flag`, as its cpuid says (what gcc's -march=native
  reads). Not /proc/cpuinfo: under qemu-user (scripts/as-cpu) that still describes the physical CPU."""
  from tilecraft.host import find_c_compiler
  try: cc = find_c_compiler()
  except RuntimeError: return False
  out = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", "/dev/null"], capture_output=True, text=True).stdout
  macro = {"avx512f": "__AVX512F__", "avx2": "__AVX2__", "fma": "__FMA__", "avx": "__AVX__"}[flag]
  return f"#define {macro} " in out

def test_default_is_native():
  assert cpu_arch() == "native"
  assert "-march=native" in Device["CPU"].compiler.flags

@pytest.mark.parametrize("arch,isa,width", [("haswell", "AVX2", 8), ("skylake-avx512", "AVX-512", 16), ("x86-64", "SSE", 4)])
def test_named_arch_sets_flags_and_width(arch, isa, width):
  if not shutil.which("gcc") or subprocess.run(["gcc", f"-march={arch}", "-E", "-x", "c", "/dev/null"], capture_output=True).returncode:
    pytest.skip(f"the C compiler has no -march={arch}")
  with Context(CPU_ARCH=arch):
    comp = Device["CPU"].compiler
    assert f"-march={arch}" in comp.flags and "-march=native" not in comp.flags
    assert (comp.target.isa, comp.target.vector_width) == (isa, width)
    assert Device["CPU"].renderer.vector_width == width
    key = comp.cache_key("void f(void) {}")
  assert key != Device["CPU"].compiler.cache_key("void f(void) {}")  # binaries are cached per target

@pytest.mark.skipif(not _host_has("avx512f"), reason="host has no AVX-512")
def test_native_on_avx512_host():
  assert (cpu_target().isa, cpu_target().vector_width) == ("AVX-512", 16)

@pytest.mark.parametrize("bad", ["bogus-cpu", "haswell; rm", ""])
def test_bad_arch_is_named(bad):
  if bad == "":  # empty means the default
    with Context(CPU_ARCH=bad): assert cpu_arch() == "native"
    return
  with Context(CPU_ARCH=bad), pytest.raises(ValueError, match="CPU_ARCH"): Device["CPU"].compiler.compile("void f(void) {}")

def _disasm(lib: bytes, tmp_path) -> str:
  p = tmp_path / "k.so"
  p.write_bytes(lib)
  return subprocess.run(["objdump", "-d", str(p)], capture_output=True, text=True).stdout

@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
def test_haswell_kernel_has_no_avx512(tmp_path, rng):
  require_arch("haswell")
  a, b = rng.random(4096, dtype=np.float32), rng.random(4096, dtype=np.float32)
  with Context(CPU_ARCH="haswell"):
    sched = (Tensor(a) + Tensor(b)).schedule()
    k = Kernel(sched[-1].ast, Device["CPU"].renderer).hand_coded_optimizations()
    assert any(o.amt == 8 for o in k.applied_opts)  # 8-wide: one ymm register
    src = k.to_program().src
    assert "float8" in src and "float16" not in src
    asm = _disasm(Device["CPU"].compiler.compile(src), tmp_path)
    assert "ymm" in asm and "zmm" not in asm
    np.testing.assert_allclose((Tensor(a) + Tensor(b)).numpy(), a + b)
  if _host_has("avx512f"):
    k = Kernel(sched[-1].ast, Device["CPU"].renderer).hand_coded_optimizations()
    assert "zmm" in _disasm(Device["CPU"].compiler.compile(k.to_program().src), tmp_path)

def test_runners_are_per_target(rng):
  require_arch("haswell")
  from tilecraft.engine.realize import get_runner
  sched = (Tensor(rng.random(256, dtype=np.float32)) * 3).schedule()
  native = get_runner(sched[-1].ast, "CPU")
  with Context(CPU_ARCH="haswell"): hsw = get_runner(sched[-1].ast, "CPU")
  assert hsw is not native and get_runner(sched[-1].ast, "CPU") is native

# ---- ISAs the host can't execute: built and inspected, never run --------------------------------

from tilecraft.host import CPUTarget, KNOWN_X86_ARCHS, check_runnable, host_target, missing_features, runnable_archs

X86 = host_target().isa in ("AVX-512", "AVX2", "AVX", "SSE")

@pytest.mark.skipif(not X86, reason="ISA checks are for x86-64 hosts")
def test_missing_features_are_named():
  fake = CPUTarget("future-cpu", "AVX-512", 16, host_target().features | {"avx512f", "avx10_9", "amx_fp99"})
  missing = missing_features(fake)
  assert "amx_fp99" in missing and "avx10_9" in missing and ("avx512f" in missing) != _host_has("avx512f")
  with pytest.raises(RuntimeError, match=r"future-cpu.*amx_fp99.*SIGILL"): check_runnable(fake)
  check_runnable(host_target())  # the host runs its own code
  # extensions a compiler never emits by itself (a VM hides some) are not held against a target
  check_runnable(CPUTarget("vm-cpu", host_target().isa, 8, host_target().features | {"sgx", "rdrnd", "clwb"}))

@pytest.mark.skipif(not X86 or _host_has("avx512f"), reason="needs an x86-64 host without AVX-512")
@pytest.mark.parametrize("device", ["CPU", "LLVM"])
def test_avx512_arch_is_an_error_not_sigill(device):
  """CPU_ARCH=skylake-avx512 on an AVX2 host: a RuntimeError naming avx512f before any kernel runs.
  (Before, the process died of SIGILL at the first kernel.)"""
  with Context(CPU_ARCH="skylake-avx512"):
    with pytest.raises(RuntimeError, match="avx512f"): (Tensor([1.0, 2.0], device=device) + 1).numpy()
    with pytest.raises(RuntimeError, match="avx512f"): Device[device].compiler.check_runnable()
    # building for it still works: the code can be inspected
    sched = (Tensor([1.0, 2.0, 3.0], device=device) * 2).schedule()
    src = Kernel(sched[-1].ast, Device[device].renderer).to_program().src
    assert Device[device].compiler.compile(src)

@pytest.mark.skipif(not X86, reason="x86-64 -march names")
def test_runnable_archs_include_the_baseline_and_native():
  archs = runnable_archs()
  assert archs[-1] == "native" and "x86-64" in archs and set(archs) - {"native"} <= set(KNOWN_X86_ARCHS)
  feats = host_target().features  # (not /proc/cpuinfo: under qemu-user it describes the real CPU, not the emulated one)
  assert ("skylake-avx512" in archs) == ("avx512f" in feats) and ("haswell" in archs) == ("avx2" in feats)

def test_compiler_version_is_in_the_binary_cache_key():
  """A compiler upgrade (gcc 12.2 -> 12.3, a fixed miscompile) must not reuse the old binaries."""
  comp = Device["CPU"].compiler
  version = subprocess.run([comp.cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
  assert version in comp.cache_key("void f(void) {}")
  import llvmlite
  assert llvmlite.__version__ in Device["LLVM"].compiler.cache_key("define void @f() { ret void }")
