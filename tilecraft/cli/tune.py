"""`tilecraft tune`: BEAM search over every kernel of the bench suite, with a progress bar. The
results land in the search cache (sqlite, `CACHEDB`), so `tilecraft bench --beam N` and `BEAM=N`
runs with the same width replay them instead of searching."""
from __future__ import annotations
import argparse, math, sys, time
from typing import Any
import numpy as np
from tilecraft.cli import CLIError, Progress, fmt_opts, fmt_time, format_table, open_device
from tilecraft.cli.suite import select, suite

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft tune`."""
  ap.add_argument("--device", default=None, help="device (default: Device.DEFAULT, i.e. $DEVICE or CPU)")
  ap.add_argument("--beam", type=int, default=2, metavar="N", help="beam width (default 2); use the same N with bench --beam / BEAM=N")
  ap.add_argument("--quick", action="store_true", help="the small-size suite (as bench --quick)")
  ap.add_argument("-k", "--only", action="append", metavar="NAME", help="only bench kernels whose name contains NAME (repeatable)")
  ap.add_argument("--budget", type=float, default=None, metavar="S", help="seconds per kernel; the best so far is kept when spent")
  ap.add_argument("--quiet", action="store_true", help="no progress bar")

def _bar(total: int, enabled: bool) -> Any:
  """A tqdm bar over kernels on stderr, or None (plain progress lines are used then)."""
  if not enabled: return None
  try: from tqdm import tqdm
  except ImportError: return None
  return tqdm(total=total, desc="tune", unit="kernel", file=sys.stderr, dynamic_ncols=True)

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft tune`; 1 when a search fails."""
  from tilecraft import Tensor
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  from tilecraft.engine import search
  from tilecraft.ops import MetaOps
  device = open_device(args.device)
  if args.beam < 1: raise CLIError("--beam must be >= 1")
  cases = select(suite(args.quick), args.only)
  if not cases: raise CLIError(f"no benchmark kernel matches {args.only}")
  ren = Device[device].renderer
  rows, failed = [], 0
  t0 = time.perf_counter()
  bar = _bar(len(cases), not args.quiet)
  prog = Progress(enabled=not args.quiet and bar is None, total=len(cases))
  try:
    for case in cases:
      if bar is not None: bar.set_postfix_str(case.key)
      prog.step(f"{case.key}: BEAM={args.beam}")
      rng = np.random.default_rng(0)
      ts = [Tensor(a, device=device) for a in case.make_inputs(rng)]
      items = [si for si in case.tilecraft_fn(*ts).schedule() if si.ast.op is MetaOps.KERNEL]
      for si in items:
        try:
          k = search.beam_search(Kernel(si.ast, ren), list(si.bufs), args.beam, budget_s=args.budget)
          rep = search.last_report
        except Exception as e:  # noqa: BLE001 - one kernel's failure doesn't stop the others
          failed += 1
          rows.append([case.key, Kernel(si.ast, ren).name, "-", "-", "-", "error", f"{type(e).__name__}: {e}"])
          continue
        hand = getattr(rep, "hand_time", math.inf)
        final = getattr(rep, "final_time", math.inf)
        gain = f"{hand / final:.2f}x" if math.isfinite(hand) and math.isfinite(final) and final > 0 else "-"
        how = ("cached " if getattr(rep, "cache_hit", False) else "") + (getattr(rep, "chose", "") or "")
        rows.append([case.key, getattr(rep, "name", "") or k.name, fmt_time(hand if math.isfinite(hand) else None),
                     fmt_time(final if math.isfinite(final) else None), gain, how, fmt_opts(k.applied_opts)])
      del ts, items
      if bar is not None: bar.update(1)
  finally:
    if bar is not None: bar.close()
    prog.clear()
  print(f"tune on {device}: BEAM={args.beam} over {len(cases)} bench kernels in {time.perf_counter() - t0:.1f}s "
        f"(search cache: {search.cache_db_path() if hasattr(search, 'cache_db_path') else 'CACHEDB'})")
  print(format_table(["bench", "kernel", "hand-coded", "beam", "gain", "chosen", "opts"], rows, "llrrrll"))
  print(f"\nreplay with: tilecraft bench --beam {args.beam}{' --quick' if args.quick else ''}  (or BEAM={args.beam} in the environment)")
  return 1 if failed else 0
