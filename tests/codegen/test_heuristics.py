"""hand_coded_optimizations / required_optimizations (DESIGN §5.1): which rules fire for the classic
kernel kinds, that every applied opt says why, and that hand-coded kernels compute what the
unoptimized ones do, on CPU and (when it opens here) OPENCL."""
import importlib.util
from pathlib import Path
import numpy as np
import pytest
from tilecraft import Context
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from tilecraft.renderer.cstyle import OpenCLRenderer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable

def _load_bench_common():
  path = Path(__file__).resolve().parents[2] / "bench" / "common.py"
  spec = importlib.util.spec_from_file_location("_tilecraft_bench_common", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)  # type: ignore[union-attr]
  return mod

bench = _load_bench_common()

# ---- AST builders (value, numpy reference) --------------------------------------------------------

def load(i, st, dt=dtypes.float32): return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dt, st))
def kernel(value, out_shape, dt=dtypes.float32):
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dt, ShapeTracker.from_shape(out_shape))),))

def matvec(K, N):
  """out[1, n] = sum_k a[1, k] * B[k, n]."""
  a = ShapeTracker.from_shape((1, K)).reshape((1, 1, K)).expand((1, N, K))
  b = ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K))
  ast = kernel(LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (load(1, a), load(2, b))),), (2,)), (1, N, 1))
  def data(rng):
    x, w = rng.random((1, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
    return [x, w], x @ w
  return ast, data

def matmul(M, N, K):
  def data(rng):
    a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
    return [a, b], a @ b
  return bench.matmul_ast(M, N, K), data

def conv(cin, cout, H, W):
  def data(rng):
    img, w = rng.random((cin, H, W), dtype=np.float32), rng.random((cout, cin, 3, 3), dtype=np.float32)
    return [img, w], bench.numpy_conv3x3(img, w)
  return bench.conv3x3_ast(cin, cout, H, W), data

def elementwise(n):
  def data(rng):
    x, y, z = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    return [x, y, z], np.maximum(x * y + z, 0)
  return bench.elementwise_ast(n), data

def reduce(shape, axes, op=ReduceOps.SUM, pre=None):
  out = tuple(1 if i in axes else s for i, s in enumerate(shape))
  x = load(1, ShapeTracker.from_shape(shape))
  if pre is not None: x = LazyOp(pre, (x,))
  ast = kernel(LazyOp(op, (x,), tuple(axes)), out)
  def data(rng):
    v = rng.standard_normal(shape, dtype=np.float32)
    w = np.exp2(v) if pre is UnaryOps.EXP2 else v
    return [v], (w.sum if op is ReduceOps.SUM else w.max)(axis=tuple(axes), keepdims=True)
  return ast, data

def stack(n, parts):
  """out[i, :] = concatenate of parts inputs along a small last axis: input j has width parts[j] and is
  placed by padding, out = pad(x0) + pad(x1) + ... (parts=(1, 1) is stack, (1, 3) is a cat)."""
  width, srcs, start = sum(parts), [], 0
  for j, w in enumerate(parts):
    st = ShapeTracker.from_shape((n, w)).pad(((0, 0), (start, width - start - w)))
    srcs.append(load(j + 1, st))
    start += w
  value = srcs[0]
  for s in srcs[1:]: value = LazyOp(BinaryOps.ADD, (value, s))
  ast = kernel(value, (n, width))
  def data(rng):
    xs = [rng.standard_normal((n, w), dtype=np.float32) for w in parts]
    return xs, np.concatenate(xs, axis=1)
  return ast, data

# ---- helpers --------------------------------------------------------------------------------------

def opencl():
  try: return Device["OPENCL"]
  except Exception as e: pytest.skip(f"OPENCL device unavailable here: {type(e).__name__}: {e}")

def device(name): return opencl() if name == "OPENCL" else Device[name]

def run(k, inputs, dev):
  p = k.to_program()
  outs = [Buffer(dev, x.arg.st.real_size(), x.arg.dtype).allocate() for x in k.ast.src]
  ins = [Buffer(dev, a.size, dtypes.from_np(a.dtype)).allocate().copyin(a) for a in inputs]
  CompiledRunner(p)(outs + ins)
  return outs[0].numpy()

def hand(ast, renderer):
  k = Kernel(ast, renderer)
  assert k.hand_coded_optimizations() is k
  return k

def ops_of(k): return [o.op for o in k.applied_opts]

# ---- which rules fire -----------------------------------------------------------------------------

def test_matvec_groups_locals_and_upcasts(rng):
  dev = opencl()
  ast, data = matvec(4096, 4096)
  k = hand(ast, dev.renderer)
  assert {OptOps.GROUP, OptOps.LOCAL, OptOps.UPCAST} <= set(ops_of(k)), k.applied_opts
  assert {"green", "cyan", "yellow"} <= set(k.colors()), k.colors()
  assert all("matvec" in r for r in k.applied_opts_reasons), k.applied_opts_reasons
  inputs, ref = data(rng)
  np.testing.assert_allclose(run(k, inputs, "OPENCL").reshape(ref.shape), ref, rtol=1e-4)

def test_matvec_rule_not_on_cpu():
  ast, _ = matvec(4096, 4096)
  k = hand(ast, Device["CPU"].renderer)
  assert not {OptOps.GROUP, OptOps.GROUPTOP, OptOps.LOCAL} & set(ops_of(k))

@pytest.mark.parametrize("fill,op", [(None, OptOps.GROUP), (0, OptOps.GROUPTOP)], ids=["fill", "reference"])
def test_sum_of_4096_is_grouped(rng, fill, op):
  dev = opencl()
  ast, data = reduce((4096,), (0,))
  with Context(**({} if fill is None else {"GPU_FILL": fill})): k = hand(ast, dev.renderer)
  assert op in ops_of(k), k.applied_opts
  assert "green" in k.colors()
  inputs, ref = data(rng)
  np.testing.assert_allclose(run(k, inputs, "OPENCL").reshape(ref.shape), ref, rtol=1e-4, atol=1e-3)

@pytest.mark.parametrize("shape,axes,op", [((512, 1024), (1,), OptOps.GROUP), ((1024, 512), (0,), OptOps.GROUPTOP), ((16, 640, 96), (1,), OptOps.GROUPTOP),
                                           ((64, 3, 400), (0, 2), OptOps.GROUP)], ids=["rows", "cols", "seq_mean", "two_axes"])
def test_gpu_fill_grouped_reduces_run_right_on_opencl(rng, shape, axes, op):
  """GPU_FILL's grouped layouts (rows: GROUP; columns: GROUPTOP with a warp of consecutive outputs) on real workgroups."""
  dev = opencl()
  ast, data = reduce(shape, axes)
  k = hand(ast, dev.renderer)
  assert k.applied_opts[0].op is op and "each input once" in k.applied_opts_reasons[0], k.applied_opts_reasons
  inputs, ref = data(rng)
  np.testing.assert_allclose(run(k, inputs, "OPENCL").reshape(ref.shape), ref, rtol=1e-4, atol=1e-3)

@pytest.mark.parametrize("parts", [(1, 1), (1, 1, 1), (1, 3), (2, 2)], ids=["stack2", "stack3", "cat1+3", "cat2+2"])
@pytest.mark.parametrize("devname", ["CPU", "OPENCL"])
def test_stack_upcasts_its_masked_axis(parts, devname, rng):
  dev = device(devname)
  ast, data = stack(64, parts)
  k = Kernel(ast, dev.renderer)
  masked = [ax for ax in range(k.first_reduce) if any(st.axis_is_masked(ax) for st in k.sts)]
  assert len(masked) == 1 and k.full_shape[masked[0]] == sum(parts), (k.full_shape, masked)
  ax, size = masked[0], k.full_shape[masked[0]]
  k.hand_coded_optimizations()
  ups = [(o, r) for o, r in zip(k.applied_opts, k.applied_opts_reasons) if o.op is OptOps.UPCAST and o.axis == ax and o.amt in (0, size)]
  assert ups, k.applied_opts
  assert "masked" in ups[0][1] or "stack" in ups[0][1]
  assert k.colors()[k.full_shape.index(size, k.first_upcast)] == "yellow"
  inputs, ref = data(rng)
  np.testing.assert_array_equal(run(k, inputs, devname).reshape(ref.shape), ref)

def test_cpu_matmul_register_tile(rng):
  ast, data = matmul(64, 64, 64)
  k = hand(ast, Device["CPU"].renderer)
  # the register tile (rows x 2 vectors: 8 rows on AVX-512, 6 padded rows on AVX2), then B packed; the
  # exact tile per ISA is pinned in tests/codegen/test_heuristics_cpu.py
  ops = ops_of(k)
  assert ops.count(OptOps.UPCAST) == 3 and ops[-2:] == [OptOps.SWAP, OptOps.PACK] and set(ops) <= {OptOps.UPCAST, OptOps.PADTO, OptOps.SWAP, OptOps.PACK}, k.applied_opts
  assert not {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP} & set(ops_of(k))
  assert "yellow" in k.colors()
  inputs, ref = data(rng)
  np.testing.assert_allclose(run(k, inputs, "CPU").reshape(ref.shape), ref, rtol=1e-5)

def test_gpu_matmul_uses_locals():
  dev = opencl()
  ast, _ = matmul(64, 64, 64)
  k = hand(ast, dev.renderer)
  assert OptOps.LOCAL in ops_of(k) and OptOps.UPCAST in ops_of(k)
  locals_ = [s for s, c in zip(k.full_shape, k.colors()) if c == "cyan"]
  assert 1 <= len(locals_) <= 3 and int(np.prod(locals_)) <= 128

def test_short_reduce_unrolled_fully():
  ast, _ = conv(4, 8, 8, 8)  # reduce axes 4, 3, 3: the innermost 3 is short
  k = hand(ast, Device["CPU"].renderer)
  unrolls = [(o, r) for o, r in zip(k.applied_opts, k.applied_opts_reasons) if o.op is OptOps.UNROLL]
  assert len(unrolls) == 1 and unrolls[0][0].amt == 0 and "short" in unrolls[0][1], k.applied_opts
  assert k.full_shape[-1] == 3 and k.colors()[-1] == "magenta"

def test_image_output_upcast_by_4_is_required():
  st = ShapeTracker.from_shape((8, 32, 64))
  out = MemBuffer(0, dtypes.imagef((8, 8, 4)), ShapeTracker.from_shape((8, 32, 1)))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(ReduceOps.SUM, (load(1, st),), (2,)),), out),))
  k = Kernel(ast, OpenCLRenderer())
  k.required_optimizations()
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 4)]
  assert "image" in k.applied_opts_reasons[0] and k.colors()[-1] == "yellow"
  # hand-coded: a small output with a long reduce groups it and keeps the texel's 4 channels threads
  # through the reduce (UPCASTMID, white); the required upcast then has nothing left to do
  k2 = Kernel(ast, OpenCLRenderer())
  k2.hand_coded_optimizations()
  assert k2.applied_opts[:2] == [Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.UPCASTMID, 0, 4)], k2.applied_opts
  assert "white" in k2.colors() and not any(o.op is OptOps.UPCAST for o in k2.applied_opts)
  # a big output is not grouped: the required upcast comes first
  big = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(ReduceOps.SUM, (load(1, ShapeTracker.from_shape((64, 128, 8))),), (2,)),),
                                       MemBuffer(0, dtypes.imagef((64, 32, 4)), ShapeTracker.from_shape((64, 128, 1)))),))
  k3 = Kernel(big, OpenCLRenderer()).hand_coded_optimizations()
  assert k3.applied_opts[0] == Opt(OptOps.UPCAST, 0, 4) and "required" in k3.applied_opts_reasons[0], k3.applied_opts

def test_symbolic_kernel_is_left_alone():
  n = Variable("n", 1, 256)
  ast = kernel(LazyOp(ReduceOps.SUM, (load(1, ShapeTracker.from_shape((n, 64))),), (1,)), (n, 1))
  for r in [Device["CPU"].renderer, OpenCLRenderer()]:
    k = hand(ast, r)
    assert not any(o.op in (OptOps.PADTO, OptOps.UPCAST, OptOps.LOCAL) and o.axis == 0 for o in k.applied_opts)

# ---- reasons, determinism -------------------------------------------------------------------------

CASES = {
  "matmul64": lambda: matmul(64, 64, 64),
  "matmul-odd": lambda: matmul(25, 20, 16),
  "matvec": lambda: matvec(256, 512),
  "conv": lambda: conv(4, 8, 8, 8),
  "elementwise": lambda: elementwise(1024),
  "rowsum": lambda: reduce((64, 256), (1,)),
  "colsum": lambda: reduce((64, 256), (0,)),
  "sum4096": lambda: reduce((4096,), (0,)),
  "sum-exp2": lambda: reduce((16, 100), (1,), pre=UnaryOps.EXP2),
  "rowmax": lambda: reduce((6, 40), (1,), ReduceOps.MAX),
  "max64": lambda: reduce((64, 64), (0,), ReduceOps.MAX),
  "stack": lambda: stack(64, (1, 1)),
  "cat": lambda: stack(30, (1, 3)),
}

DEVICES = ["CPU", "OPENCL"]

@pytest.mark.parametrize("devname", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_every_opt_has_a_reason(case, devname):
  r = device(devname).renderer
  k = hand(CASES[case]()[0], r)
  assert k.applied_opts, f"no opts for {case}"
  assert len(k.applied_opts_reasons) == len(k.applied_opts)
  for o, why in zip(k.applied_opts, k.applied_opts_reasons):
    assert isinstance(why, str) and why.strip() and why != "requested", (o, why)

@pytest.mark.parametrize("devname", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_hand_coded_is_deterministic_and_replayable(case, devname):
  r = device(devname).renderer
  ast = CASES[case]()[0]
  k1, k2 = hand(ast, r), hand(ast, r)
  assert k1.applied_opts == k2.applied_opts and k1.applied_opts_reasons == k2.applied_opts_reasons
  k3 = Kernel(ast, r)
  for o in k1.applied_opts: k3.apply_opt(o)
  assert k3.full_shape == k1.full_shape and k3.colors() == k1.colors()

# ---- hand-coded computes what the unoptimized kernel does ------------------------------------------

@pytest.mark.parametrize("devname", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_hand_coded_matches_unoptimized(case, devname, rng):
  dev = device(devname)
  ast, data = CASES[case]()
  inputs, ref = data(rng)
  base = run(Kernel(ast, dev.renderer), inputs, devname)
  k = hand(ast, dev.renderer)
  got = run(k, inputs, devname)
  tol = dict(rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))
  np.testing.assert_allclose(base.reshape(ref.shape), ref, **tol)
  np.testing.assert_allclose(got.reshape(ref.shape), base.reshape(ref.shape), **tol, err_msg=f"{k.applied_opts}")
