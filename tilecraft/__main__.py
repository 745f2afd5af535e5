"""`tilecraft` / `python -m tilecraft`: the command line (see README.md).

  bench      the benchmark suite: verified against numpy, timed, vs the measured peaks (the main job)
  show       an expression's kernels: AST, shape, opts and why, UOps, source
  devices    which devices work here and what their renderers support
  fuzz       differential opt fuzzing of the built-in kernel corpus
  tune       BEAM search over the bench suite's kernels (fills the search cache)
  cache      export / import / merge search caches between machines
  calibrate  measure the machine's peak FLOPS and memory bandwidth again
  roofline   redraw a roofline plot from `bench --json` results
  replay     process replay: record rendered kernels, diff their source against another revision
  run        run an ONNX model (tilecraft.onnx): outputs and time per call
"""
from __future__ import annotations
import argparse, importlib, sys
from typing import Optional

COMMANDS: dict[str, str] = {
  "bench": "run the benchmark suite: verify against numpy, time, compare with numpy and the measured peaks",
  "show": "show an expression's kernels: AST, colored shape, opts with reasons, UOps (-v) and source",
  "devices": "list the devices, whether they work here (and why not) and their renderer capabilities",
  "fuzz": "differential opt fuzzing of the built-in kernel corpus (exit 1 on a failure)",
  "tune": "BEAM-search the bench suite's kernels with a progress bar, filling the search cache",
  "cache": "export, import or merge the search cache (BEAM results) to move it between machines",
  "calibrate": "measure the machine's peak FLOPS and memory bandwidth (cached for bench)",
  "roofline": "draw a roofline PNG from `tilecraft bench --json` results",
  "replay": "process replay: record the kernels a run renders; diff their regenerated source against a git revision",
  "run": "run an ONNX model with tilecraft.onnx: print or save its outputs and the time per call",
}

def build_parser() -> argparse.ArgumentParser:
  """The argument parser with every subcommand."""
  ap = argparse.ArgumentParser(prog="tilecraft", description="tilecraft: a tensor-kernel compiler. Subcommands:",
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog="Settings also come from env vars: DEBUG, NOOPT, BEAM, TC, TC_OPT, DEVICE, CACHELEVEL, CACHEDB (see README.md).")
  sub = ap.add_subparsers(dest="command", metavar="COMMAND")
  for name, help_ in COMMANDS.items():
    p = sub.add_parser(name, help=help_, description=help_)
    importlib.import_module(f"tilecraft.cli.{name}").add_arguments(p)
  return ap

def main(argv: Optional[list[str]] = None) -> int:
  """Entry point of the `tilecraft` console script; returns the exit code."""
  ap = build_parser()
  args = ap.parse_args(argv)
  if args.command is None:
    ap.print_help()
    return 2
  from tilecraft.cli import CLIError
  from tilecraft.helpers import SettingError
  try: return int(importlib.import_module(f"tilecraft.cli.{args.command}").run(args) or 0)
  except CLIError as e:
    print(f"tilecraft {args.command}: {e}", file=sys.stderr)
    return e.code
  except SettingError as e:
    print(f"tilecraft {args.command}: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    return 130
  except BrokenPipeError:
    return 0

if __name__ == "__main__":
  sys.exit(main())
