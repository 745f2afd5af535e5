"""What each Opt does to the kernel's colored shape (DESIGN §5), how the shape is normalized at
construction, kernel names, the grouped-reduce AST, and that the reshaped kernels compute the right
answer (CPU always; OPENCL when pyopencl/PoCL can open a device)."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import dtypes
from tilecraft.ops import (BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps,
                           UnaryOps, verify_ast)
from tilecraft.renderer.cstyle import CRenderer, OpenCLRenderer
from tilecraft.shape.shapetracker import ShapeTracker

# ---- AST builders ---------------------------------------------------------------------------------

def load(i, st, dt=dtypes.float32): return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dt, st))
def const(v, st, dt=dtypes.float32): return LazyOp(BufferOps.CONST, (), ConstBuffer(v, dt, st))
def store(i, value, shape, dt=dtypes.float32): return LazyOp(BufferOps.STORE, (value,), MemBuffer(i, dt, ShapeTracker.from_shape(shape)))
def kernel(value, out_shape, dt=dtypes.float32): return LazyOp(MetaOps.KERNEL, (store(0, value, out_shape, dt),))

def matmul(M, N, K):
  """out[m, n] = sum_k a[m, k] * b[k, n]; kernel shape (M, N, K)."""
  a = ShapeTracker.from_shape((M, K)).reshape((M, 1, K)).expand((M, N, K))
  b = ShapeTracker.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K))
  return kernel(LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (load(1, a), load(2, b))),), (2,)), (M, N, 1))

def np_matmul(M, N, K, rng):
  a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
  return [a, b], a @ b

def reduce_ast(shape, axes, op=ReduceOps.SUM):
  out = tuple(1 if i in axes else s for i, s in enumerate(shape))
  return kernel(LazyOp(op, (load(1, ShapeTracker.from_shape(shape)),), tuple(axes)), out)

def add_ast(shape, st_b=None):
  st = ShapeTracker.from_shape(shape)
  return kernel(LazyOp(BinaryOps.ADD, (load(1, st), load(2, st_b if st_b is not None else st))), shape)

def affine_sum_ast(rows, cols):
  """out[r] = sum_c where(x[r, c] < 0.5, 3, 2*x[r, c] + 1): consts inside a padded reduce must stay masked."""
  st = ShapeTracker.from_shape((rows, cols))
  bc = ShapeTracker.from_shape((1, 1)).expand((rows, cols))
  x = load(1, st)
  lin = LazyOp(BinaryOps.ADD, (LazyOp(BinaryOps.MUL, (x, const(2.0, st))), const(1.0, bc)))
  val = LazyOp(TernaryOps.WHERE, (LazyOp(BinaryOps.CMPLT, (x, const(0.5, st))), const(3.0, st), lin))
  return kernel(LazyOp(ReduceOps.SUM, (val,), (1,)), (rows, 1))

def np_affine_sum(x): return np.where(x < 0.5, 3.0, 2 * x + 1).sum(1, keepdims=True)

CPU = CRenderer()
GPU = OpenCLRenderer()  # shapes and rendering need no OpenCL device

def make(ast, renderer, opts=()):
  k = Kernel(ast, renderer)
  for o in opts: k.apply_opt(o)
  return k

def in_strides(k, buf_idx):
  """real_strides of the MemBuffer with index buf_idx."""
  i = next(j for j, b in enumerate(k.bufs) if isinstance(b, MemBuffer) and b.idx == buf_idx)
  return k.sts[i].real_strides()

def assert_regions_ordered(k):
  """global | local | group | reduce | (magenta and yellow interleave in the upcast region)."""
  rank = {"blue": 0, "BLUE": 0, "cyan": 1, "green": 2, "white": 2, "red": 3, "magenta": 4, "yellow": 4}
  r = [rank[c] for c in k.colors()]
  assert r == sorted(r), k.colors()
  assert len(k.colors()) == len(k.full_shape) == k.shape_len

# ---- construction: ones removed, merges, reduce axes last -----------------------------------------

@pytest.mark.parametrize("renderer", [CPU, GPU], ids=["cpu", "gpu"])
def test_contiguous_elementwise_is_one_axis(renderer):
  k = make(add_ast((4, 8, 16)), renderer)
  assert k.full_shape == (512,) and k.colors() == ["blue"]

def test_size_one_axes_disappear():
  k = make(add_ast((4, 1, 16, 1)), CPU)
  assert k.full_shape == (64,)
  k = make(matmul(1, 32, 16), GPU)  # matvec: the M=1 axis goes
  assert k.full_shape == (32, 16) and k.colors() == ["blue", "red"]

def test_transposed_input_is_not_merged():
  st_b = ShapeTracker.from_shape((16, 8)).permute((1, 0))
  k = make(add_ast((8, 16), st_b), CPU)
  assert k.full_shape == (8, 16)

def test_broadcast_input_is_not_merged():
  st_b = ShapeTracker.from_shape((1, 16)).expand((8, 16))
  k = make(add_ast((8, 16), st_b), CPU)
  assert k.full_shape == (8, 16)

def test_reduce_axes_come_last():
  k = make(reduce_ast((8, 16), (0,)), CPU)  # column sum: the reduced axis 0 moves to the end
  assert k.full_shape == (16, 8) and k.colors() == ["blue", "red"] and k.first_reduce == 1
  assert k.sts[0].real_strides() == (1, 0)
  assert in_strides(k, 1) == (1, 16)

def test_reduce_axes_last_and_merged():
  k = make(reduce_ast((4, 8, 16), (1, 2)), CPU)
  assert k.full_shape == (4, 128) and k.colors() == ["blue", "red"]
  k = make(reduce_ast((4, 8, 16), (0, 2)), CPU)  # not contiguous: two reduce axes
  assert k.full_shape == (8, 4, 16) and k.colors() == ["blue", "red", "red"]

def test_globals_and_reduces_never_merge():
  k = make(reduce_ast((32, 64), (1,)), CPU)  # contiguous across the boundary, but different regions
  assert k.full_shape == (32, 64) and k.colors() == ["blue", "red"]

# ---- each opt on the colored shape ----------------------------------------------------------------

def test_padto_global_axis():
  k = make(matmul(25, 20, 16), GPU)
  k.apply_opt(Opt(OptOps.PADTO, 0, 32))
  assert k.full_shape == (32, 20, 16) and k.colors() == ["blue", "blue", "red"]
  assert k.sts[0].axis_is_masked(0) and not k.sts[0].axis_is_masked(1)
  p = k.to_program()
  assert 32 in p.global_size and 25 not in p.global_size

def test_padto_reduce_axis():
  k = make(matmul(16, 16, 25), GPU, [Opt(OptOps.PADTO, 2, 32)])
  assert k.full_shape == (16, 16, 32) and k.colors() == ["blue", "blue", "red"]
  assert in_strides(k, 1)[2] is None or k.sts[1].axis_is_masked(2)

def test_padto_multiple_is_noop_shape():
  k = make(matmul(32, 20, 16), GPU, [Opt(OptOps.PADTO, 0, 16)])
  assert k.full_shape == (32, 20, 16) and not k.sts[0].axis_is_masked(0)

def test_group_splits_reduce_into_green():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.GROUP, 0, 4)])
  assert k.full_shape == (25, 20, 4, 4) and k.colors() == ["blue", "blue", "green", "red"]
  assert k.group_for_reduces == 1
  # interleaved: green thread t takes k = t, t+4, ...; the red loop strides by 4
  assert in_strides(k, 1)[2:] == (1, 4)

def test_grouptop_takes_the_outer_chunk():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.GROUPTOP, 0, 4)])
  assert k.full_shape == (25, 20, 4, 4) and k.colors() == ["blue", "blue", "green", "red"]
  # contiguous chunks: green thread t takes k = 4t .. 4t+3
  assert in_strides(k, 1)[2:] == (4, 1)

def test_group_whole_axis():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.GROUP, 0, 0)])
  assert k.full_shape == (25, 20, 16) and k.colors() == ["blue", "blue", "green"]

def test_local_moves_split_into_cyan():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.LOCAL, 1, 4)])
  assert k.full_shape == (25, 5, 4, 16) and k.colors() == ["blue", "blue", "cyan", "red"]
  assert k.local_dims == 1 and k.global_dims == 2
  assert k.sts[0].real_strides()[:3] == (20, 4, 1)  # the inner part of the split is local
  p = k.to_program()
  assert p.local_size == [4]

def test_local_whole_axis():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.LOCAL, 1, 0)])
  assert k.full_shape == (25, 20, 16) and k.colors() == ["blue", "cyan", "red"]

def test_swap_swaps_two_blue_axes():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.SWAP, 0, 1)])
  assert k.full_shape == (20, 25, 16) and k.colors() == ["blue", "blue", "red"]
  assert k.sts[0].real_strides() == (1, 20, 0)

def test_upcast_adds_yellow_at_the_end():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.UPCAST, 0, 5)])
  assert k.full_shape == (5, 20, 16, 5) and k.colors() == ["blue", "blue", "red", "yellow"]
  assert k.upcasted == 1 and k.sts[0].real_strides()[3] == 20

def test_upcast_whole_axis_leaves_the_blue_region():
  k = make(matmul(4, 20, 16), CPU, [Opt(OptOps.UPCAST, 0, 0)])
  assert k.full_shape == (20, 16, 4) and k.colors() == ["blue", "red", "yellow"]

def test_unroll_adds_magenta():
  k = make(matmul(25, 20, 16), CPU, [Opt(OptOps.UNROLL, 0, 4)])
  assert k.full_shape == (25, 20, 4, 4) and k.colors() == ["blue", "blue", "red", "magenta"]
  k = make(matmul(25, 20, 16), CPU, [Opt(OptOps.UNROLL, 0, 0)])
  assert k.full_shape == (25, 20, 16) and k.colors() == ["blue", "blue", "magenta"]

def test_upcast_and_unroll_order():
  k = make(matmul(25, 20, 16), CPU, [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)])
  assert k.full_shape == (25, 5, 4, 4, 4) and k.colors() == ["blue", "blue", "red", "yellow", "magenta"]
  k = make(matmul(25, 20, 16), CPU, [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 1, 4)])
  assert k.colors() == ["blue", "blue", "red", "magenta", "yellow"]

def test_nolocals():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.NOLOCALS, 0, 0)])
  assert k.dont_use_locals and k.full_shape == (25, 20, 16) and k.colors() == ["BLUE", "BLUE", "red"]
  p = k.to_program()
  assert p.local_size is None and p.global_size == [500]

def test_everything_together_keeps_regions_ordered():
  k = make(matmul(32, 32, 64), GPU, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.GROUPTOP, 0, 4),
                                       Opt(OptOps.UNROLL, 1, 4), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 0, 2)])
  assert k.full_shape == (2, 4, 8, 2, 4, 4, 4, 4, 2)
  assert k.colors() == ["blue", "blue", "cyan", "cyan", "green", "red", "yellow", "magenta", "yellow"]
  assert_regions_ordered(k)
  assert np.prod(k.full_shape) == 32 * 32 * 64

def test_product_is_kept_and_regions_ordered_for_random_opts(rng):
  shapes = [(32, 24, 16), (16, 48, 12)]
  ops = [OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.SWAP, OptOps.NOLOCALS]
  for _ in range(200):
    M, N, K = shapes[rng.integers(len(shapes))]
    k = make(matmul(M, N, K), GPU)
    for _ in range(5):
      opt = Opt(ops[rng.integers(len(ops))], int(rng.integers(0, 4)), int(rng.choice([0, 2, 3, 4, 8])))
      try: k.apply_opt(opt)
      except KernelOptError: pass
      assert_regions_ordered(k)
      assert np.prod(k.full_shape) == M * N * K
      assert 1 not in k.full_shape

# ---- names ----------------------------------------------------------------------------------------

def test_name_prefixes():
  assert make(matmul(25, 20, 16), CPU).name.startswith("r_25_20_16")
  st = ShapeTracker.from_shape((64,))
  assert make(kernel(LazyOp(UnaryOps.NEG, (load(1, st),)), (64,)), CPU).name.startswith("E_64")
  assert make(kernel(load(1, st), (64,)), CPU).name.startswith("C_64")
  two = LazyOp(MetaOps.KERNEL, (store(0, load(2, st), (64,)), store(1, LazyOp(UnaryOps.NEG, (load(2, st),)), (64,))))
  assert make(two, CPU).name.startswith("E2_64")

def test_name_follows_the_shape():
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.UPCAST, 0, 5)])
  assert k.name.startswith("r_5_20_16_5")

def test_names_unique_per_ast():
  st = ShapeTracker.from_shape((48,))
  a = kernel(LazyOp(BinaryOps.ADD, (load(1, st), load(2, st))), (48,))
  b = kernel(LazyOp(BinaryOps.MUL, (load(1, st), load(2, st))), (48,))
  c = kernel(LazyOp(BinaryOps.SUB, (load(1, st), load(2, st))), (48,))
  names = [make(x, CPU).name for x in (a, b, c)]
  assert len(set(names)) == 3 and all(n.startswith("E_48") for n in names)
  a2 = kernel(LazyOp(BinaryOps.ADD, (load(1, st), load(2, st))), (48,))  # the same AST, built again
  assert make(a2, GPU).name == make(a, CPU).name == names[0]

# ---- the optimized AST ----------------------------------------------------------------------------

def _local_stores(ast): return [x for x in ast.lazyops if x.op is BufferOps.STORE and x.arg.idx < 0]

@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_group_ast_goes_through_local_memory(op):
  k = make(matmul(16, 16, 32), GPU, [Opt(op, 0, 8), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 2)])
  ast = k.get_optimized_ast()
  assert isinstance(ast.arg, KernelInfo) and ast.arg.local_dims == k.local_dims and ast.arg.upcasted == k.upcasted
  stores = _local_stores(ast)
  assert len(stores) == 1
  loads = [x for x in ast.lazyops if x.op is BufferOps.LOAD and x.arg.idx < 0]
  assert len(loads) == 1 and loads[0].src == (stores[0],)
  # the second stage reduces the loaded partials
  second = [x for x in ast.lazyops if x.op is ReduceOps.SUM and x.src[0] is loads[0]]
  assert len(second) == 1
  # the local buffer holds one partial per local thread x group thread x upcast lane
  assert stores[0].arg.st.size == 4 * 8 * 2
  verify_ast(ast)

def test_ungrouped_ast_has_no_local_buffer():
  k = make(matmul(16, 16, 32), GPU, [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UNROLL, 0, 4)])
  ast = k.get_optimized_ast()
  assert not _local_stores(ast) and isinstance(ast.arg, KernelInfo)
  verify_ast(ast)

# ---- they compute the right answer ----------------------------------------------------------------

def opencl():
  try: return Device["OPENCL"]
  except Exception as e: pytest.skip(f"OPENCL device unavailable here: {type(e).__name__}: {e}")

def run(k, inputs, device):
  p = k.to_program()
  outs = [Buffer(device, x.arg.st.real_size(), x.arg.dtype).allocate() for x in k.ast.src]
  ins = [Buffer(device, a.size, dtypes.from_np(a.dtype)).allocate().copyin(a) for a in inputs]
  CompiledRunner(p)(outs + ins)
  return outs[0].numpy()

MM_OPTS = {
  "group": [Opt(OptOps.GROUP, 0, 4)],
  "grouptop": [Opt(OptOps.GROUPTOP, 0, 8)],
  "group-whole": [Opt(OptOps.GROUP, 0, 0)],
  "group+local+upcast": [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.LOCAL, 0, 5), Opt(OptOps.UPCAST, 1, 4)],
  "grouptop+unroll+upcast": [Opt(OptOps.GROUPTOP, 0, 4), Opt(OptOps.UNROLL, 1, 0), Opt(OptOps.UPCAST, 0, 5)],
  "padto-global": [Opt(OptOps.PADTO, 0, 32)],
  "padto-both-globals+local": [Opt(OptOps.PADTO, 0, 32), Opt(OptOps.PADTO, 1, 32), Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.UPCAST, 0, 4)],
  "padto-reduce": [Opt(OptOps.PADTO, 2, 32)],
  "padto-reduce+group": [Opt(OptOps.PADTO, 2, 32), Opt(OptOps.GROUP, 0, 8)],
  "grouptop+padto-green": [Opt(OptOps.GROUPTOP, 0, 4), Opt(OptOps.PADTO, 2, 8)],
  "swap": [Opt(OptOps.SWAP, 0, 1)],
  "swap+local+upcast": [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 5)],
  "nolocals+upcast+unroll": [Opt(OptOps.NOLOCALS, 0, 0), Opt(OptOps.UPCAST, 0, 5), Opt(OptOps.UNROLL, 0, 4)],
  "local+upcast+unroll": [Opt(OptOps.LOCAL, 0, 5), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.UPCAST, 0, 5), Opt(OptOps.UNROLL, 0, 4)],
}

@pytest.mark.parametrize("name", list(MM_OPTS))
def test_opencl_matmul_runs(name, rng):
  dev = opencl()
  k = make(matmul(25, 20, 16), dev.renderer, MM_OPTS[name])
  assert k.applied_opts == MM_OPTS[name]
  inputs, ref = np_matmul(25, 20, 16, rng)
  np.testing.assert_allclose(run(k, inputs, "OPENCL").reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("opts", [[Opt(OptOps.PADTO, 0, 32)], [Opt(OptOps.PADTO, 2, 32)], [Opt(OptOps.SWAP, 0, 1)],
                                  [Opt(OptOps.PADTO, 0, 32), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4)],
                                  [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UPCAST, 1, 8)]],
                         ids=["padto-global", "padto-reduce", "swap", "padto+upcast+unroll", "swap+padto+upcast"])
def test_cpu_matmul_runs(opts, rng):
  k = make(matmul(25, 20, 16), Device["CPU"].renderer, opts)
  inputs, ref = np_matmul(25, 20, 16, rng)
  np.testing.assert_allclose(run(k, inputs, "CPU").reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("opts", [[Opt(OptOps.PADTO, 1, 32)], [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.GROUP, 0, 4)],
                                  [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.UNROLL, 1, 4)],
                                  [Opt(OptOps.PADTO, 0, 8), Opt(OptOps.PADTO, 1, 32), Opt(OptOps.LOCAL, 0, 8)]],
                         ids=["padto", "padto+group", "padto+grouptop+unroll", "padto-both+local"])
def test_opencl_padded_reduce_masks_consts(opts, rng):
  """Padding a SUM's reduce axis is safe only if the CONSTs under it read 0 in the padding too."""
  dev = opencl()
  x = rng.random((5, 25), dtype=np.float32)
  k = make(affine_sum_ast(5, 25), dev.renderer, opts)
  np.testing.assert_allclose(run(k, [x], "OPENCL").reshape(5, 1), np_affine_sum(x), rtol=1e-5)

def test_cpu_padded_reduce_masks_consts(rng):
  x = rng.random((5, 25), dtype=np.float32)
  k = make(affine_sum_ast(5, 25), Device["CPU"].renderer, [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UNROLL, 0, 8)])
  np.testing.assert_allclose(run(k, [x], "CPU").reshape(5, 1), np_affine_sum(x), rtol=1e-5)

@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_opencl_grouped_sum_and_max(op, rng):
  dev = opencl()
  x = rng.standard_normal((6, 256), dtype=np.float32)
  k = make(reduce_ast((6, 256), (1,), ReduceOps.SUM), dev.renderer, [Opt(op, 0, 16)])
  np.testing.assert_allclose(run(k, [x], "OPENCL"), x.sum(1), rtol=1e-4, atol=1e-4)
  k = make(reduce_ast((6, 256), (1,), ReduceOps.MAX), dev.renderer, [Opt(op, 0, 16)])
  np.testing.assert_array_equal(run(k, [x], "OPENCL"), x.max(1))

def test_two_groups(rng):
  """Two GROUPs on one reduce: two green axes, one local buffer holding both, one second stage."""
  k = make(matmul(25, 20, 16), GPU, [Opt(OptOps.GROUP, 0, 2), Opt(OptOps.GROUP, 0, 2)])
  assert k.colors() == ["blue", "blue", "green", "green", "red"] and k.group_for_reduces == 2
  stores = _local_stores(k.get_optimized_ast())
  assert len(stores) == 1 and stores[0].arg.st.size == 2 * 2
  dev = opencl()
  k = make(matmul(25, 20, 16), dev.renderer, [Opt(OptOps.GROUP, 0, 2), Opt(OptOps.GROUP, 0, 2)])
  inputs, ref = np_matmul(25, 20, 16, rng)
  np.testing.assert_allclose(run(k, inputs, "OPENCL").reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
@pytest.mark.parametrize("opt", [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2)], ids=["upcast", "unroll"])
def test_max_reduce_with_vector_accumulator(device, opt, rng):
  """Regression: the accumulator's per-lane reads were hoisted out of the reduce loop (fixed in 77c17b6)."""
  dev = opencl() if device == "OPENCL" else Device["CPU"]
  x = rng.random((6, 40), dtype=np.float32)
  k = make(reduce_ast((6, 40), (1,), ReduceOps.MAX), dev.renderer, [opt])
  np.testing.assert_array_equal(run(k, [x], device), x.max(1))
