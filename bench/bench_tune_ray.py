"""Tuning a model's kernels on one machine and on a Ray cluster, side by side in one run: ResNet-50's
distinct kernels (tilecraft.onnx.light: the real architecture, seeded weights) searched with BEAM in a
local process, on a one-node Ray cluster and on a two-node localhost cluster, each into a fresh search
cache; then the model's time per call with each cache's results against hand-coded opts.

  python bench/bench_tune_ray.py [--kernels N] [--budget S] [--beam W] [--repeat K] [--configs local,ray1,ray2] [--json FILE]

Each tune goes through what `tilecraft tune --model FILE.onnx [--ray ADDRESS]` runs: the model's tasks
(tilecraft.cli.tune._model_tasks), then distributed.run_local or run_ray with the driver merging each
result into its cache. `--kernels N` tunes N of the distinct kernels, spread evenly over the schedule
(0: all of them), to keep the run short; the model check then replays the tuned kernels' results and
keeps hand-coded opts for the rest (a replay-only BEAM: search.beam.cached_result decides per kernel),
so it compares the same kernels tuned three ways. The clusters are `ray start --head` (+ `ray start
--address`) with one CPU per node, in a temp dir of their own, stopped by pid afterwards; their start
is reported on its own (a real cluster is started once, not per tune). Nodes on one host share its
cores: two localhost nodes search side by side on the same 2 cores, so their timings disturb each other.

Columns: wall (the tune itself: joining Ray, the searches, the driver's writes), kernels/min, searched
(kernels whose search ran, not answered from a cache), same opts (kernels whose chosen opts equal the
local tune's), model ms (best of --repeat calls after a warm-up, two rounds alternating the caches, the
minimum kept; each in a fresh process, so no runner is shared between caches)."""
from __future__ import annotations
import argparse, json, os, shutil, signal, socket, subprocess, sys, tempfile, time
from typing import Any

RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}

# ---- a localhost Ray cluster ------------------------------------------------------------------------------

def _procs() -> dict[int, int]:
  out = {}
  for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try:
      with open(f"/proc/{p}/stat") as f: out[int(p)] = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError: continue
  return out

def _cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f: return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError: return ""

class Cluster:
  """`ray start --head` plus nodes-1 `ray start --address` on this host (one CPU each, this host's
  tilecraft resources), in a temp dir of its own; stop() kills exactly its processes (by pid)."""
  def __init__(self, nodes: int) -> None:
    from tilecraft.engine.search.distributed import node_resources
    self.dir = tempfile.mkdtemp(prefix="tcrayb", dir="/tmp")
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.address = f"127.0.0.1:{self.port}"
    self.env = {**os.environ, **RAY_ENV}
    resources = json.dumps(node_resources(["CPU"]))
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    t0 = time.perf_counter()
    for i in range(nodes):
      where = ["--head", "--port", str(self.port), "--temp-dir", self.dir, "--include-dashboard", "false"] if i == 0 else ["--address", self.address]
      r = subprocess.run([ray_cli, "start", *where, "--num-cpus", "1", "--resources", resources, "--disable-usage-stats"],
                         env=self.env, capture_output=True, text=True, timeout=180)
      if r.returncode != 0:
        self.stop()
        raise RuntimeError(f"ray start failed: {r.stdout}{r.stderr}")
    self.start_s = time.perf_counter() - t0
  def stop(self) -> None:
    deadline = time.time() + 15
    while time.time() < deadline:
      parents = _procs()
      mine = [p for p in parents if self.dir in _cmdline(p)]
      kids: dict[int, list[int]] = {}
      for p, pp in parents.items(): kids.setdefault(pp, []).append(p)
      todo, every = list(mine), set()
      while todo:
        p = todo.pop()
        if p not in every:
          every.add(p)
          todo += kids.get(p, [])
      if not every: break
      for p in every:
        try: os.kill(p, signal.SIGKILL)
        except ProcessLookupError: pass
      time.sleep(0.3)
    shutil.rmtree(self.dir, ignore_errors=True)

# ---- tuning ------------------------------------------------------------------------------------------------

def plan(model_path: str, beam: int, budget: float, n: int) -> tuple[list[Any], int]:
  """The model's distinct kernels as tasks (as `tilecraft tune --model` plans them), n of them spread evenly (0: all), and the total."""
  from tilecraft.cli.tune import _model_tasks
  tasks, _ = _model_tasks(argparse.Namespace(model=model_path, beam=beam, budget=budget, quick=False, only=None), "CPU")
  if n <= 0 or n >= len(tasks): return tasks, len(tasks)
  return [tasks[round(i * (len(tasks) - 1) / (n - 1))] for i in range(n)] if n > 1 else tasks[:1], len(tasks)

def tune(config: str, tasks: list[Any], db_path: str) -> dict[str, Any]:
  from tilecraft.engine.search import distributed
  from tilecraft.engine.search.db import SearchDB
  db = SearchDB(db_path)
  results: list[Any] = []
  def on_result(r: Any) -> None:
    db.merge_rows(r.rows)
    results.append(r)
    print(f"  {config}: {len(results)}/{len(tasks)} {r.name} {'error: ' + r.error if r.error else r.chose} ({r.wall_s:.1f}s on {r.node})", flush=True)
  cluster, start_s = None, 0.0
  if config.startswith("ray"):
    cluster = Cluster(int(config[3:]))
    start_s = cluster.start_s
  os.environ.update(RAY_ENV)
  t0 = time.perf_counter()
  try:
    if cluster is None: distributed.run_local(tasks, b"", on_result)
    else: distributed.run_ray(tasks, b"", on_result, address=cluster.address)
  finally:
    wall = time.perf_counter() - t0
    if cluster is not None: cluster.stop()
    db.close()
  return {"config": config, "wall_s": wall, "start_s": start_s, "kernels": len(tasks), "per_min": 60 * len(tasks) / wall,
          "searched": sum(not r.cache_hit for r in results), "errors": sum(r.error is not None for r in results),
          "opts": {r.name: r.opts for r in results}, "nodes": sorted({r.node for r in results})}

# ---- the model with a cache's results ---------------------------------------------------------------------

def time_model(model_path: str, cachedb: str, beam: int, budget: float, repeat: int) -> dict[str, Any]:
  """(In a fresh process.) The model's best time per call with `cachedb`'s results replayed and hand-coded
  opts for kernels it has none for; cachedb "" means hand-coded opts everywhere."""
  import tilecraft.engine.search as search_pkg
  import tilecraft.onnx as tonnx
  from tilecraft.engine.search.beam import cached_result
  from tilecraft.helpers import Context
  from tilecraft.onnx.light import light_input
  real, used = search_pkg.beam_search, {"replayed": 0, "hand": 0}
  def replay_only(k: Any, bufs: Any = None, amt: int = 2, **kw: Any) -> Any:
    if cached_result(k, amt, budget_s=kw.get("budget_s")) is None:
      used["hand"] += 1
      return k.copy().hand_coded_optimizations()
    used["replayed"] += 1
    return real(k, bufs, amt, **kw)
  search_pkg.beam_search = replay_only  # realize.optimize imports it from the package at each call
  model = tonnx.load(model_path, "CPU")
  feed = light_input(model.proto, 0)
  settings = {"BEAM": beam, "CACHEDB": cachedb, "BEAM_BUDGET": budget} if cachedb else {"BEAM": 0}
  with Context(**settings):
    model.run(feed)
    times = []
    for _ in range(repeat):
      t0 = time.perf_counter()
      model.run(feed)
      times.append(time.perf_counter() - t0)
  return {"best_ms": 1e3 * min(times), **used}

def time_kernels(tasks_path: str, caches: list[tuple[str, str]], beam: int, budget: float, rounds: int) -> dict[str, Any]:
  """(In a fresh process.) The sum over the tuned kernels (each once) of each kernel's best time with each
  cache's opts ("" = hand-coded), all in one process on the same random buffers, the distinct opts
  alternating run by run, so the machine's swings hit them alike; caches that chose the same opts for a
  kernel run the same binary, so they share its time and differ only where their choices differ."""
  import pickle
  import numpy as np
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Buffer, CompiledRunner, Device
  from tilecraft.engine import search
  from tilecraft.engine.search.actions import opts_key
  from tilecraft.engine.search.beam import _buffer_specs
  from tilecraft.engine.verify import random_array
  from tilecraft.helpers import Context
  with open(tasks_path, "rb") as f: tasks = pickle.load(f)
  ren, rng = Device["CPU"].renderer, np.random.default_rng(0)
  total, per_kernel = {name: 0.0 for name, _ in caches}, {}
  for t in tasks:
    ast = pickle.loads(t.ast)
    runners, chosen = {}, {}  # one runner per distinct opts: caches that chose the same opts share its time
    for name, db in caches:
      if not db: k = Kernel(ast, ren).hand_coded_optimizations()
      else:
        with Context(CACHEDB=db):
          k = search.beam_search(Kernel(ast, ren), None, beam, budget_s=budget, progress=False)
          assert search.last_report.cache_hit, f"{t.name} is not in {db}"
      key = opts_key(k.applied_opts)
      if key not in runners: runners[key] = CompiledRunner(k.to_program())
      chosen[name] = key
    bufs = [Buffer("CPU", n, dt).allocate().copyin(random_array(dt, n, rng)) for n, dt in _buffer_specs(Kernel(ast, ren), None)]
    best = {key: float("inf") for key in runners}
    for _ in range(rounds):
      for key, r in runners.items(): best[key] = min(best[key], r(bufs))
    for name in total: total[name] += best[chosen[name]]
    per_kernel[t.name] = {name: (1e3 * best[chosen[name]], chosen[name]) for name in chosen}
  return {"total": total, "per_kernel": per_kernel}

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--kernels", type=int, default=12, help="distinct kernels to tune, spread over the model (0: all; default 12)")
  ap.add_argument("--budget", type=float, default=2.0, help="seconds per kernel's search rounds (default 2)")
  ap.add_argument("--beam", type=int, default=1)
  ap.add_argument("--repeat", type=int, default=5, help="timed model calls per round (default 5)")
  ap.add_argument("--configs", default="local,ray1,ray2")
  ap.add_argument("--json", default=None)
  ap.add_argument("--time-model", nargs=2, metavar=("MODEL", "CACHEDB"), help=argparse.SUPPRESS)  # the child of the model check
  ap.add_argument("--time-kernels", nargs="+", metavar="TASKS NAME=DB", help=argparse.SUPPRESS)  # the child of the kernel check
  args = ap.parse_args()
  if args.time_model:
    print(json.dumps(time_model(args.time_model[0], args.time_model[1], args.beam, args.budget, args.repeat)))
    return
  if args.time_kernels:
    caches = [tuple(c.split("=", 1)) for c in args.time_kernels[1:]]
    print(json.dumps(time_kernels(args.time_kernels[0], caches, args.beam, args.budget, 10 * args.repeat)))
    return
  import onnx
  from tilecraft.onnx.light import light_model
  work = tempfile.mkdtemp(prefix="tc_bench_tune_")
  model_path = os.path.join(work, "resnet50.onnx")
  onnx.save(light_model("resnet50"), model_path)
  t0 = time.perf_counter()
  tasks, total = plan(model_path, args.beam, args.budget, args.kernels)
  plan_s = time.perf_counter() - t0
  print(f"ResNet-50: {total} distinct kernels, tuning {len(tasks)} (planned in {plan_s:.1f}s), BEAM={args.beam}, budget {args.budget:g}s", flush=True)
  rows = []
  for config in args.configs.split(","):
    rows.append(tune(config, tasks, os.path.join(work, f"{config}.db")))
    r = rows[-1]
    print(f"{config}: {r['wall_s']:.1f}s, {r['per_min']:.1f} kernels/min (start {r['start_s']:.1f}s), {r['errors']} errors", flush=True)
  # the model, each cache alternating, two rounds, fresh processes
  caches = [("hand-coded", "")] + [(r["config"], os.path.join(work, f"{r['config']}.db")) for r in rows]
  best: dict[str, dict[str, Any]] = {}
  env = {k: v for k, v in os.environ.items() if k not in ("BEAM", "CACHEDB", "BEAM_BUDGET", "DEBUG")}
  for _ in range(2):
    for name, db in caches:
      out = subprocess.run([sys.executable, __file__, "--time-model", model_path, db, "--beam", str(args.beam), "--budget", str(args.budget),
                            "--repeat", str(args.repeat)], env=env, capture_output=True, text=True, timeout=600)
      if out.returncode != 0: raise RuntimeError(f"model check with {name} failed:\n{out.stderr[-3000:]}")
      res = json.loads(out.stdout.strip().splitlines()[-1])
      if name not in best or res["best_ms"] < best[name]["best_ms"]: best[name] = res
  # the tuned kernels alone, every cache in one process, interleaved run by run
  import pickle
  with open(os.path.join(work, "tasks.pkl"), "wb") as f: pickle.dump(tasks, f)
  out = subprocess.run([sys.executable, __file__, "--time-kernels", os.path.join(work, "tasks.pkl"), *[f"{n}={db}" for n, db in caches],
                        "--beam", str(args.beam), "--budget", str(args.budget), "--repeat", str(args.repeat)], env=env, capture_output=True, text=True, timeout=600)
  if out.returncode != 0: raise RuntimeError(f"kernel check failed:\n{out.stderr[-3000:]}")
  kchk = json.loads(out.stdout.strip().splitlines()[-1])
  ksum = kchk["total"]
  for kname, per in kchk["per_kernel"].items():
    print(f"  {kname:<24} " + "  ".join(f"{n} {ms:.3f}ms [{o}]" for n, (ms, o) in per.items()), flush=True)
  ref_opts = rows[0]["opts"] if rows else {}
  print(f"\nResNet-50, {len(tasks)} of its {total} distinct kernels tuned (BEAM={args.beam}, budget {args.budget:g}s per kernel), "
        f"2 cores; model: best of {args.repeat} calls x 2 rounds, each in a fresh process; tuned kernels: the sum of their best of "
        f"{10 * args.repeat} runs each, all caches in one process, alternating\n")
  print(f"| {'where':<24} | {'wall':>7} | {'kernels/min':>11} | {'searched':>8} | {'same opts':>9} | {'cluster start':>13} | {'tuned kernels ms':>16} | {'model ms/call':>13} | {'kernels replayed/hand':>21} |")
  print(f"|{'-' * 26}|{'-' * 9}|{'-' * 13}|{'-' * 10}|{'-' * 11}|{'-' * 15}|{'-' * 18}|{'-' * 15}|{'-' * 23}|")
  h = best["hand-coded"]
  print(f"| {'hand-coded (no tune)':<24} | {'-':>7} | {'-':>11} | {'-':>8} | {'-':>9} | {'-':>13} | {1e3 * ksum['hand-coded']:>16.2f} | {h['best_ms']:>13.1f} | {str(h['replayed']) + '/' + str(h['hand']):>21} |")
  names = {"local": "local process (no Ray)", "ray1": "Ray, 1 node", "ray2": "Ray, 2 nodes (one host)"}
  for r in rows:
    m = best[r["config"]]
    same = sum(ref_opts.get(k) == v for k, v in r["opts"].items())
    print(f"| {names.get(r['config'], r['config']):<24} | {r['wall_s']:>6.1f}s | {r['per_min']:>11.1f} | {r['searched']:>8} | {same:>4}/{len(tasks):<4} | "
          f"{(str(round(r['start_s'], 1)) + 's') if r['start_s'] else '-':>13} | {1e3 * ksum[r['config']]:>16.2f} | {m['best_ms']:>13.1f} | {str(m['replayed']) + '/' + str(m['hand']):>21} |")
  if args.json:
    with open(args.json, "w") as f: json.dump({"total_kernels": total, "tuned": len(tasks), "plan_s": plan_s, "tunes": rows, "model": best, "tuned_kernels": kchk}, f, indent=1)
  shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
  main()
