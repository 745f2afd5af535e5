"""The OPENCL device through pyopencl. On a machine without a GPU, PoCL runs kernels on the CPU
with real workgroups, local memory and barriers. `Program.global_size` counts workgroups; the
launch multiplies it by the local size (OpenCL counts work-items)."""
from __future__ import annotations
import atexit, fcntl, functools, hashlib, os, shutil, tempfile, weakref
from typing import Any, Optional
import numpy as np
from tilecraft.device import Allocator, CompileError, Compiled, Compiler, DeviceUnavailable
from tilecraft.diskcache import disk_cache_off
from tilecraft.helpers import CACHELEVEL, cache_dir

# ---- PoCL's kernel cache: one directory per process ------------------------------------------------
# PoCL (3.1, Debian 12) keeps what it compiles in a cache directory (POCL_CACHE_DIR, default
# ~/.cache/pocl) that is not safe to share between processes running at once: serializing a
# program's binary (clGetProgramInfo BINARIES, what CLCompiler returns and tilecraft caches) walks
# the program's cache directory while another process that builds or loads the same source writes
# into it, and can pack an empty file; building from such a binary aborts in PoCL
# (`pocl_binary.c: ... Assertion 'len > 0'`, `pocl_llvm_wg.cc: program->data[device_i]`) or crashes.
# Parallel tests and the fuzzer's and the search's worker processes do exactly that. So each process
# gets a cache directory of its own before PoCL starts: the first of cache_dir()/pocl/<n> that no
# live process holds (an exclusive flock held for the process's life, released by the kernel even
# when it is killed), so PoCL's work is still reused by later processes; a private temporary one
# when all are held or tilecraft's disk cache is off. A POCL_CACHE_DIR set by the user is left alone.
POCL_SLOTS = 32
_SLOT_OWNER_ENV = "_TILECRAFT_POCL_CACHE_PID"  # which process claimed the POCL_CACHE_DIR in the environment
_slot_lock: Optional[int] = None  # the fd holding this process's slot (never closed)

def claim_pocl_cache_dir() -> Optional[str]:
  """Point POCL_CACHE_DIR at a cache directory only this process uses (see above); returns it, or
  None when the user set POCL_CACHE_DIR. Must run before PoCL is initialized (the first platform query)."""
  global _slot_lock
  owner = os.environ.get(_SLOT_OWNER_ENV)
  if owner is None and os.environ.get("POCL_CACHE_DIR"): return None  # the user's choice
  if owner == str(os.getpid()): return os.environ["POCL_CACHE_DIR"]
  path: Optional[str] = None
  if CACHELEVEL > 0 and not disk_cache_off():
    base = os.path.join(cache_dir(), "pocl")
    try:
      os.makedirs(base, exist_ok=True)
      for n in range(POCL_SLOTS):
        fd = os.open(os.path.join(base, f"{n}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
          os.close(fd)
          continue
        _slot_lock, path = fd, os.path.join(base, str(n))
        break
    except OSError: pass  # an unusable cache dir: a private one below
  if path is None:  # PoCL dlopens the kernels it builds from there: not on a noexec mount
    from tilecraft.runtime.cpu import _is_noexec, _lib_dirs, own_temp_dir
    for d in [d for d in _lib_dirs() if not _is_noexec(d)]:
      try: path = tempfile.mkdtemp(prefix="pocl-", dir=own_temp_dir(d))  # (removed with the process's own dir, even after kill -9)
      except OSError: continue
      atexit.register(shutil.rmtree, path, True)
      break
    if path is None: return None  # nowhere to put one: PoCL's default
  os.environ["POCL_CACHE_DIR"], os.environ[_SLOT_OWNER_ENV] = path, str(os.getpid())
  return path

claim_pocl_cache_dir()

try: import pyopencl as cl
except ImportError as e: raise ImportError("the OPENCL device needs pyopencl: pip install 'tilecraft[opencl]'") from e

# ---- fork --------------------------------------------------------------------------------------------
# PoCL (and OpenCL drivers generally) are not fork-safe: a child forked after the parent opened the
# device inherits the driver's state but not its threads, and its first command waits forever. So in
# such a child every use of OPENCL raises ForkedOpenCLError instead (buffers the parent made are
# dropped without a driver call).
class ForkedOpenCLError(RuntimeError):
  """OPENCL used in a process forked after its parent opened the device."""

_forked_from: Optional[int] = None  # in a child forked after OPENCL was opened: the parent's pid

def _unusable(*args: Any) -> Any:
  raise ForkedOpenCLError(f"OPENCL was opened in process {_forked_from} before it forked this one (pid {os.getpid()}), and OpenCL "
                          "drivers (PoCL) can't be used from a forked child: start child processes with multiprocessing's "
                          "'spawn' or 'forkserver' method (multiprocessing.get_context('spawn')), or open OPENCL only in the child")

def _after_fork_in_child() -> None:
  global _forked_from, _context
  if _forked_from is None and _context.cache_info().currsize == 0: return  # never opened: the child may open it
  if _forked_from is None: _forked_from = os.getppid()
  _context = _unusable  # type: ignore[assignment]

@functools.cache
def _context() -> tuple[Any, Any, Any]:
  """(context, device, queue) on the first GPU, else the first device of any kind."""
  try: platforms = cl.get_platforms()
  except cl.Error as e: raise DeviceUnavailable(f"no OpenCL platform (install an ICD such as pocl-opencl-icd): {e}") from e
  devices = [d for p in platforms for d in p.get_devices()]
  if not devices: raise DeviceUnavailable("OpenCL platforms found but no devices")
  dev = next((d for d in devices if d.type & cl.device_type.GPU), devices[0])
  ctx = cl.Context([dev])
  queue = cl.CommandQueue(ctx, dev, properties=cl.command_queue_properties.PROFILING_ENABLE)
  return ctx, dev, queue

class CLCompiler(Compiler):
  batch_renames = True
  def __init__(self) -> None:
    _, dev, _ = _context()
    super().__init__(f"opencl|{dev.platform.name}|{dev.name}|{dev.driver_version}")
    self.batch_builds = _serializes_slowly(dev)  # PoCL: a build of 16 kernels takes about as long as one
  def compile(self, src: str) -> bytes:
    """The program's binary; on PoCL, the source itself behind SOURCE_MARK (see _serializes_slowly)."""
    global _last_built
    ctx, dev, _ = _context()
    try: prg = cl.Program(ctx, src).build()
    except cl.RuntimeError as e: raise CompileError("OpenCL build failed", src, str(e)) from e
    lib = SOURCE_MARK + src.encode() if _serializes_slowly(dev) else prg.get_info(cl.program_info.BINARIES)[0]
    _built[hashlib.sha256(lib).digest()] = _last_built = prg  # (what loading this binary next uses: no second build)
    return lib

SOURCE_MARK = b"tilecraft-opencl-source\0"  # a "binary" that is the program's source

def _serializes_slowly(dev: Any) -> bool:
  """Whether asking the driver for a program's binary costs more than building it again from source.
  PoCL compiles every kernel of the program once more to serialize it (0.4-1 s a program, more than
  its build), while it keeps what it compiles in its own cache (POCL_CACHE_DIR, above): a rebuild
  from source is a cache hit there. So on PoCL the source is what tilecraft caches and loads."""
  return "portable computing language" in dev.platform.name.lower()

class CLAllocator(Allocator):
  def alloc(self, nbytes: int) -> Any:
    ctx, _, _ = _context()
    return cl.Buffer(ctx, cl.mem_flags.READ_WRITE, max(nbytes, 1))
  def alloc_image(self, dt: Any) -> Any:
    """An RGBA image2d of dt.shape (height, width, 4) texels: float or half channels."""
    ctx, dev, _ = _context()
    if not dev.image_support: raise RuntimeError(f"the OpenCL device {dev.name} has no image support")
    h, w, _ = dt.shape
    if w > dev.image2d_max_width or h > dev.image2d_max_height:
      raise ValueError(f"{dt!r} is over the device's image limit of {dev.image2d_max_width}x{dev.image2d_max_height} texels")
    ctype = {4: cl.channel_type.FLOAT, 2: cl.channel_type.HALF_FLOAT}[dt.base.itemsize]
    return cl.create_image(ctx, cl.mem_flags.READ_WRITE, cl.ImageFormat(cl.channel_order.RGBA, ctype), (w, h))
  def free(self, opaque: Any) -> None:
    if _forked_from is None: opaque.release()  # (the parent's buffer: no driver calls in a forked child)
  def copyin(self, dest: Any, src: memoryview) -> None:
    _, _, q = _context()
    if not src.nbytes: return
    host = np.frombuffer(src, dtype=np.uint8)
    if isinstance(dest, cl.Image): cl.enqueue_copy(q, dest, host, origin=(0, 0), region=tuple(dest.shape), is_blocking=True)
    else: cl.enqueue_copy(q, dest, host, is_blocking=True)
  def copyout(self, dest: memoryview, src: Any) -> None:
    _, _, q = _context()
    if not dest.nbytes: return
    host = np.frombuffer(dest, dtype=np.uint8)
    if isinstance(src, cl.Image): cl.enqueue_copy(q, host, src, origin=(0, 0), region=tuple(src.shape), is_blocking=True)
    else: cl.enqueue_copy(q, host, src, is_blocking=True)

# built programs by binary: the kernels of one batch (Compiler.compile_batch) share one program, and
# loading what CLCompiler.compile just built takes the program it built (_last_built keeps it alive)
_built: "weakref.WeakValueDictionary[bytes, Any]" = weakref.WeakValueDictionary()
_last_built: Any = None

class CLProgram:
  def __init__(self, name: str, lib: bytes):
    ctx, dev, self.q = _context()
    self.name = name
    digest = hashlib.sha256(lib).digest()
    if (prg := _built.get(digest)) is None:
      src = lib[len(SOURCE_MARK):].decode() if lib.startswith(SOURCE_MARK) else None
      try: prg = (cl.Program(ctx, src) if src is not None else cl.Program(ctx, [dev], [lib])).build()
      except cl.RuntimeError as e: raise CompileError(f"OpenCL could not load the binary of {name}", src or "", str(e)) from e
      _built[digest] = prg
    self.prg = prg
    self.kernel = getattr(self.prg, name)
  def __call__(self, *bufs: Any, global_size: Optional[list[int]] = None, local_size: Optional[list[int]] = None,
               vals: tuple[int, ...] = (), wait: bool = True) -> Optional[float]:
    if _forked_from is not None: _unusable()
    args = list(bufs) + [np.int64(v) for v in vals]
    self.kernel.set_args(*args)
    gs = list(global_size or [1])
    ls = None
    if local_size is not None:
      n = max(len(gs), len(local_size))
      gs, ls = gs + [1] * (n - len(gs)), list(local_size) + [1] * (n - len(local_size))
      gs = [g * l for g, l in zip(gs, ls)]
    ev = cl.enqueue_nd_range_kernel(self.q, self.kernel, gs, ls)
    if not wait: return None
    ev.wait()
    return (ev.profile.end - ev.profile.start) * 1e-9

if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork_in_child)

def cl_renderer() -> Any:
  from tilecraft.renderer.cstyle import OpenCLRenderer
  _, dev, _ = _context()
  r = OpenCLRenderer(half_arith="cl_khr_fp16" in dev.extensions, local_max=tuple(min(x, dev.max_work_group_size) for x in dev.max_work_item_sizes[:3]),
                     shared_max=min(dev.local_mem_size, 65536))
  r.max_threads = dev.max_work_group_size
  r.supports_images, r.image_max = bool(dev.image_support), (dev.image2d_max_width, dev.image2d_max_height)
  return r

def open_device() -> Compiled:
  """The OPENCL device (device.py's registry calls this); fails here, with the reason, when there is no OpenCL device."""
  _, dev, _ = _context()
  missing = {} if "cl_khr_fp64" in dev.extensions else {"double": f"the OpenCL device {dev.name} has no double precision (cl_khr_fp64)"}
  return Compiled("OPENCL", CLAllocator(), cl_renderer, CLCompiler(), CLProgram, missing_dtypes=missing)
