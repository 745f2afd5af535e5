"""Configuration (environment variables + Context) and small shared utilities."""
from __future__ import annotations
import contextlib, contextvars, functools, itertools, operator, os
from typing import Any, Iterable, Iterator, TypeVar

T = TypeVar("T")

def prod(xs: Iterable[Any], start: Any = 1) -> Any:
  return functools.reduce(operator.mul, xs, start)

def dedup(xs: Iterable[T]) -> list[T]:
  return list(dict.fromkeys(xs))

def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
  return [x for xs in xss for x in xs]

def round_up(x: int, multiple: int) -> int:
  return (x + multiple - 1) // multiple * multiple

# ---- configuration -------------------------------------------------------------------------------
# Every setting is read from the environment and can be overridden for a block with Context. The
# overrides are per thread (a contextvars.ContextVar: each thread, and each asyncio task, sees only the
# Contexts it entered; a new thread starts with none). The state is a chain, innermost first:
# (every override in force, a serial number unique to this state, the state outside it).
_NO_OVERRIDES: tuple = ({}, 0, None)
_state: contextvars.ContextVar[tuple] = contextvars.ContextVar("tilecraft_settings", default=_NO_OVERRIDES)
_state_get = _state.get
_serials = itertools.count(1)
_MISSING = object()

def current_overrides() -> dict[str, Any]:
  """The settings this thread's Context blocks override now, innermost value each (a copy)."""
  return dict(_state_get()[0])

class SettingError(ValueError):
  """An environment variable whose value doesn't parse as its setting's type."""

# os.environ's own mapping, read directly: os.environ.get encodes the name and decodes the value on
# every call, and the settings are read on every realize. Writes through os.environ (monkeypatch,
# `os.environ[k] = v`) update this mapping, so a changed variable is seen at the next read.
_env_data: Any = getattr(os.environ, "_data", None)
_env_encode: Any = getattr(os.environ, "encodekey", None)
_env_keys: dict[str, Any] = {}  # setting name -> its key in _env_data
_parsed: dict[tuple, Any] = {}  # (raw value, type of the default) -> the parsed value

_env_get: Any = _env_data.get if _env_data is not None and _env_encode is not None else os.environ.get  # a key's raw value

def _env_key(name: str) -> Any:
  """name as a key of _env_get (remembered in _env_keys)."""
  if (k := _env_keys.get(name)) is None:
    k = _env_keys[name] = name if _env_data is None or _env_encode is None else _env_encode(name)
  return k

def getenv(name: str, default: Any = 0) -> Any:
  """The current value of a setting: the innermost Context override, else the env var, else default.
  A value that isn't of the default's type raises SettingError naming the variable."""
  if _recording:
    for names in _recording: names.add(name)
  if (o := _state_get()[0]) and (v := o.get(name, _MISSING)) is not _MISSING: return v
  raw = _env_get(k if (k := _env_keys.get(name)) is not None else _env_key(name))  # (bytes on POSIX, str on Windows; None: unset)
  if raw is None: return default
  kind = type(default)
  if (hit := _parsed.get((raw, kind))) is not None: return hit
  val = raw if isinstance(raw, str) else os.fsdecode(raw)
  if kind is bool: ret: Any = val not in ("", "0", "false", "False")
  else:
    try: ret = kind(val)
    except ValueError:
      raise SettingError(f"environment variable {name}={val!r} is not a valid {kind.__name__} (e.g. {name}={default!r})") from None
  if len(_parsed) >= 1024: _parsed.clear()
  _parsed[(raw, kind)] = ret
  return ret

class Context(contextlib.ContextDecorator):
  """`with Context(DEBUG=2, BEAM=0): ...` overrides settings for the block (API), in this thread only.
  Blocks nest; one Context object may be entered by several threads at once (or as a decorator)."""
  def __init__(self, **settings: Any): self.settings = settings
  def __enter__(self) -> "Context":
    outer = _state_get()
    _state.set(({**outer[0], **self.settings}, next(_serials), outer))
    return self
  def __exit__(self, *exc: Any) -> None:
    inner = _state_get()
    if inner[2] is not None: _state.set(inner[2])

# ---- values computed from settings ---------------------------------------------------------------
# Some values are computed from several settings on every realize (which runner a device uses: its
# opts settings, compiler flags, renderer settings). settings_memo computes one once and keeps it while
# no setting it read changed. Which settings it read is recorded as it computes (every getenv call
# meanwhile), so it needn't be told; the value is computed again when the calling thread's Context
# state is another than the one it was computed under (its serial number differs), or when the
# environment value of any of those settings differs. (The function must depend only on settings and
# its arguments: arguments are part of the key, by equality.)
# _recording is shared by all threads: a memo computing in one thread may also record names another
# thread reads meanwhile. That only makes it depend on more settings than it needs (recomputed more
# often), never on fewer, and keeps getenv's hot path free of thread-local lookups.
_recording: list[set[str]] = []  # the names read by the memos computing now (getenv adds to each)


def settings_memo(fn: Any) -> Any:
  """Decorate fn(*args) -> value: cached per args until a setting it read changes (see above)."""
  memo: dict[tuple, tuple] = {}  # args -> (the Context state's serial, names read, their env keys, the env values, value)
  @functools.wraps(fn)
  def get(*args: Any) -> Any:
    if (hit := memo.get(args)) is not None and hit[0] == _state_get()[1] and tuple(map(_env_get, hit[2])) == hit[3]:
      if _recording:  # an outer memo computing now depends on these too
        for names in _recording: names.update(hit[1])
      return hit[4]
    gen, names = _state_get()[1], set()
    _recording.append(names)
    try: val = fn(*args)
    finally: del _recording[next(i for i, x in enumerate(_recording) if x is names)]  # (by identity: equal sets are others')
    for outer in _recording: outer.update(names)
    keys = tuple(_env_key(n) for n in sorted(names))
    if len(memo) >= 256: memo.clear()
    memo[args] = (gen, frozenset(names), keys, tuple(map(_env_get, keys)), val)
    return val
  get.memo = memo  # type: ignore[attr-defined]
  return get

@contextlib.contextmanager
def settings_read() -> Iterator[set[str]]:
  """`with settings_read() as names:` collects the names of the settings read in the block (getenv
  calls, and the settings a settings_memo hit depends on); process replay records their values."""
  names: set[str] = set()
  _recording.append(names)
  try: yield names
  finally: del _recording[next(i for i, x in enumerate(_recording) if x is names)]

class _Setting:
  """A named setting that reads like an int: `if DEBUG >= 2:`."""
  def __init__(self, name: str, default: Any): self.name, self.default = name, default
  @property
  def value(self) -> Any: return getenv(self.name, self.default)
  def __bool__(self) -> bool: return bool(self.value)
  def __int__(self) -> int: return int(self.value)
  def __ge__(self, x: Any) -> bool: return self.value >= x
  def __gt__(self, x: Any) -> bool: return self.value > x
  def __le__(self, x: Any) -> bool: return self.value <= x
  def __lt__(self, x: Any) -> bool: return self.value < x
  def __eq__(self, x: Any) -> bool: return self.value == x
  def __hash__(self) -> int: return hash(self.name)
  def __repr__(self) -> str: return f"{self.name}={self.value!r}"

DEBUG, NOOPT, BEAM, TC, TC_OPT = _Setting("DEBUG", 0), _Setting("NOOPT", 0), _Setting("BEAM", 0), _Setting("TC", 1), _Setting("TC_OPT", 0)
CACHELEVEL = _Setting("CACHELEVEL", 2)
IMAGE = _Setting("IMAGE", 0)  # 1: conv/matmul weights in OpenCL images, 2: their inputs too (frontend/image.py)
MEMORY_PLAN = _Setting("MEMORY_PLAN", 1)  # 1: a rerun schedule's intermediates share an arena where their lifetimes allow (engine/memory_plan.py)
WINO = _Setting("WINO", 1)  # Winograd 3x3 convs on CPUs: 0 never, 1 where measured to pay, 2 always (frontend/winograd.py)
GPU_FILL = _Setting("GPU_FILL", 1 << 17)  # threads a GPU reduce that reads each input once is grouped to reach (codegen/heuristic.py); 0: the reference's rule
SPLIT_REDUCE = _Setting("SPLIT_REDUCE", 1)  # 1: a long reduce into a small output as partial reduces (engine/lazy.py: _split_reduce); 0: one kernel

def usable_cores() -> int:
  """The CPU cores this process may run on (its affinity mask, where the OS has one)."""
  try: return len(os.sched_getaffinity(0))
  except (AttributeError, OSError): return os.cpu_count() or 1

def cache_dir() -> str:
  """Where compiled binaries and the search database live (XDG cache dir by default). Only the path:
  whoever writes there creates it, and treats an OSError as "no cache" (the directory may be
  read-only, full or impossible to create)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "tilecraft")

def megabytes_setting(name: str, default: int) -> int:
  """A size setting given in megabytes (>= 0), in bytes; a SettingError naming it otherwise."""
  val = getenv(name, str(default))
  try: mb = float(val)
  except (TypeError, ValueError): mb = -1.0
  if not 0 <= mb < float("inf"): raise SettingError(f"environment variable {name}={val!r} is not a number of megabytes >= 0 (e.g. {name}={default})")
  return int(mb * (1 << 20))
