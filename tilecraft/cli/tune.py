"""`tilecraft tune`: BEAM search over every distinct kernel of the bench suite (or of an ONNX model,
`--model FILE.onnx`), with a progress bar
(tqdm, with an ETA). Each kernel's search is one task (tilecraft.engine.search.distributed): in a
local process, or with `--ray [ADDRESS]` a Ray task on a node that can run the target. The results
come back to this process, which alone writes them into the search cache (sqlite, `CACHEDB`) as
each finishes, so `tilecraft bench --beam N` and `BEAM=N` runs with the same width replay them
instead of searching, and an interrupted run keeps what finished (a rerun searches only the rest:
the others are cache hits)."""
from __future__ import annotations
import argparse, math, os, pickle, sys, tempfile, time
from typing import Any
import numpy as np
from tilecraft.cli import CLIError, Progress, fmt_opts, fmt_time, format_table, open_device
from tilecraft.cli.suite import select, suite

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft tune`."""
  ap.add_argument("--device", default=None, help="device (default: Device.DEFAULT, i.e. $DEVICE or CPU)")
  ap.add_argument("--beam", type=int, default=2, metavar="N", help="beam width (default 2); use the same N with bench --beam / BEAM=N")
  ap.add_argument("--model", metavar="FILE.onnx", help="tune an ONNX model's distinct kernels instead of the bench suite's (needs tilecraft[onnx])")
  ap.add_argument("--quick", action="store_true", help="the small-size suite (as bench --quick)")
  ap.add_argument("-k", "--only", action="append", metavar="NAME", help="only bench kernels whose name contains NAME (repeatable)")
  ap.add_argument("--budget", type=float, default=None, metavar="S", help="seconds per kernel; the best so far is kept when spent")
  ap.add_argument("--quiet", action="store_true", help="no progress bar")
  ap.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                  help="run each kernel's search as a Ray task: join the cluster at ADDRESS, or without one start a local Ray "
                       "(pip install 'tilecraft[ray]'); without --ray the searches run in a local process")

def _bar(total: int, enabled: bool) -> Any:
  """A tqdm bar over kernels on stderr, or None (plain progress lines are used then)."""
  if not enabled: return None
  try: from tqdm import tqdm
  except ImportError: return None
  return tqdm(total=total, desc="tune", unit="kernel", file=sys.stderr, dynamic_ncols=True)

def _bench_tasks(args: argparse.Namespace, device: str) -> tuple[list[Any], int]:
  """The distinct kernels of the selected bench cases as TuneTasks (the first case that has a kernel names it), and the case count."""
  from tilecraft import Tensor
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.engine.search.distributed import TuneTask, current_settings
  from tilecraft.ops import MetaOps
  cases = select(suite(args.quick), args.only)
  if not cases: raise CLIError(f"no benchmark kernel matches {args.only}")
  ren, settings = Device[device].renderer, current_settings()
  tasks, seen = [], set()
  for case in cases:
    ts = [Tensor(a, device=device) for a in case.make_inputs(np.random.default_rng(0))]
    for si in case.tilecraft_fn(*ts).schedule():
      if si.ast.op is not MetaOps.KERNEL or si.ast.key in seen: continue
      seen.add(si.ast.key)
      tasks.append(TuneTask(case.key, Kernel(si.ast, ren).name, pickle.dumps(si.ast), device, args.beam, args.budget, settings))
  return tasks, len(cases)

def _model_tasks(args: argparse.Namespace, device: str) -> tuple[list[Any], int]:
  """The distinct kernels of an ONNX model as TuneTasks, and the model's node count. The model runs
  once here on seeded random inputs with hand-coded opts (BEAM=0); its kernels are those of the
  schedule that tilecraft.onnx captured for rerunning the graph."""
  from tilecraft.cli.run import _random_input
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.engine.search.distributed import TuneTask, current_settings
  from tilecraft.helpers import Context
  from tilecraft.ops import MetaOps
  try: import tilecraft.onnx as tonnx
  except ImportError as e: raise CLIError(f"--model needs the onnx package (pip install 'tilecraft[onnx]'): {e}") from None
  if not os.path.isfile(args.model): raise CLIError(f"--model {args.model}: no such file")
  try:
    model = tonnx.load(args.model, device)
    rng = np.random.default_rng(0)
    vis = {vi.name: vi for vi in model.proto.graph.input}
    with Context(BEAM=0): model.run({name: _random_input(vis[name], dt, rng) for name, dt in model.inputs})
  except NotImplementedError as e: raise CLIError(str(e), 1) from None
  captures = list(getattr(model, "_captures", {}).values())
  if not captures: raise CLIError(f"{args.model}: its graph's structure depends on its input data, so it has no fixed list of kernels to tune", 1)
  settings, label = current_settings(), os.path.basename(args.model)
  tasks, seen = [], set()
  for si in captures[-1].schedule:
    if si.ast.op is not MetaOps.KERNEL or si.ast.key in seen: continue
    seen.add(si.ast.key)
    tasks.append(TuneTask(label, Kernel(si.ast, Device[device].renderer).name, pickle.dumps(si.ast), device, args.beam, args.budget, settings))
  return tasks, len(model.proto.graph.node)

def _seed() -> bytes:
  """The driver's search cache results as a cache file's bytes: each task searches against a copy (a kernel tuned before is a hit)."""
  from tilecraft.engine.search.db import cache_db_path, export_results
  with tempfile.TemporaryDirectory(prefix="tilecraft-tune-") as d:
    export_results(cache_db_path(), os.path.join(d, "seed.db"))
    with open(os.path.join(d, "seed.db"), "rb") as f: return f.read()

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft tune`; 1 when a search fails."""
  from tilecraft.engine.search import distributed
  from tilecraft.engine.search.actions import opts_from_key
  from tilecraft.engine.search.db import cache_db_path, get_db
  device = open_device(args.device)
  if args.beam < 1: raise CLIError("--beam must be >= 1")
  if args.budget is not None and not args.budget > 0: raise CLIError("--budget must be > 0 seconds")
  if (db := get_db()) is None: raise CLIError("the search cache is off (CACHELEVEL=0) or unusable, so tuning would be lost")
  if args.ray is not None:
    try:
      distributed.import_ray()
      if args.ray: distributed.check_address(args.ray)  # before planning, which may take a minute for a model
    except ImportError as e: raise CLIError(str(e)) from None
    except RuntimeError as e: raise CLIError(f"Ray: {e}", code=1) from None
  tasks, n_cases = _model_tasks(args, device) if args.model else _bench_tasks(args, device)
  what = f"the {n_cases}-node model {args.model}" if args.model else f"{n_cases} bench cases"
  rows: list[list[str]] = []
  failed = 0
  t0 = time.perf_counter()
  bar = _bar(len(tasks), not args.quiet)
  prog = Progress(enabled=not args.quiet and bar is None, total=len(tasks))
  def on_result(r: distributed.TuneResult) -> None:
    nonlocal failed
    db.merge_rows(r.rows)  # the driver alone writes the cache, as each kernel finishes
    if r.error is not None:
      failed += 1
      rows.append([r.label, r.name, r.node or "-", "-", "-", "-", "error", r.error])
    else:
      hand, final = r.hand_time, r.final_time
      gain = f"{hand / final:.2f}x" if math.isfinite(hand) and math.isfinite(final) and final > 0 else "-"
      rows.append([r.label, r.name, r.node, fmt_time(hand if math.isfinite(hand) else None), fmt_time(final if math.isfinite(final) else None),
                   gain, ("cached " if r.cache_hit else "") + r.chose, fmt_opts(opts_from_key(r.opts))])
    if bar is not None:
      bar.set_postfix_str(r.name)
      bar.update(1)
    prog.step(f"{r.name}: {'error' if r.error else 'done'}")
  try:
    seed = _seed()
    if args.ray is not None: distributed.run_ray(tasks, seed, on_result, address=args.ray or None)
    else: distributed.run_local(tasks, seed, on_result)
  except RuntimeError as e:
    if args.ray is None: raise
    raise CLIError(f"Ray: {e}", code=1) from None
  finally:
    if bar is not None: bar.close()
    prog.clear()
  wall = time.perf_counter() - t0
  where = f"Ray{' at ' + args.ray if args.ray else ' (local instance)'}" if args.ray is not None else "a local process"
  print(f"tune on {device}: BEAM={args.beam} over {len(tasks)} distinct kernels of {what} on {where} in {wall:.1f}s "
        f"({60 * len(tasks) / wall:.1f} kernels/min; search cache: {cache_db_path()})")
  print(format_table(["model" if args.model else "bench", "kernel", "node", "hand-coded", "beam", "gain", "chosen", "opts"], rows, "lllrrrll"))
  # (a search its budget cut short is replayed only by searches with no larger budget, keys.replayable: without the
  # same BEAM_BUDGET, a run after `tune --budget 20` searched those kernels again at its first call, 111 s for ResNet-50)
  env = f"BEAM_BUDGET={args.budget:g} " if args.budget else ""
  if args.model: print(f"\nreplay with: {env}tilecraft run {args.model} --beam {args.beam}  (or {env}BEAM={args.beam} in the environment)")
  else: print(f"\nreplay with: {env}tilecraft bench --beam {args.beam}{' --quick' if args.quick else ''}  (or {env}BEAM={args.beam} in the environment)")
  return 1 if failed else 0
