"""Facts about the host machine that both the C renderer and the CPU runtime need: which C
compiler builds kernels, and the SIMD ISA it targets for `CPU_ARCH` (the renderer sizes vectors by
it, the runtime passes it as -march). Below both in the import graph."""
from __future__ import annotations
import functools, os, platform, re, shutil, subprocess, warnings
from dataclasses import dataclass
from typing import Optional
from tilecraft.helpers import getenv

# ---- compiler ------------------------------------------------------------------------------------

_which = functools.cache(shutil.which)  # PATH lookups: the renderer asks for the target (so the compiler) per kernel

def find_c_compiler() -> str:
  """`CPU_COMPILER=clang|gcc` if that compiler exists, else `$CC`, else gcc (or cc)."""
  if (choice := getenv("CPU_COMPILER", "")):
    if (path := _which(choice)): return path
    warnings.warn(f"CPU_COMPILER={choice} not found, falling back to {os.environ.get('CC') or 'gcc'}")
  for cc in (getenv("CC", ""), "gcc", "cc"):
    if cc and (path := _which(cc)): return path
  raise RuntimeError("no C compiler found: install gcc or set CC")

@functools.cache
def _compiler_identity(cc: str) -> str:
  """Compiler version plus host CPU: -march=native binaries are only valid on the same kind of CPU."""
  try: version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
  except (OSError, IndexError, subprocess.SubprocessError): version = "unknown"
  cpu = platform.machine()
  try:
    with open("/proc/cpuinfo") as f: info = f.read()
    cpu += "|" + "|".join(next((l for l in info.splitlines() if l.startswith(k)), "") for k in ("model name", "flags"))
  except OSError: pass
  return f"{os.path.basename(cc)}|{version}|{cpu}"

# ---- target ISA ----------------------------------------------------------------------------------
# CPU_ARCH (env or Context; default native) is the compiler's -march: CPU_ARCH=haswell builds AVX2
# kernels on an AVX-512 host, so the AVX2 code paths can be built, measured and tested anywhere.
# The vector width the heuristics assume comes from what the compiler enables for that -march.

@dataclass(frozen=True)
class CPUTarget:
  arch: str          # the -march value
  isa: str           # the widest SIMD the compiler enables for it: "AVX-512", "AVX2", "AVX", "SSE", "NEON", "scalar"
  vector_width: int  # float32 lanes of one SIMD register
  def __str__(self) -> str: return f"{self.arch} ({self.isa}, {self.vector_width} float lanes)"

def cpu_arch() -> str:
  """The -march CPU kernels are built for: `CPU_ARCH` (env or Context), default native."""
  arch = str(getenv("CPU_ARCH", "") or "native")
  if not _valid_arch(arch): raise ValueError(f"CPU_ARCH={arch!r} is not a valid -march name")
  return arch

@functools.lru_cache(maxsize=64)
def _valid_arch(arch: str) -> bool: return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", arch) is not None  # (asked on every realize)

@functools.cache
def _arch_target(cc: str, arch: str) -> CPUTarget:
  try: r = subprocess.run([cc, f"-march={arch}", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.SubprocessError) as e: raise ValueError(f"CPU_ARCH={arch!r}: could not run {cc}: {e}") from None
  if r.returncode != 0:
    err = next((l for l in r.stderr.splitlines() if "march" in l), r.stderr.strip()[:300])
    raise ValueError(f"CPU_ARCH={arch!r}: {os.path.basename(cc)} does not accept -march={arch}: {err}")
  macros = {l.split()[1] for l in r.stdout.splitlines() if l.startswith("#define ")}
  for macro, isa, width in (("__AVX512F__", "AVX-512", 16), ("__AVX2__", "AVX2", 8), ("__AVX__", "AVX", 8), ("__ARM_NEON", "NEON", 4), ("__SSE2__", "SSE", 4)):
    if macro in macros: return CPUTarget(arch, isa, width)
  return CPUTarget(arch, "scalar", 4)

def cpu_target(cc: Optional[str] = None) -> CPUTarget:
  """The ISA the CPU device targets now (per `CPU_ARCH`), as the C compiler sees that -march."""
  return _arch_target(cc or find_c_compiler(), cpu_arch())

@functools.cache
def host_vector_width() -> int:
  """float32 lanes of this host's widest SIMD (for the LLVM JIT, which targets the host; the C
  renderer follows CPU_ARCH instead)."""
  try:
    with open("/proc/cpuinfo") as f: flags = next((l for l in f if l.startswith("flags")), "").split()
  except OSError: return 4
  return 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
