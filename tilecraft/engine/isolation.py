"""Work in isolated worker processes: spawn, framing, timeouts and crash reports.

Used by the beam search (building and timing candidates) and by the fuzzer (running kernels that
may corrupt memory). A worker is a fresh interpreter, `python -c "...; serve('module:Handler')"`,
that builds one *handler* object and answers jobs by calling its methods:

- A job is `Job(kind, args, timeout, blobs)`: the worker calls `handler.<kind>(*args)`, which
  returns a `(status, payload)` tuple; an exception becomes `("error", traceback)` (or
  `("compile_error", ...)` for a CompileError). `blobs` are pickled objects shared by many jobs
  (an AST, a renderer): each is sent to a worker once and kept in `handler.blobs` (an LRU of
  _BLOBS_KEPT). Every job also names all the blobs it uses, in order, and both sides touch them in
  that order, so the parent's record of what a worker holds evicts exactly what the worker evicts
  (a parent that only added would, after 32 ASTs, skip resending the renderer every job shares).
- Messages are length-prefixed pickles over the worker's stdin/stdout. The worker points fd 1 at
  stderr, so prints from Python, compilers or kernels can't corrupt the pipe.
- The parent's side, `Pool(handler).run(jobs, n)`, runs jobs on up to n workers at once. A worker
  that dies mid-job gives `("crash", "worker killed by SIGSEGV")`, one that doesn't answer in the
  job's timeout is killed and gives `("hang", ...)`; the next job gets a fresh worker.
- A worker never imports the user's `__main__` (multiprocessing's spawn and forkserver both re-run
  it), so a script without an `if __name__ == "__main__"` guard works. Workers die with the parent
  (PR_SET_PDEATHSIG) or when their stdin closes; the current Context settings travel with each job.
"""
from __future__ import annotations
import atexit, ctypes, importlib, os, pickle, select, signal, subprocess, sys, threading, time, traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence
from tilecraft.helpers import DEBUG

STARTUP_S = 120.0  # a fresh worker's imports (and opening the device) don't count against a job's timeout
_BLOBS_KEPT = 32

# ---- framing -------------------------------------------------------------------------------------

def frame(obj: Any) -> bytes:
  data = pickle.dumps(obj)
  return len(data).to_bytes(8, "little") + data

def write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    n = os.write(fd, view)
    view = view[n:]

def read_exact(fd: int, n: int) -> bytes:
  chunks, got = [], 0
  while got < n:
    c = os.read(fd, n - got)
    if not c: raise EOFError("pipe closed")
    chunks.append(c); got += len(c)  # noqa: E702
  return b"".join(chunks)

def lru_put(d: OrderedDict, key: Any, val: Any, cap: int) -> None:
  d[key] = val
  d.move_to_end(key)
  while len(d) > cap: d.popitem(last=False)

# ---- the worker's side ---------------------------------------------------------------------------

def _set_pdeathsig() -> None:
  """Die with the parent (Linux), so a worker stuck in a hung kernel never outlives it."""
  try: ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except Exception: pass  # noqa: BLE001 - not Linux: EOF on stdin still ends an idle worker

def _load(path: str) -> Any:
  mod, _, attr = path.partition(":")
  return getattr(importlib.import_module(mod), attr)

def serve(handler_path: str) -> None:
  """The worker's main loop: build the handler named "module:attr" and answer jobs until stdin closes."""
  out_fd = os.dup(1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then closes our stdin
  _set_pdeathsig()
  in_fd = sys.stdin.fileno()
  from tilecraft.helpers import Context
  handler = _load(handler_path)()
  blobs: OrderedDict[str, Any] = OrderedDict()
  handler.blobs = blobs
  write_all(out_fd, frame(("ready", os.getpid())))
  while True:
    try: msg = pickle.loads(read_exact(in_fd, int.from_bytes(read_exact(in_fd, 8), "little")))
    except EOFError: return
    kind, settings, new_blobs, used, args = msg
    try:
      for bid in used:  # (in the parent's order: see Worker.send)
        if bid in new_blobs: lru_put(blobs, bid, pickle.loads(new_blobs[bid]), _BLOBS_KEPT)
        elif bid in blobs: blobs.move_to_end(bid)
        else: raise RuntimeError(f"blob {bid} was never sent to this worker, or was evicted (the parent's LRU record is out of step)")
      with Context(**settings): res = getattr(handler, kind)(*args)
    except Exception as e:  # noqa: BLE001
      from tilecraft.device import CompileError
      res = ("compile_error" if isinstance(e, CompileError) else "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
    write_all(out_fd, frame(res))

# ---- the parent's side ---------------------------------------------------------------------------

def _worker_env() -> dict[str, str]:
  env = dict(os.environ)
  paths = [p for p in sys.path if p] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
  env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
  return env

def signal_name(rc: int) -> str:
  try: return signal.Signals(-rc).name
  except ValueError: return f"signal {-rc}"

class Worker:
  """One worker process serving `handler` (started on demand, restarted after a crash)."""
  def __init__(self, handler: str) -> None:
    self.handler = handler
    self.proc: Optional[subprocess.Popen] = None
    self.rbuf = bytearray()
    self.ready = False
    self.known: OrderedDict[str, bool] = OrderedDict()  # the blobs the worker holds: a mirror of its LRU
    self.prepared: Any = None  # free for the caller: what this worker has set up (say, timing buffers)

  def alive(self) -> bool: return self.proc is not None and self.proc.poll() is None
  def start(self) -> None:
    self.stop()
    cmd = f"from tilecraft.engine.isolation import serve; serve({self.handler!r})"
    self.proc = subprocess.Popen([sys.executable, "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=_worker_env(), bufsize=0, close_fds=True)
    self.rbuf, self.ready, self.known, self.prepared = bytearray(), False, OrderedDict(), None
  def fileno(self) -> int:
    assert self.proc is not None and self.proc.stdout is not None
    return self.proc.stdout.fileno()
  def send(self, msg: tuple, blobs: dict[str, bytes]) -> None:
    kind, settings, args = msg
    need = {k: v for k, v in blobs.items() if k not in self.known}
    assert self.proc is not None and self.proc.stdin is not None
    write_all(self.proc.stdin.fileno(), frame((kind, settings, need, list(blobs), args)))
    for k in blobs: lru_put(self.known, k, True, _BLOBS_KEPT)  # (the worker does the same, in the same order)
  def read_frames(self) -> list[Any]:
    """Whatever complete replies are available now; EOFError when the worker is gone."""
    chunk = os.read(self.fileno(), 1 << 20)
    if not chunk: raise EOFError
    self.rbuf += chunk
    frames = []
    while len(self.rbuf) >= 8 and len(self.rbuf) >= 8 + (n := int.from_bytes(self.rbuf[:8], "little")):
      frames.append(pickle.loads(bytes(self.rbuf[8:8 + n])))
      del self.rbuf[:8 + n]
    return frames
  def death_note(self) -> str:
    if self.proc is None: return "no worker"
    try: rc = self.proc.wait(timeout=5)
    except subprocess.TimeoutExpired: return "worker stopped answering"
    return f"worker killed by {signal_name(rc)}" if rc < 0 else f"worker exited with code {rc}"
  def stop(self) -> None:
    if self.proc is None: return
    p, self.proc = self.proc, None
    try:
      if p.poll() is None: p.kill()
      p.wait(timeout=10)
    except Exception: pass  # noqa: BLE001
    for f in (p.stdin, p.stdout):
      try: f and f.close()
      except OSError: pass

@dataclass
class Job:
  kind: str
  args: tuple
  timeout: float
  blobs: dict[str, bytes] = field(default_factory=dict)

class Pool:
  """Long-lived workers serving one handler. `run(jobs, n)` runs jobs on up to n workers at once; each
  result is (status, payload) with the handler's status, "error"/"compile_error" for an exception in
  the handler, "crash" (the worker died: segfault, abort) or "hang" (no answer within the job's
  timeout: the worker is killed)."""
  def __init__(self, handler: str) -> None:
    self.handler = handler
    self.workers: list[Worker] = []
    self.lock = threading.RLock()

  def _settings(self) -> dict[str, Any]:
    from tilecraft import helpers
    out = {k: v for k, v in helpers.current_overrides().items() if isinstance(v, (int, float, str, bool))}
    out["DEBUG"] = out.get("DEBUG", int(DEBUG)) if DEBUG >= 6 else 0  # workers stay quiet unless asked
    return out

  def run(self, jobs: Sequence[Job], n: int, on_result: Optional[Callable[[int, tuple], None]] = None,
          stop: Optional[Callable[[], bool]] = None) -> list[Optional[tuple]]:
    """One result per job, in order; None for a job not run because `stop()` said so."""
    with self.lock:
      n = max(1, min(n, len(jobs))) if jobs else 1
      while len(self.workers) < n: self.workers.append(Worker(self.handler))
      results: list[Optional[tuple]] = [None] * len(jobs)
      pending = list(range(len(jobs)))[::-1]
      busy: dict[Worker, list] = {}  # worker -> [job index, deadline]
      settings = self._settings()
      def finish(w: Worker, res: tuple) -> None:
        i = busy.pop(w)[0]
        results[i] = res
        if on_result is not None: on_result(i, res)
      try:
        while pending or busy:
          for w in self.workers[:n]:
            if not pending or (stop is not None and stop()): break
            if w in busy: continue
            i = pending.pop()
            job = jobs[i]
            for attempt in range(2):  # a worker that died while idle is replaced, not blamed
              if not w.alive(): w.start()
              try:
                w.send((job.kind, settings, job.args), job.blobs)
                break
              except OSError:
                w.stop()
            else:
              results[i] = res = ("crash", "could not start a worker")
              if on_result is not None: on_result(i, res)
              continue
            busy[w] = [i, time.monotonic() + job.timeout + (0 if w.ready else STARTUP_S)]
          if not busy:
            if stop is not None and stop(): break
            continue
          now = time.monotonic()
          wait = max(0.0, min(d for _, d in busy.values()) - now)
          ready, _, _ = select.select([w.fileno() for w in busy], [], [], min(wait, 1.0))
          for w in [w for w in busy if w.fileno() in ready]:
            try: frames = w.read_frames()
            except (EOFError, OSError):
              finish(w, ("crash", w.death_note()))
              w.stop()
              continue
            for fr in frames:
              if fr[0] == "ready":
                w.ready = True
                busy[w][1] = time.monotonic() + jobs[busy[w][0]].timeout
              else:
                finish(w, fr)
                break
          now = time.monotonic()
          for w in [w for w, (_, d) in busy.items() if d < now]:
            finish(w, ("hang", f"no answer within {jobs[busy[w][0]].timeout:.3g}s: worker killed"))
            w.stop()
          if stop is not None and stop() and not busy: break
      finally:
        for w in list(busy): w.stop()  # interrupted mid-job: their late replies must never be read as another job's
      return results

  def close(self) -> None:
    """Stop the workers: close their stdin (they exit), kill what is still running after 2 s."""
    with self.lock:
      for w in self.workers:
        if w.proc is not None and w.proc.stdin is not None:
          try: w.proc.stdin.close()
          except OSError: pass
      deadline = time.monotonic() + 2
      for w in self.workers:
        if w.proc is not None:
          try: w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
          except subprocess.TimeoutExpired: pass
        w.stop()
      self.workers = []

_pools: dict[str, Pool] = {}
_pools_pid = -1

def get_pool(handler: str) -> Pool:
  """This process's long-lived pool for `handler` (a forked child gets its own: it must not share pipes)."""
  global _pools_pid
  if _pools_pid != os.getpid(): _pools.clear(); _pools_pid = os.getpid()  # noqa: E702
  if handler not in _pools: _pools[handler] = Pool(handler)
  return _pools[handler]

def close_pool(handler: str) -> None:
  if _pools_pid == os.getpid() and (p := _pools.pop(handler, None)) is not None: p.close()

@atexit.register
def close_pools() -> None:
  """Stop every pool's workers (also done at exit)."""
  for h in list(_pools): close_pool(h)
