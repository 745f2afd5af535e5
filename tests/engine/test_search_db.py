"""The portable search cache (tilecraft.engine.search.db and `tilecraft cache`): a schema-1 file
still opens, export / import / merge move results between two cache files, an imported result is
a cache hit on the same kind of machine, and a result for another kind is kept but never used.
Searches run against a tiny fake worker pool (instant builds, fixed times): no processes."""
from __future__ import annotations
import json, os, sqlite3
import pytest
from tilecraft.__main__ import main
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.engine import search
from tilecraft.engine.search import beam, db
from tilecraft.helpers import Context
from search_fakes import ew_ast as fakes_ew_ast, install_fake_pool
from tilecraft.ops import BinaryOps, LazyOp

def ew_ast(n: int) -> LazyOp: return fakes_ew_ast(n, BinaryOps.ADD)

@pytest.fixture
def pool(monkeypatch):
  return install_fake_pool(monkeypatch, lambda opts: 1e-3)  # every candidate equally fast: the hand-coded floor wins

def _search(n: int = 64) -> search.SearchReport:
  search.beam_search(Kernel(ew_ast(n), Device["CPU"].renderer), None, 1, progress=False)
  return search.last_report

def _cli(*args: str) -> int:
  return main(["cache", *args])

def test_a_schema_1_cache_is_upgraded_in_place(tmp_path):
  path = str(tmp_path / "old.db")
  conn = sqlite3.connect(path)
  conn.execute("CREATE TABLE results (key TEXT PRIMARY KEY, opts TEXT NOT NULL, chose TEXT NOT NULL, time REAL, hand_time REAL, "
               "complete INTEGER NOT NULL, budget REAL, info TEXT, created REAL)")
  conn.execute("CREATE TABLE timings (ast TEXT NOT NULL, ctx TEXT NOT NULL, opts TEXT NOT NULL, status TEXT NOT NULL, time REAL, PRIMARY KEY (ast, ctx, opts))")
  conn.execute("INSERT INTO results VALUES ('k1', '', 'hand', 1e-3, 1e-3, 1, 40.0, '{}', 5.0)")
  conn.execute("PRAGMA user_version = 1")
  conn.commit()
  conn.close()
  assert db.read_results(path) == [("k1", "", "hand", 1e-3, 1e-3, 1, 40.0, "{}", 5.0, None)]  # read-only: not upgraded by reading
  sdb = db.SearchDB(path)
  assert sdb.get_result("k1") == ("", "hand", 1e-3, 1e-3, 1, 40.0)
  sdb.put_result("k2", "", "base", 2e-3, 1e-3, True, None, "{}")
  assert {r[0]: r[9] is not None for r in sdb.result_rows()} == {"k1": False, "k2": True}
  assert sdb.conn.execute("PRAGMA user_version").fetchone()[0] == db._SCHEMA
  sdb.close()

def test_export_import_makes_the_same_search_a_cache_hit(tmp_path, pool):
  a, b, f = (str(tmp_path / n) for n in ("a.db", "b.db", "export.db"))
  with Context(CACHEDB=a, CACHELEVEL=2):
    assert not _search().cache_hit
    assert _cli("export", f) == 0
  rows = db.read_results(f)
  assert len(rows) == 1 and json.loads(rows[0][9])["cpu_arch"]  # the row says which kind of machine found it
  assert db.same_kind(rows[0][9]) is True
  with Context(CACHEDB=b, CACHELEVEL=2):
    built = len(pool.jobs)
    assert not os.path.exists(b) or db.read_results(b) == []
    assert _cli("import", f) == 0
    r = _search()
    assert r.cache_hit and len(pool.jobs) == built  # replayed: nothing built or timed
    assert not _search(128).cache_hit  # another kernel is still a search
  db.close_cache_dbs()

def test_a_result_for_another_kind_of_machine_is_kept_but_never_used(tmp_path, pool, monkeypatch):
  other, mine = str(tmp_path / "other.db"), str(tmp_path / "mine.db")
  # another machine: a different CPU (the compiler's identity names the host CPU model and flags)
  comp = Device["CPU"].compiler
  with Context(CACHEDB=other, CACHELEVEL=2):
    monkeypatch.setattr(comp, "cachekey", comp.cachekey + "|model name: Some Other CPU")
    assert not _search().cache_hit
    monkeypatch.undo()
    monkeypatch.setattr(beam, "get_pool", lambda handler: pool)
  db.close_cache_dbs()
  (other_key,) = [r[0] for r in db.read_results(other)]
  with Context(CACHEDB=mine, CACHELEVEL=2):
    assert _cli("import", other) == 0
    assert not _search().cache_hit  # not this kind: searched here
    keys = {r[0] for r in db.read_results(mine)}
    assert other_key in keys and len(keys) == 2  # the other kind's row is kept alongside this machine's
    assert _search().cache_hit
  db.close_cache_dbs()

def _row(key: str, complete: int, budget, created: float, t: float) -> tuple:
  return (key, "", "hand", t, t, complete, budget, "{}", created, json.dumps({"cpu": "x"}))

def test_merge_keeps_the_better_founded_result_never_the_faster(tmp_path, capsys):
  a, b, c = (str(tmp_path / n) for n in ("a.db", "b.db", "c.db"))
  for path, rows in ((a, [_row("k", 0, 10.0, 1.0, 1e-6), _row("only_a", 1, None, 1.0, 1.0)]),
                     (b, [_row("k", 1, 40.0, 2.0, 1.0), _row("newer", 1, 40.0, 1.0, 1.0)]),
                     (c, [_row("newer", 1, 40.0, 3.0, 2.0)])):
    sdb = db.SearchDB(path)
    sdb.merge_rows(rows)
    sdb.close()
  assert _cli("merge", a, b, c) == 0
  got = {r[0]: r for r in db.read_results(a)}
  assert set(got) == {"k", "only_a", "newer"}
  assert got["k"][5] == 1 and got["k"][3] == 1.0      # complete beats a faster budget-cut search
  assert got["newer"][8] == 3.0                       # equally founded: the newer
  assert "1 added, 1 replaced" in capsys.readouterr().out
  assert _cli("merge", a, c) == 0 and "0 added, 0 replaced (better-founded), 1 kept" in capsys.readouterr().out  # idempotent

def test_bad_files_are_named(tmp_path, capsys):
  junk = tmp_path / "junk.db"
  junk.write_bytes(b"not a database at all" * 100)
  with Context(CACHEDB=str(tmp_path / "s.db"), CACHELEVEL=2):
    assert _cli("import", str(tmp_path / "missing.db")) == 1
    assert "missing.db: no such file" in capsys.readouterr().err
    assert _cli("import", str(junk)) == 1
    assert "junk.db: not a tilecraft search cache" in capsys.readouterr().err
    assert _cli("merge", str(tmp_path / "x.db")) == 2
    assert _cli("export", str(tmp_path)) == 2 and "is a directory" in capsys.readouterr().err
  assert not (tmp_path / "x.db").exists()
