"""CPU_ARCH: the -march CPU kernels are built for, and the vector width the heuristics assume."""
import shutil, subprocess
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.host import cpu_arch, cpu_target

def _host_has(flag: str) -> bool:
  with open("/proc/cpuinfo") as f: return flag in next((l for l in f if l.startswith("flags")), "").split()

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
  from tilecraft.engine.realize import get_runner
  sched = (Tensor(rng.random(256, dtype=np.float32)) * 3).schedule()
  native = get_runner(sched[-1].ast, "CPU")
  with Context(CPU_ARCH="haswell"): hsw = get_runner(sched[-1].ast, "CPU")
  assert hsw is not native and get_runner(sched[-1].ast, "CPU") is native
