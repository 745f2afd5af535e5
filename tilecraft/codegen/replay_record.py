"""Recording for process replay (tilecraft/testing/replay.py): under RUN_PROCESS_REPLAY=1,
Kernel.to_program stores every kernel it renders (AST, renderer, applied opts, name, source) in
REPLAY_DB. It lives in codegen/ because the code generator calls it; the replay tool that reads the
records and regenerates them is test tooling (testing/replay.py)."""
from __future__ import annotations
import hashlib, os, pickle, sqlite3, time, warnings
from typing import Any

_SCHEMA = """CREATE TABLE IF NOT EXISTS kernels (key TEXT PRIMARY KEY, name TEXT, device TEXT, renderer TEXT, opts TEXT,
  ast BLOB, renderer_obj BLOB, opts_obj BLOB, src TEXT, recorded REAL)"""

def db_path() -> str:
  """REPLAY_DB, else process_replay.db in tilecraft's cache dir."""
  if (p := os.environ.get("REPLAY_DB")): return p
  from tilecraft.helpers import cache_dir
  return os.path.join(cache_dir(), "process_replay.db")

def renderer_identity(ren: Any) -> str:
  """The renderer's class and its settings, for people (the object itself is pickled for the replay)."""
  attrs = {k: v for k, v in sorted(vars(ren).items()) if not k.startswith("_") and isinstance(v, (int, float, str, bool, tuple, type(None)))}
  return f"{type(ren).__module__}.{type(ren).__qualname__}(device={getattr(ren, 'device', '?')}{''.join(f', {k}={v!r}' for k, v in attrs.items())})"

_conns: dict[tuple[int, str], sqlite3.Connection] = {}
_warned = False

def _connect(path: str) -> sqlite3.Connection:
  key = (os.getpid(), path)
  if (c := _conns.get(key)) is None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    c = _conns[key] = sqlite3.connect(path, timeout=60)
    c.execute(_SCHEMA)
    c.commit()
  return c

def record(k: Any, name: str, src: str) -> None:
  """Store one rendered kernel (called by Kernel.to_program under RUN_PROCESS_REPLAY=1). Recording
  never breaks rendering: a failure is one warning, then recording is off for this process."""
  global _warned
  if _warned: return
  try:
    ren, opts = k.opts, tuple(k.applied_opts)
    rid, opts_s = renderer_identity(ren), repr(list(opts))
    key = hashlib.sha256("\0".join([k.ast.key.hex(), rid, opts_s, name]).encode()).hexdigest()
    c = _connect(db_path())
    c.execute("INSERT OR REPLACE INTO kernels VALUES (?,?,?,?,?,?,?,?,?,?)",
              (key, name, getattr(ren, "device", ""), rid, opts_s, pickle.dumps(k.ast), pickle.dumps(ren), pickle.dumps(opts), src, time.time()))
    c.commit()
  except Exception as e:  # noqa: BLE001
    _warned = True
    warnings.warn(f"process replay: could not record kernel {name} ({type(e).__name__}: {e}); recording is off", RuntimeWarning, stacklevel=3)
