"""Tuning many kernels: each distinct kernel's BEAM search is one task, run on a Ray cluster
(`run_ray`) or, without Ray, in a local process pool (`run_local`); one mechanism, `tune_kernel`,
runs a task wherever it lands.

  TuneTask     one kernel to search: its pickled AST, device, beam width, budget and the settings
               that decide its target (CPU_ARCH, CPU_COMPILER)
  TuneResult   what came back: the chosen opts, the times, verification, the node, and the search
               cache rows the search wrote there
  tune_kernel(task, seed) -> TuneResult     run one task in this process
  run_local(tasks, seed, on_result, workers=1) / run_ray(tasks, seed, on_result, address=None)
  answered_by_seed(tasks, seed)  the tasks the driver's results already answer (no worker), and the rest
  check_address(address)     a cluster address nothing answers at is an error at once (Ray retries for minutes)
  node_resources(devices), target_resource(device, settings)

Where a task runs and what it may be compared with:
- A task's whole search (building, timing, verifying, racing) runs on one node, inside that node's
  own isolation workers (search/beam.py), so a crash or hang of a candidate costs only that
  candidate, as on one machine. Times are only compared within one search, i.e. within one node.
- A node offers one unit of a custom Ray resource per target it can execute, named from the host
  facts `tilecraft devices` reports (`target_resource`): `tilecraft_cpu_<arch>` for each CPU_ARCH
  this host runs, and `tilecraft_cpu_native_<kind>` for -march=native code of this kind of host.
  A task asks for one unit of its target's resource, so it only goes to nodes that can run it, and
  a node runs one search at a time (timing needs the machine to itself).
- A kernel the driver's search cache results (`seed`) already answer is answered by the driver
  itself, looked up by key (`answered_by_seed`), and never sent. The others' searches run against a
  scratch copy of the seed (the per-candidate timings are not in it, so they start cold); the rows the
  search adds travel back in the TuneResult and the driver alone writes them into its cache
  (`SearchDB.merge_rows`: idempotent per key, so a task Ray retried after a node died can't
  duplicate a result). Each finished task is written as it arrives: an interrupted run keeps them.
"""
from __future__ import annotations
import hashlib, json, math, os, pickle, platform, socket, sys, tempfile, time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

TARGET_SETTINGS = ("CPU_ARCH", "CPU_COMPILER")  # the settings that decide which code a kernel becomes on a node

@dataclass(frozen=True)
class TuneTask:
  """One kernel's BEAM search."""
  label: str                 # where the kernel comes from (a bench case, a model)
  name: str                  # the kernel's name
  ast: bytes                 # its AST, pickled
  device: str
  beam: int
  budget_s: Optional[float]  # None: the search's default budget
  settings: tuple[tuple[str, str], ...] = ()  # TARGET_SETTINGS that are set, as (name, value)

@dataclass
class TuneResult:
  """One task's outcome, as the driver receives it."""
  label: str
  name: str
  node: str = ""
  rows: list[tuple] = field(default_factory=list)  # search cache result rows the search wrote (db.RESULT_COLUMNS)
  cache_hit: bool = False
  chose: str = ""
  opts: str = ""             # the chosen opts (search.actions.opts_key form)
  hand_time: float = math.inf
  final_time: float = math.inf
  verified: Optional[bool] = None
  complete: bool = True
  wall_s: float = 0.0
  error: Optional[str] = None

def current_settings() -> tuple[tuple[str, str], ...]:
  """This process's TARGET_SETTINGS that are set (env or Context), for a TuneTask."""
  from tilecraft.helpers import getenv
  return tuple((n, str(v)) for n in TARGET_SETTINGS if (v := getenv(n, "")))

def _resource_name(*parts: str) -> str:
  return "tilecraft_" + "_".join(p.lower().replace(" ", "-") for p in parts)

def _kind_hash(compiler: Any) -> str:
  """A short name for this kind of host + compiler (the compiler's cachekey names its version and the host CPU)."""
  return hashlib.sha256(str(getattr(compiler, "cachekey", "") or type(compiler).__qualname__).encode()).hexdigest()[:10]

def target_resource(device: str, settings: Sequence[tuple[str, str]] = ()) -> str:
  """The Ray resource a node offers when it can run `device` kernels built with `settings`: for CPU,
  tilecraft_cpu_<CPU_ARCH>, and for -march=native tilecraft_cpu_native_<this kind of host>; for
  another device tilecraft_<device>_<its compiler's kind>."""
  from tilecraft.device import Device
  from tilecraft.helpers import Context
  with Context(**dict(settings)):
    comp = Device[device].compiler
    if device == "CPU" and hasattr(comp, "target"):
      arch = comp.target.arch
      return _resource_name("cpu", arch) + (f"_{_kind_hash(comp)}" if arch == "native" else "")
    return _resource_name(device, _kind_hash(comp))

def node_resources(devices: Sequence[str] = ("CPU",)) -> dict[str, float]:
  """The custom resources this host offers (one unit each, see the module docstring): every runnable
  CPU_ARCH of `tilecraft devices` and native for CPU, and each other device that opens and runs here."""
  from tilecraft.device import Device, DeviceUnavailable
  from tilecraft.host import runnable_archs
  out: dict[str, float] = {}
  for dev in devices:
    try: opened = Device[dev]
    except DeviceUnavailable: continue
    if opened.render_only is not None: continue
    if dev == "CPU" and hasattr(opened.compiler, "target"):
      for arch in runnable_archs(getattr(opened.compiler, "cc", None)):
        out[target_resource("CPU", (("CPU_ARCH", arch),))] = 1.0
    else: out[target_resource(dev)] = 1.0
  return out

# ---- one task, wherever it runs -------------------------------------------------------------------

def _node_name() -> str:
  """This host's name, and on Ray the start of the node's id (several nodes may share a host)."""
  ray = sys.modules.get("ray")
  try:
    if ray is not None and ray.is_initialized(): return f"{platform.node()}:{ray.get_runtime_context().get_node_id()[:6]}"
  except Exception: pass  # noqa: BLE001 - a name for the report only
  return platform.node()

def tune_kernel(task: TuneTask, seed: bytes = b"") -> TuneResult:
  """Run one task's BEAM search here, against a scratch search cache holding `seed` (a search cache
  file's bytes: the driver's results); the rows it adds come back in the result. Never raises for a
  failed search: the error is in the result."""
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.engine import search
  from tilecraft.engine.search.db import close_cache_dbs, read_results
  from tilecraft.helpers import Context
  t0 = time.perf_counter()
  res = TuneResult(task.label, task.name, node=_node_name())
  with tempfile.TemporaryDirectory(prefix="tilecraft-tune-") as d:
    path = os.path.join(d, "search.db")
    if seed:
      with open(path, "wb") as f: f.write(seed)
    try:
      before = set(read_results(path)) if seed else set()
      with Context(CACHEDB=path, CACHELEVEL=2, **dict(task.settings)):
        ast = pickle.loads(task.ast)
        k = search.beam_search(Kernel(ast, Device[task.device].renderer), None, task.beam, budget_s=task.budget_s, progress=False)
        rep = search.last_report
        close_cache_dbs()
        res.rows = [r for r in read_results(path) if r not in before]  # each names this node's kind of machine (beam.py)
      from tilecraft.engine.search.actions import opts_key
      res.opts = opts_key(k.applied_opts)
      if rep is not None:
        res.cache_hit, res.chose, res.verified, res.complete = rep.cache_hit, rep.chose, rep.verified, rep.complete
        res.hand_time, res.final_time = rep.hand_time, rep.final_time
    except Exception as e:  # noqa: BLE001 - one kernel's failure is reported, the others go on
      res.error = f"{type(e).__name__}: {e}"
    finally: close_cache_dbs()
  res.wall_s = time.perf_counter() - t0
  return res

def answered_by_seed(tasks: Sequence[TuneTask], seed: bytes) -> tuple[list[TuneResult], list[TuneTask]]:
  """Split the tasks into results for those the seed (the driver's search cache results) already answers,
  found here by key (search.beam.cached_result: nothing built, no worker, no Ray task), and the tasks
  left to run. A lookup that fails leaves its task to run: the node's search finds out for itself."""
  if not seed or not tasks: return [], list(tasks)
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.engine.search.beam import cached_result
  from tilecraft.engine.search.db import SearchDB
  from tilecraft.helpers import Context
  done: list[TuneResult] = []
  todo: list[TuneTask] = []
  with tempfile.TemporaryDirectory(prefix="tilecraft-tune-") as d:
    with open(os.path.join(d, "seed.db"), "wb") as f: f.write(seed)
    db = SearchDB(os.path.join(d, "seed.db"))
    try:
      for t in tasks:
        t0 = time.perf_counter()
        try:
          with Context(**dict(t.settings)): row = cached_result(Kernel(pickle.loads(t.ast), Device[t.device].renderer), t.beam, budget_s=t.budget_s, db=db)
        except Exception: row = None  # noqa: BLE001 - see the docstring
        if row is None:
          todo.append(t)
          continue
        opts, chose, final_t, hand_t, complete, _ = row
        done.append(TuneResult(t.label, t.name, node=f"{_node_name()} (driver)", cache_hit=True, chose=chose, opts=opts,
                               hand_time=math.inf if hand_t is None else hand_t, final_time=math.inf if final_t is None else final_t,
                               complete=bool(complete), wall_s=time.perf_counter() - t0))
    finally: db.close()
  return done, todo

# ---- running many: a local process pool or Ray -------------------------------------------------------

def run_local(tasks: Sequence[TuneTask], seed: bytes, on_result: Callable[[TuneResult], None], workers: int = 1) -> None:
  """Run the tasks in `workers` local processes (default 1: one search at a time, since timing needs
  the machine to itself), calling on_result in this process as each finishes. Tasks the seed already
  answers are answered here first (answered_by_seed), without starting a process."""
  import concurrent.futures as cf, multiprocessing as mp
  done, tasks = answered_by_seed(tasks, seed)
  for r in done: on_result(r)
  if not tasks: return
  ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
  try:
    futs = {ex.submit(tune_kernel, t, seed): t for t in tasks}
    for f in cf.as_completed(futs):
      try: r = f.result()
      except Exception as e:  # noqa: BLE001 - the pool process died (e.g. killed): report it, go on
        t = futs[f]
        r = TuneResult(t.label, t.name, node=platform.node(), error=f"{type(e).__name__}: {e}")
      on_result(r)
  except BaseException:
    ex.shutdown(wait=False, cancel_futures=True)
    raise
  ex.shutdown(wait=True)

def import_ray() -> Any:
  """The ray module, or an ImportError saying how to install it."""
  try: import ray
  except ImportError as e:
    raise ImportError(f"tuning on Ray needs the ray package, which is not installed ({e}): pip install 'tilecraft[ray]'") from None
  return ray

def resources_hint(devices: Sequence[str] = ("CPU",)) -> str:
  """The `ray start` option that makes this host offer its targets."""
  return f"--resources '{json.dumps(node_resources(devices))}'"

ADDRESS_PROBE_S = 3.0  # how long check_address waits for a TCP connect to the cluster's address

def check_address(address: str, timeout_s: float = ADDRESS_PROBE_S) -> None:
  """Fail at once, naming `address`, when nothing accepts connections there: Ray's own client keeps retrying an
  unreachable GCS for minutes (ray 2.60's ray.init was still retrying after 5). HOST:PORT (the head's GCS port, `ray start
  --head --port`) and ray://HOST:PORT (Ray Client) are probed with one TCP connect; `auto` and `local`
  are left to Ray. RuntimeError for an address that is malformed or unreachable."""
  if address in ("auto", "local"): return
  host, sep, port = (address.split("://", 1)[1] if "://" in address else address).rpartition(":")
  host = host.strip("[]")  # [IPv6]:port
  if not sep or not host or not port.isdigit():
    raise RuntimeError(f"--ray {address}: expected HOST:PORT (the head node's GCS port, 6379 unless `ray start --head --port` "
                       f"said otherwise), ray://HOST:PORT or auto")
  hosts = [host]
  if host in ("localhost", "127.0.0.1", "::1") and (ray := sys.modules.get("ray")) is not None:
    try: hosts.append(ray.util.get_node_ip_address())  # Ray itself dials this host's node IP for a loopback address
    except Exception: pass  # noqa: BLE001 - the loopback address alone
  errors = []
  for h in hosts:
    try:
      with socket.create_connection((h, int(port)), timeout=timeout_s): return
    except socket.gaierror as e: errors.append(f"{h} is not a host name this machine can resolve ({e.strerror})")
    except TimeoutError: errors.append(f"no answer from {h}:{port} within {timeout_s:g} s")
    except OSError as e: errors.append(f"{h}:{port}: {e.strerror or e}")
  raise RuntimeError(f"can't join the Ray cluster at {address}: nothing accepts connections there ({'; '.join(errors)}); "
                     f"start the head node with `ray start --head --port {port}`, or check the host and port")

def run_ray(tasks: Sequence[TuneTask], seed: bytes, on_result: Callable[[TuneResult], None], address: Optional[str] = None,
            max_retries: int = 3) -> None:
  """Run the tasks on Ray, calling on_result in this process as each finishes. Joins the cluster at
  `address`, or starts a local Ray instance offering this host's resources (the Ray instance this
  process already has is used as it is). A task Ray loses with its node is retried elsewhere up to
  `max_retries` times. Stops (cancelling what is left) on an exception, KeyboardInterrupt included.
  Tasks the seed already answers are answered here first (answered_by_seed); when that is all of them,
  Ray is not started or joined."""
  ray = import_ray()
  if address: check_address(address)
  done, tasks = answered_by_seed(tasks, seed)
  for r in done: on_result(r)
  if not tasks: return
  started = False
  if not ray.is_initialized():
    if address:
      try: ray.init(address=address, log_to_driver=False, logging_level="WARNING")
      except (ConnectionError, ValueError, RuntimeError) as e: raise RuntimeError(f"can't join the Ray cluster at {address}: {e}") from None
    else:
      devices = sorted({t.device for t in tasks}) or ["CPU"]
      ray.init(num_cpus=max(2, os.cpu_count() or 1), resources=node_resources(devices), include_dashboard=False,
               log_to_driver=False, logging_level="WARNING")
    started = True
  refs: dict[Any, TuneTask] = {}
  try:
    need = {target_resource(t.device, t.settings) for t in tasks}
    have = ray.cluster_resources()
    if (missing := sorted(r for r in need if have.get(r, 0) < 1)):
      raise RuntimeError(f"no node of the Ray cluster offers {', '.join(missing)}, so no node can run these kernels; start each node "
                         f"with `ray start ... {resources_hint(sorted({t.device for t in tasks}))}` (on that node: "
                         f"python -m tilecraft.engine.search.distributed prints its own)")
    remote = ray.remote(tune_kernel)
    # a small seed travels inline with each task (no object a dead node's task could lose track of); a big one once, by reference
    seed_ref = seed if len(seed) < (1 << 20) else ray.put(seed)
    for t in tasks:
      refs[remote.options(num_cpus=1, resources={target_resource(t.device, t.settings): 1}, max_retries=max_retries).remote(t, seed_ref)] = t
    while refs:
      ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
      for ref in ready:
        t = refs.pop(ref)
        try: r = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - the task failed for good (its retries spent): report it, go on
          r = TuneResult(t.label, t.name, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
        on_result(r)
  except BaseException:
    for ref in refs:
      try: ray.cancel(ref, force=True)
      except Exception: pass  # noqa: BLE001 - already finished or gone
    raise
  finally:
    if started: ray.shutdown()

if __name__ == "__main__":  # `python -m tilecraft.engine.search.distributed [DEVICE...]`: this host's resources, for `ray start --resources`
  print(json.dumps(node_resources(sys.argv[1:] or ["CPU"])))
