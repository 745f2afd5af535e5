"""Roofline plots (matplotlib, an optional dependency): each kernel is a point at (arithmetic
intensity, achieved GFLOPS) under the machine's measured roof min(peak FLOPS, intensity x peak
bandwidth). `tilecraft roofline results.json -o roofline.png` redraws a saved bench run."""
from __future__ import annotations
import argparse, json, math, os, stat
from typing import Any

MAX_RESULTS_BYTES = 64 << 20

def plot_roofline(records: list[dict[str, Any]], peak_gflops: float, peak_gbs: float, path: str, title: str = "") -> None:
  """Write a log-log roofline PNG of bench `records` to `path`. Raises ImportError without matplotlib."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  pts = [(r["intensity"], r["gflops"], r["name"]) for r in records if r.get("intensity") and r.get("gflops")]
  ridge = peak_gflops / peak_gbs
  xs = [p[0] for p in pts] + [ridge]
  lo, hi = min(xs) / 4, max(xs) * 4
  n = 200
  grid = [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
  fig, ax = plt.subplots(figsize=(9, 6))
  ax.plot(grid, [min(peak_gflops, x * peak_gbs) for x in grid], color="black", lw=2, label="measured roofline")
  ax.axhline(peak_gflops, color="gray", ls=":", lw=1)
  ax.axvline(ridge, color="gray", ls=":", lw=1)
  ax.annotate(f"peak {peak_gflops:.0f} GFLOPS", (hi, peak_gflops), ha="right", va="bottom", fontsize=9)
  ax.annotate(f"{peak_gbs:.1f} GB/s", (lo * 1.3, lo * 1.3 * peak_gbs), rotation=0, va="bottom", fontsize=9)
  for i, (x, y, name) in enumerate(pts):
    ax.scatter([x], [y], s=40, zorder=3, color=f"C{i % 10}", label=name)
    ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ys = [p[1] for p in pts] + [peak_gflops]
  ax.set_ylim(min(min(ys) / 3, lo * peak_gbs), max(ys) * 3)
  ax.set_xlim(lo, hi)
  ax.set_xlabel("arithmetic intensity (FLOP / byte)")
  ax.set_ylabel("performance (GFLOPS)")
  ax.set_title(title or "tilecraft roofline")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft roofline`."""
  ap.add_argument("results", help="JSON written by `tilecraft bench --json`")
  ap.add_argument("-o", "--output", default="roofline.png", help="PNG to write (default roofline.png)")

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft roofline`: plot saved bench results."""
  from tilecraft.cli import CLIError
  # a device or pipe (/dev/zero, a fifo) would be read forever: only regular files of sane size
  try: st = os.stat(args.results)
  except OSError as e: raise CLIError(f"can't read bench results from {args.results}: {e.strerror or e}") from None
  if not stat.S_ISREG(st.st_mode): raise CLIError(f"{args.results} is not a regular file (expected the JSON of `tilecraft bench --json`)")
  if st.st_size > MAX_RESULTS_BYTES: raise CLIError(f"{args.results} is {st.st_size / 2**20:.0f} MiB: too large to be bench results (at most {MAX_RESULTS_BYTES >> 20} MiB)")
  try:
    with open(args.results) as f: data = json.load(f)
    peak, records = data["peak"], data["kernels"]
  except (OSError, ValueError, KeyError, TypeError) as e: raise CLIError(f"can't read bench results from {args.results}: {e}") from None
  if not isinstance(peak, dict) or not isinstance(records, list): raise CLIError(f"{args.results} has no measured peaks or no kernel list (was calibration skipped?)")
  if not all(isinstance(peak.get(k), (int, float)) and math.isfinite(peak[k]) and peak[k] > 0 for k in ("gflops", "gbs")):
    raise CLIError("results have no peak FLOPS or bandwidth")
  if not all(isinstance(r, dict) for r in records): raise CLIError(f"{args.results}: 'kernels' must be a list of bench records")
  try: plot_roofline(records, peak["gflops"], peak["gbs"], args.output, f"tilecraft on {data.get('device', '?')}: {data.get('host', {}).get('cpu', '')}")
  except ImportError as e: raise CLIError(f"plotting needs matplotlib ({e}): pip install 'tilecraft[plot]'") from None
  print(f"roofline plot written to {args.output}")
  return 0
