"""Conv, depthwise and pooling kernels around the shapes real models have (channels 16-512, spatial 7-56,
strides 1 and 2, groups), timed with the current CPU heuristics and, side by side in the same run, with
another version of `tilecraft/codegen/heuristic.py`: a heuristic tuned on one model's shapes must not make
their neighbours slower.

  python bench/bench_conv_neighbours.py --before REV [--reps 9] [--threads 2] [-k conv3x3]   (REV: a git revision)

Each shape is one kernel (the conv's or pool's reduce) on random data; both versions run interleaved on the
same buffers, best of --reps each; ratio = before / now (above 1: now is faster); `diff` is the max
relative difference between the two outputs. The geomean of the ratios closes the table.
"""
from __future__ import annotations
import argparse, math, os, sys

# (name, input (cin, H), weight (cout, cin/groups, k) or None for a max-pool of window k, stride, padding, groups)
SHAPES = [
  ("conv3x3 16->16 56", (16, 56), (16, 16, 3), 1, 1, 1), ("conv3x3 64->64 56", (64, 56), (64, 64, 3), 1, 1, 1),
  ("conv3x3 16->64 55", (16, 55), (64, 16, 3), 1, 1, 1), ("conv3x3 128->128 28", (128, 28), (128, 128, 3), 1, 1, 1),
  ("conv3x3 32->128 27", (32, 27), (128, 32, 3), 1, 1, 1), ("conv3x3 64->64 14", (64, 14), (64, 64, 3), 1, 1, 1),
  ("conv3x3 256->256 14", (256, 14), (256, 256, 3), 1, 1, 1), ("conv3x3 64->256 13", (64, 13), (256, 64, 3), 1, 1, 1),
  ("conv3x3 48->192 13", (48, 13), (192, 48, 3), 1, 1, 1), ("conv3x3 128->128 7", (128, 7), (128, 128, 3), 1, 1, 1),
  ("conv3x3 512->512 7", (512, 7), (512, 512, 3), 1, 1, 1), ("conv3x3 s2 64->128 56", (64, 56), (128, 64, 3), 2, 1, 1),
  ("conv3x3 s2 128->256 28", (128, 28), (256, 128, 3), 2, 1, 1), ("conv3x3 s2 128->128 34", (128, 34), (128, 128, 3), 2, 1, 1),
  ("conv3x3 s2 128->128 60", (128, 60), (128, 128, 3), 2, 1, 1), ("conv3x3 s2 512->512 14", (512, 14), (512, 512, 3), 2, 1, 1), ("conv3x3 s2 3->64 224", (3, 224), (64, 3, 3), 2, 0, 1),
  ("conv3x3 s2 3->24 224", (3, 224), (24, 3, 3), 2, 1, 1), ("stem 7x7 s2 3->64 224", (3, 224), (64, 3, 7), 2, 3, 1),
  ("conv1x1 64->256 56", (64, 56), (256, 64, 1), 1, 0, 1), ("conv1x1 256->64 56", (256, 56), (64, 256, 1), 1, 0, 1),
  ("conv1x1 512->1000 13", (512, 13), (1000, 512, 1), 1, 0, 1), ("conv1x1 s2 256->512 28", (256, 28), (512, 256, 1), 2, 0, 1),
  ("conv1x1 g4 136->136 28", (136, 28), (136, 34, 1), 1, 0, 4), ("conv1x1 g2 272->272 14", (272, 14), (272, 136, 1), 1, 0, 2),
  ("conv1x1 g4 64->64 56", (64, 56), (64, 16, 1), 1, 0, 4),
  ("depthwise3x3 144 56", (144, 56), (144, 1, 3), 1, 1, 144), ("depthwise3x3 272 14", (272, 14), (272, 1, 3), 1, 1, 272),
  ("depthwise3x3 512 7", (512, 7), (512, 1, 3), 1, 1, 512), ("depthwise3x3 s2 96 28", (96, 28), (96, 1, 3), 2, 1, 96),
  ("maxpool3x3 s2 64 112", (64, 112), None, 2, 1, 3), ("maxpool3x3 s2 64 111", (64, 111), None, 2, 0, 3),
  ("maxpool3x3 s2 128 55", (128, 55), None, 2, 0, 3), ("maxpool3x3 s2 256 27", (256, 27), None, 2, 0, 3),
]

def _args() -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--before", default=None, help="another version of the heuristics to time side by side: a git revision, or a heuristic.py file")
  ap.add_argument("--reps", type=int, default=9)
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("-k", dest="only", default=None, help="only shapes whose name contains this")
  return ap.parse_args()

def _item(shape: tuple) -> tuple:
  """(ast, bufs, var_vals, 1) of the shape's last kernel (the conv or pool), its inputs realized."""
  from tilecraft import Tensor
  name, (cin, h), wshape, stride, pad, groups = shape
  x = Tensor.rand(1, cin, h, h).realize()
  if wshape is None: out = x.max_pool2d(groups, stride, padding=pad)  # (groups holds the window for a pool)
  else:
    cout, cig, k = wshape
    out = x.conv2d(Tensor.rand(cout, cig, k, k).realize() * 0.1, stride=stride, padding=pad, groups=groups)
  sched = out.schedule()
  for si in sched[:-1]:  # (inputs computed by earlier kernels: none expected, but run them if any)
    from tilecraft.engine.realize import run_schedule
    run_schedule([si])
  si = sched[-1]
  for b in si.bufs:
    if not b.is_allocated(): b.allocate()
  return (si.ast, list(si.bufs), si.var_vals, 1)

def main() -> None:
  args = _args()
  os.environ["OMP_NUM_THREADS"] = str(args.threads)
  sys.path.insert(0, os.path.dirname(__file__))
  from profile_onnx_kernels import _load_module, time_side_by_side
  before = _load_module(args.before) if args.before else None
  ratios = []
  print(f"{'shape':26s} {'kernel':34s} {'us':>9s} {'GFLOPS':>7s}" + (f" {'before':>9s} {'ratio':>6s} {'diff':>8s}" if before else "") + "  opts")
  for shape in SHAPES:
    if args.only and args.only not in shape[0]: continue
    (r,) = time_side_by_side([_item(shape)], args.reps, before)
    line = f"{shape[0]:26s} {r['name'][:34]:34s} {r['now'] * 1e6:9.1f} {r['gflops'] or 0:7.1f}"
    if before is not None:
      ratios.append(r["before"] / r["now"])
      line += f" {r['before'] * 1e6:9.1f} {ratios[-1]:5.2f}x {r['diff']:8.1e}"
    line += "  " + " ".join(r["opts"]) + ("  | before: " + " ".join(r["opts_before"]) if before is not None and r["opts_before"] != r["opts"] else "")
    print(line, flush=True)
  if ratios: print(f"geomean ratio (before / now) over {len(ratios)} shapes: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x "
                   f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")

if __name__ == "__main__":
  main()
