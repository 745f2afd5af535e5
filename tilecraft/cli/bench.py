"""`tilecraft bench`: the benchmark suite on one device, checked and timed against numpy.

Each kernel of the suite (tilecraft.cli.suite) is written with the Tensor frontend, realized once
(compiling its kernels), timed side by side with numpy in the same process, and verified against
numpy in float64 (a wrong result fails the run). Three things are timed, best of at least --runs
rounds after --warmup rounds (fast cases run until 0.25 s per timing is spent, at most 200 rounds;
--quick: 0.025 s): tilecraft's two interleaved (one run of each per round, so load on a shared
machine hits both alike), then numpy's (its BLAS threads spin after each call, which would slow
the tilecraft runs interleaved with it):

  tilecraft time = the sum of the kernel times of its schedule, each measured by
                   `CompiledRunner(bufs, var_vals, wait=True)` (CPU: wall time around the
                   kernel call; OPENCL: profiling events) on buffers allocated once.
  e2e time       = wall time of the user's call, `f(*inputs).realize()` on realized inputs,
                   its result dropped: building the lazy graph, scheduling, runner lookup,
                   allocating outputs (through the caching allocator), launching, waiting.
  numpy time     = wall time of the numpy call (which allocates its outputs too).

GFLOPS and GB/s use tilecraft's own counts for the kernels it ran (`Program.op_estimate` and
`Program.mem_estimate`, summed over the schedule); % of peak compares them with the measured peaks
(tilecraft.cli.calibrate); %roof compares GFLOPS with the roofline min(peak FLOPS, intensity x
peak bandwidth). "e2e/time" is the e2e time over the kernel time (what the call costs on top of
its kernels). "vs numpy" is numpy time / e2e time, both end to end: above 1 tilecraft is faster.

JSON (--json PATH, '-' for stdout), schema "tilecraft-bench/2":
  {"schema": "tilecraft-bench/1", "created": ISO time, "device": "CPU", "ok": bool,
   "host": {"cpu", "cores", "platform", "python", "numpy", "compiler", "target" (CPU: the -march and its ISA, e.g. "haswell (AVX2, 8 float lanes)"; else null)},
   "settings": {"quick", "runs", "warmup", "opts" ("hand-coded" | "NOOPT" | "BEAM=n"), "timing"},
   "peak": {"device", "gflops", "gbs", "flops_source", "bw_source", "probes", "measured_at", "quick"} (null: calibration failed),
   "kernels": [{"name", "desc", "ok", "verified", "error" (str or null), "max_rel_error", "tol",
                "time_s", "flops", "bytes", "gflops", "gbs", "intensity" (FLOP/byte),
                "pct_peak_flops", "pct_peak_bw", "pct_roofline", "e2e_time_s", "e2e_overhead" (e2e / time),
                "numpy_time_s", "vs_numpy" (numpy / e2e), "vs_numpy_kernels" (numpy / time),
                "runs", "e2e_runs", "numpy_runs" (timed runs made), "compile_s", "opts" (str), "schedule": [{"name", "opts" [str], "time_s", "flops", "bytes",
                "global_size", "local_size"}]}]}
Times are in seconds; a field that could not be measured is null.
"""
from __future__ import annotations
import argparse, datetime, gc, json, os, platform, sys, time, traceback, zlib
from typing import Any, Optional
import numpy as np
from tilecraft.cli import CLIError, Progress, compile_error_line, fmt_opts, fmt_time, format_table, open_device
from tilecraft.cli.calibrate import best_times
from tilecraft.cli.suite import BenchCase, select, suite
from tilecraft.engine.verify import compare, max_abs_error

SCHEMA = "tilecraft-bench/2"

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft bench`."""
  ap.add_argument("--device", default=None, help="device to run on (default: Device.DEFAULT, i.e. $DEVICE or CPU)")
  ap.add_argument("--quick", action="store_true", help="small sizes (seconds; for tests and CI)")
  ap.add_argument("--runs", type=int, default=None, help="timed runs per kernel, best counts (default 10, --quick 3)")
  ap.add_argument("--warmup", type=int, default=2, help="untimed runs before timing (default 2)")
  ap.add_argument("--beam", type=int, default=0, metavar="N", help="BEAM search each kernel with width N first (uses the search cache)")
  ap.add_argument("-k", "--only", action="append", metavar="NAME", help="only kernels whose name contains NAME (repeatable)")
  ap.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': to stdout instead of the table)")
  ap.add_argument("--plot", metavar="PNG", help="draw the kernels on the measured roofline (needs matplotlib)")
  ap.add_argument("--recalibrate", action="store_true", help="measure the machine's peaks again instead of using the cached ones")
  ap.add_argument("--quiet", action="store_true", help="no progress or notes on stderr; just the table (or JSON)")

MIN_TIME_S, MAX_RUNS = 0.25, 200  # fast kernels run more than --runs times, until MIN_TIME_S is spent (at most MAX_RUNS)

def run_case(case: BenchCase, device: str, runs: int, warmup: int, beam: int = 0, note: Any = None, min_time: float = MIN_TIME_S) -> dict[str, Any]:
  """Realize, verify and time one case; a record for the JSON (see the module docstring)."""
  from tilecraft import Context, Tensor
  from tilecraft.device import CompileError
  from tilecraft.engine.realize import get_runner
  from tilecraft.ops import MetaOps
  from tilecraft.shape.symbolic import sym_eval
  note = note or (lambda s: None)
  rec: dict[str, Any] = {"name": case.key, "desc": case.desc, "ok": False, "verified": False, "error": None, "max_rel_error": None,
                         "tol": case.tol, "time_s": None, "flops": None, "bytes": None, "gflops": None, "gbs": None, "intensity": None,
                         "pct_peak_flops": None, "pct_peak_bw": None, "pct_roofline": None, "e2e_time_s": None, "e2e_overhead": None,
                         "numpy_time_s": None, "vs_numpy": None, "vs_numpy_kernels": None, "runs": 0, "e2e_runs": 0, "numpy_runs": 0, "compile_s": None, "opts": "", "schedule": []}
  rng = np.random.default_rng(zlib.crc32(case.key.encode()))
  arrays = case.make_inputs(rng)
  def numpy_once() -> None:
    with np.errstate(all="ignore"): case.numpy_fn(*arrays)
  numpy_error: Optional[str] = None
  try: numpy_once()
  except Exception as e:  # noqa: BLE001
    numpy_error = f"numpy failed: {type(e).__name__}: {e}"
  timed_numpy = False
  try:
    with Context(BEAM=beam) if beam else Context():
      ts = [Tensor(a, device=device) for a in arrays]
      out = case.tilecraft_fn(*ts)
      items = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
      note(f"{case.key}: compiling {len(items)} kernel(s)" + (f" (BEAM={beam})" if beam else ""))
      t0 = time.perf_counter()
      out.realize()
      rec["compile_s"] = time.perf_counter() - t0
      runners = [get_runner(si.ast, device, list(si.bufs)) for si in items]
    note(f"{case.key}: timing tilecraft's kernels and its end-to-end call (interleaved), then numpy")
    per = [float("inf")] * len(items)
    def once() -> float:
      total = 0.0
      for i, (r, si) in enumerate(zip(runners, items)):
        t = r(list(si.bufs), si.var_vals, wait=True) or 0.0
        per[i] = min(per[i], t)
        total += t
      return total
    def e2e() -> None: case.tilecraft_fn(*ts).realize()  # the result is dropped, as in a user's loop
    if beam:
      def e2e() -> None:  # noqa: F811 - the same call, through the BEAM-searched kernels
        with Context(BEAM=beam): case.tilecraft_fn(*ts).realize()
    # numpy is timed on its own after: its BLAS workers spin for a while after each call (OpenBLAS: 2^28
    # cycles), on the cores the next kernels need, so interleaved they slowed tilecraft's runs (matvec's
    # e2e 1.2-1.4x its kernels with numpy in the rounds, 1.07x without)
    times, n = best_times([once, e2e], runs, warmup, min_time, MAX_RUNS)
    rec["time_s"], rec["e2e_time_s"], rec["runs"], rec["e2e_runs"] = times[0], times[1], n, n
    if numpy_error is None:
      (rec["numpy_time_s"],), rec["numpy_runs"] = best_times([numpy_once], runs, warmup, min_time, MAX_RUNS)
      timed_numpy = True
    sched = []
    for r, si, t in zip(runners, items, per):
      p = r.p
      sched.append({"name": p.name, "opts": [fmt_opts([o]) for o in p.applied_opts], "time_s": t,
                    "flops": int(sym_eval(p.op_estimate, si.var_vals)), "bytes": int(sym_eval(p.mem_estimate, si.var_vals)),
                    "global_size": list(p.global_size) if p.global_size else None, "local_size": list(p.local_size) if p.local_size else None})
    rec["schedule"] = sched
    rec["opts"] = " | ".join(fmt_opts(r.p.applied_opts) for r in runners) or "-"
    rec["flops"], rec["bytes"] = sum(k["flops"] for k in sched), sum(k["bytes"] for k in sched)
    note(f"{case.key}: verifying against numpy")
    got = out.numpy()  # the output buffer as the last timed run left it
    with Context(BEAM=beam) if beam else Context(): got_e2e = case.tilecraft_fn(*ts).numpy()  # through the user's path (pooled memory)
    with np.errstate(all="ignore"): ref = np.asarray(case.numpy_fn(*[a.astype(np.float64) for a in arrays]))
    for o in (got, got_e2e):
      if o.shape != ref.shape: raise AssertionError(f"output shape {o.shape} != numpy's {ref.shape}")
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    rec["max_rel_error"] = err = max(max_abs_error(got, ref), max_abs_error(got_e2e, ref)) / (scale or 1.0)
    # elementwise |out - numpy| <= tol * max |numpy|, i.e. max |out - numpy| / max |numpy| <= tol
    mismatch = compare(got, ref, out.dtype, rtol=0.0, atol=case.tol, scale=scale or 1.0) or \
               compare(got_e2e, ref, out.dtype, rtol=0.0, atol=case.tol, scale=scale or 1.0)
    rec["verified"] = mismatch is None
    if mismatch is not None: rec["error"] = f"wrong result: max |out - numpy| / max |numpy| = {err:.3g} > {case.tol:g} ({mismatch})"
  except CompileError as e:  # one line: the compiler's complaint (the source is in DEBUG=4 output)
    rec["error"] = f"CompileError: {compile_error_line(e)}"
  except Exception as e:  # noqa: BLE001 - one broken kernel is reported, the suite goes on
    rec["error"] = f"{type(e).__name__}: {e}"
    rec["traceback"] = traceback.format_exc(limit=6)
  if numpy_error is None and not timed_numpy:  # tilecraft failed before the interleaved timing
    note(f"{case.key}: timing numpy")
    (rec["numpy_time_s"],), rec["numpy_runs"] = best_times([numpy_once], runs, warmup, min_time, MAX_RUNS)
  rec["error"] = rec["error"] or numpy_error
  t, e2e_t, np_t = rec["time_s"], rec["e2e_time_s"], rec["numpy_time_s"]
  if t and rec["flops"] is not None:
    rec["gflops"], rec["gbs"] = rec["flops"] / t / 1e9, rec["bytes"] / t / 1e9
    rec["intensity"] = rec["flops"] / rec["bytes"] if rec["bytes"] else None
    if np_t: rec["vs_numpy_kernels"] = np_t / t
  if t and e2e_t:
    rec["e2e_overhead"] = e2e_t / t
    if np_t: rec["vs_numpy"] = np_t / e2e_t
  rec["ok"] = rec["verified"] and rec["error"] is None
  gc.collect()
  return rec

def add_peak_fractions(rec: dict[str, Any], gflops: float, gbs: float) -> None:
  """Fill the record's % of peak FLOPS, bandwidth and roofline."""
  if rec["gflops"] is None: return
  rec["pct_peak_flops"] = 100 * rec["gflops"] / gflops
  rec["pct_peak_bw"] = 100 * rec["gbs"] / gbs
  roof = min(gflops, rec["intensity"] * gbs) if rec["intensity"] else gflops
  rec["pct_roofline"] = 100 * rec["gflops"] / roof if roof else None

def _pct(x: Optional[float]) -> str: return "-" if x is None else f"{x:.1f}%" if x < 100 else f"{x:.0f}%"
def _num(x: Optional[float], fmt: str = "{:.1f}") -> str: return "-" if x is None else fmt.format(x)

def table(records: list[dict[str, Any]]) -> str:
  """The results table (one row per bench kernel)."""
  rows = []
  for r in records:
    check = "ok" if r["ok"] else ("FAIL" if r["time_s"] is not None else "ERROR")
    rows.append([r["name"], len(r["schedule"]) or "-", fmt_time(r["time_s"]), fmt_time(r["e2e_time_s"]), _num(r["e2e_overhead"], "{:.2f}x"),
                 _num(r["gflops"]), _num(r["gbs"]), _pct(r["pct_peak_flops"]), _pct(r["pct_peak_bw"]), _pct(r["pct_roofline"]),
                 fmt_time(r["numpy_time_s"]), _num(r["vs_numpy"], "{:.2f}x"), check, r["opts"]])
  return format_table(["kernel", "k", "time", "e2e", "e2e/time", "GFLOPS", "GB/s", "%peakFLOPS", "%peakBW", "%roof", "numpy", "vs numpy", "check", "opts"],
                      rows, "lrrrrrrrrrrrll")

def compiler_name(device: str) -> str:
  """The device's compiler, for the header."""
  from tilecraft.device import Device
  comp = Device[device].compiler
  if (cc := getattr(comp, "cc", None)):
    import subprocess
    try: ver = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError): ver = os.path.basename(cc)
    return ver + (" + OpenMP" if getattr(comp, "openmp", None) is not False else "")
  return (getattr(comp, "cachekey", "") or type(comp).__name__)[:80]

def target_name(device: str) -> Optional[str]:
  """The ISA the device's compiler targets (CPU: `CPU_ARCH`), for the header; None where it has no such setting."""
  from tilecraft.device import Device
  target = getattr(Device[device].compiler, "target", None)
  return None if target is None else str(target)

def threads() -> str:
  """How many threads CPU kernels use, for the header."""
  n = os.environ.get("OMP_NUM_THREADS")
  return f"{n} threads (OMP_NUM_THREADS)" if n else f"{os.cpu_count()} cores"

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft bench`; the exit code (1 when a kernel is wrong or fails)."""
  from tilecraft.cli import check_output_path, first_line, write_text
  from tilecraft.cli.calibrate import busy, cpu_model, describe, get_peaks, load_average
  from tilecraft.helpers import NOOPT
  device = open_device(args.device)
  if args.json: check_output_path(args.json, "--json")
  if args.plot: check_output_path(args.plot, "--plot")
  runs = args.runs if args.runs is not None else (3 if args.quick else 10)
  if runs < 1 or args.warmup < 0: raise CLIError("--runs must be >= 1 and --warmup >= 0")
  cases = select(suite(args.quick), args.only)
  if not cases: raise CLIError(f"no benchmark kernel matches {args.only}; kernels: {', '.join(c.key for c in suite(args.quick))}")
  json_stdout = args.json == "-"
  prog = Progress(enabled=not args.quiet)
  beam = args.beam
  opts_mode = "NOOPT" if NOOPT else f"BEAM={beam}" if beam else "hand-coded"
  load0 = load_average()
  try: peaks = get_peaks(device, args.quick, args.recalibrate, progress=prog.note)
  except Exception as e:  # noqa: BLE001 - no peaks (e.g. the compiler is broken): the kernels still run and report
    prog.message(f"note: calibration failed ({first_line(e)}); the %-of-peak columns are left empty")
    peaks = None
  prog.clear()
  prog.total = len(cases)
  records = []
  for case in cases:
    prog.step(f"{case.key}: {case.desc}")
    rec = run_case(case, device, runs, args.warmup, beam, note=lambda s: prog.note(f"[{prog.i}/{prog.total}] {s}"),
                   min_time=MIN_TIME_S / 10 if args.quick else MIN_TIME_S)
    if peaks is not None: add_peak_fractions(rec, peaks.gflops, peaks.gbs)
    records.append(rec)
    if not rec["ok"]: prog.message(f"FAILED {case.key}: {rec['error']}" + (f"\n{rec['traceback']}" if rec.get("traceback") and not args.quiet else ""))
  prog.clear()
  ok = all(r["ok"] for r in records)
  host = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
          "numpy": np.__version__, "compiler": compiler_name(device), "target": target_name(device), "load": load0}
  timing = ("tilecraft: sum of its kernels' times (CompiledRunner, wait=True); e2e: wall time of f(*inputs).realize(), result dropped; "
            "numpy: wall time of the call, timed after the two tilecraft timings (interleaved); best of at least `runs` rounds "
            f"(fast cases: until {MIN_TIME_S / 10 if args.quick else MIN_TIME_S:g} s per timing is spent, at most {MAX_RUNS}) after `warmup` rounds")
  result = {"schema": SCHEMA, "created": datetime.datetime.now().isoformat(timespec="seconds"), "device": device, "ok": ok, "host": host,
            "settings": {"quick": args.quick, "runs": runs, "warmup": args.warmup, "opts": opts_mode, "timing": timing},
            "peak": peaks.to_json() if peaks is not None else None, "kernels": records}
  if args.json:
    txt = json.dumps(result, indent=1, default=str)
    if json_stdout: print(txt)
    else:
      write_text(args.json, txt + "\n", "--json")
  out = sys.stderr if json_stdout else sys.stdout
  if not json_stdout or not args.quiet:
    if not args.quiet:
      print(f"tilecraft bench on {device}: {host['cpu']}, {threads()}; {host['compiler']}; numpy {np.__version__}; opts: {opts_mode}", file=out)
      if host["target"]: print(f"target ISA: {host['target']} (set with CPU_ARCH=<-march name>)", file=out)
      print(describe(peaks) if peaks is not None else "peak: not measured (calibration failed)", file=out)
      print(f"kernels and e2e interleaved, then numpy; best of {runs}+ rounds (fast cases: until {MIN_TIME_S / 10 if args.quick else MIN_TIME_S:g} s per timing, at most {MAX_RUNS}) "
            f"after {args.warmup} warm-up rounds. time = sum of tilecraft's kernel times (CompiledRunner); e2e = wall time of the user's "
            "call f(*inputs).realize(), result dropped; numpy = wall time of the numpy call", file=out)
      print("GFLOPS, GB/s: tilecraft's FLOP/byte counts of its kernels / time; %roof: of min(peak FLOPS, intensity x peak BW); "
            "e2e/time: e2e over kernel time; vs numpy: numpy / e2e (>1: tilecraft faster); k: kernels; opts: OP<axis>:<amount> per kernel", file=out)
      print(file=out)
    print(table(records), file=out)
    if not args.quiet: print(file=out)
    if not args.quiet:
      if busy(load0): print(f"warning: the machine was busy when the run started (load {load0:.1f} on {os.cpu_count()} cores): timings are noisy", file=out)
      if any((r["pct_peak_flops"] or 0) > 100 or (r["pct_peak_bw"] or 0) > 100 for r in records):
        print("note: some kernels beat the calibrated peaks: the calibration is stale or was measured under load (--recalibrate)", file=out)
    if ok: print(f"all {len(records)} kernels verified against numpy", file=out)
    else: print(f"FAILED: {', '.join(r['name'] for r in records if not r['ok'])}", file=out)
  if args.plot and peaks is None:
    print("--plot: no roofline without measured peaks (calibration failed)", file=sys.stderr)
    return 1
  if args.plot:
    from tilecraft.cli.roofline import plot_roofline
    try: plot_roofline(records, peaks.gflops, peaks.gbs, args.plot, f"tilecraft on {device}: {host['cpu']}")
    except ImportError as e:
      print(f"--plot needs matplotlib ({e}): pip install 'tilecraft[plot]' (the table and JSON are unaffected)", file=sys.stderr)
      return 1 if not ok else 2
    if not args.quiet: print(f"roofline plot written to {args.plot}", file=out)
  if args.json and not json_stdout and not args.quiet: print(f"results written to {args.json}", file=out)
  return 0 if ok else 1
