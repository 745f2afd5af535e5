"""Tuning many kernels (tilecraft.engine.search.distributed) on a real local Ray instance
(`ray.init(num_cpus=2)`, started once for the file and always shut down): tasks go only to nodes
offering the target's resource, results come back to the driver, which writes them into its search
cache, an interrupted run keeps what finished and a rerun searches only the rest. Tiny kernels, one
beam, a one-second budget. Skipped, saying why, where ray is not installed (pip install 'tilecraft[ray]')."""
from __future__ import annotations
import os, pickle
import pytest
from tilecraft.dtype import dtypes
from tilecraft.engine.search import distributed
from tilecraft.engine.search.db import SearchDB, export_results, same_kind
from tilecraft.host import KNOWN_X86_ARCHS, runnable_archs
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.shape.shapetracker import ShapeTracker

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'tilecraft[ray]')")

def _load(i: int, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float32, st))
def _kernel(value: LazyOp, out_shape: tuple) -> LazyOp:
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape(out_shape))),))
def ew_ast(n: int) -> LazyOp:
  st = ShapeTracker.from_shape((n,))
  return _kernel(LazyOp(BinaryOps.MUL, (_load(1, st), _load(2, st))), (n,))
def rowsum_ast(r: int, c: int) -> LazyOp: return _kernel(LazyOp(ReduceOps.SUM, (_load(1, ShapeTracker.from_shape((r, c))),), (1,)), (r, 1))

def _tasks(settings: tuple = ()) -> list[distributed.TuneTask]:
  return [distributed.TuneTask(f"case{i}", f"k{i}", pickle.dumps(ast), "CPU", 1, 1.0, settings)
          for i, ast in enumerate([ew_ast(256), rowsum_ast(16, 32)])]

@pytest.fixture(scope="module")
def local_ray():
  ray.init(num_cpus=2, resources=distributed.node_resources(["CPU"]), include_dashboard=False, log_to_driver=False, logging_level="WARNING")
  try: yield
  finally: ray.shutdown()

def _seed(db_path: str, tmp_path) -> bytes:
  out = str(tmp_path / "seed.db")
  export_results(db_path, out)
  with open(out, "rb") as f: return f.read()

def _run(db: SearchDB, tasks, seed: bytes, stop_after: int = 0) -> list[distributed.TuneResult]:
  got: list[distributed.TuneResult] = []
  def on_result(r: distributed.TuneResult) -> None:
    db.merge_rows(r.rows)  # what `tilecraft tune` does as each result arrives
    got.append(r)
    if stop_after and len(got) == stop_after: raise KeyboardInterrupt
  distributed.run_ray(tasks, seed, on_result)
  return got

def test_resources_name_what_this_host_can_run():
  res = distributed.node_resources(["CPU"])
  target = distributed.target_resource("CPU", distributed.current_settings())
  assert target in res and res[target] == 1.0
  runnable = set(runnable_archs())
  for arch in KNOWN_X86_ARCHS:
    assert (f"tilecraft_cpu_{arch}" in res) == (arch in runnable), arch

def test_interrupted_run_keeps_finished_results_and_a_rerun_searches_only_the_rest(local_ray, tmp_path):
  path = str(tmp_path / "driver.db")
  db = SearchDB(path)
  tasks = _tasks()
  with pytest.raises(KeyboardInterrupt): _run(db, tasks, b"", stop_after=1)
  assert len(db.result_rows()) == 1  # the finished one is in the driver's cache
  assert ray.is_initialized()  # run_ray leaves a Ray instance it didn't start running
  got = _run(db, tasks, _seed(path, tmp_path))
  assert len(got) == len(tasks) and all(r.error is None for r in got), [r.error for r in got]
  assert sorted(r.cache_hit for r in got) == [False, True]  # only the missing one was searched
  rows = db.result_rows()
  assert len(rows) == len(tasks) and all(same_kind(r[9], "CPU") for r in rows)
  assert all(r.node and r.opts is not None and r.hand_time > 0 for r in got)
  again = _run(db, tasks, _seed(path, tmp_path))
  assert all(r.cache_hit and not r.rows for r in again)
  db.close()

def test_kernels_go_only_to_nodes_that_can_run_the_target(local_ray):
  foreign = []
  for arch in (a for a in KNOWN_X86_ARCHS if a not in runnable_archs()):
    try: foreign.append(distributed.target_resource("CPU", (("CPU_ARCH", arch),)))
    except ValueError: pass  # the compiler doesn't know it
  if not foreign: pytest.skip("this host runs every -march its compiler knows, so there is no target it can't run")
  tasks = _tasks((("CPU_ARCH", foreign[-1].removeprefix("tilecraft_cpu_")),))[:1]
  with pytest.raises(RuntimeError, match=f"no node of the Ray cluster offers {foreign[-1]}"):
    distributed.run_ray(tasks, b"", lambda r: None)

def test_missing_ray_is_a_clear_error(monkeypatch):
  import builtins
  real = builtins.__import__
  def no_ray(name, *a, **kw):
    if name == "ray": raise ImportError("No module named 'ray'")
    return real(name, *a, **kw)
  monkeypatch.setattr(builtins, "__import__", no_ray)
  with pytest.raises(ImportError, match=r"pip install 'tilecraft\[ray\]'"): distributed.import_ray()

def _ray_task_pids(func: str = "tune_kernel") -> list[int]:
  """Ray workers running `func` now (a busy worker's process title is ray::<func>)."""
  out = []
  for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try:
      with open(f"/proc/{p}/cmdline", "rb") as f: cmd = f.read()
    except OSError: continue
    if cmd.startswith(f"ray::{func}".encode()): out.append(int(p))
  return out

@pytest.mark.slow
def test_a_worker_killed_mid_search_is_retried(local_ray, tmp_path):
  """kill -9 of the Ray worker running a search (and so of its isolation workers): Ray runs the task
  again, and every kernel's result arrives once."""
  import signal, threading, time
  killed: list[int] = []
  def killer() -> None:
    deadline = time.time() + 60
    while time.time() < deadline and not (pids := _ray_task_pids()): time.sleep(0.05)
    time.sleep(1.0)  # mid-search
    for pid in _ray_task_pids()[:1]:
      os.kill(pid, signal.SIGKILL)
      killed.append(pid)
  th = threading.Thread(target=killer, daemon=True)
  th.start()
  db = SearchDB(str(tmp_path / "driver.db"))
  tasks = [distributed.TuneTask(f"case{i}", f"k{i}", pickle.dumps(ast), "CPU", 1, 2.0, ())
           for i, ast in enumerate([ew_ast(512), rowsum_ast(32, 16)])]
  got = _run(db, tasks, b"")
  th.join()
  assert killed
  assert sorted(r.label for r in got) == sorted(t.label for t in tasks) and all(r.error is None for r in got), [(r.label, r.error) for r in got]
  assert len(db.result_rows()) == len(tasks)
  db.close()

# ---- a two-node cluster on localhost (slow: two `ray start`s take ~30 s on 2 busy cores) ----------

class LocalCluster:
  """`ray start --head` plus `ray start --address` nodes on this host, in a temp dir of their own, each
  offering this host's resources with one CPU. Stopped by killing exactly the processes it started (by
  pid: every process whose command line names its temp dir, and their children), never `ray stop`,
  which would stop every Ray on the machine."""
  def __init__(self):
    import socket, tempfile
    self.dir = tempfile.mkdtemp(prefix="tcray", dir="/tmp")  # short: Ray's socket paths must stay under ~107 chars
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.address = f"127.0.0.1:{self.port}"
    self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    self.resources = __import__("json").dumps(distributed.node_resources(["CPU"]))
  def _start(self, *args: str) -> None:
    import subprocess, sys
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    r = subprocess.run([ray_cli, "start", *args, "--num-cpus", "1", "--resources", self.resources, "--disable-usage-stats"],
                       env=self.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
  def start_head(self) -> None: self._start("--head", "--port", str(self.port), "--temp-dir", self.dir, "--include-dashboard", "false")
  def add_node(self) -> None: self._start("--address", self.address)
  def pids(self, name: str = "") -> list[int]:
    """Processes of this cluster (whose command line names its temp dir, and `name` when given), oldest first."""
    out = []
    for p in os.listdir("/proc"):
      if not p.isdigit(): continue
      try:
        with open(f"/proc/{p}/cmdline", "rb") as f: cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{p}/stat") as f: start = int(f.read().rsplit(")", 1)[1].split()[19])
      except OSError: continue
      if self.dir in cmd and name in cmd: out.append((start, int(p)))
    return [p for _, p in sorted(out)]
  def children(self, pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
      if not p.isdigit(): continue
      try:
        with open(f"/proc/{p}/stat") as f: ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      except OSError: continue
      if ppid == pid: out += [int(p)] + self.children(int(p))
    return out
  def kill(self, pid: int) -> None:
    import signal
    for p in [pid] + self.children(pid):
      try: os.kill(p, signal.SIGKILL)
      except ProcessLookupError: pass
  def stop(self) -> None:
    import shutil, time
    for _ in range(3):  # what a dying raylet leaves behind can appear late
      for pid in self.pids(): self.kill(pid)
      time.sleep(0.5)
    shutil.rmtree(self.dir, ignore_errors=True)

@pytest.fixture
def two_nodes():
  if ray.is_initialized(): ray.shutdown()  # (the module's local instance, if a test before started it)
  c = LocalCluster()
  try:
    c.start_head()
    c.add_node()
    yield c
  finally:
    if ray.is_initialized(): ray.shutdown()
    c.stop()
  assert not c.pids(), "processes of the test cluster are still running"

@pytest.mark.slow
def test_a_node_killed_mid_task_loses_nothing(two_nodes, tmp_path, monkeypatch):
  """kill -9 of a node's raylet while both nodes search: its task is retried on the other node, and
  every kernel's result arrives once."""
  import time
  monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
  ray.init(address=two_nodes.address, log_to_driver=False, logging_level="WARNING")
  deadline = time.time() + 60
  while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline: time.sleep(0.5)
  assert len([n for n in ray.nodes() if n["Alive"]]) == 2
  tasks = [distributed.TuneTask(f"case{i}", f"k{i}", pickle.dumps(ast), "CPU", 1, 2.0, ())
           for i, ast in enumerate([ew_ast(256), rowsum_ast(16, 32), ew_ast(96), rowsum_ast(8, 64)])]
  db = SearchDB(str(tmp_path / "driver.db"))
  got: list[distributed.TuneResult] = []
  killed: list[int] = []
  def on_result(r: distributed.TuneResult) -> None:
    db.merge_rows(r.rows)
    got.append(r)
    if not killed:  # the raylet of the node the driver is not attached to (killing that one would kill the driver's objects)
      mine = ray.get_runtime_context().get_node_id()
      (other,) = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != mine]
      (raylet,) = two_nodes.pids(f"--raylet_socket_name={other['RayletSocketName']}")
      killed.append(raylet)
      two_nodes.kill(raylet)
  distributed.run_ray(tasks, b"", on_result)
  assert killed and killed[0] not in two_nodes.pids("raylet")  # a node died during the run
  assert sorted(r.label for r in got) == sorted(t.label for t in tasks), [(r.label, r.error) for r in got]  # each once
  assert all(r.error is None for r in got), [r.error for r in got]
  assert len(db.result_rows()) == len(tasks)
  db.close()
