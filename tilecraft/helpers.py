"""Configuration (environment variables + Context) and small shared utilities."""
from __future__ import annotations
import contextlib, functools, operator, os
from typing import Any, Iterable, TypeVar

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
# Every setting is read from the environment once and can be overridden for a block with Context.
_overrides: dict[str, list[Any]] = {}

class SettingError(ValueError):
  """An environment variable whose value doesn't parse as its setting's type."""

# os.environ's own mapping, read directly: os.environ.get encodes the name and decodes the value on
# every call, and the settings are read on every realize. Writes through os.environ (monkeypatch,
# `os.environ[k] = v`) update this mapping, so a changed variable is seen at the next read.
_env_data: Any = getattr(os.environ, "_data", None)
_env_encode: Any = getattr(os.environ, "encodekey", None)
_env_keys: dict[str, Any] = {}  # setting name -> its key in _env_data
_parsed: dict[tuple, Any] = {}  # (raw value, type of the default) -> the parsed value

def _raw_env(name: str) -> Any:
  """The variable's raw value (bytes on POSIX, str on Windows), or None when it is unset."""
  if _env_data is None or _env_encode is None: return os.environ.get(name)
  if (k := _env_keys.get(name)) is None: k = _env_keys[name] = _env_encode(name)
  return _env_data.get(k)

def getenv(name: str, default: Any = 0) -> Any:
  """The current value of a setting: the innermost Context override, else the env var, else default.
  A value that isn't of the default's type raises SettingError naming the variable."""
  if (o := _overrides.get(name)): return o[-1]
  raw = _raw_env(name)
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
  """`with Context(DEBUG=2, BEAM=0): ...` overrides settings for the block (API)."""
  def __init__(self, **settings: Any): self.settings = settings
  def __enter__(self) -> "Context":
    for k, v in self.settings.items(): _overrides.setdefault(k, []).append(v)
    return self
  def __exit__(self, *exc: Any) -> None:
    for k in self.settings: _overrides[k].pop()

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

def cache_dir() -> str:
  """Where compiled binaries and the search database live (XDG cache dir by default). Only the path:
  whoever writes there creates it, and treats an OSError as "no cache" (the directory may be
  read-only, full or impossible to create)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "tilecraft")
