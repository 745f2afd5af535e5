"""Device registry, disk cache, Compiler caching, Buffer and CompileError (no C compiler needed)."""
import os, pickle
import numpy as np
import pytest
from tilecraft.device import (DEVICES, Allocator, Buffer, CompileError, Compiled, Compiler, CompiledRunner, Device, DeviceUnavailable,
                              _device_factories)
from tilecraft.diskcache import diskcache_get, diskcache_put
from tilecraft.dtype import dtypes
from tilecraft.helpers import Context
from tilecraft.renderer import Program, Renderer

@pytest.fixture
def cache_home(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  return tmp_path / "tilecraft"

# ---- registry ------------------------------------------------------------------------------------

def test_device_canonical_names():
  assert Device.canonicalize("cpu") == "CPU" and Device.canonicalize(" Cpu ") == "CPU"
  assert Device["cpu"] is Device["CPU"]
  assert Device["CPU"].name == "CPU"
  assert isinstance(Device["CPU"].allocator, Allocator) and isinstance(Device["CPU"].compiler, Compiler)

def test_unknown_device_lists_known():
  with pytest.raises(ValueError, match="unknown device 'TPU'.*CPU.*OPENCL"): Device["TPU"]
  with pytest.raises(ValueError, match="unknown device"): Buffer("nope", 4, dtypes.float32)

def test_unavailable_device_is_clear(monkeypatch):
  monkeypatch.delitem(_device_factories, "METAL", raising=False)
  monkeypatch.delitem(Device._opened, "METAL", raising=False)  # another test may have opened it (render-only) in this process
  with pytest.raises(DeviceUnavailable, match="METAL is not available"): Device["metal"]
  assert issubclass(DeviceUnavailable, RuntimeError)

def test_factory_import_error_becomes_unavailable(monkeypatch):
  def broken() -> Compiled: raise ImportError("No module named 'pyopencl'")
  monkeypatch.setitem(_device_factories, "OPENCL", broken)
  monkeypatch.delitem(Device._opened, "OPENCL", raising=False)
  with pytest.raises(DeviceUnavailable, match="OPENCL is not available here: No module named 'pyopencl'"): Device["OPENCL"]
  assert "OPENCL" not in Device.available() and "CPU" in Device.available()

def test_registering_a_device_is_one_line(monkeypatch):
  dev = Compiled("HIP", Allocator(), Renderer(), Compiler(None), lambda name, lib: None)
  monkeypatch.setitem(_device_factories, "HIP", lambda: dev)
  monkeypatch.delitem(Device._opened, "HIP", raising=False)
  assert Device["hip"] is dev
  Device._opened.pop("HIP")

@pytest.fixture
def clean_env(monkeypatch):
  for name in ("DEVICE",) + DEVICES: monkeypatch.delenv(name, raising=False)
  return monkeypatch

def test_default_device(clean_env):
  assert Device.DEFAULT == "CPU"
  clean_env.setenv("OPENCL", "1")
  assert Device.DEFAULT == "OPENCL"
  clean_env.setenv("LLVM", "1")  # LLVM comes before OPENCL in the device list
  assert Device.DEFAULT == "LLVM"
  clean_env.setenv("LLVM", "0")
  assert Device.DEFAULT == "OPENCL"
  clean_env.setenv("DEVICE", "python")
  assert Device.DEFAULT == "PYTHON"
  with Context(DEVICE="cpu"): assert Device.DEFAULT == "CPU"
  clean_env.setenv("DEVICE", "gpu9")
  with pytest.raises(ValueError, match="unknown device"): Device.DEFAULT

def test_renderer_is_lazy():
  calls = []
  def make() -> Renderer:
    calls.append(1)
    return Renderer()
  dev = Compiled("CPU", Allocator(), make, Compiler(None), lambda name, lib: None)
  assert not calls
  assert dev.renderer is dev.renderer and len(calls) == 1
  r = Renderer()
  assert Compiled("CPU", Allocator(), r, Compiler(None), lambda n, l: None).renderer is r
  dev.synchronize()

# ---- disk cache ----------------------------------------------------------------------------------

def test_diskcache_roundtrip(cache_home):
  assert diskcache_get("t", "k") is None
  diskcache_put("t", "k", b"\x00hello")
  assert diskcache_get("t", "k") == b"\x00hello"
  diskcache_put("t", "k", b"")
  assert diskcache_get("t", "k") == b""
  assert diskcache_get("other", "k") is None
  assert [f for f in os.listdir(cache_home / "t") if f.startswith(".tmp")] == []

@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_diskcache_corrupted_entry_is_a_miss(cache_home, damage):
  diskcache_put("t", "k", b"payload" * 100)
  (path,) = [cache_home / "t" / f for f in os.listdir(cache_home / "t")]
  data = path.read_bytes()
  path.write_bytes({"truncate": data[:-5], "flip": data[:-1] + bytes([data[-1] ^ 1]), "garbage": b"not a cache entry", "empty": b""}[damage])
  assert diskcache_get("t", "k") is None
  assert not path.exists()

def test_diskcache_disabled(cache_home):
  with Context(CACHELEVEL=0):
    diskcache_put("t", "k", b"x")
    assert diskcache_get("t", "k") is None
  assert diskcache_get("t", "k") is None

class CountingCompiler(Compiler):
  def __init__(self, cachekey="counting", flags=("-O1",)):
    super().__init__(cachekey)
    self.flags, self.calls = flags, 0
  def compile(self, src: str) -> bytes:
    self.calls += 1
    return b"BIN:" + src.encode()

def test_compile_cached(cache_home):
  c = CountingCompiler()
  assert c.compile_cached("a") == b"BIN:a" and c.calls == 1
  assert c.compile_cached("a") == b"BIN:a" and c.calls == 1
  assert CountingCompiler().compile_cached("a") == b"BIN:a"  # another instance (process) hits too
  c.compile_cached("b")
  assert c.calls == 2
  other_flags = CountingCompiler(flags=("-O3",))
  other_flags.compile_cached("a")
  assert other_flags.calls == 1
  other_key = CountingCompiler(cachekey="other")
  other_key.compile_cached("a")
  assert other_key.calls == 1
  no_cache = CountingCompiler(cachekey=None)
  no_cache.compile_cached("a"); no_cache.compile_cached("a")
  assert no_cache.calls == 2
  with Context(CACHELEVEL=0):
    c.compile_cached("a")
  assert c.calls == 3

def test_compile_cached_recovers_from_corruption(cache_home):
  c = CountingCompiler()
  c.compile_cached("a")
  for f in os.listdir(cache_home / "binaries"): (cache_home / "binaries" / f).write_bytes(b"\x7fELF broken")
  assert c.compile_cached("a") == b"BIN:a" and c.calls == 2
  assert c.compile_cached("a") == b"BIN:a" and c.calls == 2

def test_compile_error_message():
  e = CompileError("gcc failed", "void f() {\n  oops;\n}", "<stdin>:2:3: error: 'oops' undeclared")
  msg = str(e)
  assert "gcc failed" in msg and "'oops' undeclared" in msg
  assert "   2 |   oops;" in msg and "   1 | void f() {" in msg
  assert isinstance(e, RuntimeError) and e.src.startswith("void") and "undeclared" in e.stderr
  e2 = pickle.loads(pickle.dumps(e))  # compile errors cross process boundaries in search workers
  assert str(e2) == msg and e2.src == e.src and e2.stderr == e.stderr

# ---- buffers -------------------------------------------------------------------------------------

ALL_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
              dtypes.uint64, dtypes.float16, dtypes.float32, dtypes.float64]

@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_buffer_roundtrip(dt, rng):
  if dt == dtypes.bool: x = rng.random(37) > 0.5
  elif dt.np.kind == "f": x = rng.standard_normal(37).astype(dt.np)
  else:
    info = np.iinfo(dt.np)
    x = rng.integers(info.min, info.max, 37, dtype=dt.np, endpoint=True)
  b = Buffer("CPU", 37, dt)
  assert not b.is_allocated()
  assert b.allocate() is b and b.is_allocated() and b.nbytes == 37 * dt.itemsize
  b.copyin(x)
  y = b.numpy()
  assert y.dtype == dt.np and y.shape == (37,) and np.array_equal(x, y)
  y[:] = 0  # numpy() is a copy
  assert np.array_equal(b.numpy(), x)

def test_buffer_copyin_any_shape_and_strides(rng):
  x = rng.standard_normal((6, 8)).astype(np.float32)
  b = Buffer("CPU", 24, dtypes.float32).copyin(x[:, ::2])  # not contiguous
  assert np.array_equal(b.numpy(), x[:, ::2].reshape(-1))
  b.copyin(x.T[::2].T[:, :4].copy(order="F"))
  assert np.array_equal(b.numpy(), x.T[::2].T[:, :4].reshape(-1))

def test_buffer_alignment():
  for n in (1, 3, 100, 4097):
    assert Buffer("CPU", n, dtypes.float32).allocate()._buf.ptr % 64 == 0

def test_buffer_bfloat16():
  b = Buffer("CPU", 4, dtypes.bfloat16)
  b.copyin(np.array([1.0, -2.5, 3.3, 1e30], dtype=np.float32))
  y = b.numpy()
  assert y.dtype == np.float32
  np.testing.assert_allclose(y, [1.0, -2.5, 3.3, 1e30], rtol=2**-8)
  assert y[2] == np.float32(3.296875)
  b.copyin(np.array([0x3F80, 0x4000, 0, 0xBF80], dtype=np.uint16))  # raw bits
  assert y.tolist() != b.numpy().tolist() and b.numpy().tolist() == [1.0, 2.0, 0.0, -1.0]
  with pytest.raises(TypeError, match="bfloat16.*or float32"): b.copyin(np.zeros(4, np.float64))

def test_buffer_vector_dtype():
  b = Buffer("CPU", 3, dtypes.float32.vec(4)).copyin(np.arange(12, dtype=np.float32))
  assert b.nbytes == 48 and np.array_equal(b.numpy(), np.arange(12, dtype=np.float32))

def test_buffer_errors():
  b = Buffer("cpu", 4, dtypes.float32)
  assert b.device == "CPU" and "unallocated" in repr(b)
  with pytest.raises(RuntimeError, match="not allocated"): b.numpy()
  with pytest.raises(ValueError, match="5 elements.*holds 4"): b.copyin(np.zeros(5, np.float32))
  with pytest.raises(TypeError, match="float64 does not match.*float"): b.copyin(np.zeros(4, np.float64))
  with pytest.raises(TypeError, match="numpy array"): b.copyin([1.0, 2.0, 3.0, 4.0])
  with pytest.raises(ValueError, match="size"): Buffer("CPU", -1, dtypes.float32)
  assert b.copyin(np.zeros((2, 2), np.float32)).is_allocated() and "CPU size=4" in repr(b)

def test_empty_buffer():
  b = Buffer("CPU", 0, dtypes.int32).allocate()
  assert b.numpy().shape == (0,)
  b.copyin(np.zeros(0, np.int32))

def test_runner_unknown_device():
  with pytest.raises(ValueError, match="unknown device"): CompiledRunner(Program("k", "", "XPU"))

# ---- the cache can't be fooled, and no cache is not an error ---------------------------------------

def test_entry_copied_from_another_key_is_a_miss(cache_home):
  diskcache_put("t", "key one", b"one")
  diskcache_put("t", "key two", b"two")
  from tilecraft.diskcache import _diskcache_path
  p1, p2 = _diskcache_path("t", "key one"), _diskcache_path("t", "key two")
  with open(p1, "rb") as f1, open(p2, "wb") as f2: f2.write(f1.read())
  assert diskcache_get("t", "key one") == b"one"
  assert diskcache_get("t", "key two") is None and not os.path.exists(p2)  # a file for another key, dropped

def test_compile_cached_binds_the_full_key(cache_home):
  c = CountingCompiler()
  assert c.cache_key("src") == "counting\0-O1\0src"  # compiler identity, flags, source: stored in the entry itself
  c.compile_cached("a"); c.compile_cached("b")
  from tilecraft.diskcache import _diskcache_path
  pa, pb = _diskcache_path("binaries", c.cache_key("a")), _diskcache_path("binaries", c.cache_key("b"))
  with open(pb, "rb") as fb, open(pa, "wb") as fa: fa.write(fb.read())
  assert c.compile_cached("a") == b"BIN:a" and c.calls == 3

class Loader:
  """load() of binaries: those starting with b"BAD" fail like an unloadable shared object."""
  def __init__(self): self.loaded = []
  def __call__(self, lib: bytes) -> bytes:
    if lib.startswith(b"BAD"): raise OSError("invalid ELF header")
    self.loaded.append(lib)
    return lib

def test_cached_binary_that_fails_to_load_is_recompiled(cache_home):
  c, load = CountingCompiler(), Loader()
  diskcache_put("binaries", c.cache_key("a"), b"BAD payload, good checksum")
  assert c.compile_and_load("a", load) == (b"BIN:a", b"BIN:a") and c.calls == 1
  assert diskcache_get("binaries", c.cache_key("a")) == b"BIN:a"  # the entry was replaced
  assert c.compile_and_load("a", load) == (b"BIN:a", b"BIN:a") and c.calls == 1  # and now hits

def test_fresh_binary_that_fails_to_load_raises_and_is_not_cached(cache_home):
  class Bad(CountingCompiler):
    def compile(self, src: str) -> bytes: self.calls += 1; return b"BAD" + src.encode()  # noqa: E702
  c = Bad()
  with pytest.raises(OSError, match="invalid ELF"): c.compile_and_load("a", Loader())
  assert diskcache_get("binaries", c.cache_key("a")) is None

@pytest.fixture
def fresh_runners():
  """No in-process runners (engine/plan_cache.py cleared): each kernel goes through the compiler's
  disk cache again. Calling the fixture's value forgets the runners made since; the test's runners
  are forgotten after it too."""
  from tilecraft.engine import plan_cache
  plan_cache.clear()
  yield plan_cache.clear
  plan_cache.clear()

def test_swapped_kernel_binaries_give_the_right_answer(cache_home, fresh_runners):
  """The issue's repro: the cached binary of a*2 copied over the one of a+1 made a+1 return [0,2,4,6]."""
  from tilecraft import Tensor
  a = np.arange(4, dtype=np.float32)
  np.testing.assert_array_equal((Tensor(a) + 1).numpy(), a + 1)
  np.testing.assert_array_equal((Tensor(a) * 2).numpy(), a * 2)
  entries = {p: p.read_bytes() for p in (cache_home / "binaries").iterdir()}
  (add,) = [p for p, d in entries.items() if b"+(float4){1.0f" in d]
  (mul,) = [p for p, d in entries.items() if b"*(float4){2.0f" in d]
  add.write_bytes(entries[mul])
  fresh_runners()
  np.testing.assert_array_equal((Tensor(a) + 1).numpy(), a + 1)
  assert b"+(float4){1.0f" in add.read_bytes()  # rebuilt under its own key

def test_unloadable_cached_kernel_is_recompiled(cache_home, fresh_runners):
  from tilecraft import Tensor
  a = np.arange(4, dtype=np.float32)
  np.testing.assert_array_equal((Tensor(a) + 1).numpy(), a + 1)
  (entry,) = list((cache_home / "binaries").iterdir())
  key = entry.read_bytes()[38:]
  key = key[4:4 + int.from_bytes(key[:4], "little")].decode()
  diskcache_put("binaries", key, b"\x7fELF but not a shared object")  # valid checksum, unloadable payload
  for _ in range(2):  # every later run too
    fresh_runners()
    np.testing.assert_array_equal((Tensor(a) + 1).numpy(), a + 1)
  assert diskcache_get("binaries", key)[:4] == b"\x7fELF" and len(diskcache_get("binaries", key)) > 100

@pytest.mark.parametrize("how", ["proc", "file-in-the-way", "disk-full"])
def test_unusable_cache_dir_runs_without_cache_and_warns_once(tmp_path, monkeypatch, fresh_runners, how):
  import warnings
  from tilecraft import Tensor, diskcache as device_mod
  monkeypatch.setattr(device_mod, "_cache_off", {})
  monkeypatch.setattr(device_mod, "_cache_ok", set())
  monkeypatch.delenv(device_mod._OFF_ENV, raising=False)
  if how == "proc": monkeypatch.setenv("XDG_CACHE_HOME", "/proc/x")
  else:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if how == "file-in-the-way": (tmp_path / "tilecraft").write_text("not a directory")
    else:
      class Full:
        @staticmethod
        def mkstemp(**kw): raise OSError(28, "No space left on device")
      monkeypatch.setattr(device_mod, "tempfile", Full)
  a = np.arange(5, dtype=np.float32)
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for k in range(3): np.testing.assert_array_equal((Tensor(a) + (k + 10)).numpy(), a + (k + 10))
  msgs = [str(x.message) for x in w if "disk cache" in str(x.message)]
  assert len(msgs) == 1 and "running without it" in msgs[0], msgs

def test_worker_processes_inherit_cache_off_silently(cache_home, monkeypatch):
  """A process started after the parent turned the cache off (a search worker) is off too, without
  warning again."""
  import warnings
  from tilecraft import diskcache as device_mod
  monkeypatch.setattr(device_mod, "_cache_off", {})
  monkeypatch.setenv(device_mod._OFF_ENV, str(cache_home))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    diskcache_put("t", "k", b"x")
    assert diskcache_get("t", "k") is None and not (cache_home / "t").exists()

def test_run_compiler_reruns_a_crashed_compiler_once(tmp_path) -> None:
  """A compiler crash (a signal, or the LLVM/GCC crash banner) is run once more with a warning; an
  ordinary compile error is not rerun; a second crash is returned as it is."""
  import sys, warnings
  from tilecraft.device import run_compiler
  count = tmp_path / "count"
  def fake(behaviour: str) -> list[str]:
    code = (f"import pathlib, sys, os, signal\np = pathlib.Path({str(count)!r})\nn = int(p.read_text()) if p.exists() else 0\n"
            f"p.write_text(str(n + 1))\nb = {behaviour!r}\n"
            "if b == 'banner' or (b == 'once' and n == 0): sys.stderr.write('PLEASE submit a bug report\\n'); sys.exit(1)\n"
            "if b == 'signal' and n == 0: os.kill(os.getpid(), signal.SIGSEGV)\n"
            "if b == 'error': sys.stderr.write('error: bad\\n'); sys.exit(1)\n")
    return [sys.executable, "-c", code]
  for behaviour, runs, rc in [("once", 2, 0), ("signal", 2, 0), ("error", 1, 1), ("banner", 2, 1)]:
    count.unlink(missing_ok=True)
    with warnings.catch_warnings(record=True) as w:
      warnings.simplefilter("always")
      res = run_compiler(fake(behaviour), input="src")
    assert (int(count.read_text()), res.returncode) == (runs, rc), behaviour
    assert (len(w) == 1) == (runs == 2), behaviour

# ---- the disk cache's size bound (issue 28) --------------------------------------------------------

def test_diskcache_is_bounded_least_recently_used_first(cache_home, monkeypatch):
  """Every distinct Python scalar compiles a kernel and adds an entry: a loop with a changing learning
  rate grew the cache without end. DISK_CACHE_MB bounds each table; the least recently used entries go
  (a hit counts as a use), down to 3/4 of the bound."""
  import time
  from tilecraft.diskcache import _diskcache_path, disk_cache_max_bytes
  monkeypatch.setenv("DISK_CACHE_MB", str(100_000 / (1 << 20)))  # 100 kB
  assert disk_cache_max_bytes() == 100_000
  table = cache_home / "bounded"
  t0 = time.time() - 1000
  for i in range(30):
    diskcache_put("bounded", f"key {i}", bytes(10_000))
    os.utime(_diskcache_path("bounded", f"key {i}"), (t0 + i, t0 + i))  # (mtimes 1 s apart: the order is certain)
    if i == 5: assert diskcache_get("bounded", "key 0") is not None  # a hit: key 0 is now the most recently used
    sizes = [p.stat().st_size for p in table.iterdir()]
    assert sum(sizes) <= 100_000 + 10_100, f"{sum(sizes)} bytes after {i + 1} puts"
  kept = {i for i in range(30) if diskcache_get("bounded", f"key {i}") is not None}
  assert 29 in kept and 28 in kept and 0 in kept and 1 not in kept and len(kept) >= 6
  # a finished put's temp file of a killed process goes once it is an hour old
  stale = table / ".tmp-dead"
  stale.write_bytes(b"x")
  os.utime(stale, (t0 - 7200, t0 - 7200))
  for i in range(30, 40): diskcache_put("bounded", f"key {i}", bytes(10_000))
  assert not stale.exists()

def test_diskcache_bound_setting(cache_home, monkeypatch):
  from tilecraft.diskcache import disk_cache_max_bytes
  from tilecraft.helpers import SettingError
  monkeypatch.delenv("DISK_CACHE_MB", raising=False)
  assert disk_cache_max_bytes() == 1024 << 20
  monkeypatch.setenv("DISK_CACHE_MB", "0")  # no bound
  for i in range(5): diskcache_put("unbounded", f"k{i}", bytes(1000))
  assert len(list((cache_home / "unbounded").iterdir())) == 5
  monkeypatch.setenv("DISK_CACHE_MB", "lots")
  with pytest.raises(SettingError, match="DISK_CACHE_MB='lots'"): diskcache_put("unbounded", "k9", b"x")
