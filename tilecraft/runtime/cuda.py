"""The CUDA device: kernels compiled to cubins (NVRTC when its library is found, else nvcc), run
through the CUDA driver API of cuda-python (module load, launch, events for timing). Where there is
no driver or no GPU the device still opens, render + compile-check only.

`Program.global_size` counts blocks and `local_size` threads per block. A kernel without a local
size (NOLOCALS) counts threads in `global_size`; its block is the largest divisor of that count up to
256 threads, so the grid covers it exactly (the kernel has no bounds check)."""
from __future__ import annotations
import ctypes, ctypes.util, functools, glob, os, shutil, subprocess, sys, tempfile
from typing import Any, Optional
import numpy as np
from tilecraft.device import Allocator, CompileError, Compiled, Compiler, DeviceUnavailable, render_only_device, run_compiler
from tilecraft.helpers import getenv

# ---- compilers -----------------------------------------------------------------------------------

def _nvcc_path() -> Optional[str]:
  for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
    if cand and os.path.isfile(cand) and os.access(cand, os.X_OK): return cand
  return None

@functools.cache
def _nvrtc() -> Optional[ctypes.CDLL]:
  """libnvrtc: $NVRTC_LIB, the nvidia-cuda-nvrtc wheel (cu13 or cu12 layout), the toolkit, the loader path."""
  cands = [os.environ.get("NVRTC_LIB", "")]
  for p in sys.path:
    cands += sorted(glob.glob(os.path.join(p, "nvidia", "cu1*", "lib", "libnvrtc.so.*")), reverse=True)
    cands += sorted(glob.glob(os.path.join(p, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*")), reverse=True)
  cands += sorted(glob.glob(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64", "libnvrtc.so*")), reverse=True)
  cands.append(ctypes.util.find_library("nvrtc") or "")
  for c in cands:
    if not c or "builtins" in c or ".alt." in c: continue
    # NVRTC dlopens its builtins library by name: load it first from the same folder (wheels have no rpath)
    for b in glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so.*")):
      if ".alt." not in b:
        try: ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
        except OSError: pass
    try: lib = ctypes.CDLL(c)
    except OSError: continue
    maj, mnr = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(maj), ctypes.byref(mnr)) == 0:
      lib.tc_version = f"{maj.value}.{mnr.value}"  # type: ignore[attr-defined]
      return lib
  return None

def cuda_compiler_missing() -> Optional[str]:
  """Why no CUDA compiler can be used here, or None."""
  if _nvrtc() is None and _nvcc_path() is None:
    return "no CUDA compiler: neither libnvrtc (pip install nvidia-cuda-nvrtc) nor nvcc (set NVCC or CUDA_HOME) was found"
  return None

class CUDACompiler(Compiler):
  """CUDA C -> a cubin for `arch` (e.g. sm_80). `CUDA_COMPILER=nvrtc|nvcc` picks one; by default NVRTC
  when its library loads (what the runtime uses), else nvcc."""
  batch_wrap = "namespace tc_batch{i} {{\n{src}\n}}"
  def __init__(self, arch: str = "sm_80"):
    self.arch = arch
    choice = getenv("CUDA_COMPILER", "")
    self.backend = choice if choice in ("nvrtc", "nvcc") else ("nvrtc" if _nvrtc() is not None else "nvcc")
    self.flags = (f"--gpu-architecture={arch}", "-O3") if self.backend == "nvcc" else (f"--gpu-architecture={arch}",)
    super().__init__(f"cuda|{self.backend}|{self._version()}|{arch}")
  def _version(self) -> str:
    if self.backend == "nvrtc": return getattr(_nvrtc(), "tc_version", "missing")
    if (nvcc := _nvcc_path()) is None: return "missing"
    try: return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError): return "unknown"
  def compile(self, src: str) -> bytes:
    if (why := cuda_compiler_missing()) is not None: raise DeviceUnavailable(why)
    return self._nvrtc(src) if self.backend == "nvrtc" else self._nvcc(src)
  def _nvcc(self, src: str) -> bytes:
    nvcc = _nvcc_path()
    if nvcc is None: raise DeviceUnavailable("CUDA_COMPILER=nvcc but nvcc was not found (set NVCC or CUDA_HOME)")
    with tempfile.TemporaryDirectory(prefix="tilecraft-cuda-") as d:
      cu, out = os.path.join(d, "kernel.cu"), os.path.join(d, "kernel.cubin")
      with open(cu, "w") as f: f.write(src)
      try: res = run_compiler([nvcc, "-cubin", *self.flags, "-o", out, cu], timeout=600)
      except subprocess.TimeoutExpired as e: raise CompileError(f"nvcc timed out ({self.arch})", src, str(e)) from e
      if res.returncode != 0: raise CompileError(f"nvcc failed for {self.arch}", src, res.stderr + res.stdout)
      with open(out, "rb") as f: return f.read()
  def _nvrtc(self, src: str) -> bytes:
    lib = _nvrtc()
    if lib is None: raise DeviceUnavailable("CUDA_COMPILER=nvrtc but libnvrtc was not found (pip install nvidia-cuda-nvrtc, or set NVRTC_LIB)")
    prog = ctypes.c_void_p()
    if (rc := lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None, None)) != 0:
      raise CompileError(f"nvrtcCreateProgram failed ({rc})", src)
    try:
      opts = (ctypes.c_char_p * len(self.flags))(*[o.encode() for o in self.flags])
      rc = lib.nvrtcCompileProgram(prog, len(self.flags), opts)
      size = ctypes.c_size_t()
      lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
      log = ctypes.create_string_buffer(size.value)
      lib.nvrtcGetProgramLog(prog, log)
      if rc != 0: raise CompileError(f"NVRTC failed for {self.arch} (error {rc})", src, log.value.decode(errors="replace"))
      if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0 or size.value == 0:
        raise CompileError(f"NVRTC produced no cubin for {self.arch}", src, log.value.decode(errors="replace"))
      cubin = ctypes.create_string_buffer(size.value)
      lib.nvrtcGetCUBIN(prog, cubin)
      return cubin.raw
    finally: lib.nvrtcDestroyProgram(ctypes.byref(prog))

# ---- driver --------------------------------------------------------------------------------------

def _driver() -> Any:
  try: from cuda.bindings import driver  # cuda-python >= 12.6
  except ImportError:
    try: from cuda import cuda as driver  # type: ignore[no-redef]  # older cuda-python
    except ImportError as e: raise DeviceUnavailable("the CUDA runtime needs cuda-python: pip install 'tilecraft[cuda]'") from e
  return driver

def _check(res: Any, what: str) -> Any:
  """The value(s) of a cuda-python call, which returns (CUresult, *values); raises on an error."""
  err, *vals = res if isinstance(res, tuple) else (res,)
  if int(err) != 0:
    cu = _driver()
    _, msg = cu.cuGetErrorString(err)
    raise RuntimeError(f"CUDA {what} failed: {getattr(err, 'name', err)}: {msg.decode() if isinstance(msg, bytes) else msg}")
  return vals[0] if len(vals) == 1 else tuple(vals) if vals else None

class _Ctx:
  """The primary context of GPU 0, made current on the calling thread by `get()`."""
  def __init__(self) -> None:
    self.cu = cu = _driver()
    try: res = cu.cuInit(0)
    except RuntimeError as e: raise DeviceUnavailable(f"no CUDA driver here ({e})") from e  # libcuda.so can't be loaded
    if int(res[0]) != 0: raise DeviceUnavailable(f"cuInit failed: {getattr(res[0], 'name', res[0])} (no NVIDIA GPU or driver?)")
    if _check(cu.cuDeviceGetCount(), "cuDeviceGetCount") == 0: raise DeviceUnavailable("the CUDA driver sees no GPU")
    self.dev = _check(cu.cuDeviceGet(0), "cuDeviceGet")
    self.ctx = _check(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
    A = cu.CUdevice_attribute
    attr = lambda a: _check(cu.cuDeviceGetAttribute(a, self.dev), "cuDeviceGetAttribute")  # noqa: E731
    self.arch = f"sm_{attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)}{attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)}"
    self.name = _check(cu.cuDeviceGetName(256, self.dev), "cuDeviceGetName").split(b"\0")[0].decode()
    self.max_grid = tuple(attr(getattr(A, f"CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_{d}")) for d in "XYZ")
    self.max_block = tuple(attr(getattr(A, f"CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_{d}")) for d in "XYZ")
    self.get()
  def get(self) -> Any:
    _check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
    return self.cu

@functools.cache
def _context() -> _Ctx: return _Ctx()

class CUDAAllocator(Allocator):
  def alloc(self, nbytes: int) -> Any: return _check(_context().get().cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})")
  def free(self, opaque: Any) -> None: _check(_context().get().cuMemFree(opaque), "cuMemFree")
  def copyin(self, dest: Any, src: memoryview) -> None:
    if src.nbytes: _check(_context().get().cuMemcpyHtoD(dest, np.frombuffer(src, dtype=np.uint8), src.nbytes), "cuMemcpyHtoD")
  def copyout(self, dest: memoryview, src: Any) -> None:
    if dest.nbytes: _check(_context().get().cuMemcpyDtoH(np.frombuffer(dest, dtype=np.uint8), src, dest.nbytes), "cuMemcpyDtoH")

def _block_for(n: int, most: int = 256) -> int:
  return next(b for b in range(min(n, most), 0, -1) if n % b == 0)

class CUDAProgram:
  def __init__(self, name: str, lib: bytes):
    c = _context()
    cu = c.get()
    self.name, self.c = name, c
    self.module = _check(cu.cuModuleLoadData(lib), f"cuModuleLoadData({name})")
    self.func = _check(cu.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")
    self.start, self.end = _check(cu.cuEventCreate(0), "cuEventCreate"), _check(cu.cuEventCreate(0), "cuEventCreate")
  def __call__(self, *bufs: Any, global_size: Optional[list[int]] = None, local_size: Optional[list[int]] = None,
               vals: tuple[int, ...] = (), wait: bool = True) -> Optional[float]:
    cu = self.c.get()
    gs = [int(g) for g in (global_size or [1])]
    if local_size is None:  # NOLOCALS: global_size counts threads
      blk = _block_for(gs[0])
      gs, ls = [gs[0] // blk] + gs[1:], [blk]
    else: ls = [int(x) for x in local_size]
    gs, ls = (gs + [1, 1, 1])[:3], (ls + [1, 1, 1])[:3]
    if any(g > m for g, m in zip(gs, self.c.max_grid)) or any(b > m for b, m in zip(ls, self.c.max_block)) or ls[0] * ls[1] * ls[2] > 1024:
      raise RuntimeError(f"kernel {self.name}: launch grid {gs} x block {ls} is over the GPU's limits (grid {self.c.max_grid}, block {self.c.max_block}, 1024 threads)")
    args = [ctypes.c_uint64(int(b)) for b in bufs] + [ctypes.c_int64(int(v)) for v in vals]
    params = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
    if wait: _check(cu.cuEventRecord(self.start, 0), "cuEventRecord")
    _check(cu.cuLaunchKernel(self.func, *gs, *ls, 0, 0, ctypes.addressof(params), 0), f"cuLaunchKernel({self.name})")
    if not wait: return None
    _check(cu.cuEventRecord(self.end, 0), "cuEventRecord")
    _check(cu.cuEventSynchronize(self.end), f"kernel {self.name}")
    return _check(cu.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime") * 1e-3
  def __del__(self) -> None:
    try: _check(self.c.get().cuModuleUnload(self.module), "cuModuleUnload")
    except Exception: pass  # interpreter shutdown

def open_cuda() -> Compiled:
  """The CUDA device: runnable where cuda-python finds a GPU, else render + compile-check only (sm_80)."""
  from tilecraft.renderer.cuda import CUDARenderer
  try: c = _context()
  except DeviceUnavailable as e: return render_only_device("CUDA", CUDARenderer, CUDACompiler("sm_80"), str(e))
  return Compiled("CUDA", CUDAAllocator(), CUDARenderer, CUDACompiler(c.arch), CUDAProgram, lambda: _check(c.get().cuCtxSynchronize(), "cuCtxSynchronize"))

open_device = open_cuda  # device.py's registry calls runtime.<name>.open_device
