"""Recording for process replay (tilecraft/testing/replay.py): under RUN_PROCESS_REPLAY=1,
Kernel.to_program stores every kernel it renders (AST, renderer, applied opts, name, source, and the
settings that change the source) in REPLAY_DB. The settings are TC (the kernel's tensor-core use),
TC_OPT, NOLOCALS, CPU_ARCH, IMAGE and every setting read while lowering and rendering (the renderer's
settings_key() ones among them), each as a Context override, an environment value or "unset"; the
replay restores them (testing/replay.py: restored_settings) before it rebuilds the kernel. It lives in codegen/ because the code generator calls it; the replay tool that reads the
records and regenerates them is test tooling (testing/replay.py)."""
from __future__ import annotations
import hashlib, os, pickle, sqlite3, time, warnings
from typing import TYPE_CHECKING, Any, Callable
if TYPE_CHECKING: from tilecraft.codegen.kernel_shape import KernelShape

_SCHEMA = """CREATE TABLE IF NOT EXISTS kernels (key TEXT PRIMARY KEY, name TEXT, device TEXT, renderer TEXT, opts TEXT,
  ast BLOB, renderer_obj BLOB, opts_obj BLOB, src TEXT, recorded REAL, settings BLOB)"""
_COLUMNS = ("key", "name", "device", "renderer", "opts", "ast", "renderer_obj", "opts_obj", "src", "recorded", "settings")

# always recorded (they decide the opts and the layout: TC use 3 renders no WMMA), whether read or not
SOURCE_SETTINGS = ("TC", "TC_OPT", "NOLOCALS", "CPU_ARCH", "IMAGE")
# read while rendering but never the source's business
_NOT_RECORDED = frozenset({"RUN_PROCESS_REPLAY", "REPLAY_DB", "DEBUG"})

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
    if "settings" not in {r[1] for r in c.execute("PRAGMA table_info(kernels)")}: c.execute("ALTER TABLE kernels ADD COLUMN settings BLOB")  # older databases
    c.commit()
  return c

def settings_snapshot(k: KernelShape, names: set[str]) -> dict[str, tuple]:
  """{name: ("set", value) | ("env", raw string) | ("unset",)} for SOURCE_SETTINGS and `names`; TC is
  the kernel's own tensor-core use when it has a TC opt (apply_tensor_cores may have been given one)."""
  from tilecraft.helpers import current_overrides
  ov = current_overrides()
  out: dict[str, tuple] = {}
  for n in sorted((set(names) | set(SOURCE_SETTINGS)) - _NOT_RECORDED):
    if n in ov: out[n] = ("set", ov[n])
    elif (raw := os.environ.get(n)) is not None: out[n] = ("env", raw)
    else: out[n] = ("unset",)
  if k.tensor_core is not None: out["TC"] = ("set", int(k.use_tensor_cores))
  return out

def render_and_record(k: KernelShape, name: str, render: Callable[[], str]) -> str:
  """Kernel.to_program's lowering and rendering (`render`) under RUN_PROCESS_REPLAY=1: the source,
  recorded with the settings read meanwhile (the renderer's settings_key() included)."""
  from tilecraft.helpers import settings_read
  with settings_read() as names:
    src = render()
    k.opts.settings_key()
  record(k, name, src, names)
  return src

def record(k: KernelShape, name: str, src: str, names: frozenset[str] | set[str] = frozenset()) -> None:
  """Store one rendered kernel (called by Kernel.to_program under RUN_PROCESS_REPLAY=1). Recording
  never breaks rendering: a failure is one warning, then recording is off for this process."""
  global _warned
  if _warned: return
  try:
    ren, opts = k.opts, tuple(k.applied_opts)
    rid, opts_s = renderer_identity(ren), repr(list(opts))
    settings = settings_snapshot(k, set(names))
    key = hashlib.sha256("\0".join([k.ast.key.hex(), rid, opts_s, name, repr(sorted(settings.items()))]).encode()).hexdigest()
    c = _connect(db_path())
    c.execute(f"INSERT OR REPLACE INTO kernels ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
              (key, name, ren.device, rid, opts_s, pickle.dumps(k.ast), pickle.dumps(ren), pickle.dumps(opts), src, time.time(),
               pickle.dumps(settings)))
    c.commit()
  except Exception as e:  # noqa: BLE001
    _warned = True
    warnings.warn(f"process replay: could not record kernel {name} ({type(e).__name__}: {e}); recording is off", RuntimeWarning, stacklevel=3)
