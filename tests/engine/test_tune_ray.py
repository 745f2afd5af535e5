"""Tuning many kernels (tilecraft.engine.search.distributed) on a real local Ray instance
(`ray.init(num_cpus=2)`, started once for the file and always shut down): tasks go only to nodes
offering the target's resource, results come back to the driver, which writes them into its search
cache, an interrupted run keeps what finished and a rerun searches only the rest. Tiny kernels, one
beam, a one-second budget. Skipped, saying why, where ray is not installed (pip install 'tilecraft[ray]')."""
from __future__ import annotations
import os, pickle
import pytest
from tilecraft.dtype import dtypes
from tilecraft.engine.search import distributed
from tilecraft.engine.search.db import SearchDB, export_results, same_kind
from tilecraft.host import KNOWN_X86_ARCHS, runnable_archs
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.shape.shapetracker import ShapeTracker

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'tilecraft[ray]')")

def _load(i: int, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float32, st))
def _kernel(value: LazyOp, out_shape: tuple) -> LazyOp:
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape(out_shape))),))
def ew_ast(n: int) -> LazyOp:
  st = ShapeTracker.from_shape((n,))
  return _kernel(LazyOp(BinaryOps.MUL, (_load(1, st), _load(2, st))), (n,))
def rowsum_ast(r: int, c: int) -> LazyOp: return _kernel(LazyOp(ReduceOps.SUM, (_load(1, ShapeTracker.from_shape((r, c))),), (1,)), (r, 1))

def _tasks(settings: tuple = ()) -> list[distributed.TuneTask]:
  return [distributed.TuneTask(f"case{i}", f"k{i}", pickle.dumps(ast), "CPU", 1, 1.0, settings)
          for i, ast in enumerate([ew_ast(256), rowsum_ast(16, 32)])]

@pytest.fixture(scope="module")
def local_ray():
  ray.init(num_cpus=2, resources=distributed.node_resources(["CPU"]), include_dashboard=False, log_to_driver=False, logging_level="WARNING")
  try: yield
  finally: ray.shutdown()

def _seed(db_path: str, tmp_path) -> bytes:
  out = str(tmp_path / "seed.db")
  export_results(db_path, out)
  with open(out, "rb") as f: return f.read()

def _run(db: SearchDB, tasks, seed: bytes, stop_after: int = 0) -> list[distributed.TuneResult]:
  got: list[distributed.TuneResult] = []
  def on_result(r: distributed.TuneResult) -> None:
    db.merge_rows(r.rows)  # what `tilecraft tune` does as each result arrives
    got.append(r)
    if stop_after and len(got) == stop_after: raise KeyboardInterrupt
  distributed.run_ray(tasks, seed, on_result)
  return got

def test_resources_name_what_this_host_can_run():
  res = distributed.node_resources(["CPU"])
  target = distributed.target_resource("CPU", distributed.current_settings())
  assert target in res and res[target] == 1.0
  runnable = set(runnable_archs())
  for arch in KNOWN_X86_ARCHS:
    assert (f"tilecraft_cpu_{arch}" in res) == (arch in runnable), arch

def test_interrupted_run_keeps_finished_results_and_a_rerun_searches_only_the_rest(local_ray, tmp_path):
  path = str(tmp_path / "driver.db")
  db = SearchDB(path)
  tasks = _tasks()
  with pytest.raises(KeyboardInterrupt): _run(db, tasks, b"", stop_after=1)
  assert len(db.result_rows()) == 1  # the finished one is in the driver's cache
  assert ray.is_initialized()  # run_ray leaves a Ray instance it didn't start running
  got = _run(db, tasks, _seed(path, tmp_path))
  assert len(got) == len(tasks) and all(r.error is None for r in got), [r.error for r in got]
  assert sorted(r.cache_hit for r in got) == [False, True]  # only the missing one was searched
  rows = db.result_rows()
  assert len(rows) == len(tasks) and all(same_kind(r[9], "CPU") for r in rows)
  assert all(r.node and r.opts is not None and r.hand_time > 0 for r in got)
  again = _run(db, tasks, _seed(path, tmp_path))
  assert all(r.cache_hit and not r.rows for r in again)
  db.close()

def test_kernels_go_only_to_nodes_that_can_run_the_target(local_ray):
  foreign = []
  for arch in (a for a in KNOWN_X86_ARCHS if a not in runnable_archs()):
    try: foreign.append(distributed.target_resource("CPU", (("CPU_ARCH", arch),)))
    except ValueError: pass  # the compiler doesn't know it
  if not foreign: pytest.skip("this host runs every -march its compiler knows, so there is no target it can't run")
  tasks = _tasks((("CPU_ARCH", foreign[-1].removeprefix("tilecraft_cpu_")),))[:1]
  with pytest.raises(RuntimeError, match=f"no node of the Ray cluster offers {foreign[-1]}"):
    distributed.run_ray(tasks, b"", lambda r: None)

def test_missing_ray_is_a_clear_error(monkeypatch):
  import builtins
  real = builtins.__import__
  def no_ray(name, *a, **kw):
    if name == "ray": raise ImportError("No module named 'ray'")
    return real(name, *a, **kw)
  monkeypatch.setattr(builtins, "__import__", no_ray)
  with pytest.raises(ImportError, match=r"pip install 'tilecraft\[ray\]'"): distributed.import_ray()
