"""The search's sqlite cache (`CACHEDB`, default cache_dir()/search.db; CACHELEVEL=0 disables): one
row per search (AST key, device, renderer, compiler, settings) whose opts are replayed on a hit, and
one row per timed candidate so a repeat search (say, with a wider beam) starts warm."""
from __future__ import annotations
import math, os, sqlite3, time, warnings
from typing import Any, Callable, Optional
from tilecraft.device import disk_cache_off, disk_cache_unusable
from tilecraft.helpers import cache_dir, getenv

_SCHEMA = 1

def cache_db_path() -> str:
  """`CACHEDB` (env or Context) if set, else cache_dir()/search.db."""
  return getenv("CACHEDB", "") or os.path.join(cache_dir(), "search.db")

class SearchDB:
  """Search results and per-candidate timings in one sqlite file. A file that is not a database, or
  fails sqlite's quick_check, is moved aside to `<path>.corrupt` with a warning and rebuilt; one that
  can't be used (its directory unwritable, the disk full, locked) is off for the process, reported by
  the disk cache's one mechanism (tilecraft.device.disk_cache_unusable: one warning, none when the
  kernel cache already found the directory unusable)."""
  def __init__(self, path: str):
    self.path = path
    self.conn: Optional[sqlite3.Connection] = None
    self.broken = False

  def _connect(self) -> sqlite3.Connection:
    d = os.path.dirname(os.path.abspath(self.path))
    os.makedirs(d, exist_ok=True)
    conn = sqlite3.connect(self.path, timeout=30)
    try:
      row = conn.execute("PRAGMA quick_check").fetchone()
      if row is None or row[0] != "ok": raise sqlite3.DatabaseError(f"quick_check says {row[0] if row else 'nothing'}")
      ver = conn.execute("PRAGMA user_version").fetchone()[0]
      if ver not in (0, _SCHEMA):
        conn.executescript("DROP TABLE IF EXISTS results; DROP TABLE IF EXISTS timings;")
      with conn:
        conn.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, opts TEXT NOT NULL, chose TEXT NOT NULL, time REAL, "
                     "hand_time REAL, complete INTEGER NOT NULL, budget REAL, info TEXT, created REAL)")
        conn.execute("CREATE TABLE IF NOT EXISTS timings (ast TEXT NOT NULL, ctx TEXT NOT NULL, opts TEXT NOT NULL, status TEXT NOT NULL, "
                     "time REAL, PRIMARY KEY (ast, ctx, opts))")
        conn.execute(f"PRAGMA user_version = {_SCHEMA}")
    except BaseException:
      conn.close()
      raise
    return conn

  def _open(self) -> Optional[sqlite3.Connection]:
    if self.broken: return None
    if disk_cache_off(os.path.dirname(os.path.abspath(self.path))) or disk_cache_off(self.path):  # already reported
      self.broken = True
      return None
    if self.conn is None:
      try: self.conn = self._connect()
      except sqlite3.DatabaseError as e:
        if not _is_corruption(e): return self._give_up(e)
        self._rebuild(e)
        try: self.conn = self._connect()
        except sqlite3.Error as e2: return self._give_up(e2)
      except OSError as e: return self._give_up(e)
    return self.conn

  def _rebuild(self, err: Exception) -> None:
    bad = self.path + ".corrupt"
    try: os.replace(self.path, bad)
    except OSError: bad = "(could not move it aside)"
    for ext in ("-journal", "-wal", "-shm"):
      try: os.unlink(self.path + ext)
      except OSError: pass
    warnings.warn(f"search cache {self.path} is corrupted ({err}); moved it to {bad} and started a new one", RuntimeWarning, stacklevel=4)

  def _give_up(self, err: Exception) -> Optional[sqlite3.Connection]:
    """Searching without the cache: reported like any unusable disk cache (one warning per process)."""
    disk_cache_unusable(err, self.path)
    self.broken = True
    return None

  def _do(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
    for attempt in range(2):
      if (conn := self._open()) is None: return None
      try: return fn(conn)
      except sqlite3.DatabaseError as e:
        if not _is_corruption(e): return self._give_up(e)
        err: Exception = e
      try: conn.close()
      except sqlite3.Error: pass
      self.conn = None
      if attempt == 0: self._rebuild(err)
    return None

  def get_result(self, key: str) -> Optional[tuple]:
    return self._do(lambda c: c.execute("SELECT opts, chose, time, hand_time, complete, budget FROM results WHERE key=?", (key,)).fetchone())
  def put_result(self, key: str, opts: str, chose: str, t: float, hand_t: float, complete: bool, budget: Optional[float], info: str) -> None:
    def put(c: sqlite3.Connection) -> None:
      with c: c.execute("INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?,?,?,?)",
                        (key, opts, chose, _finite(t), _finite(hand_t), int(complete), budget, info, time.time()))
    self._do(put)
  def get_timings(self, ast: str, ctx: str) -> dict[str, tuple[str, Optional[float]]]:
    rows = self._do(lambda c: c.execute("SELECT opts, status, time FROM timings WHERE ast=? AND ctx=?", (ast, ctx)).fetchall())
    return {o: (s, t) for o, s, t in (rows or [])}
  def put_timings(self, ast: str, ctx: str, rows: list[tuple[str, str, Optional[float]]]) -> None:
    if not rows: return
    def put(c: sqlite3.Connection) -> None:
      with c: c.executemany("INSERT OR REPLACE INTO timings VALUES (?,?,?,?,?)", [(ast, ctx, o, s, t) for o, s, t in rows])
    self._do(put)
  def close(self) -> None:
    if self.conn is not None:
      try: self.conn.close()
      except sqlite3.Error: pass
      self.conn = None

def _is_corruption(e: Exception) -> bool:
  """Errors that mean the file is damaged (rebuild it), as opposed to locked, read-only or full (leave it)."""
  msg = str(e).lower()
  return any(w in msg for w in ("not a database", "malformed", "quick_check", "encrypted", "disk image", "corrupt"))

def _finite(x: Optional[float]) -> Optional[float]: return x if x is not None and math.isfinite(x) else None

_dbs: dict[tuple[str, int], SearchDB] = {}

def close_cache_dbs() -> None:
  """Close this process's connections to search caches (they reopen on the next use)."""
  for db in _dbs.values(): db.close()
  _dbs.clear()

def get_db() -> Optional[SearchDB]:
  if int(getenv("CACHELEVEL", 2)) <= 0: return None
  key = (os.path.abspath(cache_db_path()), os.getpid())
  if key not in _dbs: _dbs[key] = SearchDB(key[0])
  db = _dbs[key]
  return None if db.broken else db
