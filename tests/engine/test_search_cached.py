"""Looking a search's result up without searching (tilecraft.engine.search.beam.cached_result) and what
a tuning driver does with it (distributed.answered_by_seed, run_local): the lookup finds exactly what
beam_search would replay (same key, same budget rule), each stored row names the kind of machine and
the device that found it, and tasks the driver's results already answer never reach a worker. Also
the search's floor: the hand-coded kernel is built even when it is over the candidates' uops cap
(ResNet-50's 3x3 convs at 7x7x512 were, and the search then kept the unoptimized kernel, 2-3x slower).
Searches run against the tiny fake worker pool (instant builds, fixed times): no processes."""
from __future__ import annotations
import json, pickle
import pytest
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.engine import search
from tilecraft.engine.search import beam, db, distributed
from tilecraft.engine.search.actions import opts_key
from tilecraft.helpers import Context
from tilecraft.ops import BinaryOps, LazyOp
from search_fakes import FakePool, ew_ast as fakes_ew_ast, install_fake_pool

def ew_ast(n: int) -> LazyOp: return fakes_ew_ast(n, BinaryOps.MUL)

@pytest.fixture
def pool(monkeypatch):
  return install_fake_pool(monkeypatch, lambda opts: 1e-3 / (1 + len(opts)))  # more opts, faster: the search picks a beam kernel

def _kernel(n: int = 64) -> Kernel: return Kernel(ew_ast(n), Device["CPU"].renderer)

def test_the_lookup_finds_what_the_search_would_replay(tmp_path, pool):
  with Context(CACHEDB=str(tmp_path / "s.db"), CACHELEVEL=2):
    assert beam.cached_result(_kernel(), 1) is None
    k = search.beam_search(_kernel(), None, 1, progress=False)
    row = beam.cached_result(_kernel(), 1)
    assert row is not None and row[0] == opts_key(k.applied_opts) and row[1] == search.last_report.chose and row[4] == 1
    jobs = len(pool.jobs)
    assert beam.cached_result(_kernel(), 1) == row and len(pool.jobs) == jobs  # a lookup builds nothing
    # anything in the key changes the answer: another kernel, width or search setting
    assert beam.cached_result(_kernel(128), 1) is None
    assert beam.cached_result(_kernel(), 2) is None
    assert beam.cached_result(_kernel(), 1, max_upcast=16) is None
    with pytest.raises(TypeError, match=r"\['runs'\] are not search settings"): beam.cached_result(_kernel(), 1, runs=5)
    # a search cut by its budget (5 s) stands only for searches with no larger budget, as beam_search replays it
    ((key, *_),) = db.read_results(str(tmp_path / "s.db"))
    sdb = db.get_db()
    sdb.put_result(key, row[0], row[1], row[2], row[3], False, 5.0, "{}")
    for budget, hit in ((5.0, True), (3.0, True), (10.0, False), (None, False)):  # None: the default budget, 40 s
      assert (beam.cached_result(_kernel(), 1, budget_s=budget) is not None) == hit, budget
      search.beam_search(_kernel(), None, 1, budget_s=budget, progress=False)
      assert search.last_report.cache_hit == hit, budget
      sdb.put_result(key, row[0], row[1], row[2], row[3], False, 5.0, "{}")  # (a search put a complete row back)
  db.close_cache_dbs()

def test_each_result_row_names_the_machine_and_device(tmp_path, pool):
  path = str(tmp_path / "s.db")
  with Context(CACHEDB=path, CACHELEVEL=2): search.beam_search(_kernel(), None, 1, progress=False)
  db.close_cache_dbs()
  ((*_, kind),) = db.read_results(path)
  facts = json.loads(kind)
  assert facts["device"] == "CPU" and facts["search"] == beam.SEARCH_VERSION and db.same_kind(kind, "CPU") is True

def _tasks(*sizes: int) -> list[distributed.TuneTask]:
  return [distributed.TuneTask(f"case{n}", f"k{n}", pickle.dumps(ew_ast(n)), "CPU", 1, None) for n in sizes]

def test_the_driver_answers_tasks_its_results_cover_without_a_worker(tmp_path, pool, monkeypatch):
  path, seed_path = str(tmp_path / "driver.db"), str(tmp_path / "seed.db")
  with Context(CACHEDB=path, CACHELEVEL=2):
    for n in (64, 128): search.beam_search(_kernel(n), None, 1, progress=False)
  db.close_cache_dbs()
  db.export_results(path, seed_path)
  with open(seed_path, "rb") as f: seed = f.read()
  done, todo = distributed.answered_by_seed(_tasks(64, 256), seed)
  assert [r.label for r in done] == ["case64"] and [t.label for t in todo] == ["case256"]
  stored = {r[1] for r in db.read_results(path)}
  assert done[0].cache_hit and done[0].opts in stored and done[0].node.endswith("(driver)") and done[0].final_time > 0
  assert distributed.answered_by_seed(_tasks(64), b"") == ([], _tasks(64))  # no seed: everything runs
  # every task answered: run_local starts no process at all
  import concurrent.futures as cf
  monkeypatch.setattr(cf, "ProcessPoolExecutor", lambda *a, **kw: pytest.fail("started a worker process for cached kernels"))
  got: list[distributed.TuneResult] = []
  distributed.run_local(_tasks(64, 128), seed, got.append)
  assert sorted(r.label for r in got) == ["case128", "case64"] and all(r.cache_hit and not r.rows and r.error is None for r in got)

def test_the_hand_coded_floor_is_built_even_over_the_uops_cap(tmp_path, monkeypatch):
  """The real worker skips a build over max_uops; the hand-coded kernel (the floor) must never be skipped,
  else the unoptimized kernel becomes the floor and a slower kernel is chosen."""
  hand_opts = tuple(_kernel().hand_coded_optimizations().applied_opts)
  assert hand_opts
  class CappedPool(FakePool):
    def _build(self, ast_id, ren_id, ast_key, device, opts, name, vv, max_uops, do_compile, front=0):
      if max_uops and tuple(opts_from_wire(opts)) == hand_opts: return ("skip", f"over the cap of {max_uops}")
      return super()._build(ast_id, ren_id, ast_key, device, opts, name, vv, max_uops, do_compile, front)
  from tilecraft.engine.search.actions import opt_unwire
  opts_from_wire = lambda wire: [opt_unwire(o) for o in wire]
  pool = CappedPool(lambda opts: 0.5e-3 if tuple(opts) == hand_opts else 1e-3)  # the hand-coded kernel is the fastest
  monkeypatch.setattr(beam, "get_pool", lambda handler: pool)
  k = search.beam_search(_kernel(), None, 1, progress=False, disable_cache=True)
  r = search.last_report
  assert r.chose == "hand" and r.hand_time == pytest.approx(0.5e-3) and tuple(k.applied_opts) == hand_opts, (r.chose, r.hand_time, k.applied_opts)
