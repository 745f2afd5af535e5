"""The LLVM runtime (tilecraft.runtime.llvm): the chunk pool that runs a parallel kernel on every
core, the disk cache of compiled objects, and programs with the same name living side by side."""
import dataclasses, threading
import numpy as np
import pytest

llvm_rt = pytest.importorskip("tilecraft.runtime.llvm")
from tilecraft.device import Buffer, CompiledRunner, Device  # noqa: E402
from tilecraft.dtype import dtypes  # noqa: E402
from tilecraft.testing.corpus import ST, alu, kernel, ld, store  # noqa: E402
from tilecraft.testing.fuzz import get_program  # noqa: E402
from tilecraft.ops import BinaryOps  # noqa: E402

def test_chunk_pool_runs_every_chunk_once_on_its_own_thread():
  pool = llvm_rt.ChunkPool(4)
  seen: dict[int, int] = {}
  lock = threading.Lock()
  barrier = threading.Barrier(4, timeout=30)  # all four chunks must be running at the same time to pass it
  def chunk(i: int) -> None:
    barrier.wait()
    with lock: seen[i] = threading.get_ident()
  for _ in range(3):
    seen.clear()
    pool.run(chunk)
    assert sorted(seen) == [0, 1, 2, 3] and len(set(seen.values())) == 4
  def bad(i: int) -> None:
    if i == 2: raise ValueError("chunk 2 failed")
  with pytest.raises(ValueError, match="chunk 2 failed"): pool.run(bad)
  pool.run(lambda i: None)  # still usable after a failure

def test_compiled_objects_come_from_the_disk_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  comp = Device["LLVM"].compiler
  src = get_program(kernel(store(0, dtypes.float32, ST((5,)), alu(BinaryOps.ADD, ld(1, dtypes.float32, ST((5,))), ld(1, dtypes.float32, ST((5,)))))),
                    [], "LLVM").src
  calls = []
  orig = type(comp).compile
  monkeypatch.setattr(type(comp), "compile", lambda self, s: calls.append(1) or orig(self, s))
  a, b = comp.compile_cached(src), comp.compile_cached(src)
  assert a == b and len(calls) == 1
  assert comp.compile_cached(src.replace("fadd", "fsub")) != a and len(calls) == 2  # another source is another entry

def test_programs_with_one_name_stay_apart():
  """Every program links into its own JIT library: two kernels named alike don't replace each other."""
  p = get_program(kernel(store(0, dtypes.float32, ST((4,)), alu(BinaryOps.MUL, ld(1, dtypes.float32, ST((4,))), ld(1, dtypes.float32, ST((4,)))))),
                  [], "LLVM")
  progs = [CompiledRunner(p), CompiledRunner(dataclasses.replace(p, src=p.src.replace("fmul", "fadd")))]
  x = np.arange(4, dtype=np.float32)
  outs = []
  for p in progs:
    bufs = [Buffer("LLVM", 4, dtypes.float32).allocate(), Buffer("LLVM", 4, dtypes.float32).allocate().copyin(x)]
    p(bufs)
    outs.append(bufs[0].numpy())
  np.testing.assert_array_equal(outs[0], x * x)
  np.testing.assert_array_equal(outs[1], x + x)
