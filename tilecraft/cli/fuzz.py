"""`tilecraft fuzz`: differential opt fuzzing of the built-in kernel corpus (tilecraft.testing.fuzz).

For each corpus kernel, random valid opt sequences must give the same output as the unoptimized
kernel and as numpy. Failures are printed with the minimal failing opt list. Failures of
corpus entries listed as known bugs (tilecraft.testing.corpus.KNOWN_BUGS) are reported as
expected and don't fail the run unless --strict.
With --replay [DB], the kernels recorded in a process-replay DB (`tilecraft replay record --models
resnet50,...`: what real models run) are fuzzed instead: each with the opts it was recorded with, then
random ones, against its own unoptimized kernel (tilecraft.testing.fuzz.fuzz_recorded); --models M,M
records one call of those ONNX models (light ones and the zoo's) into a temporary DB first and fuzzes that.
Exit codes: 0 all passed, 1 a failure, 2 bad arguments or an unusable device."""
from __future__ import annotations
import argparse, json, time
from typing import Any
from tilecraft.cli import CLIError, Progress, open_device

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft fuzz`."""
  ap.add_argument("--device", default=None, help="device to fuzz (default: Device.DEFAULT, i.e. $DEVICE or CPU)")
  ap.add_argument("-n", "--n", type=int, default=200, help="random opt sequences per corpus kernel (default 200)")
  ap.add_argument("--seed", type=int, default=0, help="seed (runs are reproducible per seed)")
  ap.add_argument("-k", "--kernel", action="append", metavar="NAME", help="only corpus kernels whose name contains NAME (repeatable)")
  ap.add_argument("--big", action="store_true", help="include the larger corpus kernels")
  ap.add_argument("--replay", nargs="?", const="", default=None, metavar="DB",
                  help="fuzz the kernels recorded in a process-replay DB (default: REPLAY_DB or the cache's; record with "
                       "`tilecraft replay record --models ...`): each with its recorded opts, then random ones")
  ap.add_argument("--models", metavar="M,M", help="run one call of these ONNX models (light ones, resnet50,squeezenet,..., and the zoo's, mobilenet_v2,...; needs the "
                  "[onnx] extra), recording their kernels into a temporary process-replay DB, and fuzz those (as --replay)")
  ap.add_argument("--no-isolate", action="store_true", help="run kernels in this process (faster; a kernel that corrupts memory may crash it)")
  ap.add_argument("--strict", action="store_true", help="known-bug failures fail the run too")
  ap.add_argument("--list", action="store_true", help="list the corpus kernels and exit")
  ap.add_argument("--json", metavar="PATH", help="write a JSON report")
  ap.add_argument("--quiet", action="store_true", help="no per-kernel progress on stderr")

def _check_of(f: Any) -> str: return "fuzz" if f.opts else "noopt"

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft fuzz`; 1 on an unexpected failure."""
  from tilecraft.testing import fuzz as fz
  from tilecraft.testing.corpus import corpus
  device = open_device(args.device)
  if args.n < 0: raise CLIError("--n must be >= 0")
  if args.models: return _run_models(args, device)
  if args.replay is not None: return _run_recorded(args, device)
  entries = corpus(not args.big)
  if args.kernel:
    entries = {name: v for name, v in entries.items() if any(s in name for s in args.kernel)}
    if not entries: raise CLIError(f"no corpus kernel matches {args.kernel} (see tilecraft fuzz --list)")
  if args.list:
    for name, entry in entries.items(): print(f"{name:40s} {' '.join(entry.tags)}")
    return 0
  prog = Progress(enabled=not args.quiet, total=len(entries))
  t0 = time.perf_counter()
  reports: dict[str, Any] = {}
  iso = fz.IsolatedRunner(not args.big) if not args.no_isolate else None
  try:
    for name, entry in entries.items():
      prog.step(f"{name}: {args.n} opt sequences on {device}")
      reports[name] = fz.fuzz_entry(entry, args.n, device, args.seed, isolated=iso)
  finally:
    if iso is not None: iso.close()
  prog.clear()
  return _report(args, device, reports, t0, "corpus kernels")

def _run_recorded(args: argparse.Namespace, device: str, what: str = "") -> int:
  """`tilecraft fuzz --replay [DB]`: fuzz_recorded on the DB's kernels of `device` (-k: names containing NAME)."""
  import os
  from tilecraft.codegen.replay_record import db_path
  from tilecraft.testing import fuzz as fz
  path = args.replay or db_path()
  if not os.path.exists(path): raise CLIError(f"no process-replay DB at {path} (record one: tilecraft replay record --models resnet50,...)")
  kernels = [(n, k) for n, k in fz.recorded_kernels(path, device) if not args.kernel or any(s in n for s in args.kernel)]
  if not kernels: raise CLIError(f"no kernel of {device}{' matching ' + str(args.kernel) if args.kernel else ''} is recorded in {path}")
  if args.list:
    for name, key in kernels: print(f"{name:40s} {key[:16]}")
    return 0
  prog = Progress(enabled=not args.quiet, total=len(kernels))
  t0 = time.perf_counter()
  reports = fz.fuzz_recorded(path, device, args.n, args.seed, args.kernel, isolate=not args.no_isolate,
                             progress=lambda name: prog.step(f"{name}: its recorded opts and {args.n} opt sequences on {device}"))
  prog.clear()
  return _report(args, device, reports, t0, what or f"recorded kernels from {path}")

def _run_models(args: argparse.Namespace, device: str) -> int:
  """`tilecraft fuzz --models M,M`: one call of each light model on `device`, its kernels recorded into a
  temporary DB (tilecraft.testing.replay.record_models), then _run_recorded on it."""
  import os, tempfile
  from tilecraft.cli.replay import light_models_arg
  from tilecraft.testing import replay
  if args.replay is not None: raise CLIError("--models records its own kernels: give --models or --replay, not both")
  models = light_models_arg(args.models)
  with tempfile.TemporaryDirectory(prefix="tilecraft-fuzz-") as tmp:
    args.replay = os.path.join(tmp, "replay.db")
    if not args.quiet: print(f"recording the kernels of {', '.join(models)} on {device} ...", flush=True)
    with replay.restored_settings({"REPLAY_DB": ("env", args.replay), "RUN_PROCESS_REPLAY": ("env", "1")}): replay.record_models([device], models)
    return _run_recorded(args, device, f"kernels of {', '.join(models)}'s call")

def _report(args: argparse.Namespace, device: str, reports: dict[str, Any], t0: float, what: str) -> int:
  """Print (and with --json write) the fuzz reports; 1 on an unexpected failure."""
  from tilecraft.testing import fuzz as fz
  from tilecraft.testing.corpus import known_bug
  total = fz.FuzzReport()
  unexpected: list[tuple[str, Any]] = []
  expected: list[tuple[str, Any, str]] = []
  for name, r in reports.items():
    total = total.merge(r)
    for f in r.failures:
      why = known_bug(name, device, _check_of(f))
      if why and not args.strict: expected.append((name, f, why))
      else: unexpected.append((name, f))
  print(f"fuzzed {len(reports)} {what} on {device} (seed {args.seed}, {args.n} opt sequences each) in {time.perf_counter() - t0:.1f}s")
  print(f"  {total.pairs} (kernel, opts) pairs, {total.programs} distinct programs, {total.runs} runs, {total.refusals} refused opts")
  bad_names = sorted({n for n, _ in unexpected})
  if expected:
    names = sorted({n for n, _, _ in expected})
    print(f"  {len(expected)} failure(s) in known-bug kernels (expected; --strict to count them): {', '.join(names)}")
  for name, f in _firsts(unexpected):
    print(f"\nFAIL {name}: {f}")
    if f.minimal_opts is not None: print(f"  reproduce: minimal failing opts {f.minimal_opts}")
  if unexpected: print(f"\n{len(unexpected)} failure(s) in {len(bad_names)} kernel(s): {', '.join(bad_names)}")
  else: print("  no unexpected failures")
  if args.json:
    data = {"device": device, "seed": args.seed, "n": args.n, "ok": not unexpected,
            "kernels": {n: {"pairs": r.pairs, "runs": r.runs, "programs": r.programs, "refusals": r.refusals, "seconds": r.seconds,
                            "failures": [{"kind": f.kind, "opts": [str(o) for o in f.opts],
                                          "minimal_opts": None if f.minimal_opts is None else [str(o) for o in f.minimal_opts],
                                          "message": f.message, "known_bug": known_bug(n, device, _check_of(f))}
                                         for f in r.failures]} for n, r in reports.items()}}
    with open(args.json, "w") as fh: json.dump(data, fh, indent=1, default=str)
  return 1 if unexpected else 0

def _firsts(fails: list[tuple[str, Any]], per_kernel: int = 2) -> list[tuple[str, Any]]:
  """The first few failures of each kernel (the first one is the shrunk one)."""
  seen: dict[str, int] = {}
  out = []
  for name, f in fails:
    if seen.get(name, 0) < per_kernel: out.append((name, f))
    seen[name] = seen.get(name, 0) + 1
  return out
