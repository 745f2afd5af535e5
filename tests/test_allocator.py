"""The caching allocator every device's memory goes through (tilecraft.device.CachingAllocator)."""
import gc
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.device import Allocator, Buffer, CachingAllocator, Compiled, Compiler, Device, alloc_cache_bytes
from tilecraft.dtype import dtypes
from tilecraft.helpers import Context
from tilecraft.renderer import Renderer

class Handle:
  """A fake device allocation: knows its size and whether the device still has it."""
  def __init__(self, nbytes: int): self.nbytes, self.live = nbytes, True
  def __repr__(self) -> str: return f"<Handle {self.nbytes}{'' if self.live else ' freed'}>"

class FakeDevice(Allocator):
  """Device memory with a hard limit: an allocation past `limit` live bytes fails like a driver's would."""
  def __init__(self, limit: int = 1 << 30): self.limit, self.used, self.allocs, self.frees = limit, 0, 0, 0
  def alloc(self, nbytes: int) -> Handle:
    if self.used + nbytes > self.limit: raise MemoryError(f"out of device memory: {self.used} + {nbytes} > {self.limit}")
    self.used += nbytes
    self.allocs += 1
    return Handle(nbytes)
  def free(self, h: Handle) -> None:
    assert h.live, "the device freed a handle twice"
    h.live = False
    self.used -= h.nbytes
    self.frees += 1

def test_reuses_a_freed_buffer_of_the_same_size():
  dev = FakeDevice()
  a = CachingAllocator(dev, "FAKE", cap_bytes=1 << 20)
  h = a.alloc(256)
  a.free(h, 256)
  assert a.pooled_bytes == 256 and dev.frees == 0
  assert a.alloc(256) is h and dev.allocs == 1
  assert (a.hits, a.misses) == (1, 1) and a.pooled_bytes == 0
  h2 = a.alloc(128)  # another size is a miss
  assert h2 is not h and dev.allocs == 2 and a.misses == 2

def test_never_hands_out_a_live_buffer():
  a = CachingAllocator(FakeDevice(), "FAKE", cap_bytes=1 << 20)
  rng = np.random.default_rng(0)
  live: list[Handle] = []
  for _ in range(400):
    if live and rng.random() < 0.45:
      h = live.pop(int(rng.integers(len(live))))
      a.free(h, h.nbytes)
    else:
      n = int(rng.choice([16, 64, 256]))
      h = a.alloc(n)
      assert h.live and h.nbytes == n and all(h is not x for x in live), "handed out memory that is still in use"
      live.append(h)
  assert a.hits > 50  # the pool was really exercised
  h = live.pop()
  a.free(h, h.nbytes)
  with pytest.raises(RuntimeError, match="freed twice"): a.free(h, h.nbytes)

def test_respects_the_cap_dropping_least_recently_used_sizes():
  dev = FakeDevice()
  a = CachingAllocator(dev, "FAKE", cap_bytes=1000)
  hs = [a.alloc(300) for _ in range(3)] + [a.alloc(200)]
  for h in hs: a.free(h, h.nbytes)
  # 300 * 3 + 200 doesn't fit in 1000: the oldest 300-byte handle went back to the device
  assert a.pooled_bytes == 800 and dev.frees == 1 and not hs[0].live
  big = a.alloc(2000)
  a.free(big, 2000)  # bigger than the cap: straight back to the device
  assert not big.live and a.pooled_bytes == 800
  a.free(a.alloc(100), 100)  # 100 fits next to 800
  a.free(a.alloc(150), 150)  # 150 doesn't: the least recently used size (300) gives up a handle
  assert a.pooled_bytes == 300 + 200 + 100 + 150 and a.pooled_bytes <= 1000
  a.flush()
  assert a.pooled_bytes == 0 and dev.used == 0

def test_cap_from_the_environment(monkeypatch):
  monkeypatch.delenv("ALLOC_CACHE_MB", raising=False)
  assert alloc_cache_bytes() == 512 << 20
  monkeypatch.setenv("ALLOC_CACHE_MB", "0.5")
  assert alloc_cache_bytes() == 1 << 19
  dev = FakeDevice()
  a = CachingAllocator(dev, "FAKE")  # no explicit cap: ALLOC_CACHE_MB, read at each free
  with Context(ALLOC_CACHE_MB=0):  # 0 turns caching off
    a.free(a.alloc(64), 64)
  assert dev.frees == 1 and a.pooled_bytes == 0
  a.free(a.alloc(64), 64)
  assert dev.frees == 1 and a.pooled_bytes == 64
  for bad in ("-1", "lots", "inf"):
    monkeypatch.setenv("ALLOC_CACHE_MB", bad)
    with pytest.raises(ValueError, match="ALLOC_CACHE_MB"): alloc_cache_bytes()

def test_a_failed_allocation_flushes_and_retries(capsys):
  dev = FakeDevice(limit=1000)
  a = CachingAllocator(dev, "FAKE", cap_bytes=1 << 20)
  for h in [a.alloc(400), a.alloc(400)]: a.free(h, 400)
  assert dev.used == 800
  with Context(DEBUG=2): h = a.alloc(600)  # only fits once the pooled 800 bytes are given back
  assert h.live and dev.used == 600 and a.pooled_bytes == 0 and a.flushes == 1
  assert "flushing 800 pooled bytes" in capsys.readouterr().out
  with pytest.raises(MemoryError, match="out of device memory"): a.alloc(600)  # nothing to flush: the device's error
  a.free(h, 600)
  with pytest.raises(MemoryError): a.alloc(2000)  # flushing doesn't help: the retry's error comes through
  assert dev.used == 0

def test_stats_name_hits_and_misses():
  a = CachingAllocator(FakeDevice(), "FAKE", cap_bytes=1 << 20)
  a.free(a.alloc(64), 64)
  a.alloc(64)
  assert a.stats().startswith("allocator FAKE: 1 hits, 1 misses, 0 flushes")

def test_every_device_allocates_through_the_cache():
  raw = FakeDevice()
  dev = Compiled("HIP", raw, Renderer(), Compiler(None), lambda name, lib: None)
  assert isinstance(dev.allocator, CachingAllocator) and dev.allocator.raw is raw
  assert Compiled("HIP", dev.allocator, Renderer(), Compiler(None), lambda name, lib: None).allocator is dev.allocator  # not wrapped twice
  assert isinstance(Device["CPU"].allocator, CachingAllocator)

def _devices() -> list[str]:
  return [d for d in ("CPU", "OPENCL") if d in Device.available()]

@pytest.mark.parametrize("device", _devices())
def test_buffers_reuse_device_memory(device):
  alloc = Device[device].allocator
  with Context(ALLOC_CACHE_MB=64):
    n = 12345  # a size nothing else in the suite uses
    b = Buffer(device, n, dtypes.float32).allocate()
    keep = Buffer(device, n, dtypes.float32).allocate().copyin(np.full(n, 7, np.float32))
    handle = b._buf
    del b
    gc.collect()
    hits = alloc.hits
    c = Buffer(device, n, dtypes.float32).allocate()
    assert c._buf is handle and alloc.hits == hits + 1
    c.copyin(np.zeros(n, np.float32))
    np.testing.assert_array_equal(keep.numpy(), 7)  # the live buffer is untouched

@pytest.mark.parametrize("device", _devices())
def test_arrays_given_to_the_user_never_alias_pooled_memory(device):
  x = np.arange(4096, dtype=np.float32)
  a = Tensor(x, device=device)
  x[:] = -1  # Tensor() copied the user's array in
  t = (a + 1).realize()
  got = t.numpy()
  del t
  gc.collect()
  for k in range(3): (a * 0 + k).realize().numpy()  # same size: these outputs reuse t's memory
  np.testing.assert_array_equal(got, np.arange(4096, dtype=np.float32) + 1)

def test_a_bad_alloc_cache_mb_is_a_clear_error_at_the_first_allocation(monkeypatch):
  """(issue 28) ALLOC_CACHE_MB=abc was read only when a buffer was freed -- in __del__, where the error
  was lost -- so it went unreported; now the first allocation that reaches the device names it."""
  from tilecraft import Tensor
  from tilecraft.helpers import SettingError
  dev = FakeDevice()
  a = CachingAllocator(dev, "FAKE")
  monkeypatch.setenv("ALLOC_CACHE_MB", "abc")
  with pytest.raises(SettingError, match="ALLOC_CACHE_MB='abc'"): a.alloc(64)
  with pytest.raises(SettingError, match="ALLOC_CACHE_MB='abc'"): (Tensor(np.arange(4099, dtype=np.float32)) + 1).numpy()  # (a size no pool holds)
  a.free(a.raw.alloc(64), 64)  # a free (where errors are lost) gives the memory back instead
  assert dev.frees == 1
