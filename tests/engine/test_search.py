"""Beam search (tilecraft.engine.search): the action grid, worker isolation (segfaults, hangs), the
sqlite cache (hits, warm timings, corruption), verification and the hand-coded floor.

Most logic tests run against a fake worker pool (no processes, instant "timings"); the tests that
need real workers use tiny kernels, one round and short timeouts."""
from __future__ import annotations
import math, os, pickle, sqlite3, subprocess, sys, textwrap
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.engine import isolation, realize, search
from tilecraft.engine.search import actions, beam, worker
from tilecraft.helpers import Context
from tilecraft.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable

# ---- ASTs ----------------------------------------------------------------------------------------

def _load(i: int, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float32, st))
def _kernel(value: LazyOp, out_shape: tuple) -> LazyOp:
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape(out_shape))),))

def matmul_ast(M: int, N: int, K: int) -> LazyOp:
  a = ShapeTracker.from_shape((M, K)).reshape((M, 1, K)).expand((M, N, K))
  b = ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K))
  return _kernel(LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (_load(1, a), _load(2, b))),), (2,)), (M, N, 1))

def ew_ast(n: int) -> LazyOp:
  """out = max(x * y + 1, 0)"""
  st = ShapeTracker.from_shape((n,))
  one = LazyOp(BufferOps.CONST, (), ConstBuffer(1.0, dtypes.float32, st))
  zero = LazyOp(BufferOps.CONST, (), ConstBuffer(0.0, dtypes.float32, st))
  x = LazyOp(BinaryOps.ADD, (LazyOp(BinaryOps.MUL, (_load(1, st), _load(2, st))), one))
  return _kernel(LazyOp(BinaryOps.MAX, (x, zero)), (n,))

def rowsum_ast(r: int, c: int) -> LazyOp:
  return _kernel(LazyOp(ReduceOps.SUM, (_load(1, ShapeTracker.from_shape((r, c))),), (1,)), (r, 1))

def run_kernel(k: Kernel, inputs: list[np.ndarray], out_size: int) -> np.ndarray:
  dev = k.opts.device
  out = Buffer(dev, out_size, dtypes.float32).allocate()
  ins = [Buffer(dev, a.size, dtypes.float32).allocate().copyin(a.ravel()) for a in inputs]
  CompiledRunner(k.to_program())([out] + ins)
  return out.numpy()

def cpu_kernel(ast: LazyOp) -> Kernel: return Kernel(ast, Device["CPU"].renderer)

def opencl_renderer():
  try: return Device["OPENCL"].renderer
  except Exception as e:  # noqa: BLE001
    pytest.skip(f"no OPENCL here: {e}")

@pytest.fixture
def cachedb(tmp_path):
  path = str(tmp_path / "search.db")
  with Context(CACHEDB=path, CACHELEVEL=2): yield path

# ---- a fake worker pool (tests/search_fakes.py, shared with test_search_db.py) ---------------------

from search_fakes import FakePool  # noqa: E402

@pytest.fixture
def fake_pool(monkeypatch):
  def install(*a, **kw):
    pool = FakePool(*a, **kw)
    monkeypatch.setattr(beam, "get_pool", lambda handler: pool)
    return pool
  return install

def hand_opts(ast: LazyOp, ren=None) -> tuple:
  return tuple(Kernel(ast, ren or Device["CPU"].renderer).hand_coded_optimizations().applied_opts)

# ---- the action grid -----------------------------------------------------------------------------

def test_actions_are_one_opt_each_and_distinct():
  k = cpu_kernel(matmul_ast(32, 32, 32))
  acts = search.get_kernel_actions(k)
  assert acts[0] is k
  sigs = set()
  for i, k2 in acts.items():
    if i == 0: continue
    assert k2.applied_opts == [search.ACTIONS[i - 1]]
    assert k2.applied_opts[0].op not in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS)  # the CPU has no locals
    sigs.add(actions.signature(k2))
  assert len(sigs) == len(acts) - 1, "two actions gave the same kernel"
  assert actions.signature(k) not in sigs, "a no-op action (e.g. PADTO of a multiple) was kept"
  assert k.applied_opts == [], "get_kernel_actions must not touch the kernel"
  assert 0 not in search.get_kernel_actions(k, include_0=False)
  ops = {k2.applied_opts[0].op for i, k2 in acts.items() if i}
  assert {OptOps.UPCAST, OptOps.UNROLL, OptOps.SWAP} <= ops

def test_actions_respect_caps():
  k = cpu_kernel(matmul_ast(64, 64, 64))
  k.apply_opt(Opt(OptOps.UPCAST, 0, 16)); k.apply_opt(Opt(OptOps.UPCAST, 0, 4))  # noqa: E702
  for k2 in search.get_kernel_actions(k, include_0=False).values():
    assert search.kernel_caps_ok(k2)
  # 64 output lanes: only upcasts up to 4 more are allowed under max_upcast=256
  ups = [k2.applied_opts[-1] for k2 in search.get_kernel_actions(k, include_0=False).values() if k2.applied_opts[-1].op is OptOps.UPCAST]
  assert ups and all(o.amt in (2, 3, 4) for o in ups)
  # nothing that adds lanes fits (a PADTO of the remaining global axis, 64 -> 66, adds none)
  left = search.get_kernel_actions(k, include_0=False, max_upcast=64, max_lanes=64).values()
  assert all(k2.applied_opts[-1].op is OptOps.PADTO and k2.full_shape[k2.first_upcast:] == k.full_shape[k.first_upcast:] for k2 in left)

def test_action_grid_has_the_heuristics_tiles():
  """The search reaches the hand-coded AVX2 matmul tile on its own: UPCAST 6 and PADTO to 6 are actions."""
  k = cpu_kernel(matmul_ast(100, 64, 64))
  kids = [k2.applied_opts[-1] for k2 in search.get_kernel_actions(k, include_0=False).values()]
  assert Opt(OptOps.PADTO, 0, 6) in kids and Opt(OptOps.PADTO, 1, 8) not in kids  # (64 is a multiple of 8: a no-op, left out)
  assert Opt(OptOps.UPCAST, 1, 8) in kids and Opt(OptOps.UPCAST, 0, 6) not in kids  # (100 % 6 != 0: refused)
  k.apply_opt(Opt(OptOps.PADTO, 0, 6))
  assert any(k2.applied_opts[-1] == Opt(OptOps.UPCAST, 0, 6) for k2 in search.get_kernel_actions(k, include_0=False).values())

def test_actions_on_opencl_include_locals_and_groups():
  ren = opencl_renderer()
  acts = search.get_kernel_actions(Kernel(rowsum_ast(16, 4096), ren), include_0=False)
  ops = {k.applied_opts[0].op for k in acts.values()}
  assert {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS} <= ops
  for k in acts.values():
    assert search.kernel_caps_ok(k)
    threads = math.prod(k.full_shape[k.global_dims:k.first_reduce + k.group_for_reduces])
    assert threads <= 1024

def test_test_size_and_buffer_specs():
  assert beam._test_size(None) == (None, 1.0)
  assert beam._test_size([64, 8]) == ([64, 8], 1.0)
  small, factor = beam._test_size([4096, 512, 3])
  assert math.prod(small) <= beam._TEST_GLOBAL_MAX and factor == pytest.approx(4096 * 512 * 3 / math.prod(small))
  k = cpu_kernel(matmul_ast(8, 16, 4))
  assert beam._buffer_specs(k, None) == [(128, dtypes.float32), (32, dtypes.float32), (64, dtypes.float32)]
  with pytest.raises(ValueError, match="takes 3 buffers"): beam._buffer_specs(k, [Buffer("CPU", 128, dtypes.float32)])
  bufs = [Buffer("CPU", n, dtypes.float32) for n in (128, 32, 60)]
  with pytest.raises(ValueError, match="touches 64"): beam._buffer_specs(k, bufs)
  with pytest.raises(ValueError, match="beam width"): search.beam_search(k, None, 0)

# ---- the search's logic (fake pool) --------------------------------------------------------------

def _times_favoring(target: tuple, hand: tuple, fast: float = 1e-3, hand_t: float = 5e-3):
  """target is fast (its prefixes lead there), the hand-coded kernel is middling, everything else slow."""
  def times(opts):
    if opts == target: return fast
    if opts and opts == target[:len(opts)]: return hand_t * 0.8
    if opts == hand: return hand_t
    return 1e-2 + 1e-4 * len(opts)
  return times

def test_beam_finds_a_faster_candidate_and_caches_it(fake_pool, cachedb):
  ast = matmul_ast(32, 32, 32)
  target = (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 8))
  pool = fake_pool(_times_favoring(target, hand_opts(ast)))
  k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == target
  r = search.last_report
  assert r.chose == "beam" and r.verified and not r.cache_hit and r.rounds >= 2
  assert pool.count("verify") == 2 and pool.count("race") == 2  # verified as built and with a front guard; raced twice (order swapped)
  # the winner's reasons say where it came from
  assert all("beam" in why for why in k.applied_opts_reasons)

def test_timing_is_relative_to_the_hand_coded_kernel_run_alongside(fake_pool, cachedb):
  """A burst of machine load while the best candidate is timed slows the reference run in the same job
  just as much, so the candidate is still ranked by its true speed."""
  ast = matmul_ast(32, 32, 32)
  target = (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 8))
  times = _times_favoring(target, hand_opts(ast))
  pool = fake_pool(times)
  quiet_time = pool._time
  def loaded_time(device, prog, specs, runs, early, directive, hang_s, ref=None):
    status, (ts, ref_ts) = quiet_time(device, prog, specs, runs, early, directive, hang_s, ref)
    load = 6.0 if tuple(actions.opts_from_key(pool._key(prog))) == target else 1.0
    return status, ([t * load for t in ts], [t * load for t in ref_ts])
  pool._time = loaded_time
  k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == target
  assert all(j.args[-1] is not None for j in pool.jobs if j.kind == "time" and j.args[1][1].decode() != actions.opts_key(hand_opts(ast)))
  assert search.last_report.beam_time == pytest.approx(1e-3)

def test_timing_status_is_early_only_when_stopped_short(fake_pool, cachedb):
  """A candidate is recorded "early" only when its timing job stopped before `runs` runs (the worker
  does that when it is far slower than the best so far); a full timing is "ok"."""
  ast = matmul_ast(32, 32, 32)
  hand = hand_opts(ast)
  short = (Opt(OptOps.UPCAST, 1, 2),)
  pool = fake_pool(lambda o: 5e-3 if o == hand else 1e-2)
  full_time = pool._time
  def time_job(device, prog, specs, runs, early, directive, hang_s, ref=None):
    status, (ts, ref_ts) = full_time(device, prog, specs, runs, early, directive, hang_s, ref)
    return status, ((ts[:1], ref_ts[:1]) if tuple(actions.opts_from_key(pool._key(prog))) == short else (ts, ref_ts))
  pool._time = time_job
  search.beam_search(cpu_kernel(ast), None, 2, runs=3, progress=False)
  with sqlite3.connect(cachedb) as c: rows = dict(c.execute("SELECT opts, status FROM timings").fetchall())
  assert rows[actions.opts_key(short)] == "early"
  others = [st for o, st in rows.items() if o != actions.opts_key(short)]
  assert len(others) > 5 and set(others) == {"ok"}

def test_cache_hit_does_no_timing(fake_pool, cachedb, monkeypatch):
  ast = matmul_ast(32, 32, 32)
  target = (Opt(OptOps.UPCAST, 1, 4),)
  fake_pool(_times_favoring(target, hand_opts(ast)))
  first = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  def no_pool(handler):
    raise AssertionError("a cache hit must not start workers or time anything")
  monkeypatch.setattr(beam, "get_pool", no_pool)
  again = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert again.applied_opts == first.applied_opts == list(target)
  assert search.last_report.cache_hit
  # another beam width, device settings or CACHELEVEL=0 is a different search
  with pytest.raises(AssertionError, match="cache hit"): search.beam_search(cpu_kernel(ast), None, 3, progress=False)
  with Context(CACHELEVEL=0), pytest.raises(AssertionError, match="cache hit"): search.beam_search(cpu_kernel(ast), None, 2, progress=False)

def test_hand_coded_win_replays_hand_coded(fake_pool, cachedb, monkeypatch):
  ast = matmul_ast(32, 32, 32)
  fake_pool(lambda opts: 1e-3 if opts == hand_opts(ast) else 1e-2)
  k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == hand_opts(ast) and search.last_report.chose == "hand"
  monkeypatch.setattr(beam, "get_pool", lambda handler: (_ for _ in ()).throw(AssertionError("no pool on a hit")))
  k2 = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert k2.applied_opts == k.applied_opts and k2.applied_opts_reasons == k.applied_opts_reasons  # the heuristic's reasons survive

def test_wider_beam_starts_warm(fake_pool, cachedb):
  ast = matmul_ast(32, 32, 32)
  times = _times_favoring((Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 2)), hand_opts(ast))
  pool = fake_pool(times)
  search.beam_search(cpu_kernel(ast), None, 1, progress=False)
  timed_first = {j.args[1][1] for j in pool.jobs if j.kind == "time"}
  pool2 = fake_pool(times)
  search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  r = search.last_report
  assert r.cached_timings > 0 and not r.cache_hit
  # only the seeds (hand-coded and unoptimized: the floor is always measured afresh) are timed again
  timed_again = timed_first & {j.args[1][1] for j in pool2.jobs if j.kind == "time"}
  assert timed_again <= {b"[]", actions.opts_key(hand_opts(ast)).encode()}

def test_never_slower_than_hand_coded(fake_pool, cachedb):
  """The search's measurements say a candidate is 5x faster, but the head-to-head race says the
  hand-coded kernel is: the hand-coded kernel is returned."""
  ast = matmul_ast(32, 32, 32)
  hand = hand_opts(ast)
  target = (Opt(OptOps.UPCAST, 0, 4),)
  fake_pool(_times_favoring(target, hand), race=lambda ts: [ts[0], ts[0] * 1.001])
  k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == hand
  assert search.last_report.chose == "hand"
  # and a candidate that is only "faster" within min_gain is not taken either
  fake_pool(lambda opts: 1e-3 if opts == hand else 0.995e-3, race=None)
  with Context(CACHELEVEL=0): k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == hand

def test_winner_must_win_both_races(fake_pool, cachedb):
  """The race runs twice, the order swapped: a candidate that only wins where it runs second (the
  first program of each round pays for a burst of load) is not taken."""
  ast = matmul_ast(32, 32, 32)
  hand = hand_opts(ast)
  target = (Opt(OptOps.UPCAST, 0, 4),)
  def first_pays(ts): return [ts[0] * 1.5, *ts[1:]]
  pool = fake_pool(_times_favoring(target, hand, fast=4e-3, hand_t=5e-3), race=first_pays)
  k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == hand and search.last_report.chose == "hand"
  assert pool.count("race") == 2
  # with no order effect the same candidate wins both races
  fake_pool(_times_favoring(target, hand, fast=4e-3, hand_t=5e-3))
  with Context(CACHELEVEL=0): k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == target and search.last_report.chose == "beam"

def test_default_budget(fake_pool, cachedb, monkeypatch):
  """budget_s=None is DEFAULT_BUDGET_S (a kernel's search stays near a minute); math.inf is none."""
  ast = matmul_ast(32, 32, 32)
  fake_pool(lambda opts: 1e-3)
  monkeypatch.setattr(beam, "DEFAULT_BUDGET_S", 0.0)
  with Context(CACHELEVEL=0): search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert not search.last_report.complete and search.last_report.rounds == 0
  with Context(CACHELEVEL=0): search.beam_search(cpu_kernel(ast), None, 2, progress=False, budget_s=math.inf)
  assert search.last_report.complete and search.last_report.rounds >= 1

def test_wrong_winner_is_rejected(fake_pool, cachedb):
  ast = matmul_ast(32, 32, 32)
  hand = hand_opts(ast)
  best, second = (Opt(OptOps.UPCAST, 0, 4),), (Opt(OptOps.UPCAST, 1, 4),)
  times = {best: 1e-3, second: 2e-3, hand: 4e-3}
  pool = fake_pool(lambda o: times.get(o, 1e-2), wrong={actions.opts_key(best)})
  with pytest.warns(RuntimeWarning, match="wrong results"):
    k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts) == second
  assert any(st == "wrong" and o == best for o, st, _ in search.last_report.failures)
  verify = [j for j in pool.jobs if j.kind == "verify"]
  assert len(verify) == 2 and all(v.args[1][1] == b"[]" for v in verify)  # the reference is the unoptimized kernel
  assert [v.args[-1] for v in verify] == [0, beam.VERIFY_FRONT]  # as built, then with a guard zone before every buffer

def test_failed_candidates_are_skipped_logic(fake_pool, cachedb, monkeypatch):
  ast = matmul_ast(32, 32, 32)
  hand = hand_opts(ast)
  crash, hang = (Opt(OptOps.UPCAST, 0, 4),), (Opt(OptOps.UPCAST, 1, 4),)
  times = {crash: 1e-4, hang: 1e-4, hand: 4e-3, (Opt(OptOps.UPCAST, 0, 2),): 2e-3}
  fake_pool(lambda o: times.get(o, 1e-2))
  monkeypatch.setattr(beam, "_test_hook", lambda opts: {crash: "segfault", hang: "hang"}.get(tuple(opts)))
  k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert tuple(k.applied_opts[:1]) not in (crash, hang)
  fails = {o: st for o, st, _ in search.last_report.failures}
  assert fails[crash] == "crash" and fails[hang] == "hang"

def test_budget_returns_best_so_far(fake_pool, cachedb):
  ast = matmul_ast(32, 32, 32)
  pool = fake_pool(_times_favoring((Opt(OptOps.UPCAST, 0, 4),), hand_opts(ast)))
  k = search.beam_search(cpu_kernel(ast), None, 2, budget_s=0.0, progress=False)
  r = search.last_report
  assert not r.complete and r.rounds == 0
  assert tuple(k.applied_opts) == hand_opts(ast)  # only the floor was timed
  assert pool.count("time") == 2  # hand-coded and unoptimized
  # an incomplete result is not a hit for a search with more budget
  pool = fake_pool(_times_favoring((Opt(OptOps.UPCAST, 0, 4),), hand_opts(ast)))
  search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert not search.last_report.cache_hit and search.last_report.complete

def test_progress_bar_and_missing_tqdm(fake_pool, cachedb, monkeypatch, capsys):
  ast = matmul_ast(32, 32, 32)
  fake_pool(_times_favoring((Opt(OptOps.UPCAST, 0, 4),), hand_opts(ast)))
  pytest.importorskip("tqdm")
  with Context(CACHELEVEL=0): search.beam_search(cpu_kernel(ast), None, 2, progress=True)
  err = capsys.readouterr().err
  assert "BEAM=2" in err and "best" in err and "round" in err
  monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails like a missing package
  monkeypatch.setattr(beam, "_tqdm_note_shown", False)
  with Context(CACHELEVEL=0):
    search.beam_search(cpu_kernel(ast), None, 2, progress=True)
    search.beam_search(cpu_kernel(ast), None, 2, progress=True)
  assert capsys.readouterr().err.count("tqdm is not installed") == 1

def test_debug_summary_line(fake_pool, cachedb, capsys):
  ast = matmul_ast(32, 32, 32)
  fake_pool(_times_favoring((Opt(OptOps.UPCAST, 0, 4),), hand_opts(ast)))
  with Context(DEBUG=2):
    search.beam_search(cpu_kernel(ast), None, 2, progress=False)
    search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("search ")]
  assert len(lines) == 2 and "hand" in lines[0] and "cache hit" in lines[1]

# ---- the sqlite cache ----------------------------------------------------------------------------

def test_corrupted_cache_is_reported_and_rebuilt(fake_pool, cachedb):
  with open(cachedb, "wb") as f: f.write(b"this is not a sqlite database, just garbage " * 100)
  ast = matmul_ast(32, 32, 32)
  fake_pool(_times_favoring((Opt(OptOps.UPCAST, 0, 4),), hand_opts(ast)))
  with pytest.warns(RuntimeWarning, match="corrupted"):
    k = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert os.path.exists(cachedb + ".corrupt")
  with sqlite3.connect(cachedb) as c:
    assert c.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 1
    assert c.execute("SELECT COUNT(*) FROM timings").fetchone()[0] > 0
  search.close_cache_dbs()
  k2 = search.beam_search(cpu_kernel(ast), None, 2, progress=False)
  assert search.last_report.cache_hit and k2.applied_opts == k.applied_opts

@pytest.mark.parametrize("where", ["cache-dir", "cachedb"])
def test_unusable_search_cache_warns_once_like_the_kernel_cache(fake_pool, tmp_path, monkeypatch, where):
  """One mechanism, one warning: an unusable cache dir is reported once for the kernel cache and the
  search's database together; an unusable CACHEDB elsewhere once, and the search goes on without it."""
  import warnings
  from tilecraft import diskcache as device_mod
  monkeypatch.setattr(device_mod, "_cache_off", {})
  monkeypatch.setattr(device_mod, "_cache_ok", set())
  monkeypatch.delenv(device_mod._OFF_ENV, raising=False)
  (tmp_path / "file").write_text("not a directory")
  if where == "cache-dir": monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
  else: monkeypatch.setenv("CACHEDB", str(tmp_path / "file" / "search.db"))
  search.close_cache_dbs()
  ast = matmul_ast(16, 16, 16)
  target = (Opt(OptOps.UPCAST, 0, 4),)
  fake_pool(_times_favoring(target, hand_opts(ast)))
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for _ in range(2):
      assert tuple(search.beam_search(cpu_kernel(ast), None, 2, progress=False).applied_opts) == target
      assert not search.last_report.cache_hit
    device_mod.diskcache_put("t", "k", b"x")
  msgs = [str(x.message) for x in w if "cache" in str(x.message)]
  assert len(msgs) == 1 and "not usable" in msgs[0] and "running without it" in msgs[0], msgs
  assert ("search.db" in msgs[0]) == (where == "cachedb")
  search.close_cache_dbs()

def test_cache_corrupted_mid_file(tmp_path):
  path = str(tmp_path / "s.db")
  db = search.SearchDB(path)
  db.put_result("k", "[]", "hand", 1.0, 1.0, True, None, "{}")
  db.put_timings("a", "c", [(f"[{i}]", "ok", 1e-3 * i) for i in range(2000)])
  db.close()
  with open(path, "r+b") as f:  # garble pages after the header
    f.seek(4096); f.write(os.urandom(16384))  # noqa: E702
  db = search.SearchDB(path)
  with pytest.warns(RuntimeWarning, match="corrupted"):
    got = db.get_result("k")
  assert got is None  # rebuilt empty: a miss, not a crash
  db.put_result("k", "[]", "hand", 1.0, 1.0, True, None, "{}")
  assert db.get_result("k") is not None

# ---- real worker processes -----------------------------------------------------------------------

def test_worker_keeps_shared_blobs_past_its_lru():
  """A blob every job shares (the renderer) is sent once; after more distinct blobs than the worker keeps (a tune
  of a model's 46 kernels: 46 ASTs), the parent still knows what the worker holds and resends what it evicted.
  (Before: from the 32nd AST on, every job failed with KeyError 'ren:...', and tune kept the hand-coded opts.)"""
  pool = isolation.Pool("search_fakes:BlobEcho")
  try:
    n = 3 * isolation._BLOBS_KEPT
    for i in range(n):
      blobs = {"ren:shared": pickle.dumps("renderer"), f"ast:{i}": pickle.dumps(i)}
      status, payload = pool.run([isolation.Job("echo", tuple(blobs), 30.0, blobs)], 1)[0]
      assert (status, payload) == ("ok", ["renderer", i]), (i, status, payload)
    # an old blob the worker evicted long ago is sent again, not assumed
    blobs = {"ast:0": pickle.dumps(0)}
    assert pool.run([isolation.Job("echo", ("ast:0",), 30.0, blobs)], 1)[0] == ("ok", [0])
  finally: pool.close()

def test_worker_build_matches_parent_render_symbolic():
  """ASTs (with symbolic shapes) travel to a worker and render exactly as here."""
  n = Variable("n", 1, 64)
  st = ShapeTracker.from_shape((n, 16))
  ast = _kernel(LazyOp(ReduceOps.SUM, (_load(1, st),), (1,)), (n, 1))
  k = cpu_kernel(ast)
  k.apply_opt(Opt(OptOps.UNROLL, 0, 4))
  src = k.to_program(name_override="kern").src
  blob_ast, blob_ren = pickle.dumps(ast), pickle.dumps(k.opts)
  job = isolation.Job("build", ("ast:x", "ren:x", ast.key.hex(), "CPU", [actions.opt_wire(o) for o in k.applied_opts], "kern", {"n": 64}, 0, False),
                    120.0, {"ast:x": blob_ast, "ren:x": blob_ren})
  status, payload = isolation.get_pool(worker.HANDLER).run([job], 1)[0]
  assert status == "ok", payload
  assert payload["src"] == src and payload["vals"] == [64]

def test_worker_build_recompiles_a_cached_binary_that_does_not_load(tmp_path, monkeypatch):
  """The build job goes through the checked cache entry point (compile_and_load): a cached binary with
  a valid checksum that fails to load is rebuilt, not handed to the timing jobs (where every run of
  the candidate would fail)."""
  from tilecraft.diskcache import diskcache_get, diskcache_put
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  ast = ew_ast(64)
  k = cpu_kernel(ast)
  src = k.to_program(name_override="kern").src
  comp = Device["CPU"].compiler
  diskcache_put("binaries", comp.cache_key(src), b"\x7fELF but not a shared object")
  w = worker.SearchWorker()
  w.blobs.update({"ast:x": ast, "ren:x": k.opts})
  status, payload = w.build("ast:x", "ren:x", ast.key.hex(), "CPU", [], "kern", {}, 0, True)
  assert status == "ok" and payload["src"] == src
  assert payload["lib"][:4] == b"\x7fELF" and len(payload["lib"]) > 100 and diskcache_get("binaries", comp.cache_key(src)) == payload["lib"]
  x, y = np.arange(64, dtype=np.float32), np.full(64, 2, dtype=np.float32)
  bufs = [Buffer("CPU", 64, dtypes.float32).allocate()] + [Buffer("CPU", 64, dtypes.float32).allocate().copyin(a) for a in (x, y)]
  w.run_once("CPU", ("kern", payload["lib"], payload["gs"], payload["ls"], payload["vals"]), bufs)
  np.testing.assert_allclose(bufs[0].numpy(), np.maximum(x * y + 1, 0))

def test_segfault_and_hang_are_skipped_and_result_is_correct(cachedb, monkeypatch):
  n = 4096
  ast = ew_ast(n)
  crash, hang = Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 0, 8)
  def hook(opts):
    if opts and opts[-1] == crash: return "segfault"
    if opts and opts[-1] == hang: return "hang"
    return None
  monkeypatch.setattr(beam, "_test_hook", hook)
  k = search.beam_search(cpu_kernel(ast), None, 2, timeout_s=2.0, max_rounds=1, progress=False)
  r = search.last_report
  kinds = {st for o, st, msg in r.failures}
  assert "crash" in kinds and "hang" in kinds, r.failures
  assert any("SIGSEGV" in msg for _, st, msg in r.failures if st == "crash")
  assert r.timed >= 3  # the search went on after the failures
  assert crash not in k.applied_opts[-1:] and hang not in k.applied_opts[-1:]
  rng = np.random.default_rng(0)
  x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32) - 0.5
  np.testing.assert_allclose(run_kernel(k, [x, y], n), np.maximum(x * y + 1, 0), rtol=1e-6)

def test_verify_job_catches_wrong_and_out_of_bounds():
  """The verification worker flags a kernel computing something else, and one writing past its output."""
  n = 256
  def prog(ast, opts=()):
    k = cpu_kernel(ast)
    for o in opts: k.apply_opt(o)
    p = k.to_program(name_override="kern")
    return ("kern", Device["CPU"].compiler.compile_cached(p.src), None, None, [])
  ref = prog(ew_ast(n))
  same = prog(ew_ast(n), [Opt(OptOps.UPCAST, 0, 8)])
  other = prog(_kernel(LazyOp(BinaryOps.ADD, (_load(1, ShapeTracker.from_shape((n,))), _load(2, ShapeTracker.from_shape((n,))))), (n,)))
  st_big = ShapeTracker.from_shape((n + 8,))
  overflow = prog(_kernel(LazyOp(BinaryOps.MUL, (_load(1, ShapeTracker.from_shape((n,)).pad(((0, 8),))), _load(2, ShapeTracker.from_shape((n,)).pad(((0, 8),))))), (n + 8,)))
  specs = [(n, dtypes.float32)] * 3
  assert st_big.size == n + 8
  status, res = isolation.get_pool(worker.HANDLER).run([isolation.Job("verify", ("CPU", ref, [same, other, overflow], specs, 1, False, 7, 64), 60.0)], 1)[0]
  assert status == "ok", res
  assert res[0][0] and not res[1][0] and not res[2][0]
  assert "past the end" in res[2][2]

def test_script_without_main_guard(tmp_path):
  """Workers never re-run the user's script (unlike multiprocessing's spawn/forkserver)."""
  script = tmp_path / "user_script.py"
  script.write_text(textwrap.dedent(f"""
    import sys
    sys.path[:0] = [{os.path.dirname(__file__)!r}, {os.path.dirname(os.path.dirname(__file__))!r}]  # (test_search, and the tests' helpers)
    from test_search import ew_ast
    from tilecraft.codegen.kernel import Kernel
    from tilecraft.device import Device
    from tilecraft.engine.search import beam_search
    print("SCRIPT BODY RAN")
    k = beam_search(Kernel(ew_ast(1024), Device["CPU"].renderer), None, 1, max_rounds=1, progress=False, disable_cache=True)
    print("OPTS", k.applied_opts)
  """))
  r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.count("SCRIPT BODY RAN") == 1 and "OPTS" in r.stdout

def test_optimize_kernel_modes(monkeypatch):
  ast = matmul_ast(32, 32, 32)
  with Context(NOOPT=1): assert realize.optimize(cpu_kernel(ast)).applied_opts == []
  with Context(BEAM=0): assert tuple(realize.optimize(cpu_kernel(ast)).applied_opts) == hand_opts(ast)
  calls = []
  def fake_beam(k, bufs, amt, **kw):
    calls.append((amt, kw))
    return k.copy()
  monkeypatch.setattr(search, "beam_search", fake_beam)
  with Context(BEAM=3, BEAM_BUDGET=5.0): realize.optimize(cpu_kernel(ast), None)
  assert calls == [(3, {"budget_s": 5.0})]
  def broken(*a, **kw): raise OSError("no workers")
  monkeypatch.setattr(search, "beam_search", broken)
  with Context(BEAM=2), pytest.warns(RuntimeWarning, match="hand-coded"):
    k = realize.optimize(cpu_kernel(ast))
  assert tuple(k.applied_opts) == hand_opts(ast)

@pytest.mark.slow
@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_real_beam_on_small_kernels(device, cachedb):
  ren = Device["CPU"].renderer if device == "CPU" else opencl_renderer()
  rng = np.random.default_rng(1)
  a, b = rng.random((64, 64), dtype=np.float32), rng.random((64, 64), dtype=np.float32)
  k = search.beam_search(Kernel(matmul_ast(64, 64, 64), ren), None, 2, max_rounds=3, progress=False)
  r = search.last_report
  # the report describes the kernel returned: the hand-coded opts when they won, else a verified
  # candidate that is not the hand-coded kernel
  assert r.chose in ("hand", "beam") and tuple(k.applied_opts) == r.opts
  if r.chose == "hand": assert r.opts == hand_opts(matmul_ast(64, 64, 64), ren)
  else: assert r.verified and r.opts != hand_opts(matmul_ast(64, 64, 64), ren) and r.timed > 2
  np.testing.assert_allclose(run_kernel(k, [a, b], 64 * 64).reshape(64, 64), a @ b, rtol=1e-4)
  k2 = search.beam_search(Kernel(matmul_ast(64, 64, 64), ren), None, 2, max_rounds=3, progress=False)
  assert search.last_report.cache_hit and k2.applied_opts == k.applied_opts

def test_an_opt_that_raises_a_bug_is_reported_and_skipped(monkeypatch):
  ast = matmul_ast(32, 32, 32)
  real = Kernel._apply_opt
  def buggy(self, opt):
    if opt.op is OptOps.UNROLL: raise IndexError("bug")
    real(self, opt)
  monkeypatch.setattr(Kernel, "_apply_opt", buggy)
  with pytest.warns(RuntimeWarning, match="IndexError"):
    acts = search.get_kernel_actions(cpu_kernel(ast))
  assert acts and all(o.op is not OptOps.UNROLL for k in acts.values() for o in k.applied_opts)
