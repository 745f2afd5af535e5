"""The search's sqlite cache (`CACHEDB`, default cache_dir()/search.db; CACHELEVEL=0 disables): one
row per search (AST key, device, renderer, compiler, settings) whose opts are replayed on a hit, and
one row per timed candidate so a repeat search (say, with a wider beam) starts warm.

A result's key is a hash of everything that decides whether its opts are right for a machine: the
AST, the device, the renderer, the compiler's identity (its version, the host CPU's model and ISA
flags, the -march from CPU_ARCH), the code generator's source and the search's version and settings
(see search/beam.py). A row is therefore only ever replayed on the same kind of machine; rows for
other kinds sit in the same file unused. Each row also carries `kind`, a readable JSON description of
the machine that produced it (device, ISA, CPU_ARCH, compiler, versions), for people and for
`tilecraft cache` to report on; matching never reads it.

Portable caches (`tilecraft cache export/import/merge`): `export_results` writes the results (not the
per-candidate timings: those stay on the machine that measured them, so timings from different
machines are never compared) to a new file; `merge_results` folds result rows from other files into
one, keeping per key the better-founded row (complete over budget-cut, a larger budget, then newer),
never the faster one, because times measured on different machines aren't comparable.

Schema history: 1 had no `kind` column; a schema-1 file is upgraded in place (rows kept)."""
from __future__ import annotations
import functools, json, math, os, platform, sqlite3, time, warnings
from typing import Any, Callable, Iterable, Optional, Sequence
from tilecraft.diskcache import disk_cache_off, disk_cache_unusable
from tilecraft.helpers import cache_dir, getenv

_SCHEMA = 2
RESULT_COLUMNS = ("key", "opts", "chose", "time", "hand_time", "complete", "budget", "info", "created", "kind")
_CREATE_RESULTS = ("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, opts TEXT NOT NULL, chose TEXT NOT NULL, time REAL, "
                   "hand_time REAL, complete INTEGER NOT NULL, budget REAL, info TEXT, created REAL, kind TEXT)")

def cache_db_path() -> str:
  """`CACHEDB` (env or Context) if set, else cache_dir()/search.db."""
  return getenv("CACHEDB", "") or os.path.join(cache_dir(), "search.db")

class SearchDB:
  """Search results and per-candidate timings in one sqlite file. A file that is not a database, or
  fails sqlite's quick_check, is moved aside to `<path>.corrupt` with a warning and rebuilt; one that
  can't be used (its directory unwritable, the disk full, locked) is off for the process, reported by
  the disk cache's one mechanism (tilecraft.diskcache.disk_cache_unusable: one warning, none when the
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
      if ver not in (0, 1, _SCHEMA):
        conn.executescript("DROP TABLE IF EXISTS results; DROP TABLE IF EXISTS timings;")
      with conn:
        if ver == 1 and "kind" not in _columns(conn, "results"): conn.execute("ALTER TABLE results ADD COLUMN kind TEXT")
        conn.execute(_CREATE_RESULTS)
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
  def put_result(self, key: str, opts: str, chose: str, t: float, hand_t: float, complete: bool, budget: Optional[float], info: str,
                 kind: Optional[str] = None) -> None:
    """Store one search's result; `kind` describes the machine it was found on (default: this one)."""
    row = (key, opts, chose, _finite(t), _finite(hand_t), int(complete), budget, info, time.time(), kind or machine_kind())
    self._do(lambda c: _insert_results(c, [row]))
  def result_rows(self) -> list[tuple]:
    """Every result row, columns as RESULT_COLUMNS."""
    return self._do(lambda c: c.execute(f"SELECT {', '.join(RESULT_COLUMNS)} FROM results").fetchall()) or []
  def merge_rows(self, rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    """Fold result rows (RESULT_COLUMNS) in, keeping per key the better-founded row (see merge_results);
    counts of rows 'added', 'replaced' and 'kept' (the one here was as good or better)."""
    return self._do(lambda c: _merge(c, rows)) or {"added": 0, "replaced": 0, "kept": 0}
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

def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
  return [r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()]

def _insert_results(c: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> None:
  with c: c.executemany(f"INSERT OR REPLACE INTO results ({', '.join(RESULT_COLUMNS)}) VALUES ({','.join('?' * len(RESULT_COLUMNS))})",
                        [tuple(r) for r in rows])

def _rank(row: Sequence[Any]) -> tuple:
  """How well-founded a result row is: complete beats budget-cut, then the larger budget (None: unbounded), then the newer.
  Never its time: two rows for one key may come from two machines, whose times aren't comparable."""
  complete, budget, created = row[5], row[6], row[8]
  return (int(bool(complete)), math.inf if budget is None else float(budget), float(created or 0.0))

def _merge(c: sqlite3.Connection, rows: Iterable[Sequence[Any]]) -> dict[str, int]:
  best: dict[str, tuple] = {}  # the best incoming row per key first, so each key counts once
  for r in rows:
    r = tuple(r)
    if len(r) != len(RESULT_COLUMNS): raise ValueError(f"a search-cache result row has {len(r)} fields, expected {len(RESULT_COLUMNS)}")
    if r[0] not in best or _rank(r) > _rank(best[r[0]]): best[r[0]] = r
  counts = {"added": 0, "replaced": 0, "kept": 0}
  todo = []
  for key, r in best.items():
    old = c.execute(f"SELECT {', '.join(RESULT_COLUMNS)} FROM results WHERE key=?", (key,)).fetchone()
    if old is None: counts["added"] += 1
    elif _rank(r) > _rank(old): counts["replaced"] += 1
    else:
      counts["kept"] += 1
      continue
    todo.append(r)
  _insert_results(c, todo)
  return counts

class CacheFileError(ValueError):
  """A file given to export/import/merge that is not a usable search cache (the message says why)."""

def read_results(path: str) -> list[tuple]:
  """The result rows (RESULT_COLUMNS; `kind` None for schema-1 files) of the search cache file at `path`,
  opened read-only; CacheFileError when it is missing or not a search cache."""
  if not os.path.isfile(path): raise CacheFileError(f"{path}: no such file")
  try:
    conn = sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True, timeout=30)
  except sqlite3.Error as e: raise CacheFileError(f"{path}: can't open it: {e}") from None
  try:
    if (row := conn.execute("PRAGMA quick_check").fetchone()) is None or row[0] != "ok": raise CacheFileError(f"{path}: damaged ({row})")
    ver = conn.execute("PRAGMA user_version").fetchone()[0]
    cols = _columns(conn, "results")
    if not cols: raise CacheFileError(f"{path}: not a tilecraft search cache (no results table)")
    if ver not in (1, _SCHEMA): raise CacheFileError(f"{path}: search cache schema {ver}, this tilecraft reads 1 and {_SCHEMA}")
    sel = ", ".join(c if c in cols else "NULL" for c in RESULT_COLUMNS)
    return conn.execute(f"SELECT {sel} FROM results").fetchall()
  except sqlite3.DatabaseError as e: raise CacheFileError(f"{path}: not a tilecraft search cache ({e})") from None
  finally: conn.close()

def _open_file(path: str) -> SearchDB:
  db = SearchDB(path)
  if db._open() is None: raise CacheFileError(f"{path}: can't be used as a search cache (see the warning above)")
  return db

def export_results(src: str, dst: str) -> int:
  """Write the result rows of the search cache `src` to a new search cache file `dst` (replaced if
  present); the number of rows. Per-candidate timings are not exported (they belong to the machine
  that measured them)."""
  rows = read_results(src) if os.path.exists(src) else []
  tmp = f"{dst}.tmp{os.getpid()}"
  for p in (tmp, tmp + "-journal"):
    if os.path.exists(p): os.unlink(p)
  db = _open_file(tmp)
  try:
    assert db.conn is not None
    _insert_results(db.conn, rows)
  finally: db.close()
  os.replace(tmp, dst)
  return len(rows)

def merge_results(dst: str, srcs: Sequence[str]) -> dict[str, int]:
  """Fold the result rows of the search cache files `srcs` into `dst` (created if missing): per key,
  the better-founded row wins (complete over budget-cut, larger budget, then newer). Counts of rows
  added, replaced and kept. Every source is read before `dst` is touched, so a bad one changes nothing."""
  rows = [r for s in srcs for r in read_results(s)]
  db = _open_file(dst)
  try: return db.merge_rows(rows)
  finally: db.close()

@functools.cache
def _host_facts() -> dict[str, Any]:
  facts: dict[str, Any] = {"machine": platform.machine(), "system": platform.system()}
  try:
    with open("/proc/cpuinfo") as f: model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    if model: facts["cpu"] = model
  except OSError: pass
  try:
    from tilecraft.host import find_c_compiler, host_target
    import subprocess
    cc = find_c_compiler()
    facts["cc"] = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    facts["host_isa"] = host_target(cc).isa
  except Exception: pass  # noqa: BLE001 - a description, not a key: leave out what can't be found
  try:
    from importlib.metadata import version
    facts["tilecraft"] = version("tilecraft")
  except Exception: pass  # noqa: BLE001
  return facts

def machine_kind(device: Optional[str] = None) -> str:
  """A readable JSON description of this machine for result rows: the host CPU and ISA, CPU_ARCH, the
  C compiler, tilecraft's version and the search's version (and `device` when given). Informative only:
  the row's key already decides where it applies."""
  facts = dict(_host_facts())
  try:
    from tilecraft.host import cpu_arch
    facts["cpu_arch"] = cpu_arch()
  except ValueError: pass
  from tilecraft.engine.search.keys import SEARCH_VERSION, codegen_identity  # (keys.py imports the codegen: only when a row is written)
  facts["search"], facts["codegen"] = SEARCH_VERSION, codegen_identity()
  if device: facts["device"] = device
  return json.dumps(facts, sort_keys=True)

def same_kind(kind: Optional[str], device: Optional[str] = None) -> Optional[bool]:
  """Whether a row's `kind` describes this machine (for reports; None: the row doesn't say)."""
  if not kind: return None
  try: theirs = json.loads(kind)
  except ValueError: return None
  ours = json.loads(machine_kind(device))
  return all(theirs.get(k) == ours.get(k) for k in ("machine", "cpu", "cc", "cpu_arch", "tilecraft", "search", "codegen")
             if k in theirs or k in ours)

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
