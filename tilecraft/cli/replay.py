"""`tilecraft replay`: process replay (tilecraft.testing.replay).

  tilecraft replay record [--device D ...] [--models resnet50,...]
                                             record the bench suite's and the fuzz corpus's kernels
                                             (hand-coded opts) into the replay database, and with
                                             --models those of ONNX models' calls (light and zoo)
  tilecraft replay diff --against REV        regenerate every recorded kernel at REV and in the working
                                             tree; a unified diff per kernel whose source changed, and
                                             the count (--heuristics: each tree's own hand-coded
                                             heuristics pick the opts, so heuristic changes show)
  tilecraft replay list                      the recorded kernels (and the settings they were recorded under)

Any run records too with RUN_PROCESS_REPLAY=1. The database is --db, else REPLAY_DB, else
process_replay.db in the cache dir. Exit codes: 0 (also when kernels changed: the diff is for
review), 2 on bad input (no database, REV unknown, not a git checkout)."""
from __future__ import annotations
import argparse, os
from tilecraft.cli import CLIError, format_table

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The subcommands of `tilecraft replay`."""
  sub = ap.add_subparsers(dest="action", metavar="ACTION", required=True)
  rec = sub.add_parser("record", help="record the bench suite's and the fuzz corpus's kernels with hand-coded opts")
  rec.add_argument("--device", action="append", help="device whose renderer renders them (repeatable; default CPU, and LLVM where it opens)")
  rec.add_argument("--quick", action="store_true", help="the bench suite's small sizes")
  rec.add_argument("--models", metavar="M,M", help="also run one call of these ONNX models (light ones, resnet50,shufflenet,..., and the zoo's, mobilenet_v2,...: real model shapes; needs the [onnx] extra) and record their kernels")
  rec.add_argument("--db", help="the replay database (default: REPLAY_DB or the cache dir)")
  d = sub.add_parser("diff", help="regenerate the recorded kernels at REV and in the working tree and diff their source")
  d.add_argument("--against", default="HEAD", metavar="REV", help="git revision to compare with (default HEAD)")
  d.add_argument("--db", help="the replay database (default: REPLAY_DB or the cache dir)")
  d.add_argument("--max-lines", type=int, default=0, metavar="N", help="at most N diff lines per kernel (0: all)")
  d.add_argument("--names", action="store_true", help="only the names of the changed kernels, no diffs")
  d.add_argument("--heuristics", action="store_true", help="each side's hand-coded heuristics choose the opts (not the recorded ones): shows what a heuristic change does")
  ls = sub.add_parser("list", help="list the recorded kernels")
  ls.add_argument("--db", help="the replay database (default: REPLAY_DB or the cache dir)")

def light_models_arg(arg: str | None) -> list[str]:
  """The ONNX models a --models M,M option names (none for None: light models and the zoo's, tilecraft.onnx.zoo.
  model_names), each checked: CLIError for a name that isn't one, or without the onnx package."""
  models = [m.strip() for m in (arg or "").split(",") if m.strip()]
  if models:
    try:
      from tilecraft.onnx.zoo import model_names
      known = model_names()
    except ImportError as e: raise CLIError(f"--models needs the onnx package (pip install 'tilecraft[onnx]'): {e}") from None
    if (unknown := [m for m in models if m not in known]):
      raise CLIError(f"--models: unknown model(s) {unknown}; the models are {', '.join(known)}")
  return models

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft replay ACTION`."""
  from tilecraft.testing import replay
  if args.db: os.environ["REPLAY_DB"] = os.path.abspath(args.db)
  path = replay.db_path()
  if args.action == "record":
    from tilecraft.cli import open_device
    from tilecraft.device import Device, DeviceUnavailable
    devices = [open_device(d) for d in args.device] if args.device else ["CPU"]
    if not args.device:
      try: Device["LLVM"]; devices.append("LLVM")  # noqa: E702
      except DeviceUnavailable: pass
    models = light_models_arg(args.models)  # (checked before anything is recorded)
    os.environ["RUN_PROCESS_REPLAY"] = "1"
    n = replay.record_suite(devices, args.quick)
    print(f"process replay: recorded {n} kernels ({', '.join(devices)}) into {path}")
    if models: print(f"process replay: recorded the kernels of {replay.record_models(devices, models)} model call(s) into {path}")
    return 0
  if not os.path.exists(path): raise CLIError(f"no replay database at {path}: record one first (tilecraft replay record, or RUN_PROCESS_REPLAY=1)")
  if args.action == "list":
    rows = [[k["name"], k["device"], k["opts"], k["settings"], len(k["src"].splitlines())] for k in replay.recorded(path)]
    print(format_table(["kernel", "device", "opts", "settings", "lines"], rows, "llllr"))
    return 0
  try: res = replay.diff(args.against, path, heuristics=args.heuristics)
  except RuntimeError as e: raise CLIError(str(e)) from None
  if args.names:
    for c in res["changed"]: print(f"{c['name']} on {c['device']}" + (f": {c['old_opts'] or '(none)'} -> {c['new_opts'] or '(none)'}" if args.heuristics else ""))
    print(f"process replay: {len(res['changed'])} of {res['total']} recorded kernels changed against {args.against}")
  else: print(replay.format_diff(res, args.max_lines))
  return 0
