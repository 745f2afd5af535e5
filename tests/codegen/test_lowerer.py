"""Lowering's index arithmetic: int32 where every value (and partial sum) fits, int64 wherever a
buffer, view, loop bound, constant index or closed-form count can pass 2^31 (DESIGN §3). The
default tier uses kernels whose offsets pass 2^31 through strides, expands and masks over tiny
buffers; the slow tier uses real multi-GB buffers."""
import re
from typing import Optional
import numpy as np
import pytest
from tilecraft import Context, Tensor, dtypes
from tilecraft.codegen.kernel import Kernel
from tilecraft.codegen.lower_index import _needs_int64
from tilecraft.device import Device
from tilecraft.shape.symbolic import Variable

I64 = {"CPU": "long long", "OPENCL": "long", "CUDA": "long long"}
SUFFIX = {"CPU": "ll", "OPENCL": "l", "CUDA": "ll"}

def source(t: Tensor, device: str, opts: Optional[str] = "hand") -> str:
  """The rendered source of t's last kernel: unoptimized (required opts only) or hand-coded."""
  k = Kernel(t.schedule()[-1].ast, opts=Device[device].renderer)
  k = k.hand_coded_optimizations() if opts == "hand" else k.required_optimizations()
  return k.to_program().src

@pytest.mark.parametrize("noopt", [1, 0], ids=["noopt", "hand"])
def test_closed_form_count_past_int32(device: str, noopt: int) -> None:
  """arange-style windows of 2^32+6 masked ones: each row's count depends on the row, so it is
  computed in the kernel, in int64 (in int32 it came out as 3..6)."""
  N, k = 2**32 + 6, 3
  w = Tensor.full((1,), 1, dtypes.int64, device=device).expand(N).pad(((k, 0),))._windows(N)
  with Context(NOOPT=noopt, SPLIT_REDUCE=0): got = w.sum(1).numpy()  # (one kernel: its loop is past int32)
  np.testing.assert_array_equal(got, N - k + np.arange(k + 1, dtype=np.int64))
  np.testing.assert_array_equal(w.sum(1).numpy(), got)  # (split into partial reduces)
  if noopt:
    with Context(SPLIT_REDUCE=0): src = source(w.sum(1), device, None)
    assert f"4294967302{SUFFIX[device]}" in src and "-6" not in src, src

def test_sum_of_ones_past_int32(device: str) -> None:
  assert Tensor.ones(2**32 + 6, dtype=dtypes.int64, device=device).sum().item() == 2**32 + 6
  assert Tensor.ones(2**32 + 6, device=device).sum().item() == np.float32(2**32 + 6)  # 6.0 when the count was int32
  np.testing.assert_array_equal(Tensor.ones(3, 2**31 + 1, dtype=dtypes.int64, device=device).sum(1).numpy(), np.full(3, 2**31 + 1))
  assert Tensor.ones(2**31 + 1, dtype=dtypes.int64, device=device).reshape(1, -1).expand(2, -1).sum().item() == 2 * (2**31 + 1)

def test_strided_view_past_int32(device: str) -> None:
  """A stride of 7e8 over a 3-element buffer expanded to 3e9 elements: the flat offsets of the 5
  outputs reach 2.8e9, so the index math is int64 even though every load hits the tiny buffer."""
  M, S = 10**9 + 7, 7 * 10**8 + 1
  b = np.array([3., 5., 7.], np.float32)
  x = Tensor(b, device=device).reshape(3, 1).expand(3, M).reshape(3 * M)[::S] + 0
  assert f"({I64[device]})" in source(x, device)
  np.testing.assert_array_equal(x.numpy(), b[np.arange(5) * S // M])

@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_loop_bounds_past_int32_are_64bit(device: str) -> None:
  """Rendered only (running them needs GBs): a loop or id over 2^31+5 elements counts in int64."""
  n = 2**31 + 5
  big = Tensor.empty(n, dtype=dtypes.uint8, device=device)
  for opts in (None, "hand"):
    with Context(SPLIT_REDUCE=0): src = source(big.max(), device, opts)  # (one kernel, not partial reduces)
    if device == "CPU" or opts is None: assert re.search(rf"for \({I64[device]} ridx\d+ = 0{SUFFIX[device]}; ridx\d+ < 2147483653{SUFFIX[device]};", src), src
    assert "2147483653" in src and "-2147483643" not in src, src
  src = source(big + 1, "CPU", None)
  assert re.search(r"for \(long long gidx0 = 0ll; gidx0 < 2147483653ll;", src), src
  src = source(big[2**31 + 3] + 1, device, None)
  assert f"[2147483651{SUFFIX[device]}]" in src, src

@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_small_kernels_keep_int32(device: str) -> None:
  a = Tensor.empty(1000, 1000, device=device)
  for t in (a.sum(1), a + 1, a.T.contiguous()):
    for opts in (None, "hand"):
      src = source(t, device, opts)
      assert I64[device] not in src, src

def test_needs_int64_sees_partial_sums_and_bounds() -> None:
  a, b = Variable("a", 0, 1), Variable("b", 0, 1)
  assert not _needs_int64(a * 2**30 + 5) and not _needs_int64(2**31 - 1) and _needs_int64(2**31) and _needs_int64(-2**31)
  e = a * 2**30 + b * 2**30 - 2**30  # its value fits in int32, the partial sum a*2^30 + b*2^30 doesn't
  assert e.vmax <= 2**31 - 1 and e.vmin >= -2**31 + 1 and _needs_int64(e)
  assert _needs_int64(Variable("r", 0, 2**31) // 7) and _needs_int64((a < 2**31 + 3)) is False  # a < big folds to 1
  assert _needs_int64(Variable("s", 0, 2**31 + 4) < 2**31 + 3)

# ---- real memory past 2^31 elements (GBs) ----------------------------------------------------------------

@pytest.mark.slow
def test_uint8_buffer_past_int32_reduces() -> None:
  n = 2**31 + 2**15 + 7
  x = np.zeros(n, np.uint8)
  x[[0, 2**31 - 1, 2**31, 2**31 + 2**15 + 3, n - 1]] = [1, 2, 3, 200, 9]
  t = Tensor(x)
  del x
  assert t.max().item() == 200
  assert t.sum().item() == 1 + 2 + 3 + 200 + 9
  assert t[2**31 + 2**15 + 3].item() == 200 and t[n - 1].item() == 9 and t[2**31 - 1].item() == 2

@pytest.mark.slow
def test_index_past_int32_on_a_real_buffer() -> None:
  n = 2**31 + 4
  x = np.zeros(n, np.uint8)
  x[2**31 + 3] = 7
  t = Tensor(x)
  del x
  assert t[2**31 + 3].item() == 7 and (t[2**31 + 3] + 1).item() == 8
  y = (t[2**31:] * 2).numpy()
  np.testing.assert_array_equal(y, np.array([0, 0, 0, 14], np.uint8))

def test_dependent_reduce_second_loop_and_prefetch() -> None:
  """A reduce reading another reduce's result (softmax's statistics) runs a second loop over the reduce
  axis after the first; on the CPU that loop prefetches the rows of the next outer iteration."""
  from tilecraft.codegen.uops import UOps
  from tilecraft.testing import fuzz
  from tilecraft.testing.corpus import corpus
  e = corpus()["softmax_stats_6x40"]
  from tilecraft.codegen.kernel import Opt, OptOps
  opts = [Opt(OptOps.UNROLL, 0, 8)]  # vector loads along the row
  k = fuzz.build_kernel(e.ast, opts, "CPU")
  p = k.to_program()
  ranges = [u for u in k.uops if u.op is UOps.RANGE and u.arg[0] == "reduce"]
  assert [u.arg[1] for u in ranges] == [1, 1] and ranges[1].arg[2] == 1  # one loop per reduce, the dependent one second
  pre = [u for u in k.uops if u.op is UOps.PREFETCH]
  assert pre and "__builtin_prefetch" in p.src
  assert k.uops.index(ranges[1]) < k.uops.index(pre[0])  # inside the second loop
  inputs = fuzz.entry_inputs(e)
  got = fuzz.run_ast(e.ast, inputs, opts, "CPU")
  for g, w in zip(got, e.reference(inputs, {})): np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-5, atol=1e-6)
  assert "PREFETCH" not in fuzz.build_kernel(e.ast, opts, "PYTHON").to_program().src  # only targets with has_prefetch

def _reduce_updates(k):
  """The value each accumulator's PHI stores, per accumulator."""
  from tilecraft.codegen.uops import UOps
  return [u.src[1] for u in k.uops if u.op is UOps.PHI]

@pytest.mark.parametrize("co,chained", [(8, True), (1, False)])
def test_unrolled_sum_chains_into_many_accumulators(co, chained) -> None:
  """A conv with kx unrolled: with 8 accumulators (8 output channels) each term is added into the
  accumulator in turn (one FMA each); with 1, the terms are summed first (a tree, off the
  accumulator's chain). Both vs numpy."""
  import importlib.util
  from pathlib import Path
  from tilecraft.codegen.kernel import Opt, OptOps
  from tilecraft.codegen.uops import UOps
  from tilecraft.device import Buffer, CompiledRunner
  from tilecraft.ops import BinaryOps
  spec = importlib.util.spec_from_file_location("_tc_bench_common", Path(__file__).resolve().parents[2] / "bench" / "common.py")
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)  # type: ignore[union-attr]
  k = Kernel(bench.conv3x3_ast(3, 8, 5, 8), Device["CPU"].renderer)
  for o in [Opt(OptOps.UPCAST, 2, 8)] + ([Opt(OptOps.UPCAST, 0, co)] if co > 1 else []) + [Opt(OptOps.UNROLL, 2, 0)]: k.apply_opt(o)
  k.linearize()
  ups = _reduce_updates(k)
  assert len(ups) == co
  for u in ups:
    depth, x = 0, u
    while x.op is UOps.ALU and x.arg is BinaryOps.ADD and x.src[0].op is not UOps.ACCREAD: x, depth = x.src[0], depth + 1
    assert (depth == 2) == chained and x.src[0].op is UOps.ACCREAD, (co, depth)  # acc + t0 + t1 + t2, left to right
  rng = np.random.default_rng(0)
  img, w = rng.random((3, 5, 8), dtype=np.float32), rng.random((8, 3, 3, 3), dtype=np.float32)
  out = Buffer("CPU", 8 * 40, dtypes.float32).allocate()
  CompiledRunner(k.to_program())([out, Buffer("CPU", img.size, dtypes.float32).copyin(img), Buffer("CPU", w.size, dtypes.float32).copyin(w)])
  np.testing.assert_allclose(out.numpy().reshape(8, 5, 8), bench.numpy_conv3x3(img, w), rtol=1e-5)

def test_c_offset_addressing() -> None:
  """The C renderer writes data[x+c] as (data+x)[c] (base + displacement addressing under -fwrapv)."""
  a, b = Tensor(np.arange(64, dtype=np.float32)), Tensor(np.ones(64, dtype=np.float32))
  src = Kernel((a.reshape(8, 8)[:, 1:] + b.reshape(8, 8)[:, :7]).schedule()[-1].ast, Device["CPU"].renderer).to_program().src
  assert re.search(r"\(data1\+\w+\)\[1\]", src) and not re.search(r"data\d\[\(\w+\+\d+\)\]", src), src
  np.testing.assert_array_equal((a.reshape(8, 8)[:, 1:] + b.reshape(8, 8)[:, :7]).numpy(), np.arange(64, dtype=np.float32).reshape(8, 8)[:, 1:] + 1)

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("op", ["max", "sum"])
def test_vector_accumulator_lanes_combine_in_vector_halves(device: str, op: str) -> None:
  """A row reduce whose accumulator is a vector (UNROLL of the contiguous reduce axis) combines its lanes as vectors,
  half against half (16 -> 8 -> 4 -> 2 lanes, then the last pair), where the target has the vector op; the max keeps
  NaN and the -inf/+inf cases numpy has."""
  from tilecraft.codegen.kernel import Opt, OptOps
  from tilecraft.codegen.uops import UOps
  rng = np.random.default_rng(5)
  x = rng.standard_normal((6, 64)).astype(np.float32)
  x[1, 37], x[2, :], x[3, 5], x[4, 63] = np.nan, -np.inf, np.inf, np.nan
  if op == "sum": x[1:5] = rng.standard_normal((4, 64)).astype(np.float32)
  t = Tensor(x, device=device)
  t = t.max(-1) if op == "max" else t.sum(-1)
  k = Kernel(t.schedule()[-1].ast, opts=Device[device].renderer)
  k.apply_opt(Opt(OptOps.UNROLL, 0, 16))
  prog = k.to_program()
  alu = "MAX" if op == "max" else "ADD"
  widths = sorted({u.dtype.count for u in k.uops if u.op is UOps.ALU and u.arg.name == alu and u.dtype.count > 1})
  vector_alu = Device[device].renderer.vector_alu
  assert widths == ([2, 4, 8, 16] if any(o.name == alu for o in vector_alu) else []), widths
  from tilecraft.device import Buffer, CompiledRunner
  out = Buffer(device, 6, dtypes.float32).allocate()
  CompiledRunner(prog)([out, Buffer(device, x.size, dtypes.float32).copyin(x)])
  want = x.max(-1) if op == "max" else x.astype(np.float64).sum(-1)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
