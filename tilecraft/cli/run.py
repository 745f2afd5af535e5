"""`tilecraft run MODEL.onnx [--input NAME=FILE.npy ...] [--device D] [--beam N] [--repeat K] [--out DIR] [--no-fold]`:
run an ONNX model with tilecraft.onnx. Inputs not given are filled with seeded random data of the
declared shape (dynamic dims: 1). Prints each output's name, shape, dtype and a short summary (or saves
NAME.npy files under --out) and the time per call: the first call (builds the graph, compiles) and the best
of the rest (which rerun the built graph). --no-fold loads without BatchNorm and constant folding."""
from __future__ import annotations
import argparse, os, time
from typing import Any

def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("model", help="the .onnx file")
  p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="a graph input from a .npy file (repeatable)")
  p.add_argument("--device", default=None, help="the device to run on (default: the default device)")
  p.add_argument("--beam", type=int, default=0, help="BEAM search width for each kernel (0: hand-coded heuristics)")
  p.add_argument("--repeat", type=int, default=3, help="timed calls after the first (default 3)")
  p.add_argument("--out", default=None, metavar="DIR", help="save each output as DIR/NAME.npy instead of printing a summary")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
  p.add_argument("--no-fold", action="store_true", help="no graph rewrites (BatchNorm folded into Conv, constant folding)")
  p.add_argument("--profile", type=int, nargs="?", const=20, default=None, metavar="N",
                 help="then time each kernel in sequence (10 calls, medians) and print the N graph nodes that take longest (default 20; 0: all)")

def _random_input(vi: Any, dt: Any, rng: Any) -> Any:
  import numpy as np
  shape = [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]
  npdt = np.dtype(dt.np)
  if npdt.kind == "f": return rng.standard_normal(shape).astype(npdt)
  if npdt.kind == "b": return rng.random(shape) < 0.5
  return rng.integers(0, 10, shape).astype(npdt)

def run(args: argparse.Namespace) -> int:
  import numpy as np
  from tilecraft.cli import CLIError, open_device
  from tilecraft.helpers import Context
  try: import tilecraft.onnx as tonnx
  except ImportError as e: raise CLIError(f"tilecraft run needs the onnx package (pip install tilecraft[onnx]): {e}") from None
  if not os.path.exists(args.model): raise CLIError(f"no such file: {args.model}")
  dev = open_device(args.device) if args.device else None
  try: model = tonnx.load(args.model, dev, fold=not args.no_fold)
  except NotImplementedError as e: raise CLIError(str(e), 1) from None
  feed: dict[str, Any] = {}
  for spec in args.input:
    name, eq, path = spec.partition("=")
    if not eq: raise CLIError(f"--input takes NAME=FILE.npy, got {spec!r}")
    try: feed[name] = np.load(path)
    except OSError as e: raise CLIError(f"can't read {path}: {e}") from None
  rng = np.random.default_rng(args.seed)
  vis = {vi.name: vi for vi in model.proto.graph.input}
  for name, dt in model.inputs:
    if name not in feed:
      feed[name] = _random_input(vis[name], dt, rng)
      print(f"input {name}: random {dt.name} {tuple(feed[name].shape)} (seed {args.seed})")
  times = []
  with Context(BEAM=args.beam):
    for k in range(1 + max(args.repeat, 0)):
      t0 = time.perf_counter()
      try: out = model.run(feed)
      except NotImplementedError as e: raise CLIError(str(e), 1) from None
      times.append(time.perf_counter() - t0)
  for name, v in out.items():
    if args.out:
      os.makedirs(args.out, exist_ok=True)
      safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
      np.save(os.path.join(args.out, safe + ".npy"), v)
      print(f"output {name}: {v.dtype} {v.shape} -> {os.path.join(args.out, safe + '.npy')}")
    else:
      summary = np.array2string(v.reshape(-1)[:8], precision=5, separator=", ")
      print(f"output {name}: {v.dtype} {v.shape} {summary}{' ...' if v.size > 8 else ''}")
  rest = f", best of {len(times) - 1} more: {min(times[1:]) * 1e3:.2f} ms" if len(times) > 1 else ""
  print(f"time per call: first {times[0] * 1e3:.2f} ms (compiles){rest}")
  if args.profile is not None:
    if args.profile < 0: raise CLIError(f"--profile takes a count >= 0, got {args.profile}")
    with Context(BEAM=args.beam):
      try: rows = model.profile(feed)
      except ValueError as e: raise CLIError(str(e), 1) from None
    print_profile(rows, args.profile)
  return 0

def print_profile(rows: list, top: int) -> None:
  """The per-node table of OnnxModel.profile: the `top` slowest nodes (0: all), slowest first, with their share."""
  total = sum(r.seconds for r in rows) or 1e-12
  kernels = sum(len(r.kernels) for r in rows)
  print(f"profile: {len(rows)} graph nodes run {kernels} kernels, {total * 1e3:.2f} ms in sequence (medians of 10 calls)")
  shown = sorted(rows, key=lambda r: -r.seconds)[:top or len(rows)]
  for r in shown:
    ops = "+".join(r.ops)
    print(f"  {r.seconds * 1e3:8.3f} ms {100 * r.seconds / total:5.1f}%  {r.node[:24]:24s} {ops[:40]:40s} {' '.join(r.kernels)}")
  if len(shown) < len(rows): print(f"  ({len(rows) - len(shown)} more nodes, {sum(r.seconds for r in rows if r not in shown) * 1e3:.3f} ms)")
