"""Tuning many kernels (tilecraft.engine.search.distributed) on a real Ray cluster: two nodes on
localhost (`ray start --head` plus `ray start --address`, one CPU each, in a temp dir of their own),
started once for the file and always stopped. Tasks go only to nodes offering the target's
resource, results come back to the driver, which writes them into its search cache; an interrupted
run keeps what finished and a rerun searches only the rest; a Ray worker killed mid-search (kill -9)
and a node whose raylet is killed mid-search are retried, every result arriving exactly once; a
wrong address fails within seconds, naming it.

Kept short for CI's 2 cores: two tiny kernels, beam width 1 and a half-second budget (the search
still builds, times, verifies and races), one isolation worker per search (BEAM_WORKERS=1 on the
nodes), faster node-death detection on the head (--system-config), kills as soon as the search's
isolation worker is up instead of after a fixed sleep. Skipped, saying why, where ray is not
installed (pip install 'tilecraft[ray]'). Under `pytest -n N --dist loadgroup` the file stays on one
worker (xdist_group), so the cluster starts once."""
from __future__ import annotations
import json, os, pickle, signal, socket, subprocess, sys, tempfile, threading, time
import pytest
from tilecraft.dtype import dtypes
from tilecraft.engine.search import distributed
from tilecraft.engine.search.db import SearchDB, export_results, same_kind
from tilecraft.host import KNOWN_X86_ARCHS, runnable_archs
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.shape.shapetracker import ShapeTracker

try: import ray
except ImportError: ray = None
pytestmark = pytest.mark.xdist_group("ray_cluster")

@pytest.fixture(autouse=True, scope="module")
def _needs_ray(require_or_skip) -> None:
  """Skips without ray; fails in CI, which installs it (.ci/run, tests/conftest.py: CI_INSTALLS)."""
  if ray is None: require_or_skip("ray", "ray is not installed (pip install 'tilecraft[ray]')")

def _load(i: int, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dtypes.float32, st))
def _kernel(value: LazyOp, out_shape: tuple) -> LazyOp:
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape(out_shape))),))
def ew_ast(n: int) -> LazyOp:
  st = ShapeTracker.from_shape((n,))
  return _kernel(LazyOp(BinaryOps.MUL, (_load(1, st), _load(2, st))), (n,))
def rowsum_ast(r: int, c: int) -> LazyOp: return _kernel(LazyOp(ReduceOps.SUM, (_load(1, ShapeTracker.from_shape((r, c))),), (1,)), (r, 1))

def _tasks(settings: tuple = ()) -> list[distributed.TuneTask]:
  return [distributed.TuneTask(f"case{i}", f"k{i}", pickle.dumps(ast), "CPU", 1, 0.5, settings)
          for i, ast in enumerate([ew_ast(256), rowsum_ast(16, 32)])]

# ---- processes, read from /proc ----------------------------------------------------------------------

def _procs() -> dict[int, tuple[int, int]]:
  """pid -> (parent pid, start time) of every process now."""
  out = {}
  for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try:
      with open(f"/proc/{p}/stat") as f: fields = f.read().rsplit(")", 1)[1].split()
    except OSError: continue
    out[int(p)] = (int(fields[1]), int(fields[19]))
  return out

def _cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f: return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError: return ""

def _descendants(pid: int, procs: dict[int, tuple[int, int]]) -> list[int]:
  kids: dict[int, list[int]] = {}
  for p, (pp, _) in procs.items(): kids.setdefault(pp, []).append(p)
  out, todo = [], list(kids.get(pid, ()))
  while todo:
    p = todo.pop()
    out.append(p)
    todo += kids.get(p, ())
  return out

def _kill(pids: list[int]) -> None:
  for p in pids:
    try: os.kill(p, signal.SIGKILL)
    except ProcessLookupError: pass

class LocalCluster:
  """`ray start --head` plus one `ray start --address` node on this host, in a temp dir of their own,
  each offering this host's resources with one CPU. Stopped by killing exactly the processes it
  started (by pid: every process whose command line names its temp dir, and their descendants),
  never `ray stop`, which stops every Ray of this user on the machine, other jobs' included."""
  # the head declares a node dead after 3 missed health checks 0.5 s apart (default: 5, 3 s apart); a raylet
  # that is merely busy still answered in time at load 8 on 2 cores
  SYSTEM_CONFIG = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 500, "health_check_timeout_ms": 1000,
                   "health_check_failure_threshold": 3}
  def __init__(self) -> None:
    self.dir = tempfile.mkdtemp(prefix="tcray", dir="/tmp")  # short: Ray's socket paths must stay under ~107 chars
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.address = f"127.0.0.1:{self.port}"
    self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "BEAM_WORKERS": "1"}
    self.resources = json.dumps(distributed.node_resources(["CPU"]))
  def _start(self, *args: str) -> None:
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    r = subprocess.run([ray_cli, "start", *args, "--num-cpus", "1", "--resources", self.resources, "--disable-usage-stats",
                        "--include-log-monitor", "false"], env=self.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
  def start(self) -> None:
    self._start("--head", "--port", str(self.port), "--temp-dir", self.dir, "--include-dashboard", "false", "--no-monitor",
                "--system-config", json.dumps(self.SYSTEM_CONFIG))
    self._start("--address", self.address)
  def pids(self, name: str = "") -> list[int]:
    """Processes of this cluster whose command line names its temp dir (and `name` when given), oldest
    first; with no name, their descendants too (workers, agents)."""
    procs = _procs()
    own = sorted((procs[p][1], p) for p in procs if self.dir in (cmd := _cmdline(p)) and name in cmd)
    out = [p for _, p in own]
    if not name: out += [d for p in list(out) for d in _descendants(p, procs) if d not in out]
    return out
  def kill(self, pid: int) -> None:
    """kill -9 of a process and its descendants (a raylet takes its workers and agents along)."""
    _kill([pid] + _descendants(pid, _procs()))
  def searching_workers(self, raylet: int = 0) -> list[int]:
    """Ray workers of this cluster (of one raylet's node when given) in the middle of a search: running
    tune_kernel (a busy worker's process title is ray::tune_kernel) with the search's isolation worker up."""
    procs = _procs()
    out = []
    for r in [raylet] if raylet else self.pids("raylet"):
      for p in _descendants(r, procs):
        if _cmdline(p).startswith("ray::tune_kernel") and _descendants(p, procs): out.append(p)
    return out
  def stop(self) -> None:
    import shutil
    deadline = time.time() + 10
    while (left := self.pids()) and time.time() < deadline:  # what a dying raylet leaves behind can appear late
      _kill(left)
      time.sleep(0.2)
    shutil.rmtree(self.dir, ignore_errors=True)

@pytest.fixture(scope="module")
def cluster(_needs_ray):
  """The file's cluster, with this process's driver attached to it."""
  if ray.is_initialized(): ray.shutdown()
  c = LocalCluster()
  saved = os.environ.get("RAY_AUTH_MODE")
  os.environ["RAY_AUTH_MODE"] = "disabled"
  try:
    c.start()
    ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
    deadline = time.time() + 60
    while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline: time.sleep(0.2)
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    yield c
  finally:
    if ray.is_initialized(): ray.shutdown()
    c.stop()
    if saved is None: os.environ.pop("RAY_AUTH_MODE", None)
    else: os.environ["RAY_AUTH_MODE"] = saved
  assert not c.pids(), "processes of the test cluster are still running"

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

def _kill_when_searching(c: LocalCluster, killed: list[int], raylet: int = 0, kill_node: bool = False) -> threading.Thread:
  """A thread that kills (kill -9) the first Ray worker it sees mid-search (of `raylet`'s node when
  given), or with kill_node that node's raylet and everything under it; the pid killed goes to `killed`."""
  def killer() -> None:
    deadline = time.time() + 90
    while time.time() < deadline:
      if (busy := c.searching_workers(raylet)):
        victim = raylet if kill_node else busy[0]
        if kill_node: c.kill(raylet)
        else: os.kill(victim, signal.SIGKILL)  # the worker alone: its isolation workers die with it (PR_SET_PDEATHSIG)
        killed.append(victim)
        return
      time.sleep(0.05)
  th = threading.Thread(target=killer, daemon=True)
  th.start()
  return th

# ---- without a cluster -----------------------------------------------------------------------------------

def test_resources_name_what_this_host_can_run():
  res = distributed.node_resources(["CPU"])
  target = distributed.target_resource("CPU", distributed.current_settings())
  assert target in res and res[target] == 1.0
  runnable = set(runnable_archs())
  for arch in KNOWN_X86_ARCHS:
    assert (f"tilecraft_cpu_{arch}" in res) == (arch in runnable), arch

def test_missing_ray_is_a_clear_error(monkeypatch):
  import builtins
  real = builtins.__import__
  def no_ray(name, *a, **kw):
    if name == "ray": raise ImportError("No module named 'ray'")
    return real(name, *a, **kw)
  monkeypatch.setattr(builtins, "__import__", no_ray)
  with pytest.raises(ImportError, match=r"pip install 'tilecraft\[ray\]'"): distributed.import_ray()

def test_a_wrong_address_fails_within_seconds_naming_it(monkeypatch, capsys, tmp_path):
  """Nothing listening at the address: an error naming it at once, before ray.init (whose own retries
  go on for minutes). A malformed address is refused the same way."""
  with socket.socket() as s:  # a port nothing listens on once this socket is closed
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
  monkeypatch.setattr(ray, "is_initialized", lambda: False)  # (as in a fresh `tilecraft tune --ray ADDRESS`)
  def no_init(*a, **kw): raise AssertionError("ray.init was called for an address nothing listens on")
  monkeypatch.setattr(ray, "init", no_init)
  t0 = time.perf_counter()
  with pytest.raises(RuntimeError, match=f"Ray cluster at {address}: nothing accepts connections"):
    distributed.run_ray(_tasks(), b"", lambda r: None, address=address)
  assert time.perf_counter() - t0 < 5
  from tilecraft.__main__ import main  # `tilecraft tune --ray ADDRESS` says so before planning anything
  monkeypatch.setenv("CACHEDB", str(tmp_path / "search.db"))
  monkeypatch.setattr("tilecraft.cli.tune._bench_tasks", lambda *a: pytest.fail("planned the kernels before checking the address"))
  assert main(["tune", "--quiet", "--ray", address]) == 1
  assert f"Ray: can't join the Ray cluster at {address}: nothing accepts connections" in capsys.readouterr().err
  for bad in ("head-node", "head-node:port", ":6379"):
    with pytest.raises(RuntimeError, match=f"--ray {bad}: expected HOST:PORT"): distributed.check_address(bad)
  distributed.check_address("auto")  # Ray finds the cluster this host runs: nothing to probe

# ---- on the cluster (the raylet kill goes last: it leaves one node) -------------------------------------

def test_interrupted_run_keeps_finished_results_and_a_rerun_searches_only_the_rest(cluster, tmp_path):
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

def test_kernels_go_only_to_nodes_that_can_run_the_target(cluster):
  foreign = []
  for arch in (a for a in KNOWN_X86_ARCHS if a not in runnable_archs()):
    try: foreign.append(distributed.target_resource("CPU", (("CPU_ARCH", arch),)))
    except ValueError: pass  # the compiler doesn't know it
  if not foreign: pytest.skip("this host runs every -march its compiler knows, so there is no target it can't run")
  tasks = _tasks((("CPU_ARCH", foreign[-1].removeprefix("tilecraft_cpu_")),))[:1]
  with pytest.raises(RuntimeError, match=f"no node of the Ray cluster offers {foreign[-1]}"):
    distributed.run_ray(tasks, b"", lambda r: None)

def test_a_worker_killed_mid_search_is_retried(cluster, tmp_path):
  """kill -9 of the Ray worker running a search (its isolation worker dies with it): Ray runs the
  task again, and every kernel's result arrives once."""
  killed: list[int] = []
  th = _kill_when_searching(cluster, killed)
  db = SearchDB(str(tmp_path / "driver.db"))
  tasks = _tasks()
  got = _run(db, tasks, b"")
  th.join()
  assert killed, "no Ray worker was seen mid-search"
  assert sorted(r.label for r in got) == sorted(t.label for t in tasks), [(r.label, r.error) for r in got]  # each once
  assert all(r.error is None for r in got), [(r.label, r.error) for r in got]
  assert len(db.result_rows()) == len(tasks)
  db.close()

def test_a_node_killed_mid_search_loses_nothing(cluster, tmp_path):
  """kill -9 of a node's raylet (and everything under it) while its worker searches: the task is
  retried on the other node, and every kernel's result arrives once, all from the surviving node."""
  mine = ray.get_runtime_context().get_node_id()
  (other,) = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != mine]  # not the driver's node: that would take the driver's objects
  (raylet,) = cluster.pids(f"--raylet_socket_name={other['RayletSocketName']}")
  killed: list[int] = []
  th = _kill_when_searching(cluster, killed, raylet, kill_node=True)
  db = SearchDB(str(tmp_path / "driver.db"))
  tasks = _tasks()
  got = _run(db, tasks, b"")
  th.join()
  assert killed == [raylet] and raylet not in cluster.pids("raylet"), "the other node was never seen mid-search"
  assert sorted(r.label for r in got) == sorted(t.label for t in tasks), [(r.label, r.error) for r in got]  # each once
  assert all(r.error is None for r in got), [(r.label, r.error) for r in got]
  assert all(r.node.endswith(":" + mine[:6]) for r in got), [r.node for r in got]  # the lost search ran again on this node
  assert len(db.result_rows()) == len(tasks)
  db.close()
