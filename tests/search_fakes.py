"""A stand-in for the beam search's worker pool (isolation.Pool), shared by the search tests: builds are
instant and each candidate's time comes from a table (tests' `pythonpath` makes this importable)."""
from tilecraft.dtype import dtypes
from tilecraft.engine.search import actions, beam
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps
from tilecraft.shape.shapetracker import ShapeTracker

def ew_ast(n: int, op: BinaryOps = BinaryOps.ADD) -> LazyOp:
  """out[i] = a[i] <op> b[i], float32, n elements: a kernel the fake pool searches in no time."""
  st = ShapeTracker.from_shape((n,))
  ld = lambda i: LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float32, st))
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(op, (ld(1), ld(2))),), MemBuffer(0, dtypes.float32, st)),))

def install_fake_pool(monkeypatch, times) -> "FakePool":
  """A FakePool with `times` as the beam search's worker pool for this test."""
  p = FakePool(times)
  monkeypatch.setattr(beam, "get_pool", lambda handler: p)
  return p

class _FakeWorker:
  def __init__(self): self.prepared = None
  def alive(self) -> bool: return True

class FakePool:
  """Stands in for isolation.Pool. `times(opts) -> seconds` decides each candidate's time; `race`
  decides the head-to-head (floor time, winner time); `wrong` is a set of opts keys that fail
  verification."""
  def __init__(self, times, race=None, wrong=()):
    self.times, self.race, self.wrong = times, race, set(wrong)
    self.workers = [_FakeWorker()]
    self.jobs: list = []
  def run(self, jobs, n, on_result=None, stop=None):
    out = []
    for i, j in enumerate(jobs):
      if stop is not None and stop():
        out.append(None)
        continue
      self.jobs.append(j)
      res = getattr(self, "_" + j.kind)(*j.args)
      if on_result: on_result(i, res)
      out.append(res)
    return out
  def _build(self, ast_id, ren_id, ast_key, device, opts, name, vv, max_uops, do_compile, front=0):
    key = actions.opts_key([actions.opt_unwire(o) for o in opts])
    return ("ok", {"src": key, "lib": key.encode(), "gs": None, "ls": None, "vals": [], "uops": 1, "ops": 0, "render_s": 0, "compile_s": 0})
  def _prepare(self, device, specs): return ("ok", None)
  def _key(self, prog): return prog[1].decode()
  def _time(self, device, prog, specs, runs, early, directive, hang_s, ref=None):
    opts = actions.opts_from_key(self._key(prog))
    if directive in ("segfault", "hang"): return ("crash" if directive == "segfault" else "hang", directive)
    ref_t = [] if ref is None else [self.times(tuple(actions.opts_from_key(self._key(ref))))] * runs
    return ("ok", ([self.times(tuple(opts))] * runs, ref_t))
  def _verify(self, device, ref, cands, specs, n_out, outs_read, seed, guard, front=0):
    return ("ok", [(self._key(c) not in self.wrong, 0.0 if self._key(c) not in self.wrong else 1.0, "") for c in cands])
  def _race(self, device, progs, specs, runs):
    ts = [self.times(tuple(actions.opts_from_key(self._key(p)))) for p in progs]
    return ("ok", self.race(ts) if self.race else ts)
  def count(self, kind): return sum(j.kind == kind for j in self.jobs)

class BlobEcho:
  """A worker handler (isolation.serve) whose one job answers with the blobs it was given, by id."""
  blobs: dict
  def echo(self, *ids: str) -> tuple: return ("ok", [self.blobs[i] for i in ids])
