"""The CPU device: C kernels built by the system C compiler into a shared object, loaded with ctypes.
The renderer puts `#pragma omp parallel for` on the outermost (global) loop, so kernels use all
cores through OpenMP; the thread count comes from the environment (OMP_NUM_THREADS).

fork: GNU OpenMP (libgomp, what gcc links) is not fork-safe. A thread that ran a parallel region keeps
a pool of worker threads, and a child forked from it inherits the pool's bookkeeping but not the
threads: its next parallel region waits for them forever. So in a child forked after a kernel ran, the
thread that forked (the child's only thread) runs kernels on one thread (omp_set_num_threads(1));
threads the child starts get pools of their own and use every core. LLVM's OpenMP (libomp, what clang
links) re-initializes itself in a child and is left alone."""
from __future__ import annotations
import atexit, ctypes, functools, hashlib, os, shutil, subprocess, tempfile, time, warnings, weakref
from typing import Any, Optional
import numpy as np
from tilecraft.device import Allocator, CompileError, Compiled, Compiler, run_compiler
from tilecraft.helpers import DEBUG, cache_dir
from tilecraft.host import CPUTarget, _compiler_identity, check_runnable, cpu_arch, cpu_target, find_c_compiler
from tilecraft.renderer.c import CRenderer

# How OpenMP's threads wait between kernels. Spinning forever (ACTIVE, or libgomp's default of 300,000
# spins, milliseconds) starves everything else when the cores are shared; sleeping at once (PASSIVE)
# costs a wake-up per parallel region, and a model's call runs dozens of kernels back to back (a woken
# thread is 10-20 us late here, more on a VM whose idle vCPU halted). So a waiting thread spins first,
# then sleeps: 30,000 spins, ~1.5 ms of pause loops (measured), enough to carry a model's call from one
# kernel to the next (a serial copy kernel or the host's own work between launches included) and short
# enough that a process calling now and then gives the cores back. 1,000 spins (~60 us) looked enough
# in a tight loop, but a call that follows any pause (a user's app between requests; a benchmark's
# pause) ran at half speed: the threads fell asleep inside it and each wake-up of a halted vCPU cost
# far more than in the loop. Measured on 2 cores (AVX-512 VM), call after a 50 ms pause vs in a loop:
# SqueezeNet 1,000 spins 12.6-13.2 ms vs 6.9-7.1; 10,000 6.8-8.5; 30,000 5.9-6.3 vs 5.8-6.7. ShuffleNet
# 8.6-10.9 vs 3.8-4.1 ms; 30,000: 3.9-4.7 vs 3.6-3.9. With two busy loops on the same cores: SqueezeNet
# 12.5-16.8 ms (1,000) vs 15.9-16.6 (30,000), within noise; the suite's time is unchanged. Set before the
# first kernel loads libgomp; an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins (OMP_WAIT_POLICY=PASSIVE
# alone: no spin at all).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ: os.environ["GOMP_SPINCOUNT"] = "30000"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# ---- temp files ----------------------------------------------------------------------------------
# Compiled objects pass through files (the compiler's output, the copy dlopen maps). They live in a
# directory of this process's own, tilecraft-<pid>.d in the temp dir, removed when the process exits;
# one left by a process that was killed (kill -9 of a search's parent) is removed by the next process
# that makes its own, as are bare tilecraft-*.so files older than an hour (what versions before left).
_own_dirs: dict[tuple[int, str], str] = {}  # (pid, base dir) -> this process's dir there

def _pid_alive(pid: int) -> bool:
  try: os.kill(pid, 0)
  except ProcessLookupError: return False
  except OSError: return True  # (another user's: alive)
  return True

def _sweep_dead(base: str) -> None:
  """Remove what processes that are gone left in base: their tilecraft-<pid>.d dirs (ours only), and
  bare tilecraft-*.so files an hour old."""
  try: entries = list(os.scandir(base))
  except OSError: return
  uid, now = os.getuid(), time.time()
  for e in entries:
    if not e.name.startswith("tilecraft-"): continue
    try:
      if e.name.endswith(".d") and e.name[10:-2].isdigit() and e.is_dir(follow_symlinks=False):
        if e.stat(follow_symlinks=False).st_uid == uid and not _pid_alive(int(e.name[10:-2])): shutil.rmtree(e.path, ignore_errors=True)
      elif e.name.endswith(".so") and e.is_file(follow_symlinks=False):
        st = e.stat(follow_symlinks=False)
        if st.st_uid == uid and now - st.st_mtime > 3600: os.unlink(e.path)
    except OSError: pass

def own_temp_dir(base: Optional[str] = None) -> str:
  """This process's temp directory under base (default: the system temp dir), made on first use (an
  OSError when it can't be)."""
  base = base or tempfile.gettempdir()
  if (d := _own_dirs.get((os.getpid(), base))) is not None and os.path.isdir(d): return d
  _sweep_dead(base)
  d = os.path.join(base, f"tilecraft-{os.getpid()}.d")
  os.makedirs(d, mode=0o700, exist_ok=True)
  if (os.getpid(), base) not in _own_dirs: atexit.register(_remove_own, os.getpid(), d)
  _own_dirs[(os.getpid(), base)] = d
  return d

def _remove_own(pid: int, d: str) -> None:
  if os.getpid() == pid: shutil.rmtree(d, ignore_errors=True)  # (a forked child inherits the atexit list)

# ---- compiler ------------------------------------------------------------------------------------

_OPENMP_PROBE = "int omp_get_max_threads(void);\nint probe(void) { int n = 0;\n#pragma omp parallel for reduction(+:n)\n" \
                "for (int i = 0; i < 4; i++) n += omp_get_max_threads();\nreturn n; }\n"

@functools.cache
def _accepts_flag(cc: str, flag: str) -> bool:
  try: return subprocess.run([cc, flag, "-x", "c", "-c", "-", "-o", os.devnull], input=b"int x;\n", capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.SubprocessError): return False

class CPUCompiler(Compiler):
  """C source -> shared object bytes, via `cc ... -x c - -o out.so` (source on stdin). The -march is
  `CPU_ARCH` at compile time (part of `flags`, so of the binary cache key)."""
  batch_renames = True
  parallel_compile = True
  base_flags: tuple[str, ...] = ("-O3", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=fast", "-fwrapv")
  def __init__(self, cc: Optional[str] = None):
    self.cc = cc or find_c_compiler()
    # gcc 12 with -march=native on AVX512-FP16 hosts emits masked half stores (vmovsh {k}) that
    # binutils 2.40 rejects: keep half arithmetic off those instructions where the flag is known
    if _accepts_flag(self.cc, "-mno-avx512fp16"): self.base_flags = self.base_flags + ("-mno-avx512fp16",)
    self.openmp: Optional[bool] = None  # None: not known yet; assumed to work until a compile says otherwise
    super().__init__(f"cpu|{_compiler_identity(self.cc)}")
  @property
  def target(self) -> CPUTarget: return cpu_target(self.cc)
  def check_runnable(self) -> None: check_runnable(self.target, cc=self.cc)
  @property
  def flags(self) -> tuple[str, ...]: return self._flags(True)  # requested flags: part of the cache key
  def _flags(self, openmp: bool) -> tuple[str, ...]: return (f"-march={cpu_arch()}",) + self.base_flags + (("-fopenmp",) if openmp else ())
  def _run(self, src: str, openmp: bool) -> tuple[Optional[bytes], str]:
    fd, out = tempfile.mkstemp(suffix=".so", prefix="cc-", dir=(tmp := own_temp_dir()))
    os.close(fd)
    try:
      self.target  # an unknown CPU_ARCH fails here, naming it, not as a compile error of the kernel
      args = [self.cc, *self._flags(openmp), "-x", "c", "-", "-o", out, "-lm"]
      r = run_compiler(args, input=src.encode(), env={**os.environ, "TMPDIR": tmp})  # (the compiler's own temp files too)
      if r.returncode != 0: return None, r.stderr.decode(errors="replace")
      with open(out, "rb") as f: return f.read(), r.stderr.decode(errors="replace")
    finally:
      try: os.unlink(out)
      except OSError: pass
  def _openmp_works(self) -> bool:
    if self.openmp is None:
      self.openmp = self._run(_OPENMP_PROBE, openmp=True)[0] is not None
      if not self.openmp: warnings.warn(f"{self.cc} cannot build with -fopenmp: CPU kernels will run on one core")
    return self.openmp
  def compile(self, src: str) -> bytes:
    lib, err = self._run(src, openmp=self.openmp is not False)
    if lib is None and self.openmp is not False and any(w in err.lower() for w in ("omp", "openmp")) and not self._openmp_works():
      lib, err = self._run(src, openmp=False)
    if lib is None: raise CompileError(f"{os.path.basename(self.cc)} failed to compile the kernel", src, err)
    if DEBUG >= 6 and err: print(err)
    return lib

# ---- memory --------------------------------------------------------------------------------------

class CPUBuffer:
  """CPU memory: a 64-byte aligned numpy byte array (or `mem`, a slice of another's: CPUAllocator.view); `ptr` is what kernels receive (ctypes takes the
  buffer itself for a `c_void_p` argument: `_as_parameter_`)."""
  __slots__ = ("mem", "ptr", "nbytes", "_as_parameter_")
  ALIGN = 64
  def __init__(self, nbytes: int, mem: Optional[np.ndarray] = None):
    if mem is None:
      raw = np.empty(nbytes + self.ALIGN, dtype=np.uint8)
      off = -raw.ctypes.data % self.ALIGN
      mem = raw[off:off + nbytes]
    self.mem, self.nbytes = mem, nbytes
    self.ptr: int = self.mem.ctypes.data
    self._as_parameter_ = self.ptr
  def __repr__(self) -> str: return f"<CPUBuffer {self.nbytes} bytes at {self.ptr:#x}>"

class CPUAllocator(Allocator):
  def alloc(self, nbytes: int) -> CPUBuffer: return CPUBuffer(nbytes)
  def view(self, arena: CPUBuffer, offset: int, nbytes: int) -> CPUBuffer:
    """`nbytes` of `arena` from `offset` as a buffer of their own (engine/memory_plan.py's slices; the
    slice keeps the arena's memory alive)."""
    if offset < 0 or offset + nbytes > arena.nbytes: raise ValueError(f"a slice [{offset}, {offset + nbytes}) of a {arena.nbytes}-byte buffer")
    return CPUBuffer(nbytes, arena.mem[offset:offset + nbytes])
  def free(self, opaque: CPUBuffer) -> None: pass  # the numpy array is freed with the handle
  def copyin(self, dest: CPUBuffer, src: memoryview) -> None:
    s = np.frombuffer(src, dtype=np.uint8)
    if s.size > dest.nbytes: raise ValueError(f"copyin of {s.size} bytes into a {dest.nbytes}-byte buffer")
    dest.mem[:s.size] = s
  def copyout(self, dest: memoryview, src: CPUBuffer) -> None:
    d = np.frombuffer(dest, dtype=np.uint8)
    if d.size > src.nbytes: raise ValueError(f"copyout of {d.size} bytes from a {src.nbytes}-byte buffer")
    d[:] = src.mem[:d.size]

# ---- programs ------------------------------------------------------------------------------------

# dlopen needs the .so in a file on a filesystem that allows mapping it executable: a noexec temp
# dir (a hardened /tmp) fails, so the library goes to the first candidate that works.
def _lib_dirs() -> list[str]:
  """Where a kernel library may be written and mapped, best first: the temp dir, /dev/shm, the cache dir."""
  return [tempfile.gettempdir(), "/dev/shm", os.path.join(cache_dir(), "lib")]

def _is_noexec(d: str) -> bool:
  try: return bool(os.statvfs(d).f_flag & os.ST_NOEXEC)
  except (OSError, AttributeError): return False

_lib_dir: Optional[str] = None  # the directory the last library loaded from
# loaded libraries by content: the kernels of one batch (Compiler.compile_batch) share one mapping
_loaded: "weakref.WeakValueDictionary[bytes, ctypes.CDLL]" = weakref.WeakValueDictionary()

def load_library(lib: bytes) -> ctypes.CDLL:
  """dlopen the shared object `lib` from a temp file (unlinked at once: the mapping stays valid),
  in the first directory where that works; the same bytes loaded again (while the first handle lives)
  give the same handle. OSError naming every directory tried when none does (also what a damaged
  library gives)."""
  digest = hashlib.sha256(lib).digest()
  if (handle := _loaded.get(digest)) is not None: return handle
  handle = _load_library(lib)
  _loaded[digest] = handle
  return handle

def _load_library(lib: bytes) -> ctypes.CDLL:
  global _lib_dir
  dirs = ([_lib_dir] if _lib_dir else []) + [d for d in _lib_dirs() if d != _lib_dir]
  why = []
  for d in dirs:
    if d != _lib_dir and _is_noexec(d):
      why.append(f"{d}: mounted noexec")
      continue
    try:
      os.makedirs(d, exist_ok=True)
      fd, path = tempfile.mkstemp(suffix=".so", prefix="lib-", dir=own_temp_dir(d))
    except OSError as e:
      why.append(f"{d}: {e}")
      continue
    try:
      with os.fdopen(fd, "wb") as f: f.write(lib)
      handle = ctypes.CDLL(path)
    except OSError as e:
      why.append(f"{d}: {e}")
      continue
    finally:
      try: os.unlink(path)
      except OSError: pass
    _lib_dir = d
    return handle
  raise OSError("could not load a CPU kernel library from any directory (" + "; ".join(why) + ")")

# ---- fork (see the module docstring) ----------------------------------------------------------------
_ran = False  # a kernel ran in this process (so maybe an OpenMP pool exists in the thread that ran it)
_omp_lib: Optional[ctypes.CDLL] = None  # a loaded kernel library: symbol lookups through it reach its OpenMP runtime

def _kernel_ran() -> None:
  global _ran
  _ran = True

def _after_fork_in_child() -> None:
  if not _ran or _omp_lib is None: return
  try:
    if hasattr(_omp_lib, "__kmpc_fork_call"): return  # LLVM's libomp: fork-safe
    _omp_lib.omp_set_num_threads(ctypes.c_int(1))
  except AttributeError: pass  # built without OpenMP: no pool

if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork_in_child)

class CPUProgram:
  """A loaded kernel. Called with buffer handles, then the symbolic values as `long long`s."""
  def __init__(self, name: str, lib: bytes):
    global _omp_lib
    self.name = name
    check_runnable(cpu_target())  # built for the CPU_ARCH in force: an ISA this host lacks is an error, not a SIGILL
    self.lib = _omp_lib = load_library(lib)
    try: self.fxn = getattr(self.lib, name)
    except AttributeError: raise RuntimeError(f"compiled CPU library has no function named {name!r}") from None
    self.fxn.restype = None
    self._typed: Any = None  # the function again, with argtypes: pointers only (what launch calls)
  def __call__(self, *bufs: Any, global_size: Optional[list[int]] = None, local_size: Optional[list[int]] = None,
               vals: tuple[int, ...] = (), wait: bool = True) -> Optional[float]:
    args = [ctypes.c_void_p(b if isinstance(b, int) else b.ptr) for b in bufs] + [ctypes.c_int64(v) for v in vals]
    if not _ran: _kernel_ran()
    st = time.perf_counter()
    self.fxn(*args)
    return time.perf_counter() - st if wait else None
  def launch(self, *bufs: CPUBuffer) -> None:
    """Run on CPUBuffers, for a kernel without Variables: ctypes converts each buffer (typed c_void_p)
    in C, so a launch is one foreign call."""
    if (f := self._typed) is None or len(f.argtypes) != len(bufs):
      f = self._typed = self.lib[self.name]  # (a new function object: fxn's untyped calls stay as they are)
      f.restype, f.argtypes = None, [ctypes.c_void_p] * len(bufs)
      if not _ran: _kernel_ran()
    f(*bufs)
  def __repr__(self) -> str: return f"<CPUProgram {self.name}>"

def open_device() -> Compiled:
  """The CPU device (device.py's registry calls this)."""
  return Compiled("CPU", CPUAllocator(), CRenderer, CPUCompiler(), CPUProgram)
