"""Whole ONNX models on tilecraft CPU against onnxruntime CPU, side by side in the same run, with the same
number of threads (OMP_NUM_THREADS for tilecraft's kernels, intra_op_num_threads for onnxruntime).

  python bench/bench_onnx.py [--models squeezenet,resnet50,bert_like | all] [--repeat N] [--threads T] [--json FILE]

Models: the onnx package's nine light models (tilecraft.onnx.light: seeded random weights) and the
models tilecraft.onnx.zoo builds with onnx.helper, since no model file can be downloaded here: `bert_like`
(a BERT-style encoder), `mobilenet_v2` and `efficientnet_b0` (depthwise-separable inverted residuals,
ReLU6 as Clip, squeeze-and-excitation with SiLU).

Per model, each in fresh worker processes:
  cold    the first call (build + compile) with an empty kernel cache (a new XDG_CACHE_HOME)
  warm    the first call in a new process whose disk cache holds the kernels (build + load)
  time    per inference after warm-up: tilecraft and onnxruntime alternate in pairs of calls, each pair
          after a pause of SETTLE_S and timed on its second call, median of --repeat each. A runtime's
          threads spin for a while after a call (onnxruntime's pool for milliseconds, tilecraft's OpenMP
          threads ~1.5 ms): a call right after the other runtime's shares the cores with them. After the
          pause, each runtime is seen as a user calling it now and then sees it. (With a spin of ~60 us,
          tilecraft's threads fell asleep inside such a call and SqueezeNet took 12-13 ms against 6-7 in a
          tight loop: runtime/cpu.py's spin count is set from that.)
  ratio   onnxruntime's time / tilecraft's (above 1: tilecraft is faster)
  kernels launched per call (--no-fold: without BatchNorm and constant folding, for the counts before/after)
  agree   the largest |tilecraft - onnxruntime| over the outputs, relative to the output's largest |value|,
          and whether every output is within rtol 1e-3 (atol 1e-5 * max |value|)
onnx and onnxruntime are bench/test dependencies only (the `[test]` extra)."""
from __future__ import annotations
import argparse, json, os, subprocess, sys, tempfile, time
from typing import Any, Optional
import numpy as np
from tilecraft.onnx.zoo import model_and_input

DEFAULT_MODELS = ["squeezenet", "shufflenet", "resnet50", "inception_v1", "densenet121", "bert_like", "mobilenet_v2", "efficientnet_b0"]

# ---- a worker: one model in one process ------------------------------------------------------------
def worker(name: str, phase: str, repeat: int, threads: int, fold: bool = True) -> dict:
  from tilecraft.engine import realize
  from tilecraft.onnx import load
  m, inp = model_and_input(name)
  out: dict[str, Any] = {"model": name}
  t0 = time.perf_counter()
  tm = load(m, fold=fold)
  k0 = realize.kernel_count
  res = tm.run(inp)
  out["first_call_s"] = time.perf_counter() - t0
  out["kernels_first_call"] = realize.kernel_count - k0
  if phase == "warm": return out
  import onnxruntime as ort
  so = ort.SessionOptions()
  so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
  sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
  ref = sess.run(None, inp)
  worst, ok = 0.0, True
  for o, r in zip(m.graph.output, ref):
    a = res[o.name]
    scale = float(np.abs(r).max()) or 1.0
    worst = max(worst, float(np.abs(a.astype(np.float64) - r).max()) / scale)
    ok = ok and bool(np.allclose(a, r, rtol=1e-3, atol=1e-5 * scale))
  out["max_rel_err"], out["agree"] = worst, ok
  for _ in range(2): tm.run(inp); sess.run(None, inp)  # noqa: E702  (warm-up)
  k0 = realize.kernel_count
  tm.run(inp)
  out["kernels_per_call"] = realize.kernel_count - k0
  tt, to = [], []
  for _ in range(repeat):  # in pairs after a pause: each runtime is timed on its second call in a row (see the docstring)
    time.sleep(SETTLE_S)
    tm.run(inp)
    t0 = time.perf_counter(); tm.run(inp); tt.append(time.perf_counter() - t0)  # noqa: E702
    time.sleep(SETTLE_S)
    sess.run(None, inp)
    t0 = time.perf_counter(); sess.run(None, inp); to.append(time.perf_counter() - t0)  # noqa: E702
  out["tilecraft_s"], out["ort_s"] = float(np.median(tt)), float(np.median(to))
  out["tilecraft_best_s"], out["ort_best_s"] = min(tt), min(to)
  return out

SETTLE_S = 0.05  # before each runtime's pair of calls: the other runtime's threads have stopped spinning

def count_kernels(name: str) -> dict:
  """Kernels per call with and without the graph rewrites, from the schedules alone (no kernel of the
  per-call schedule is compiled or run; with folding, the constants' kernels run once at build)."""
  from tilecraft.onnx import graph, load
  m, inp = model_and_input(name)
  out: dict[str, Any] = {"model": name}
  counted: list[int] = []
  real_run, real_read = graph.run_schedule, graph._Capture.read_outputs
  graph.run_schedule = lambda sched: counted.append(sum(1 for si in sched if si.ast.op.name == "KERNEL"))  # type: ignore[assignment]
  graph._Capture.read_outputs = lambda self, names: {}  # type: ignore[assignment]
  try:
    for fold in (False, True):
      counted.clear()
      tm = load(m, fold=fold)
      tm.run(inp)
      out["kernels_fold" if fold else "kernels_nofold"] = counted[-1]
      out["bn_folded"] = max(out.get("bn_folded", 0), tm.bn_folded)
  finally: graph.run_schedule, graph._Capture.read_outputs = real_run, real_read
  return out

# ---- per node: where the two runtimes' time goes -----------------------------------------------------
def node_groups(name: str, repeat: int, threads: int) -> dict:
  """Both runtimes' time per part of the graph, in one process, alternating: tilecraft's OnnxModel.profile (each kernel
  timed in sequence, in a call after a pause and two untimed calls) and onnxruntime's profiler (each node, timed on the
  second call of a pair after a pause, as above); medians of `repeat` each. The
  two fuse differently (onnxruntime folds a residual Add into the conv before it, tilecraft into the kernel that
  writes the Relu after it; tilecraft's Winograd conv is four kernels), so the parts compared are the smallest sets
  of the model's nodes that each side's entries don't straddle: every tilecraft entry and every onnxruntime node
  joins the nodes it computes, a BatchNormalization joins the node it normalizes, and joined sets merge."""
  import onnx, onnxruntime as ort
  from tilecraft.onnx import load
  m, inp = model_and_input(name)
  g = m.graph
  producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
  parent = list(range(len(g.node)))
  def find(i: int) -> int:
    while parent[i] != i: parent[i] = parent[parent[i]]; i = parent[i]  # noqa: E702
    return i
  def join(ids: list[int]) -> None:
    for i in ids[1:]: parent[find(i)] = find(ids[0])
  for i, n in enumerate(g.node):
    if n.op_type == "BatchNormalization" and n.input[0] in producer: join([i, producer[n.input[0]]])
  tm = load(m)
  with tempfile.TemporaryDirectory(prefix="tc_bench_nodes_") as tmp:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.enable_profiling, so.profile_file_prefix = True, os.path.join(tmp, "ort")
    so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(2): sess.run(None, inp)
    ours = []
    for _ in range(repeat):
      time.sleep(SETTLE_S)
      ours.append(tm.profile(inp, repeat=1))
      time.sleep(SETTLE_S)
      for _ in range(2): sess.run(None, inp)
    with open(sess.end_profiling()) as f: events = json.load(f)
    optimized = {n.name: n for n in onnx.load(so.optimized_model_filepath).graph.node}
  tc_parts = [([producer[v] for v in r.values if v in producer], float(np.median([run[k].seconds for run in ours]))) for k, r in enumerate(ours[0])]
  durations: dict[str, list[float]] = {}
  for e in events:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"): durations.setdefault(e["name"][:-len("_kernel_time")], []).append(e["dur"] * 1e-6)
  by_name = {n.name: i for i, n in enumerate(g.node) if n.name}
  def model_node(nm: str) -> Optional[int]:
    # which model node an onnxruntime node stands for: its NCHWc rewrite keeps the value name (r11 -> "r11_nchwc"),
    # a fusion the first node's name ("l0_q_mm/MatMulAddFusion"), other nodes their name or one of the model's values
    n = optimized.get(nm)
    cands = [producer.get(nm[:-len("_nchwc")])] if nm.endswith("_nchwc") else []
    cands += [by_name.get(nm), by_name.get(nm.split("/")[0])] + [producer.get(o) for o in (n.output if n is not None else [])]
    return next((i for i in cands if i is not None), None)
  readers: dict[str, list[str]] = {}
  for n in optimized.values():
    for x in n.input: readers.setdefault(x, []).append(n.name)
  def stands_for(nm: str, seen: frozenset = frozenset()) -> Optional[int]:
    # a node of onnxruntime's own (a reshape around a fused Gemm, a layout reorder) stands for the model node its readers do
    if (i := model_node(nm)) is not None or nm in seen or nm not in optimized: return i
    return next((j for o in optimized[nm].output for r in readers.get(o, []) if (j := stands_for(r, seen | {nm})) is not None), None)
  ort_parts = []
  for nm, ds in durations.items():
    i = stands_for(nm)
    ort_parts.append(([i] if i is not None else [], float(np.median(ds[2:][1::2] or ds))))
  for ids, _ in tc_parts + ort_parts:
    if ids: join(ids)
  groups: dict[Any, dict] = {}
  for side, parts in (("tilecraft", tc_parts), ("ort", ort_parts)):
    for ids, t in parts:
      key = find(ids[0]) if ids else None
      grp = groups.setdefault(key, {"tilecraft_s": 0.0, "ort_s": 0.0})
      grp[f"{side}_s"] += t
  inits = {i.name: list(i.dims) for i in g.initializer}
  def weight_shape(v: str) -> Optional[list]:
    if v in inits: return inits[v]
    p = g.node[producer[v]] if v in producer else None
    if p is not None and p.op_type == "ConstantOfShape" and p.input[0] in producer and g.node[producer[p.input[0]]].op_type == "Constant":
      return [int(d) for d in onnx.numpy_helper.to_array(g.node[producer[p.input[0]]].attribute[0].t)]
    return None
  def describe(i: int) -> str:
    n = g.node[i]
    if n.op_type not in ("Conv", "Gemm", "MatMul"): return n.op_type
    w = weight_shape(n.input[1]) if len(n.input) > 1 else None
    if n.op_type != "Conv" or not w or len(w) != 4: return f"{n.op_type} {'x'.join(map(str, w))}" if w else n.op_type
    st = next((list(a.ints) for a in n.attribute if a.name == "strides"), [1, 1])
    return f"Conv {w[2]}x{w[3]}{' s' + str(st[0]) if st[0] != 1 else ''} {w[1]}->{w[0]}"
  members: dict[Any, list[int]] = {}
  for i in range(len(g.node)): members.setdefault(find(i), []).append(i)
  rows = []
  for key, grp in groups.items():
    ops = [describe(i) for i in members.get(key, [])] if key is not None else ["(onnxruntime's own nodes)"]
    main = [d for d in ops if d.startswith(("Conv ", "Gemm", "MatMul"))] or [d for d in ops if d not in ("Constant", "ConstantOfShape", "Shape")] or ops
    rows.append({"part": " + ".join(dict.fromkeys(main)), "tilecraft_s": grp["tilecraft_s"], "ort_s": grp["ort_s"]})
  return {"model": name, "parts": rows}

def print_node_groups(res: dict, top: int) -> None:
  """The parts of node_groups slowest first (top of them, 0: all), then the parts summed by what they compute."""
  rows = res["parts"]
  tt, to = sum(r["tilecraft_s"] for r in rows), sum(r["ort_s"] for r in rows)
  print(f"\n{res['model']}: per part of the graph (sums in sequence: tilecraft {tt * 1e3:.2f} ms, onnxruntime {to * 1e3:.2f} ms)")
  print(f"  {'tilecraft ms':>12s} {'ort ms':>8s} {'ratio':>6s}  part")
  for r in sorted(rows, key=lambda r: -max(r["tilecraft_s"], r["ort_s"]))[:top or len(rows)]:
    ratio = r["ort_s"] / r["tilecraft_s"] if r["tilecraft_s"] else float("nan")
    print(f"  {r['tilecraft_s'] * 1e3:12.3f} {r['ort_s'] * 1e3:8.3f} {ratio:6.2f}  {r['part']}")
  kinds: dict[str, list] = {}
  for r in rows:
    k = kinds.setdefault(r["part"], [0, 0.0, 0.0])
    k[0] += 1; k[1] += r["tilecraft_s"]; k[2] += r["ort_s"]  # noqa: E702
  print(f"  summed by part: {'count':>5s} {'tilecraft ms':>12s} {'ort ms':>8s} {'ratio':>6s}")
  for part, (cnt, t, o) in sorted(kinds.items(), key=lambda kv: -max(kv[1][1], kv[1][2])):
    print(f"  {part[:60]:60s} {cnt:5d} {t * 1e3:12.3f} {o * 1e3:8.3f} {o / t if t else float('nan'):6.2f}")

def _spawn(name: str, phase: str, cache: str, repeat: int, threads: int, fold: bool) -> dict:
  env = dict(os.environ, XDG_CACHE_HOME=cache, OMP_NUM_THREADS=str(threads))
  p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name, "--phase", phase, "--repeat", str(repeat), "--threads", str(threads)]
                     + ([] if fold else ["--no-fold"]),
                     env=env, capture_output=True, text=True, timeout=3600)
  if p.returncode != 0: return {"model": name, "error": [f"exit status {p.returncode}"] + (p.stderr or p.stdout).strip().splitlines()[-1:]}
  return json.loads(p.stdout.strip().splitlines()[-1])

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description="ONNX models: tilecraft CPU vs onnxruntime CPU, side by side")
  ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated names, or 'all' (the nine light models and the zoo's)")
  ap.add_argument("--repeat", type=int, default=10, help="timed calls of each runtime per model")
  ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  ap.add_argument("--json", default=None, help="also write the rows to this file")
  ap.add_argument("--no-fold", action="store_true", help="load with fold=False (no BatchNorm folding, no constant folding)")
  ap.add_argument("--cache", default=None, metavar="DIR", help="use this XDG_CACHE_HOME (kept) instead of a fresh one per model: 'cold' is then the first call with that cache")
  ap.add_argument("--count-kernels", action="store_true", help="only count the kernels per call with and without folding (nothing timed)")
  ap.add_argument("--per-node", type=int, nargs="?", const=15, default=None, metavar="N",
                  help="then, per model, both runtimes' time per part of the graph (its N slowest parts, default 15; 0: all) and summed by kind")
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--phase", default="cold", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    res = node_groups(args.worker, args.repeat, args.threads) if args.phase == "nodes" else worker(args.worker, args.phase, args.repeat, args.threads, not args.no_fold)
    print(json.dumps(res))
    return 0
  if args.models == "all":
    from tilecraft.onnx.zoo import model_names
    names = model_names()
  else: names = [s for s in args.models.split(",") if s]
  if args.count_kernels:
    print(f"{'model':14s} {'BN folded':>9s} {'kernels/call':>12s} {'unfolded':>8s}")
    for name in names:
      r = count_kernels(name)
      print(f"{name:14s} {r['bn_folded']:9d} {r['kernels_fold']:12d} {r['kernels_nofold']:8d}", flush=True)
    return 0
  rows = []
  print(f"{'model':14s} {'tilecraft ms':>12s} {'ort ms':>8s} {'ratio':>6s} {'cold s':>7s} {'warm s':>7s} {'kernels':>7s} {'max rel err':>11s} agree", flush=True)
  for name in names:
    with tempfile.TemporaryDirectory(prefix="tc_bench_onnx_") as tmp:
      cache = os.path.abspath(os.path.expanduser(args.cache)) if args.cache else tmp
      row = _spawn(name, "cold", cache, args.repeat, args.threads, not args.no_fold)
      if "error" not in row:
        warm = _spawn(name, "warm", cache, args.repeat, args.threads, not args.no_fold)
        row["warm_first_call_s"] = warm.get("first_call_s")
        if "error" in warm: print(f"{name}: the warm first call failed: {warm['error']}", flush=True)
    rows.append(row)
    if "error" in row:
      print(f"{name:14s} error: {row['error']}", flush=True)
      continue
    row["ratio"] = row["ort_s"] / row["tilecraft_s"]
    warm = row.get("warm_first_call_s")
    print(f"{name:14s} {row['tilecraft_s'] * 1e3:12.2f} {row['ort_s'] * 1e3:8.2f} {row['ratio']:6.2f} {row['first_call_s']:7.1f} "
          f"{warm if warm is not None else float('nan'):7.1f} {row['kernels_per_call']:7d} {row['max_rel_err']:11.1e} {'yes' if row['agree'] else 'NO'}", flush=True)
  print(f"(ratio: onnxruntime time / tilecraft time, medians of {args.repeat} calls each, alternating in pairs, {args.threads} threads; "
        "cold: first call with an empty kernel cache; warm: first call of a new process with the disk cache filled)")
  if args.per_node is not None:
    for name in names:
      with tempfile.TemporaryDirectory(prefix="tc_bench_onnx_") as tmp:
        res = _spawn(name, "nodes", os.path.abspath(os.path.expanduser(args.cache)) if args.cache else tmp, args.repeat, args.threads, True)
      if "error" in res: print(f"{name}: per-node profile failed: {res['error']}", flush=True)
      else: print_node_groups(res, args.per_node)
      next((r for r in rows if r.get("model") == name), {})["parts"] = res.get("parts")
  if args.json:
    with open(args.json, "w") as f: json.dump(rows, f, indent=1)
  return 0

if __name__ == "__main__":
  sys.exit(main())
