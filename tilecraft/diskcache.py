"""The disk cache of compiled binaries and other build products: one file per entry under
cache_dir()/<table>/, checked on read (a bad entry is a miss), bounded in size (least recently used
go first), and turned off for the process with one warning where the directory can't be used."""
from __future__ import annotations
import hashlib, os, tempfile, time, warnings
from typing import Optional
from tilecraft.helpers import CACHELEVEL, DEBUG, cache_dir, megabytes_setting, settings_memo

# One entry per file: cache_dir()/<table>/<sha256(key)>. An entry holds its full key next to the
# payload and starts with a magic and the sha256 of both, so a truncated or garbled entry, or one
# copied over from another key, reads as a miss instead of the wrong bytes. A cache that can't be
# used (a directory that can't be created or written: read-only, full, not a directory; or a file
# of another cache, like the search's database) is turned off for the process with one warning, by
# disk_cache_unusable, the one place every on-disk cache reports that: kernels still compile and run.
_MAGIC = b"TCDC2\n"
_cache_off: dict[str, str] = {}  # cache dir (or file) -> why it was turned off
_cache_ok: set[str] = set()  # cache dirs that exist and are writable
_OFF_ENV = "_TILECRAFT_DISKCACHE_OFF"  # tells worker processes started later: these are off, and already warned about

def disk_cache_off(where: Optional[str] = None) -> bool:
  """Whether the cache at `where` (default: the kernel cache, cache_dir()) is off for this process.
  Only for the kernel cache dir this checks (once, the first compiler to open does it, before any
  worker process starts) that it can be created and written; others are off once reported unusable."""
  d = where or cache_dir()
  if d in _cache_off: return True
  if os.environ.get(_OFF_ENV) and d in os.environ[_OFF_ENV].split(os.pathsep):
    _cache_off[d] = "off in the parent process"
    return True
  if where is not None and where != cache_dir(): return False
  if d in _cache_ok: return False
  try:
    os.makedirs(d, exist_ok=True)
    if not os.access(d, os.W_OK | os.X_OK): raise PermissionError(f"{d} is not writable")
  except OSError as e:
    disk_cache_unusable(e)
    return True
  _cache_ok.add(d)
  return False

def _diskcache_path(table: str, key: str) -> str:
  return os.path.join(cache_dir(), table, hashlib.sha256(key.encode()).hexdigest())

def disk_cache_unusable(e: Exception, where: Optional[str] = None) -> None:
  """The cache at `where` (default: cache_dir()) can't be used because of `e`: off for this process
  (and the worker processes it starts later), with one warning the first time."""
  d = where or cache_dir()
  if d in _cache_off: return
  _cache_off[d] = f"{type(e).__name__}: {e}"
  os.environ[_OFF_ENV] = os.pathsep.join(filter(None, [os.environ.get(_OFF_ENV), d]))
  warnings.warn(f"tilecraft: the disk cache in {d} is not usable ({_cache_off[d]}); running without it", RuntimeWarning, stacklevel=3)

def _drop(path: str, why: str) -> None:
  if DEBUG >= 1: print(f"diskcache: dropping {why} entry {path}")
  try: os.unlink(path)
  except OSError: pass

# The size bound: a table holds at most DISK_CACHE_MB megabytes of entries (default 1024; 0: no bound).
# Each process learns a table's size once (a scan at its first put there) and adds what it puts; when
# that passes the bound, the least recently used entries (oldest mtime: a hit touches its entry) are
# removed until 3/4 of the bound is left. Other processes' puts are seen at that rescan, so the bound
# may be passed by what they put since, not more. Temp files of puts that never finished (a killed
# process) go at that rescan once they are an hour old.
_table_bytes: dict[str, int] = {}  # table dir -> its size in bytes, as this process counts it

@settings_memo
def disk_cache_max_bytes() -> int:
  """The bound on each disk cache table: `DISK_CACHE_MB` (default 1024; 0 means no bound)."""
  return megabytes_setting("DISK_CACHE_MB", 1024)

def _table_entries(tdir: str) -> list[tuple[float, int, str]]:
  """(mtime, size, path) of the table's entries; stale temp files are removed on the way."""
  out, now = [], time.time()
  with os.scandir(tdir) as it:
    for e in it:
      try:
        st = e.stat(follow_symlinks=False)
        if e.name.startswith(".tmp-"):
          if now - st.st_mtime > 3600: os.unlink(e.path)
          continue
        out.append((st.st_mtime, st.st_size, e.path))
      except OSError: pass  # (removed meanwhile)
  return out

def _bound_table(tdir: str, added: int) -> None:
  """Count `added` bytes put into the table at tdir; evict when it passes the bound (see above)."""
  if (limit := disk_cache_max_bytes()) <= 0: return
  if tdir in _table_bytes:
    _table_bytes[tdir] += added
    if _table_bytes[tdir] <= limit: return
  entries = _table_entries(tdir)
  total = sum(size for _, size, _ in entries)
  if total > limit:
    entries.sort()
    for _, size, path in entries:
      if total <= limit * 3 // 4: break
      try: os.unlink(path)
      except OSError: continue
      total -= size
    if DEBUG >= 1: print(f"diskcache: {tdir} over DISK_CACHE_MB, least recently used entries removed ({total} bytes left)")
  _table_bytes[tdir] = total

def diskcache_get(table: str, key: str) -> Optional[bytes]:
  """The bytes stored under (table, key), or None on a miss, a bad entry, a disabled cache or CACHELEVEL=0."""
  if CACHELEVEL <= 0 or disk_cache_off(): return None
  path = _diskcache_path(table, key)
  try:
    with open(path, "rb") as f: data = f.read()
  except OSError: return None
  try: os.utime(path)  # recently used (what the size bound evicts last)
  except OSError: pass
  head = len(_MAGIC) + 32
  if not (len(data) >= head + 4 and data[:len(_MAGIC)] == _MAGIC and hashlib.sha256(data[head:]).digest() == data[len(_MAGIC):head]):
    _drop(path, "corrupted")
    return None
  klen = int.from_bytes(data[head:head + 4], "little")
  if data[head + 4:head + 4 + klen] != key.encode():
    _drop(path, "mismatched")  # a file for another key at this key's path
    return None
  return data[head + 4 + klen:]

def diskcache_put(table: str, key: str, value: bytes) -> None:
  """Store value under (table, key) atomically (temp file + rename); a no-op when CACHELEVEL=0.
  Any OSError (no directory, read-only, disk full) turns the cache off with one warning."""
  if CACHELEVEL <= 0 or disk_cache_off(): return
  k = key.encode()
  body = len(k).to_bytes(4, "little") + k + value
  tmp = None
  try:
    path = _diskcache_path(table, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "wb") as f: f.write(_MAGIC + hashlib.sha256(body).digest() + body)
    os.replace(tmp, path)
    tmp = None
    _bound_table(os.path.dirname(path), len(_MAGIC) + 32 + len(body))
  except OSError as e: disk_cache_unusable(e)
  finally:
    if tmp is not None:
      try: os.unlink(tmp)
      except OSError: pass

def diskcache_drop(table: str, key: str) -> None:
  """Remove the entry of (table, key), if there is one (an entry its reader found unusable)."""
  if disk_cache_off(): return
  try: os.unlink(_diskcache_path(table, key))
  except OSError: pass

def diskcache_has(table: str, key: str) -> bool:
  """Whether (table, key) has an entry (not read or checked: diskcache_get still may miss on it)."""
  if CACHELEVEL <= 0 or disk_cache_off(): return False
  return os.path.exists(_diskcache_path(table, key))
