"""The LLVM device: LLVM IR (tilecraft.renderer.llvmir) optimized with LLVM's O3 pipeline (the new
pass builder) and compiled for the host CPU by llvmlite, in process: no external compiler. The
compiler's product is an object file, so it is cached on disk like the CPU device's shared
objects (Compiler.compile_cached); the runtime links each object into its own library of one
process-wide ORC JIT and calls the kernel through ctypes.

All cores: a kernel whose outermost loop is marked parallel (`@tc_parallel`, set by the renderer
for the same kernels the C renderer gives `#pragma omp parallel for`) takes (chunk, chunks) and
runs only its share of that loop. The runtime calls it once per chunk from a pool of threads;
ctypes releases the GIL during each call, so the chunks run at the same time. The thread count
is LLVM_THREADS, else OMP_NUM_THREADS, else the CPUs this process may run on."""
from __future__ import annotations
import ctypes, functools, itertools, os, queue, threading, time
from typing import Any, Callable, Optional
from tilecraft.device import CompileError, Compiled, Compiler
from tilecraft.helpers import DEBUG, SettingError, getenv, usable_cores
from tilecraft.host import CPUTarget, check_runnable, cpu_arch, cpu_target

try: import llvmlite
except ImportError as e: raise ImportError("the LLVM device needs llvmlite: pip install 'tilecraft[llvm]'") from e
import llvmlite.binding as llvm

def _init_llvm() -> None:
  for init in ("initialize_native_target", "initialize_native_asmprinter"):  # llvmlite >= 0.44 initializes LLVM itself
    try: getattr(llvm, init)()
    except (AttributeError, RuntimeError): pass

@functools.lru_cache(maxsize=None)
def _target_machine(arch: str) -> Any:
  _init_llvm()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  cpu, features = (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()) if arch == "native" else (arch, "")
  return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic", codemodel="jitdefault")

def target_machine() -> Any:
  """The LLVM target of `CPU_ARCH`, the same -march names as the C device (haswell, x86-64-v2,
  skylake-avx512, ...); default native: this host's CPU and features."""
  return _target_machine(cpu_arch())

def _check_runnable() -> None:
  """RuntimeError naming the missing ISA extensions when this host can't run code built for CPU_ARCH."""
  if (arch := cpu_arch()) == "native": return
  try: target: CPUTarget = cpu_target()  # what the -march enables, as the C compiler reports it
  except RuntimeError: raise RuntimeError(f"CPU_ARCH={arch}: without a C compiler the LLVM device can't tell whether this host runs it; unset CPU_ARCH") from None
  check_runnable(target)

class LLVMCompiler(Compiler):
  """LLVM IR -> optimized object code (bytes) for the CPU_ARCH target (default: the host CPU)."""
  def __init__(self) -> None:
    tm = target_machine()
    # the host's CPU and features stay in the identity: a native build is only valid on the same kind of CPU
    super().__init__(f"llvm|llvmlite {llvmlite.__version__}|llvm {'.'.join(map(str, llvm.llvm_version_info))}|{tm.triple}|"
                     f"{llvm.get_host_cpu_name()}|{llvm.get_host_cpu_features().flatten()}")
  @property
  def flags(self) -> tuple[str, ...]: return ("-O3", "fp-contract=fast", f"cpu={cpu_arch()}")  # what compile does: part of the cache key
  def check_runnable(self) -> None: _check_runnable()
  def compile(self, src: str) -> bytes:
    tm = target_machine()
    try:
      mod = llvm.parse_assembly(src)
      mod.verify()
    except RuntimeError as e: raise CompileError("LLVM rejected the kernel's IR", src, str(e)) from e
    mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization, pto.slp_vectorization, pto.loop_unrolling = True, True, True
    pb = llvm.PassBuilder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    if DEBUG >= 7: print(str(mod))
    return bytes(tm.emit_object(mod))

# ---- running -------------------------------------------------------------------------------------

_jit_state: dict[int, Any] = {}  # pid -> LLJIT: a forked child builds its own
_lib_ids = itertools.count()

def _jit() -> Any:
  if (j := _jit_state.get(os.getpid())) is None: j = _jit_state[os.getpid()] = llvm.create_lljit_compiler(_target_machine("native"))
  return j

def thread_count() -> int:
  """Threads a parallel kernel runs on: LLVM_THREADS, else OMP_NUM_THREADS, else the usable cores.
  A count below 1 or over max(256, 8 x the cores) is a SettingError naming the variable."""
  for name in ("LLVM_THREADS", "OMP_NUM_THREADS"):
    if (n := getenv(name, 0)):
      if n < 1 or (n > 256 and n > 8 * usable_cores()):
        cores = usable_cores()
        raise SettingError(f"{name}={n} is not a usable thread count for LLVM kernels: it must be 1 to {max(256, 8 * cores)} "
                           f"(this machine has {cores} cores)")
      return n
  return usable_cores()

class ChunkPool:
  """Runs fn(i) for i in range(n) on n threads at once: the caller runs chunk 0, n-1 workers the
  rest. Workers sleep on queues between calls; one call runs at a time."""
  def __init__(self, n: int):
    self.n = n
    self.lock = threading.Lock()
    self.jobs: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(n - 1)]
    self.done: queue.SimpleQueue = queue.SimpleQueue()
    for q in self.jobs: threading.Thread(target=self._work, args=(q,), daemon=True, name="tilecraft-llvm").start()
  def _work(self, q: queue.SimpleQueue) -> None:
    while True:
      fn, i = q.get()
      try: fn(i); self.done.put(None)  # noqa: E702
      except BaseException as e: self.done.put(e)  # noqa: BLE001
  def run(self, fn: Callable[[int], None]) -> None:
    with self.lock:
      for i, q in enumerate(self.jobs, start=1): q.put((fn, i))
      err: Optional[BaseException] = None
      try: fn(0)
      except BaseException as e: err = e  # noqa: BLE001
      for _ in self.jobs: err = err or self.done.get()
      if err is not None: raise err

_pools: dict[tuple[int, int], ChunkPool] = {}

def chunk_pool(n: int) -> ChunkPool:
  key = (os.getpid(), n)
  if (p := _pools.get(key)) is None: p = _pools[key] = ChunkPool(n)
  return p

class LLVMProgram:
  """A linked kernel. Called with buffer handles, then the symbolic values as int64s."""
  def __init__(self, name: str, lib: bytes):
    self.name = name
    _check_runnable()  # built for CPU_ARCH: an ISA this host lacks is an error, not a SIGILL
    try:
      self.tracker = llvm.JITLibraryBuilder().add_object_img(lib).add_current_process().export_symbol(name).export_symbol("tc_parallel") \
                        .link(_jit(), f"tilecraft_{next(_lib_ids)}_{name}")
    except RuntimeError as e: raise RuntimeError(f"the LLVM JIT could not link kernel {name!r}: {e}") from e
    self.addr = self.tracker[name]
    self.parallel = bool(ctypes.c_int32.from_address(self.tracker["tc_parallel"]).value)
    self._fns: dict[tuple[int, int], Any] = {}
  def _fn(self, nbufs: int, nvals: int) -> Any:
    if (f := self._fns.get((nbufs, nvals))) is None:
      f = self._fns[(nbufs, nvals)] = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs + [ctypes.c_int64] * nvals + [ctypes.c_int32] * 2))(self.addr)
    return f
  def __call__(self, *bufs: Any, global_size: Optional[list[int]] = None, local_size: Optional[list[int]] = None,
               vals: tuple[int, ...] = (), wait: bool = True) -> Optional[float]:
    fn = self._fn(len(bufs), len(vals))
    args = [ctypes.c_void_p(b if isinstance(b, int) else b.ptr) for b in bufs] + [ctypes.c_int64(v) for v in vals]
    n = thread_count() if self.parallel else 1
    st = time.perf_counter()
    if n == 1: fn(*args, 0, 1)
    else: chunk_pool(n).run(lambda i: fn(*args, i, n))
    return time.perf_counter() - st if wait else None
  def __repr__(self) -> str: return f"<LLVMProgram {self.name}{' (parallel)' if self.parallel else ''}>"

def open_device() -> Compiled:
  """The LLVM device (device.py's registry calls this)."""
  from tilecraft.runtime.cpu import CPUAllocator
  def renderer() -> Any:
    from tilecraft.renderer.llvmir import LLVMRenderer
    return LLVMRenderer()
  return Compiled("LLVM", CPUAllocator(), renderer, LLVMCompiler(), LLVMProgram)
