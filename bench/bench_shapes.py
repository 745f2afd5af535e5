"""Shape robustness: kernels with the shapes real models have (ResNet-50, MobileNet-v2, GPT-2, BERT, a
LLaMA-style MLP), tilecraft against XLA (jax.jit on the CPU) side by side, and numpy where numpy has
the op; per-workload roofline figures in the JSON.

tilecraft's time is the sum of its kernels' times (each kernel's compiled C call, the way a captured
graph would replay them: no Python scheduling); XLA's is one call of the jitted function
(`f(*xs).block_until_ready()`, XLA's dispatch included). The two are timed interleaved in rounds,
alternating which goes first, best of --reps calls per round, best over --rounds rounds. numpy (float32,
its BLAS for the matmuls) is timed after the rounds: its BLAS threads spin for a while after each call
on the cores the next kernels need. Each side's output is checked against a float64 numpy reference.

jax runs in its own virtual environment (never a tilecraft dependency), created on first use:
  python3 -m venv VENV && VENV/bin/pip install jax numpy
(VENV: --venv, default $JAX_VENV or /tmp/jaxvenv). The jax side is a worker process of that venv's
python driven over a pipe, the way bench_peer_tinygrad.py drives tinygrad.

Roofline figures per workload (JSON "kernels", one record a workload): flops and bytes are tilecraft's
estimates summed over its kernels (Program.op_estimate / mem_estimate), GFLOP/s and GB/s over
tilecraft's time, and the fractions of the machine's measured peaks (tilecraft.cli.calibrate) and of
the roofline min(peak FLOPS, intensity x peak bandwidth); each record's own "kernels" list has the
same figures per kernel (its best time in the rounds). `tilecraft roofline shapes.json` draws the
workloads.

Run: python bench/bench_shapes.py [--rounds 5] [--reps 3] [-k NAME] [--beam N] [--json shapes.json]
"""
from __future__ import annotations
import argparse, json, math, os, subprocess, sys, tempfile, time, zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

JAX_REQS = ["jax", "numpy"]

# ---- the workloads (the reference, numpy and jax sides use only numpy / jax.numpy) ------------------

def _conv_ref(x: Any, w: Any, stride: int = 1, pad: int = 0, groups: int = 1) -> Any:
  """NCHW x OIHW convolution in numpy (the float64 reference)."""
  import numpy as np
  n, cin, _, _ = x.shape
  cout, cpg, kh, kw = w.shape
  p = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = np.lib.stride_tricks.sliding_window_view(p, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]  # n c oh ow kh kw
  win = win.reshape(n, groups, cpg, *win.shape[2:])
  wg = w.reshape(groups, cout // groups, cpg, kh, kw)
  return np.einsum("ngchwij,goc ij->ngohw".replace(" ", ""), win, wg).reshape(n, cout, win.shape[3], win.shape[4])

def _softmax_ref(x: Any) -> Any:
  import numpy as np
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def _gelu_ref(x: Any) -> Any:
  import numpy as np
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

def _layernorm_ref(x: Any, g: Any, b: Any) -> Any:
  import numpy as np
  xc = x - x.mean(-1, keepdims=True)
  return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5) * g + b

def _silu_ref(x: Any) -> Any:
  import numpy as np
  return x / (1 + np.exp(-x))

@dataclass
class Workload:
  """One kernel shape. `tc(*tensors)` is tilecraft's Tensor code, `jx(J, *arrays)` jax's (J has jnp,
  lax, nn), `ref(*float64 arrays)` the reference; `numpy` the float32 numpy code timed (None where
  numpy has no such op)."""
  name: str
  model: str
  shapes: list[tuple[int, ...]]
  tc: Callable
  jx: Callable
  ref: Callable
  numpy: Optional[Callable] = None
  scales: Optional[list[float]] = None  # inputs are standard normal times this (weights ~ 1/sqrt(fan-in))
  def inputs(self) -> list[Any]:
    import numpy as np
    rng = np.random.default_rng(zlib.crc32(self.name.encode()))
    return [(rng.standard_normal(s, dtype=np.float32) * np.float32(sc)).astype(np.float32)
            for s, sc in zip(self.shapes, self.scales or [1.0] * len(self.shapes))]

def _conv(stride: int = 1, pad: int = 0, groups: int = 1) -> tuple[Callable, Callable, Callable]:
  """(tilecraft, jax, reference) of one convolution."""
  def tc(x: Any, w: Any) -> Any: return x.conv2d(w, stride=stride, padding=pad, groups=groups)
  def jx(J: Any, x: Any, w: Any) -> Any:
    return J.lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad), (pad, pad)], feature_group_count=groups)
  def ref(x: Any, w: Any) -> Any: return _conv_ref(x, w, stride, pad, groups)
  return tc, jx, ref

def _conv1x1_numpy(stride: int) -> Callable:
  """A 1x1 conv in numpy: a matmul over the (strided) pixels."""
  def f(x: Any, w: Any) -> Any:
    xs = x[:, :, ::stride, ::stride]
    n, c, h, wd = xs.shape
    return (w.reshape(w.shape[0], c) @ xs.reshape(c, h * wd)).reshape(1, w.shape[0], h, wd)
  return f

def _ln_tc(x: Any, g: Any, b: Any) -> Any: return x.layernorm() * g + b
def _ln_jx(J: Any, x: Any, g: Any, b: Any) -> Any:
  xc = x - x.mean(-1, keepdims=True)
  return xc * J.lax.rsqrt((xc * xc).mean(-1, keepdims=True) + 1e-5) * g + b

def _gelu_tc(x: Any) -> Any: return x.gelu()
def _mlp_tc(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any: return (x @ w1 + b1).gelu() @ w2 + b2
def _mlp_jx(J: Any, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any: return J.nn.gelu(x @ w1 + b1, approximate=True) @ w2 + b2
def _mlp_ref(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any: return _gelu_ref(x @ w1 + b1) @ w2 + b2
def _swiglu_tc(x: Any, w1: Any, w3: Any, w2: Any) -> Any:
  h = x @ w1
  return (h * h.sigmoid() * (x @ w3)) @ w2
def _swiglu_jx(J: Any, x: Any, w1: Any, w3: Any, w2: Any) -> Any: return (J.nn.silu(x @ w1) * (x @ w3)) @ w2
def _swiglu_ref(x: Any, w1: Any, w3: Any, w2: Any) -> Any: return (_silu_ref(x @ w1) * (x @ w3)) @ w2
def _scores_tc(q: Any, k: Any) -> Any: return (q @ k.transpose(-1, -2) * 0.125).softmax(-1)
def _scores_jx(J: Any, q: Any, k: Any) -> Any: return J.nn.softmax(q @ J.jnp.swapaxes(k, -1, -2) * 0.125, axis=-1)
def _scores_ref(q: Any, k: Any) -> Any: return _softmax_ref(q @ k.swapaxes(-1, -2) * 0.125)

def _mm_tc(a: Any, b: Any) -> Any: return a @ b
def _mm_jx(J: Any, a: Any, b: Any) -> Any: return a @ b
def _mm_ref(a: Any, b: Any) -> Any: return a @ b
def _lin_tc(x: Any, w: Any, b: Any) -> Any: return x @ w + b
def _lin_jx(J: Any, x: Any, w: Any, b: Any) -> Any: return x @ w + b
def _lin_ref(x: Any, w: Any, b: Any) -> Any: return x @ w + b

def workloads() -> list[Workload]:
  def conv(name: str, model: str, x: tuple, w: tuple, stride: int = 1, pad: int = 0, groups: int = 1, np_fn: Optional[Callable] = None) -> Workload:
    return Workload(name, model, [x, w], *_conv(stride, pad, groups), np_fn, [1.0, 1 / math.sqrt(w[1] * w[2] * w[3])])
  r = 1 / math.sqrt(768)
  return [
    Workload("matmul 300x700x500", "generic (issue 29)", [(300, 700), (700, 500)], _mm_tc, _mm_jx, _mm_ref, _mm_ref),
    Workload("layernorm 128x768", "GPT-2 / BERT", [(128, 768), (768,), (768,)], _ln_tc, _ln_jx, _layernorm_ref, _layernorm_ref),
    conv("conv1x1 s2 1024->2048 14^2", "ResNet-50 downsample", (1, 1024, 14, 14), (2048, 1024, 1, 1), stride=2, np_fn=_conv1x1_numpy(2)),
    Workload("attn scores+softmax 12x128x64", "BERT-base", [(12, 128, 64), (12, 128, 64)], _scores_tc, _scores_jx, _scores_ref, _scores_ref),
    conv("conv3x3 s2 128ch 56^2", "ResNet-50 layer2", (1, 128, 56, 56), (128, 128, 3, 3), stride=2, pad=1),
    Workload("MLP 128 tok 768-3072-768", "GPT-2 small", [(128, 768), (768, 3072), (3072,), (3072, 768), (768,)], _mlp_tc, _mlp_jx, _mlp_ref,
             _mlp_ref, [1.0, r, 1.0, 1 / math.sqrt(3072), 1.0]),
    Workload("QKV proj 128x768x2304", "GPT-2 small", [(128, 768), (768, 2304), (2304,)], _lin_tc, _lin_jx, _lin_ref, _lin_ref, [1.0, r, 1.0]),
    Workload("fc 2048->1000 batch 1", "ResNet-50 head", [(1, 2048), (2048, 1000), (1000,)], _lin_tc, _lin_jx, _lin_ref, _lin_ref,
             [1.0, 1 / math.sqrt(2048), 1.0]),
    conv("stem 7x7 s2 3->64 224^2", "ResNet-50 stem", (1, 3, 224, 224), (64, 3, 7, 7), stride=2, pad=3),
    conv("conv1x1 64->256 56^2", "ResNet-50 layer1", (1, 64, 56, 56), (256, 64, 1, 1), np_fn=_conv1x1_numpy(1)),
    conv("depthwise 3x3 144ch 56^2", "MobileNet-v2", (1, 144, 56, 56), (144, 1, 3, 3), pad=1, groups=144),
    conv("pointwise 24->144 56^2", "MobileNet-v2 expand", (1, 24, 56, 56), (144, 24, 1, 1), np_fn=_conv1x1_numpy(1)),
    Workload("attn probs@V 12x128x128x64", "BERT-base", [(12, 128, 128), (12, 128, 64)], _mm_tc, _mm_jx, _mm_ref, _mm_ref, [1 / 128, 1.0]),
    Workload("SwiGLU MLP 32x1024x2816", "LLaMA-style", [(32, 1024), (1024, 2816), (1024, 2816), (2816, 1024)], _swiglu_tc, _swiglu_jx,
             _swiglu_ref, _swiglu_ref, [1.0, 1 / 32, 1 / 32, 1 / math.sqrt(2816)]),
    Workload("matmul 16x4096x1024 (K>>M)", "LLaMA-style decode batch", [(16, 4096), (4096, 1024)], _mm_tc, _mm_jx, _mm_ref, _mm_ref, [1.0, 1 / 64]),
    Workload("matmul 8x4096x2048 (decode)", "LLaMA-style decode, 8 sequences", [(8, 4096), (4096, 2048)], _mm_tc, _mm_jx, _mm_ref, _mm_ref,
             [1.0, 1 / 64]),
    Workload("matmul 512x4096x16 (LoRA down)", "LLaMA-style LoRA, rank 16", [(512, 4096), (4096, 16)], _mm_tc, _mm_jx, _mm_ref, _mm_ref,
             [1.0, 1 / 64]),
    Workload("gelu 128x3072", "GPT-2 MLP epilogue", [(128, 3072)], _gelu_tc, lambda J, x: J.nn.gelu(x, approximate=True), _gelu_ref, _gelu_ref),
  ]

def rel_error(out: Any, ref: Any) -> float:
  import numpy as np
  if out.shape != ref.shape: raise AssertionError(f"output shape {out.shape} != the reference's {ref.shape}")
  return float(np.abs(out.astype(np.float64) - ref).max()) / (float(np.abs(ref).max()) or 1.0)

# ---- the jax side: a worker process of the jax venv ------------------------------------------------

def worker() -> None:
  """JSON requests on stdin ({"setup": name} or {"time": name, "reps": n}), one JSON answer a line."""
  import importlib.metadata, types
  import jax, jax.numpy as jnp, numpy as np
  J = types.SimpleNamespace(jnp=jnp, lax=jax.lax, nn=jax.nn)
  ws, state = {w.name: w for w in workloads()}, {}
  out = sys.stdout
  sys.stdout = sys.stderr  # nothing but answers on the pipe
  print(json.dumps({"ready": True, "version": importlib.metadata.version("jax"), "device": str(jax.devices()[0])}), file=out, flush=True)
  for line in sys.stdin:
    req = json.loads(line)
    try:
      if "setup" in req:
        w = ws[req["setup"]]
        arrays = w.inputs()
        xs = [jax.device_put(a) for a in arrays]
        fn = jax.jit(lambda *a, w=w: w.jx(J, *a))
        got = np.asarray(fn(*xs).block_until_ready())
        state[w.name] = (fn, xs)
        ans = {"err": rel_error(got, np.asarray(w.ref(*[a.astype(np.float64) for a in arrays])))}
      else:
        fn, xs = state[req["time"]]
        best = float("inf")
        for _ in range(req["reps"]):
          t0 = time.perf_counter()
          fn(*xs).block_until_ready()
          best = min(best, time.perf_counter() - t0)
        ans = {"t": best}
    except Exception as e:  # noqa: BLE001 - reported to the driver, which marks the workload failed
      ans = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(ans), file=out, flush=True)

def ensure_venv(venv: str) -> str:
  """The venv's python, with jax installed (created on first use)."""
  from common import ensure_peer_venv
  return ensure_peer_venv(venv, list(JAX_REQS), "import jax, numpy")

def Peer(py: str) -> "PeerWorker":
  """The jax worker, over a pipe (XLA on the CPU)."""
  from common import PeerWorker  # (here: the worker side runs in the peer's venv, without tilecraft)
  return PeerWorker(py, __file__, "jax", env={"JAX_PLATFORMS": "cpu"})

# ---- the tilecraft side ----------------------------------------------------------------------------

class TilecraftSide:
  """Realized inputs, the compiled kernels of each workload (hand-coded opts, or BEAM=n), their timing. The variants
  of a workload read the same input buffers: in separate ones, two copies of the very same kernel (a gelu BEAM left
  as it was) timed 0.77x apart in one run, from where their buffers happened to lie."""
  def __init__(self) -> None:
    self.state: dict[tuple[str, int], Any] = {}
    self.inputs: dict[str, list[Any]] = {}
  def setup(self, w: Workload, beam: int) -> dict[str, Any]:
    import numpy as np
    from tilecraft import Context, Tensor
    from tilecraft.engine.realize import get_runner
    from tilecraft.ops import MetaOps
    from tilecraft.shape.symbolic import sym_eval
    arrays = w.inputs()
    t0 = time.perf_counter()
    with Context(BEAM=beam) if beam else Context():
      if w.name not in self.inputs: self.inputs[w.name] = [Tensor(a).realize() for a in arrays]
      ts = self.inputs[w.name]
      out = w.tc(*ts)
      items = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
      out.realize()
      runners = [get_runner(si.ast, si.bufs[0].device, list(si.bufs)) for si in items]
    got = out.numpy()
    self.state[(w.name, beam)] = (runners, items, [float("inf")] * len(runners))
    kernels = [{"name": r.p.name, "opts": [f"{o.op.name}({o.axis},{o.amt})" for o in r.p.applied_opts],
                "flops": float(sym_eval(r.p.op_estimate, si.var_vals)), "bytes": float(sym_eval(r.p.mem_estimate, si.var_vals))} for r, si in zip(runners, items)]
    return {"err": rel_error(got, np.asarray(w.ref(*[a.astype(np.float64) for a in arrays]))), "compile_s": time.perf_counter() - t0,
            "flops": sum(k["flops"] for k in kernels), "bytes": sum(k["bytes"] for k in kernels), "kernels": kernels}
  def time(self, name: str, beam: int, reps: int) -> float:
    """Best of reps calls of all the workload's kernels (each kernel's own best is kept too: kernel_times)."""
    runners, items, per = self.state[(name, beam)]
    best = float("inf")
    for _ in range(reps):
      ts = [r(list(si.bufs), si.var_vals, wait=True) or 0.0 for r, si in zip(runners, items)]
      for i, t in enumerate(ts): per[i] = min(per[i], t)
      best = min(best, sum(ts))
    return best
  def kernel_times(self, name: str, beam: int) -> list[float]: return self.state[(name, beam)][2]

def numpy_time(w: Workload, rounds: int, reps: int) -> Optional[float]:
  if w.numpy is None: return None
  arrays = w.inputs()
  w.numpy(*arrays)
  best = float("inf")
  for _ in range(rounds * reps):
    t0 = time.perf_counter()
    w.numpy(*arrays)
    best = min(best, time.perf_counter() - t0)
  return best

# ---- the driver ------------------------------------------------------------------------------------

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--reps", type=int, default=3, help="calls per side per round (best counts)")
  ap.add_argument("-k", dest="only", action="append", help="only workloads whose name contains this")
  ap.add_argument("--beam", type=int, default=0, help="also time BEAM=N kernels (a third column, in the same rounds)")
  ap.add_argument("--json", help="write the records (with roofline figures) here")
  ap.add_argument("--no-numpy", action="store_true", help="don't time numpy")
  ap.add_argument("--venv", default=os.environ.get("JAX_VENV", "/tmp/jaxvenv"))
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker: return worker()
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tilecraft.cli.bench import add_peak_fractions
  from tilecraft.cli.calibrate import cpu_model, get_peaks, load_average
  from tilecraft.device import Device
  ws = [w for w in workloads() if not args.only or any(s in w.name for s in args.only)]
  if not ws: sys.exit(f"no workload matches {args.only}")
  peer = Peer(ensure_venv(args.venv))
  tc = TilecraftSide()
  variants = [0] + ([args.beam] if args.beam else [])
  recs: dict[str, dict[str, Any]] = {}
  for w in ws:
    rec: dict[str, Any] = {"name": w.name, "model": w.model, "shapes": [list(s) for s in w.shapes], "error": None}
    ans = peer.ask(setup=w.name)
    rec["xla_err"] = ans.get("err")
    if "error" in ans: rec["error"] = f"jax: {ans['error']}"
    for beam in variants:
      key = "" if beam == 0 else f"beam{beam}_"
      try: s = tc.setup(w, beam)
      except Exception as e:  # noqa: BLE001 - one broken workload is reported, the rest go on
        rec["error"] = f"tilecraft{' BEAM' if beam else ''}: {type(e).__name__}: {e}"
        continue
      rec[key + "err"], rec[key + "compile_s"], rec[key + "kernels"] = s["err"], s["compile_s"], s["kernels"]
      if beam == 0: rec["flops"], rec["bytes"] = s["flops"], s["bytes"]
      print(f"{w.name}: {'BEAM=' + str(beam) if beam else 'hand-coded'} compiled in {s['compile_s']:.1f} s, max rel err {s['err']:.1e}", file=sys.stderr)
    recs[w.name] = rec
  ok = {n: r["error"] is None and max(r.get("err", 1), r.get("xla_err") or 1, *(r.get(f"beam{b}_err", 0) for b in variants if b)) <= 1e-3
        for n, r in recs.items()}
  load0 = load_average()
  best = {n: {"xla": float("inf"), **{v: float("inf") for v in variants}} for n in recs if ok[n]}
  for rnd in range(args.rounds):
    for n in best:
      sides = ["xla", *variants]
      for side in (sides if rnd % 2 == 0 else sides[::-1]):
        t = peer.ask(time=n, reps=args.reps).get("t", float("inf")) if side == "xla" else tc.time(n, side, args.reps)
        best[n][side] = min(best[n][side], t)
  peer.close()
  peaks = get_peaks(Device.DEFAULT)
  for w in ws:
    rec = recs[w.name]
    if w.name in best:
      b = best[w.name]
      rec["time_s"], rec["xla_time_s"] = b[0], b["xla"]
      rec["vs_xla"] = b["xla"] / b[0]
      if args.beam: rec["beam_time_s"], rec["beam_vs_xla"], rec["beam_vs_hand"] = b[args.beam], b["xla"] / b[args.beam], b[0] / b[args.beam]
      rec["gflops"], rec["gbs"] = rec["flops"] / b[0] / 1e9, rec["bytes"] / b[0] / 1e9
      rec["intensity"] = rec["flops"] / rec["bytes"] if rec["bytes"] else None
      add_peak_fractions(rec, peaks.gflops, peaks.gbs)
      for kr, t in zip(rec["kernels"], tc.kernel_times(w.name, 0)):  # each kernel's own roofline figures
        kr["time_s"], kr["gflops"], kr["gbs"] = t, kr["flops"] / t / 1e9, kr["bytes"] / t / 1e9
        kr["intensity"] = kr["flops"] / kr["bytes"] if kr["bytes"] else None
        add_peak_fractions(kr, peaks.gflops, peaks.gbs)
    rec["numpy_time_s"] = None if args.no_numpy else numpy_time(w, args.rounds, args.reps)
    if rec.get("time_s") and rec["numpy_time_s"]: rec["vs_numpy"] = rec["numpy_time_s"] / rec["time_s"]
  print(f"tilecraft vs XLA (jax {peer.hello['version']}, {peer.hello['device']}) on {cpu_model()}, {os.cpu_count()} cores; load {load0:.1f} at the start; "
        f"peaks {peaks.gflops:.0f} GFLOP/s, {peaks.gbs:.1f} GB/s")
  print(f"kernel time (sum of tilecraft's kernels) vs one jitted XLA call; interleaved, best of {args.reps} x {args.rounds} rounds; ratio = XLA time / tilecraft time")
  hdr = f"{'workload':32s} {'tilecraft':>10s} {'XLA':>10s} {'vs XLA':>7s}" + (f" {'BEAM':>10s} {'vs XLA':>7s} {'vs hand':>7s}" if args.beam else "") + \
        f" {'numpy':>10s} {'vs np':>6s} {'GFLOP/s':>8s} {'GB/s':>6s} {'%roof':>6s}"
  print(hdr)
  def ms(t: Optional[float]) -> str: return f"{t * 1e3:7.3f} ms" if t else f"{'-':>10s}"
  ratios, beam_ratios = [], []
  for w in ws:
    r = recs[w.name]
    if "time_s" not in r:
      print(f"{w.name:32s} FAILED: {r['error'] or ''} (errors: tilecraft {r.get('err')}, XLA {r.get('xla_err')})")
      continue
    ratios.append(r["vs_xla"])
    line = f"{w.name:32s} {ms(r['time_s'])} {ms(r['xla_time_s'])} {r['vs_xla']:6.2f}x"
    if args.beam:
      beam_ratios.append(r["beam_vs_xla"])
      line += f" {ms(r['beam_time_s'])} {r['beam_vs_xla']:6.2f}x {r['beam_vs_hand']:6.2f}x"
    line += f" {ms(r['numpy_time_s'])} " + (f"{r['vs_numpy']:5.2f}x" if r.get("vs_numpy") else f"{'-':>6s}")
    line += f" {r['gflops']:8.1f} {r['gbs']:6.1f} {r['pct_roofline']:5.1f}%"
    print(line)
  def gm(xs: list[float]) -> float: return math.exp(sum(map(math.log, xs)) / len(xs))
  if ratios: print(f"geomean vs XLA over {len(ratios)} workloads: {gm(ratios):.2f}x (min {min(ratios):.2f}x)")
  if beam_ratios: print(f"BEAM={args.beam}: geomean vs XLA {gm(beam_ratios):.2f}x (min {min(beam_ratios):.2f}x)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"device": Device.DEFAULT, "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "load": load0}, "peer": peer.hello,
                 "peak": peaks.to_json(), "rounds": args.rounds, "reps": args.reps, "beam": args.beam, "kernels": list(recs.values())}, f, indent=1)
    print(f"records written to {args.json}")
  if not all(ok.values()): sys.exit(1)

if __name__ == "__main__":
  main()
