"""`tilecraft cache`: move the search cache (sqlite, `CACHEDB`) between machines.

  tilecraft cache export FILE        the search cache's results -> a new cache file FILE
  tilecraft cache import FILE        FILE's results -> the search cache
  tilecraft cache merge FILE...      the second and later FILEs' results -> the first FILE (created if missing)

Only search results travel (the opts each search chose, with its times, verification and the kind
of machine it ran on); per-candidate timings stay on the machine that measured them. A result's key
names the device, the ISA (CPU_ARCH and the host CPU's features), the compiler and the versions,
so an imported result is replayed only on the same kind of machine and kept, unused, elsewhere.
When two files hold a result for the same key, the better-founded one wins (a complete search over
a budget-cut one, a larger budget, then the newer), never the faster: times from different machines
are not compared. See docs/tuning.md."""
from __future__ import annotations
import argparse, os
from collections import Counter
from tilecraft.cli import CLIError, check_output_path

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The subcommands of `tilecraft cache`."""
  sub = ap.add_subparsers(dest="cache_command", metavar="ACTION")
  p = sub.add_parser("export", help="write the search cache's results to a new cache file")
  p.add_argument("file", metavar="FILE")
  p = sub.add_parser("import", help="merge a cache file's results into the search cache")
  p.add_argument("file", metavar="FILE")
  p = sub.add_parser("merge", help="merge the second and later cache files into the first (created if missing)")
  p.add_argument("files", metavar="FILE", nargs="+")

def _describe(counts: dict[str, int]) -> str:
  return f"{counts['added']} added, {counts['replaced']} replaced (better-founded), {counts['kept']} kept as they were"

def _kinds(path: str) -> str:
  """How many of a file's results were found on this kind of machine (and so are used here)."""
  from tilecraft.engine.search.db import read_results, same_kind
  verdicts = Counter(same_kind(r[9]) for r in read_results(path))
  return (f"{verdicts[True]} from this kind of machine, {verdicts[False]} for other kinds (kept, not used here)"
          + (f", {verdicts[None]} without a machine description" if verdicts[None] else ""))

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft cache ACTION`."""
  from tilecraft.engine.search.db import CacheFileError, cache_db_path, export_results, merge_results
  here = os.path.abspath(cache_db_path())
  try:
    if args.cache_command == "export":
      check_output_path(args.file, "export file")
      if os.path.abspath(args.file) == here: raise CLIError(f"{args.file} is the search cache itself")
      n = export_results(here, args.file)
      print(f"exported {n} search results from {here} to {args.file}")
    elif args.cache_command == "import":
      if os.path.abspath(args.file) == here: raise CLIError(f"{args.file} is the search cache itself")
      counts = merge_results(here, [args.file])
      print(f"imported {args.file} into {here}: {_describe(counts)}; {_kinds(args.file)}")
    elif args.cache_command == "merge":
      if len(args.files) < 2: raise CLIError("merge needs two or more files: the first receives the others' results")
      dst, srcs = args.files[0], args.files[1:]
      if os.path.abspath(dst) in map(os.path.abspath, srcs): raise CLIError(f"{dst} is both the destination and a source")
      check_output_path(dst, "merge destination")
      counts = merge_results(dst, srcs)
      print(f"merged {', '.join(srcs)} into {dst}: {_describe(counts)}")
    else: raise CLIError("say what to do: tilecraft cache export FILE | import FILE | merge FILE...")
  except CacheFileError as e: raise CLIError(str(e), code=1) from None
  return 0
