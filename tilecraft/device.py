"""Devices: the registry (`Device`), memory (`Allocator`, `Buffer`), compilers (binaries cached by
diskcache.py), and `CompiledRunner`, which launches a rendered `Program` on `Buffer`s."""
from __future__ import annotations
import atexit, bisect, concurrent.futures, contextvars, importlib, os, re, subprocess, warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence, Union
import numpy as np
from tilecraft.dtype import ImageDType
from tilecraft.diskcache import diskcache_drop, diskcache_get, diskcache_has, diskcache_put, disk_cache_off
from tilecraft.helpers import CACHELEVEL, DEBUG, SettingError, getenv, megabytes_setting, prod, settings_memo, usable_cores

if TYPE_CHECKING:
  from tilecraft.dtype import DType
  from tilecraft.renderer import Program, Renderer

# ---- errors --------------------------------------------------------------------------------------

class CompileError(RuntimeError):
  """A kernel failed to compile. The message holds the compiler's output and the numbered source."""
  def __init__(self, msg: str, src: str = "", stderr: str = ""):
    self.msg, self.src, self.stderr = msg, src, stderr
    numbered = "\n".join(f"{i:4d} | {line}" for i, line in enumerate(src.splitlines(), start=1))
    super().__init__(f"{msg}\n--- compiler output ---\n{stderr.rstrip()}\n--- source ---\n{numbered}")
  def __reduce__(self) -> tuple: return (CompileError, (self.msg, self.src, self.stderr))  # survives worker processes

_CRASH_BANNERS = ("PLEASE submit a bug report", "internal compiler error")  # LLVM's and GCC's crash handlers

def _crashed(res: subprocess.CompletedProcess) -> bool:
  out = res.stderr if isinstance(res.stderr, str) else (res.stderr or b"").decode(errors="replace")
  return res.returncode < 0 or (res.returncode != 0 and any(b in out for b in _CRASH_BANNERS))

def run_compiler(args: list[str], input: Union[str, bytes, None] = None, timeout: Optional[float] = None,
                 env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
  """Run an external compiler (output captured; text when `input` is text or absent). A compiler that
  crashed -- killed by a signal, or printing LLVM's or GCC's crash banner -- is run once more, with a
  warning: such a crash is a bug of the compiler that need not repeat (clang-15 once corrupted its heap
  on a large HIP module under load, and compiled the same module cleanly after) and says nothing about
  the source. A second crash is returned as it is, so the caller reports it with the source."""
  text = not isinstance(input, bytes)
  res = subprocess.run(args, input=input, capture_output=True, text=text, timeout=timeout, env=env)
  if _crashed(res):
    warnings.warn(f"{os.path.basename(args[0])} crashed (exit {res.returncode}); running it once more")
    res = subprocess.run(args, input=input, capture_output=True, text=text, timeout=timeout, env=env)
  return res

class DeviceUnavailable(RuntimeError):
  """A known device that can't be opened here (not implemented yet, or its driver is missing)."""

# ---- compilers -----------------------------------------------------------------------------------

_ATTRIBUTE = re.compile(r"__attribute__\s*\(\(")
_FUNCTION_DEFINITION = re.compile(r"^(?!typedef\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{")

def _drop_attributes(line: str) -> str:
  """line without its `__attribute__((...))` groups (their parentheses nest)."""
  while (m := _ATTRIBUTE.search(line)):
    depth, i = 2, m.end()
    while i < len(line) and depth:
      depth += {"(": 1, ")": -1}.get(line[i], 0)
      i += 1
    line = line[:m.start()] + line[i:]
  return line

def defined_functions(src: str) -> list[str]:
  """The names of the functions a C-dialect source defines at file scope (the kernel and its helpers):
  definitions start a line with their return type and open their body on that line, as every C-style
  renderer here writes them. Declarations of outside functions (no body) are not included."""
  names = []
  for line in src.split("\n"):
    if not line[:1].isalpha() and line[:1] != "_": continue  # (indented code, preprocessor lines, braces, comments)
    if (m := _FUNCTION_DEFINITION.match(_drop_attributes(line).lstrip())) and m.group(1) not in names: names.append(m.group(1))
  return names

class Compiler:
  """Turns kernel source into a binary. `cachekey` names the compiler (None: never cached).
  `compile_batch` puts many kernels in one translation unit, each isolated from the others: compilers
  of C++ dialects set `batch_wrap` (a namespace per kernel), those of C dialects set
  `batch_renames` (every function a kernel's source defines, the kernel included, is renamed by the
  preprocessor to `<name>__b<i>`: `batch_name`); `error_line` is a regex for the line numbers of errors."""
  flags: tuple[str, ...] = ()
  batch_wrap: Optional[str] = None
  batch_renames: bool = False
  parallel_compile: bool = False  # compile() may run in several threads at once (it runs a separate process)
  batch_builds: bool = False  # a compile_batch run costs about what compiling one kernel does (PoCL: the build, not the kernels, is the cost)
  error_line: str = r"(?:\((\d+)\)|:(\d+):\d+): (?:fatal )?error"
  def __init__(self, cachekey: Optional[str] = None):
    self.cachekey = cachekey
    if cachekey is not None and CACHELEVEL > 0: disk_cache_off()  # find out (and warn) now, before worker processes start
  def compile(self, src: str) -> bytes: raise NotImplementedError(f"{type(self).__name__} cannot compile")
  def check_runnable(self) -> None:
    """Raise (naming why) when this host cannot execute what the compiler builds under the current
    settings, e.g. a CPU ISA it lacks: callers ask before running anything. Most compilers can't tell."""
  def cache_key(self, src: str) -> str:
    """The full key of src's binary: compiler identity, flags and the source itself."""
    return "\0".join([self.cachekey or "", " ".join(self.flags), src])
  def is_cached(self, src: str) -> bool:
    """Whether src's binary is in the disk cache already (compile_cached would read it, not compile)."""
    return self.cachekey is not None and diskcache_has("binaries", self.cache_key(src))
  def compile_cached(self, src: str) -> bytes:
    if self.cachekey is None: return self.compile(src)
    key = self.cache_key(src)
    if (lib := diskcache_get("binaries", key)) is not None: return lib
    lib = self.compile(src)
    diskcache_put("binaries", key, lib)
    return lib
  def compile_batch(self, srcs: list[str]) -> bytes:
    """Compile many kernels in one compiler run (disk-cached like one source): each source is isolated
    by `batch_part` so their helpers don't collide (in a namespace: kernel names must be unique; by
    renaming: the i-th kernel's symbol is `batch_name(i, name)`). A failure raises CompileError with the
    source of the (first) kernel the errors are in."""
    if self.batch_wrap is None and not self.batch_renames: raise NotImplementedError(f"{type(self).__name__} can't compile kernels in batches")
    parts, starts, line = [], [], 1
    for i, s in enumerate(srcs):
      part = self.batch_part(i, s)
      starts.append(line)
      parts.append(part)
      line += part.count("\n") + 1
    try: return self.compile_cached("\n".join(parts) + "\n")
    except CompileError as e:
      lines = [int(a or b) for a, b in re.findall(self.error_line, e.stderr)]
      bad = sorted({bisect.bisect_right(starts, n) - 1 for n in lines if n >= 1})
      if not bad: raise
      raise CompileError(f"{len(bad)} of {len(srcs)} kernels in a batch failed to compile (kernels {bad[:10]}); the first one's source:",
                         srcs[bad[0]], e.stderr) from None
  def build_many(self, progs: Iterable[tuple[str, str]], max_batch: int, parallel: bool = False,
                 singles: bool = True, count: Optional[int] = None) -> list[Optional[tuple[bytes, Optional[str]]]]:
    """Build many programs ((source, kernel name) each) in few compiler runs: batches of up to
    max_batch (compile_batch, where the compiler can batch: else one run each). With `parallel`, a
    compiler that runs as a separate process (parallel_compile) gets at least one batch per core (of
    two kernels or more) and builds them in threads at once, each under the caller's settings. A
    program whose own binary is in the disk cache is read from there, not built again in a batch.
    `progs` may be a generator that renders each program as it is asked for, with `count` (how many
    it yields): then each batch starts building as soon as its last program is rendered, and the
    compiler's runs overlap the rendering of the rest (engine/realize.py: compile_ahead, a model's first
    call). Returns per program (binary, the kernel's symbol in it or None for its own name), or None
    where its batch failed to build (compiled alone, the failing one reports its error with its
    source) or, without `singles`, where it would have been built alone."""
    if count is None:
      progs = list(progs)
      count = len(progs)
    if self.batch_renames:  # (C dialects: each kernel's symbol in the batch is batch_name's)
      n = -(-count // max_batch) if count else 0
      if parallel and self.parallel_compile: n = max(n, min(usable_cores(), count // 2))
      size = -(-count // max(n, 1))
    else: n, size = count, 1
    got: list[tuple[str, str]] = []
    out: list[Optional[tuple[bytes, Optional[str]]]] = []
    def build(batch: list[int]) -> Optional[bytes]:
      try: return self.compile_batch([got[i][0] for i in batch]) if len(batch) > 1 else self.compile_cached(got[batch[0]][0])
      except Exception: return None  # noqa: BLE001 -- (see above)
    pool = concurrent.futures.ThreadPoolExecutor(min(n, usable_cores())) if parallel and self.parallel_compile and n > 1 else None
    started: list[tuple[list[int], Any]] = []  # (batch, its future or its binary)
    def start(batch: list[int]) -> None:
      if not batch or (not singles and len(batch) == 1): return
      # (settings are per thread: each compile sees the caller's)
      started.append((batch, pool.submit(contextvars.copy_context().run, build, batch) if pool is not None else build(batch)))
    batch: list[int] = []
    try:
      for src, name in progs:
        i = len(got)
        got.append((src, name))
        out.append(None)
        if self.is_cached(src):
          try: out[i] = (self.compile_cached(src), None)
          except Exception: pass  # noqa: BLE001 -- (compiled alone later, which reports it)
          continue
        batch.append(i)
        if len(batch) == size:
          start(batch)
          batch = []
      start(batch)
      for b, lib in started:
        if pool is not None: lib = lib.result()
        if lib is None: continue
        for j, i in enumerate(b): out[i] = (lib, self.batch_name(j, got[i][1]) if len(b) > 1 else None)
    finally:
      if pool is not None: pool.shutdown(wait=True)
    return out
  def batch_part(self, i: int, src: str) -> str:
    """src as the i-th kernel of a batch (see compile_batch)."""
    src = src.rstrip("\n")
    if not self.batch_renames: return self.batch_wrap.format(i=i, src=src) if self.batch_wrap is not None else src
    names = defined_functions(src)
    return "\n".join([f"#define {n} {self.batch_name(i, n)}" for n in names] + [src] + [f"#undef {n}" for n in names])
  def batch_name(self, i: int, name: str) -> str:
    """The symbol the function `name` of the i-th kernel of a batch has in its binary (C dialects)."""
    return f"{name}__b{i}"
  def compile_and_load(self, src: str, load: Callable[[bytes], Any]) -> tuple[bytes, Any]:
    """(binary, load(binary)). A cached binary that fails to load (a stale or damaged entry, whatever
    its checksum says) is a miss: it is dropped and src is compiled again; only a fresh binary that
    fails to load raises. A fresh binary is cached once it has loaded."""
    if self.cachekey is None:
      lib = self.compile(src)
      return lib, load(lib)
    key = self.cache_key(src)
    if (lib := diskcache_get("binaries", key)) is not None:
      try: return lib, load(lib)
      except Exception as e:  # noqa: BLE001 -- any failure to load a cached binary means: rebuild it
        if DEBUG >= 1: print(f"diskcache: a cached binary failed to load ({type(e).__name__}: {e}); recompiling")
        diskcache_drop("binaries", key)
    lib = self.compile(src)
    prg = load(lib)
    diskcache_put("binaries", key, lib)
    return lib, prg

# ---- memory --------------------------------------------------------------------------------------

class Allocator:
  """Device memory. The opaque handle returned by alloc is what the runtime's programs take.
  A device implements this; `Compiled` wraps it in a CachingAllocator, which is what Buffers use."""
  def alloc(self, nbytes: int) -> Any: raise NotImplementedError
  def alloc_image(self, dt: Any) -> Any:
    """An image buffer of the ImageDType dt (devices with images override this)."""
    raise NotImplementedError(f"{type(self).__name__}: this device has no image buffers ({dt!r}); images are an OPENCL feature")
  def free(self, opaque: Any) -> None: pass
  def copyin(self, dest: Any, src: memoryview) -> None: raise NotImplementedError
  def copyout(self, dest: memoryview, src: Any) -> None: raise NotImplementedError

@settings_memo  # (every free asks for the bound)
def alloc_cache_bytes() -> int:
  """The caching allocator's bound: `ALLOC_CACHE_MB` (default 512; 0 turns the cache off)."""
  return megabytes_setting("ALLOC_CACHE_MB", 512)

class CachingAllocator(Allocator):
  """Keeps freed device memory for reuse by size: `free` parks a handle in a pool keyed by its byte
  size, `alloc` of the same size takes it back (a hit) instead of asking the device (a miss). The
  pool holds at most `cap_bytes` (default: ALLOC_CACHE_MB), least recently used sizes go first;
  when the device fails an allocation the pool is flushed and the allocation retried once.

  Reuse is what makes a user's loop cheap: fresh CPU memory costs a page fault per 4 KiB on first
  touch, often more than the kernel writing it. A handle is in the pool only after its Buffer died,
  and no user-visible array shares memory with a Buffer (`Buffer.numpy()` copies), so pooled memory
  is never aliased. Runtimes run on one in-order queue, so memory freed after a kernel was enqueued
  is reused only by work queued after it. Anything else (copyin, copyout, a device's own extras)
  goes to the wrapped allocator."""
  def __init__(self, raw: Allocator, name: str = "", cap_bytes: Optional[int] = None):
    self.raw, self.name, self._cap = raw, name, cap_bytes
    # (nbytes, image dtype or None) -> freed handles; dict order = least recently used size first. An
    # image is only reused as an image of the same dtype (its texel layout is part of the handle).
    self._pool: dict[tuple[int, Any], list[Any]] = {}
    self._pooled: set[int] = set()  # ids of the pooled handles (they are alive: the pool holds them)
    self.pooled_bytes = self.hits = self.misses = self.flushes = 0
  @property
  def cap_bytes(self) -> int: return self._cap if self._cap is not None else alloc_cache_bytes()
  def alloc(self, nbytes: int, image: Any = None) -> Any:
    key = (nbytes, image)
    if (handles := self._pool.get(key)):
      h = handles.pop()
      if not handles: del self._pool[key]
      self._pooled.discard(id(h))
      self.pooled_bytes -= nbytes
      self.hits += 1
      return h
    self.misses += 1
    if self._cap is None: alloc_cache_bytes()  # a bad ALLOC_CACHE_MB is reported here (free runs where errors are lost: __del__)
    fresh = (lambda: self.raw.alloc(nbytes)) if image is None else (lambda: self.raw.alloc_image(image))
    try: return fresh()
    except NotImplementedError: raise
    except Exception as e:  # noqa: BLE001 - devices fail allocations in their own ways; a flush is cheap and the retry re-raises
      if not self._pool: raise
      if DEBUG >= 2: print(f"allocator {self.name}: allocating {nbytes} bytes failed ({type(e).__name__}); flushing {self.pooled_bytes} pooled bytes and retrying")
      self.flush()
      return fresh()
  def free(self, opaque: Any, nbytes: int = -1, image: Any = None) -> None:  # type: ignore[override]
    """Park `opaque` (of `nbytes` bytes) for reuse, or free it when it can't be pooled (unknown or
    zero size, bigger than the cap)."""
    if id(opaque) in self._pooled: raise RuntimeError(f"allocator {self.name}: {opaque!r} freed twice")
    try: cap = self._cap if self._cap is not None else alloc_cache_bytes()
    except SettingError: cap = 0  # (alloc reports it)
    if nbytes <= 0 or nbytes > cap:
      self.raw.free(opaque)
      return
    while self.pooled_bytes + nbytes > cap and self._pool: self._evict_one()
    # (each step leaves the pool consistent: a garbage collection in between may free Buffers into it)
    key = (nbytes, image)
    self._pool.setdefault(key, []).append(opaque)
    self._pooled.add(id(opaque))
    self.pooled_bytes += nbytes
    self._pool[key] = self._pool.pop(key)  # this size is now the most recently used
  def _evict_one(self) -> None:
    key = next(iter(self._pool))
    nbytes = key[0]
    handles = self._pool[key]
    h = handles.pop(0)  # the oldest of the least recently used size
    if not handles: del self._pool[key]
    self._pooled.discard(id(h))
    self.pooled_bytes -= nbytes
    self.raw.free(h)
  def flush(self) -> None:
    """Give every pooled handle back to the device."""
    self.flushes += 1
    while self._pool: self._evict_one()
  def stats(self) -> str:
    n = sum(len(h) for h in self._pool.values())
    return (f"allocator {self.name}: {self.hits} hits, {self.misses} misses, {self.flushes} flushes; "
            f"pool {self.pooled_bytes / 2**20:.1f} MB in {n} buffers (cap {self.cap_bytes / 2**20:.0f} MB)")
  def copyin(self, dest: Any, src: memoryview) -> None: self.raw.copyin(dest, src)
  def copyout(self, dest: memoryview, src: Any) -> None: self.raw.copyout(dest, src)
  def __getattr__(self, name: str) -> Any:
    if name == "raw": raise AttributeError(name)  # not set up yet (unpickling, a failed __init__)
    return getattr(self.raw, name)
  def __repr__(self) -> str: return f"<CachingAllocator {self.name} over {type(self.raw).__name__}>"

def _is_bf16(dtype: DType) -> bool: return dtype.fmt is None and dtype.name.startswith("bfloat16")

def _np_dtype(dtype: DType) -> np.dtype:
  """The numpy dtype of one lane a Buffer of `dtype` exchanges with numpy (bfloat16: its uint16 bits)."""
  if dtype.fmt is not None: return np.dtype(dtype.fmt)
  if _is_bf16(dtype): return np.dtype(np.uint16)
  raise TypeError(f"{dtype.name} has no numpy equivalent")

class Buffer:
  """`size` elements of `dtype` on `device` (API). Memory is allocated by `.allocate()` (or the first
  `.copyin`) and goes back to the device's caching allocator when the Buffer is garbage collected."""
  def __init__(self, device: str, size: int, dtype: DType):
    if not isinstance(size, (int, np.integer)) or size < 0: raise ValueError(f"Buffer size must be an int >= 0, got {size!r}")
    self.device, self.size, self.dtype = device if device in DEVICES else Device.canonicalize(device), int(size), dtype
    self.nbytes: int = self.size * dtype.itemsize
  def is_allocated(self) -> bool: return hasattr(self, "_buf")
  def allocate(self) -> Buffer:
    if not hasattr(self, "_buf"):
      self.allocator = Device[self.device].allocator
      if isinstance(self.dtype, ImageDType):
        if self.size != prod(self.dtype.shape): raise ValueError(f"an image Buffer of {self.dtype!r} holds {prod(self.dtype.shape)} elements, not {self.size}")
        self._buf = self.allocator.alloc(self.nbytes, image=self.dtype)
      else: self._buf = self.allocator.alloc(self.nbytes)
    return self
  def _np_count(self, npdt: np.dtype) -> int: return self.nbytes // npdt.itemsize
  def copyin(self, arr: np.ndarray) -> Buffer:
    """Copy a numpy array in (any shape, same number of elements). For bfloat16 pass the uint16 bits
    or float32 values (rounded to bfloat16)."""
    if not isinstance(arr, np.ndarray): raise TypeError(f"Buffer.copyin takes a numpy array, got {type(arr).__name__}")
    npdt = _np_dtype(self.dtype)
    if _is_bf16(self.dtype) and arr.dtype == np.float32:
      from tilecraft.dtype import bf16_bits_from_f32
      arr = np.asarray(bf16_bits_from_f32(arr))
    if arr.dtype != npdt:
      raise TypeError(f"Buffer.copyin: array dtype {arr.dtype} does not match buffer dtype {self.dtype.name} (numpy {npdt})"
                      + (" or float32" if _is_bf16(self.dtype) else ""))
    if arr.size != self._np_count(npdt):
      raise ValueError(f"Buffer.copyin: array has {arr.size} elements {arr.shape}, buffer holds {self._np_count(npdt)}")
    self.allocate()
    if self.nbytes: self.allocator.copyin(self._buf, memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)))
    return self
  def numpy(self) -> np.ndarray:
    """A flat copy of the contents (bfloat16 comes back as float32)."""
    if not self.is_allocated(): raise RuntimeError(f"{self!r} is not allocated")
    npdt = _np_dtype(self.dtype)
    out = np.empty(self._np_count(npdt), dtype=npdt)
    if self.nbytes: self.allocator.copyout(memoryview(out.view(np.uint8)), self._buf)
    if _is_bf16(self.dtype):
      from tilecraft.dtype import f32_from_bf16_bits
      return np.asarray(f32_from_bf16_bits(out))
    return out
  def __del__(self) -> None:
    if hasattr(self, "_buf"):
      try: self.allocator.free(self._buf, self.nbytes, self.dtype if isinstance(self.dtype, ImageDType) else None)
      except Exception: pass  # interpreter shutdown
  def __repr__(self) -> str:
    return f"<Buffer {self.device} size={self.size} dtype={self.dtype.name}{'' if self.is_allocated() else ' (unallocated)'}>"

# ---- devices -------------------------------------------------------------------------------------

class Compiled:
  """An opened device: allocator, renderer, compiler and runtime (`runtime(name, lib)` -> program).
  `renderer` may be a zero-argument factory so the device opens before the renderer is needed.
  `render_only` is None, or why kernels can't run here (the device only renders and compile-checks).
  `missing_dtypes`: dtype name -> why this device can't compute with it though its renderer names
  the type (an OpenCL device without cl_khr_fp64 has no double)."""
  def __init__(self, name: str, allocator: Allocator, renderer: Union[Renderer, Callable[[], Renderer]], compiler: Compiler,
               runtime: Callable[[str, bytes], Any], synchronize: Optional[Callable[[], None]] = None, render_only: Optional[str] = None,
               missing_dtypes: Optional[dict[str, str]] = None):
    self.name, self.compiler, self.runtime, self.missing_dtypes = name, compiler, runtime, dict(missing_dtypes or {})
    self.allocator = allocator if isinstance(allocator, (CachingAllocator, _NoMemory)) else CachingAllocator(allocator, name)
    self._renderer, self._synchronize, self.render_only = renderer, synchronize, render_only
  @property
  def renderer(self) -> Renderer:
    if (r := self.__dict__.get("_made_renderer")) is not None: return r
    from tilecraft.renderer import Renderer
    if not isinstance(self._renderer, Renderer): self._renderer = self._renderer()
    self._made_renderer = self._renderer
    return self._renderer
  def synchronize(self) -> None:
    if self._synchronize is not None: self._synchronize()
  def __repr__(self) -> str: return f"<Compiled {self.name}>"

class _NoMemory(Allocator):
  """The allocator of a render-only device: any use raises DeviceUnavailable with the reason."""
  def __init__(self, msg: str): self.msg = msg
  def alloc(self, nbytes: int, image: Any = None) -> Any: raise DeviceUnavailable(self.msg)
  def copyin(self, dest: Any, src: memoryview) -> None: raise DeviceUnavailable(self.msg)
  def copyout(self, dest: memoryview, src: Any) -> None: raise DeviceUnavailable(self.msg)

def render_only_device(name: str, renderer: Union[Renderer, Callable[[], Renderer]], compiler: Compiler, reason: str) -> Compiled:
  """A device whose renderer and compiler work here but whose kernels can't run (no GPU or driver):
  allocating or launching raises DeviceUnavailable saying so."""
  msg = f"device {name} is render + compile-check only here ({reason}): its kernels can't run"
  def runtime(name_: str, lib: bytes) -> Any: raise DeviceUnavailable(msg)
  return Compiled(name, _NoMemory(msg), renderer, compiler, runtime, render_only=reason)

DEVICES: tuple[str, ...] = ("CPU", "LLVM", "OPENCL", "PYTHON", "CUDA", "METAL", "HIP")

# The runtimes, by name -> the module that opens it: tilecraft.runtime.<name> defines
# `open_device() -> Compiled` (and may raise DeviceUnavailable saying why not here). device.py names
# runtimes only as strings, so runtime/* import device.py (Allocator, Compiler, Compiled, ...) and
# never the other way round. A device is added by one line here (a callable instead of a module path
# also works: tests use that).
_device_factories: dict[str, Union[str, Callable[[], Compiled]]] = {
  "CPU": "tilecraft.runtime.cpu", "OPENCL": "tilecraft.runtime.opencl", "CUDA": "tilecraft.runtime.cuda", "HIP": "tilecraft.runtime.hip",
  "METAL": "tilecraft.runtime.metal", "PYTHON": "tilecraft.runtime.python", "LLVM": "tilecraft.runtime.llvm"}

def _open(factory: Union[str, Callable[[], Compiled]]) -> Compiled:
  return importlib.import_module(factory).open_device() if isinstance(factory, str) else factory()

class _Device:
  """The device registry (API): `Device["CPU"]` opens (once) and returns a device, `Device.DEFAULT`
  names the default one."""
  def __init__(self) -> None: self._opened: dict[str, Compiled] = {}
  @staticmethod
  def canonicalize(name: str) -> str:
    """'cpu' -> 'CPU'. Unknown names raise ValueError listing the known ones."""
    if not isinstance(name, str): raise TypeError(f"device name must be a str, got {name!r}")
    if (cname := name.strip().upper()) not in DEVICES: raise ValueError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return cname
  def __getitem__(self, name: str) -> Compiled:
    if (dev := self._opened.get(name)) is not None: return dev  # (a canonical name: asked on every realize)
    cname = self.canonicalize(name)
    if cname not in self._opened:
      if (factory := _device_factories.get(cname)) is None:
        raise DeviceUnavailable(f"device {cname} is not available: no runtime for it is implemented yet "
                                f"(available: {', '.join(_device_factories)})")
      try: self._opened[cname] = _open(factory)
      except ImportError as e: raise DeviceUnavailable(f"device {cname} is not available here: {e}") from e
    return self._opened[cname]
  @property
  def DEFAULT(self) -> str:
    """`DEVICE=name`, else the first known X with env `X=1`, else CPU."""
    if (name := getenv("DEVICE", "")): return self.canonicalize(name)
    for d in DEVICES:
      if getenv(d, "") not in ("", "0"): return d
    return "CPU"
  def available(self) -> list[str]:
    """Known devices that open on this machine and can run kernels (not the render-only ones)."""
    out = []
    for d in DEVICES:
      try: dev = self[d]
      except DeviceUnavailable: continue
      if dev.render_only is None: out.append(d)
    return out
  def __repr__(self) -> str: return f"<Device default={self.DEFAULT} opened={list(self._opened)}>"

Device = _Device()

@atexit.register
def _report_allocators() -> None:
  if DEBUG >= 2:
    for dev in Device._opened.values():
      if dev.allocator.hits or dev.allocator.misses: print(dev.allocator.stats())

# ---- running programs ----------------------------------------------------------------------------

class CompiledRunner:
  """Compiles (disk-cached) a Program for its device and launches it on Buffers (API)."""
  def __init__(self, program: Program, precompiled: Optional[bytes] = None, symbol: Optional[str] = None):
    """`precompiled`: the binary, already built (skips the compiler); `symbol`: the kernel's name in it
    where that isn't the program's (a batch's binary: Compiler.batch_name)."""
    self.p, self.device = program, Device[program.device]
    self.dname = self.device.name
    if precompiled is not None: self.lib, self.clprg = precompiled, self.device.runtime(symbol or program.name, precompiled)
    else: self.lib, self.clprg = self.device.compiler.compile_and_load(program.src, lambda lib: self.device.runtime(program.name, lib))
    # without Variables the launch dims never change: evaluated once, not per call
    self._dims = None if program.vars else program.launch_dims({})
  def _var_vals(self, var_vals: Optional[dict]) -> tuple[int, ...]:
    var_vals = var_vals or {}
    by_name = {getattr(k, "expr", k): v for k, v in var_vals.items()}
    vals = []
    for v in self.p.vars:
      if v in var_vals: vals.append(int(var_vals[v]))
      elif v.expr in by_name: vals.append(int(by_name[v.expr]))
      elif getattr(v, "is_bound", False): vals.append(int(v.val))
      else: raise ValueError(f"kernel {self.p.name} needs a value for Variable {v.expr!r}; var_vals has {sorted(map(str, by_name))}")
    return tuple(vals)
  def __call__(self, bufs: list[Buffer], var_vals: Optional[dict] = None, wait: bool = True) -> Optional[float]:
    """Run with `bufs` in the program's buffer order (outputs first); seconds taken when `wait`."""
    handles, kw = self.launch_args(bufs, var_vals)
    return self.clprg(*handles, wait=wait, **kw)
  def launch_args(self, bufs: list[Buffer], var_vals: Optional[dict] = None) -> tuple[list, dict]:
    """The checked arguments of a launch on `bufs`: the memory handles and the keyword arguments of
    the program call (`self.clprg(*handles, wait=..., **kw)` runs it; each launch needs its own)."""
    if self.p.globals and len(bufs) != len(self.p.globals):
      raise ValueError(f"kernel {self.p.name} takes {len(self.p.globals)} buffers (indices {self.p.globals}), got {len(bufs)}")
    for i, b in enumerate(bufs):
      if not isinstance(b, Buffer): raise TypeError(f"kernel {self.p.name}: argument {i} is {type(b).__name__}, not a Buffer")
      if b.device != self.dname: raise ValueError(f"kernel {self.p.name} runs on {self.dname}, but buffer {i} is on {b.device}")
      if not b.is_allocated(): raise RuntimeError(f"kernel {self.p.name}: buffer {i} {b!r} is not allocated")
    if self._dims is None:
      vals = self._var_vals(var_vals)
      global_size, local_size = self.p.launch_dims(dict(zip(self.p.vars, vals)))
    else:
      vals, (gs, ls) = (), self._dims
      global_size, local_size = (None if gs is None else list(gs)), (None if ls is None else list(ls))  # copies: a runtime may edit them
    return [b._buf for b in bufs], {"global_size": global_size, "local_size": local_size, "vals": vals}
  def launcher(self) -> Any:
    """What launches this program on memory handles (`Buffer._buf`s, in its buffer order) with
    `.launch(*handles)`, without waiting, timing or checks: for launches checked once (a kernel without
    Variables, on buffers of the devices and sizes it was checked with). The runtime's program itself
    where it has such a `launch`, else an adapter to its call."""
    if self.p.vars: raise ValueError(f"kernel {self.p.name} takes Variables: its launches need var_vals")
    return self.clprg if hasattr(self.clprg, "launch") else _Launch(self.clprg, *self._dims)  # type: ignore[misc]
  def __repr__(self) -> str: return f"<CompiledRunner {self.p.name} on {self.dname}>"

class _Launch:
  """A program's call, as `launch(*handles)`: no Variables, fixed launch dims (copied per launch: a runtime may edit them)."""
  __slots__ = ("prg", "gs", "ls")
  def __init__(self, prg: Any, gs: Any, ls: Any): self.prg, self.gs, self.ls = prg, gs, ls
  def launch(self, *handles: Any) -> None:
    gs, ls = self.gs, self.ls
    self.prg(*handles, global_size=None if gs is None else list(gs), local_size=None if ls is None else list(ls), vals=(), wait=False)

def dtype_unsupported(device: str, dt: Any) -> Optional[str]:
  """Why `device` can't compute with dtype `dt`, or None when it can (a device that can't be opened
  is reported when it is used, not here)."""
  try: dev = Device[device]
  except DeviceUnavailable: return None
  names = getattr(dev.renderer, "type_names", None)
  if names is not None and dt not in names: return f"device {device} has no {dt.name} type"
  return dev.missing_dtypes.get(getattr(dt, "name", ""))
