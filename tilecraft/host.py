"""Facts about the host machine that the CPU renderers (C, LLVM IR) and runtimes need: which C
compiler builds kernels, the SIMD ISA it targets for `CPU_ARCH` (the renderers size vectors by it,
the C runtime passes it as -march, the LLVM JIT takes it as its target CPU), and whether this host
can execute that ISA (`check_runnable`: code for an ISA the host lacks may be built and inspected,
never run). Below the renderers and runtimes in the import graph."""
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
  features: frozenset[str] = frozenset()  # ISA extensions it enables, named as in /proc/cpuinfo-style lower case: "avx2", "f16c", "avx512f"
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
  defines = dict((l.split() + [""])[1:3] for l in r.stdout.splitlines() if l.startswith("#define "))
  macros = set(defines)
  # an ISA extension shows as an upper-case macro defined to 1 (__AVX512F__, __SSE4_2__, __F16C__)
  features = frozenset(m[2:-2].lower() for m, v in defines.items()
                       if v == "1" and re.fullmatch(r"__[A-Z][A-Z0-9_]*__", m) and not m.startswith(_NOT_FEATURE_PREFIXES))
  for macro, isa, width in (("__AVX512F__", "AVX-512", 16), ("__AVX2__", "AVX2", 8), ("__AVX__", "AVX", 8), ("__ARM_NEON", "NEON", 4), ("__SSE2__", "SSE", 4)):
    if macro in macros: return CPUTarget(arch, isa, width, features)
  return CPUTarget(arch, "scalar", 4, features)

# predefined macros defined to 1 that are the language's, the ABI's or the compiler's, not ISA extensions
_NOT_FEATURE_PREFIXES = ("__STDC", "__GCC", "__GNUC", "__ELF", "__LP64", "__OPTIMIZE", "__NO_INLINE", "__PIC", "__PIE", "__CHAR",
                         "__ORDER", "__SIZEOF", "__FLT", "__DBL", "__LDBL", "__DEC", "__SSE_MATH", "__SSE2_MATH", "__MMX_WITH_SSE",
                         "__SEG_", "__CET", "__SHSTK", "__HAVE_", "__REGISTER", "__USER_LABEL", "__VERSION", "__BIGGEST", "__BYTE_ORDER",
                         "__FINITE", "__FLOAT_WORD")

def cpu_target(cc: Optional[str] = None) -> CPUTarget:
  """The ISA the CPU device targets now (per `CPU_ARCH`), as the C compiler sees that -march."""
  return _arch_target(cc or find_c_compiler(), cpu_arch())

def host_target(cc: Optional[str] = None) -> CPUTarget:
  """The ISA of the CPU this process runs on, as the C compiler sees `-march=native`."""
  return _arch_target(cc or find_c_compiler(), "native")

# A kernel built for an ISA the host lacks dies of SIGILL at its first instruction the host can't
# decode, taking the Python process with it. The runtimes ask first, before loading a kernel.
def missing_features(target: CPUTarget, cc: Optional[str] = None) -> list[str]:
  """The ISA extensions `target` enables that this host's CPU does not have (empty: it can run here).
  Only x86-64 hosts are checked (elsewhere -march names are not comparable this way)."""
  if target.arch == "native" or platform.machine() not in ("x86_64", "AMD64"): return []
  return sorted(f for f in target.features - host_target(cc).features if f.startswith(_CODEGEN_FEATURES))

# extensions a compiler uses in plain C (vectorizing, bit tricks) without intrinsics: the ones a
# kernel can contain. Others (sgx, rdrnd, xsave, clwb, ...) differ between a CPU model and a VM's
# view of it but never appear in a kernel.
_CODEGEN_FEATURES = ("sse", "ssse3", "avx", "fma", "f16c", "bmi", "lzcnt", "popcnt", "movbe", "abm", "xop", "amx", "mmx", "3dnow", "adx")

def check_runnable(target: CPUTarget, what: str = "CPU_ARCH", cc: Optional[str] = None) -> None:
  """Raise RuntimeError naming the missing extensions when this host cannot execute code built for `target`."""
  if (missing := missing_features(target, cc)):
    raise RuntimeError(f"{what}={target.arch} builds code for ISA extensions this host's CPU does not have: {', '.join(missing)}; "
                       f"running it would crash the process (SIGILL). Unset {what}, or pick one this host can run "
                       f"(`tilecraft devices` lists them); code for {target.arch} can still be rendered and compiled for inspection")

# -march names `tilecraft devices` checks against the host (x86-64 levels, then common CPUs)
KNOWN_X86_ARCHS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "haswell", "skylake", "skylake-avx512", "icelake-server",
                   "sapphirerapids", "znver2", "znver3", "znver4")

def runnable_archs(cc: Optional[str] = None) -> list[str]:
  """The KNOWN_X86_ARCHS this host can execute (and the compiler knows), plus native."""
  out = []
  for arch in KNOWN_X86_ARCHS:
    try: t = _arch_target(cc or find_c_compiler(), arch)
    except ValueError: continue
    if not missing_features(t, cc): out.append(arch)
  return out + ["native"]

@functools.cache
def host_vector_width() -> int:
  """float32 lanes of this host's widest SIMD (for the LLVM JIT, which targets the host; the C
  renderer follows CPU_ARCH instead)."""
  try:
    with open("/proc/cpuinfo") as f: flags = next((l for l in f if l.startswith("flags")), "").split()
  except OSError: return 4
  return 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
