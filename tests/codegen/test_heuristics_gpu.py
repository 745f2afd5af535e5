"""The GPU hand-coded opts against the reference's (tinygrad 0.9.2; issue 27 item 8): on kernels the
reference scheduled (tilecraft/testing/heuristic_reference.py), the opts it chooses for grouped
reduces (GROUPTOP 256 only for outputs of at most 32 elements, else 16; nothing after a GROUP),
matrix-vector products (batched ones too), a second unroll of a short reduce, and workgroups
(expand axes first, sizes of 3 allowed); masked (stack/cat) axes upcast several at a time. The
kernels chosen run on the PYTHON device (a GPU emulator) against numpy. tilecraft's one measured departure, the
GPU_FILL rule (memory-bound reduces grouped until the kernel has 2^17 threads), is compared with the reference under
GPU_FILL=0 and tested on its own below."""
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel, OptOps
from tilecraft.device import Device
from tilecraft.renderer.cstyle import OpenCLRenderer
from tilecraft.testing.fuzz import run_program
from tilecraft.testing.heuristic_reference import KERNELS
from tilecraft.testing.tc_cases import np_eval, reference_ast

def hand(ast, ren=None):
  k = Kernel(ast, opts=ren or OpenCLRenderer())
  k.hand_coded_optimizations()
  return k

def opts(k): return [(o.op.name, o.axis, o.amt) for o in k.applied_opts]

# where tilecraft's other rules (register-tile upcasts for data reuse, the upcast of an output axis
# when none is) still differ from the reference's, only the rules of item 8 are compared
SAME = ["sum_4096", "sum_rows_8x1024", "sum_rows_32x4096", "sum_rows_64x1024", "sum_cols_1024x64", "matvec_4096", "matvec_t_4096",
        "matvec_batched_4x1024x256", "matvec_batched_t_4x256x1024", "elementwise_6x6x6", "matmul_64_float"]

@pytest.mark.parametrize("name", SAME)
def test_same_opts_as_the_reference(name):
  ast_data, full_shape, ref = KERNELS[name]
  assert Kernel(reference_ast(ast_data)).full_shape == full_shape
  with Context(GPU_FILL=0): k = hand(reference_ast(ast_data))
  assert _without_accuracy_unroll(k) == [tuple(o) for o in ref], k.applied_opts_reasons

def _without_accuracy_unroll(k):
  """The opts less tilecraft's one addition to the reference's grouped reduces: the serial part of a
  long float sum unrolled by 4 (4 accumulators per thread), the last opt after a GROUP/GROUPTOP."""
  got = opts(k)
  if k.group_for_reduces and "accuracy" in k.applied_opts_reasons[-1]:
    assert got[-1][0] == "UNROLL" and got[-1][2] == 4
    return got[:-1]
  return got

def test_second_short_reduce_is_unrolled_and_locals_as_the_reference():
  """conv 3x3: both 3-wide window axes unrolled; the workgroup is the reference's (16 x 8 on the output
  axes the weights are broadcast along)."""
  ast_data, _, ref = KERNELS["conv3x3_16x16x32"]
  got = opts(hand(reference_ast(ast_data)))
  assert [o for o in got if o[0] in ("UNROLL", "LOCAL")] == [tuple(o) for o in ref if o[0] in ("UNROLL", "LOCAL")], got
  ast_data, _, ref = KERNELS["elementwise_3x96x64"]
  got = opts(hand(reference_ast(ast_data)))
  assert [o for o in got if o[0] == "LOCAL"] == [tuple(o) for o in ref if o[0] == "LOCAL"], got

def test_nothing_after_a_group():
  """After a GROUP/GROUPTOP only the accuracy unroll of a long float sum's serial part follows: a
  float32 mean of 2^22 values on a GPU keeps 4 accumulators per thread."""
  k = hand(reference_ast(KERNELS["sum_rows_64x1024"][0]))
  assert opts(k) == [("GROUP", 0, 256)]  # (GPU_FILL: 64 x 256 threads, a serial part of 4)
  with Context(GPU_FILL=0): k = hand(reference_ast(KERNELS["sum_rows_64x1024"][0]))
  assert opts(k) == [("GROUPTOP", 0, 16), ("UNROLL", 1, 4)] and "accuracy" in k.applied_opts_reasons[-1]
  k = hand(reference_ast(KERNELS["matvec_batched_4x1024x256"][0]))
  assert k.group_for_reduces and not any(o.op is OptOps.UNROLL for o in k.applied_opts), k.applied_opts
  with Context(GPU_FILL=0): k = hand(reference_ast(KERNELS["sum_rows_8x1024"][0]))  # 256 threads leave a serial part of 4: nothing
  assert opts(k) == [("GROUPTOP", 0, 256)]

def _threads(k) -> int:
  p = k.to_program()
  return int(np.prod(p.global_size or [1]) * np.prod(p.local_size or [1]))

@pytest.mark.parametrize("shape,axis,op,group", [((4096, 4096), 1, "GROUP", 32), ((64, 1024), 1, "GROUP", 256), ((512, 768), 1, "GROUP", 256),
                                                 ((1 << 22,), 0, "GROUP", 256), ((8, 64, 56, 56), (2, 3), "GROUP", 64),
                                                 ((4096, 4096), 0, "GROUPTOP", 32), ((8, 512, 768), 1, "GROUPTOP", 32), ((512, 64), 0, "GROUPTOP", 32)],
                         ids=["rows_4096x4096", "rows_64x1024", "rows_512x768", "sum_4M", "mean_hw", "cols_4096x4096", "seq_mean", "cols_512x64"])
def test_memory_bound_reduce_is_grouped_to_fill_the_gpu(shape, axis, op, group):
  """GPU_FILL: a reduce that reads each input once is split across `group` threads per output, the smallest group that
  reaches 2^17 threads in all (else the largest dividing the reduce): along contiguous rows 16..256 threads (GROUP);
  across contiguous outputs (column sums) up to 32 threads (GROUPTOP), with a warp of 32 consecutive outputs (LOCAL).
  Under GPU_FILL=0 the reference's layout (one thread per output, 1024 threads for 4096 rows). The chosen kernel runs
  right on PYTHON."""
  t = Tensor.empty(*shape, device="PYTHON").sum(axis)
  ast = t.schedule()[0].ast
  k = hand(ast, Device["PYTHON"].renderer)
  assert (opts(k)[0][0], opts(k)[0][2]) == (op, group), k.applied_opts_reasons
  if op == "GROUPTOP": assert opts(k)[1][0] == "LOCAL" and opts(k)[1][2] == 32, k.applied_opts_reasons
  assert "each input once" in k.applied_opts_reasons[0]
  out = int(np.prod(k.output_shape))
  red = int(np.prod(shape)) // out
  amts = (16, 32, 64, 128, 256) if op == "GROUP" else (2, 4, 8, 16, 32)
  assert _threads(k) == out * group and (out * group >= 1 << 17 or group == max(g for g in amts if red % g == 0))
  with Context(GPU_FILL=0): k0 = hand(ast, Device["PYTHON"].renderer)
  assert "each input once" not in " ".join(k0.applied_opts_reasons) and _threads(k0) < _threads(k)
  if np.prod(shape) <= 1 << 16:  # (the emulator runs a thread at a time)
    from tilecraft.testing.fuzz import buffer_size, buffer_views
    rng = np.random.default_rng(1)
    vals = {i: rng.uniform(-1, 1, buffer_size(v)).astype(np.float32) for i, v in buffer_views(ast).items() if i >= len(ast.src)}
    want = np_eval(ast, {i: v.astype(np.float64) for i, v in vals.items()})[0]
    np.testing.assert_allclose(run_program(ast, k.to_program(), vals, "PYTHON")[0].reshape(want.shape), want, rtol=1e-4, atol=1e-4)

def test_grouped_fill_leaves_reuse_and_short_reduces_alone():
  """Not under GPU_FILL: a matmul with a small output (its inputs are shared between outputs: register tiles), a reduce
  too short to share, a strided reduce whose outputs aren't contiguous either (a transpose's column sums)."""
  col = Tensor.empty(4096, 8, 512, device="PYTHON").permute(2, 1, 0).sum(2).schedule()[0].ast
  mm = (Tensor.empty(64, 4096, device="PYTHON") @ Tensor.empty(4096, 64, device="PYTHON")).schedule()[0].ast
  short = Tensor.empty(4096, 128, device="PYTHON").sum(1).schedule()[0].ast
  for ast in (col, mm, short):
    k = hand(ast, Device["PYTHON"].renderer)
    assert not any("each input once" in r for r in k.applied_opts_reasons), k.applied_opts_reasons

def test_several_masked_axes_upcast(rng):
  """A pad of two small axes (7 x 7 after padding, both masked): both are upcast whole (49 lanes), the
  innermost first, as the reference does; the CPU keeps its one-axis rule. It runs right on PYTHON."""
  x = rng.uniform(-1, 1, (64, 5, 6)).astype(np.float32)
  si = (Tensor(x).pad(((0, 0), (1, 1), (0, 1))) + 1).schedule()[-1]
  k = Kernel(si.ast, opts=OpenCLRenderer())
  masked = [a for a in range(k.first_reduce) if k.full_shape[a] <= 7 and any(st.axis_is_masked(a) for st in k.sts)]
  assert len(masked) == 2, k.full_shape
  k.hand_coded_optimizations()
  ups = [o for o in k.applied_opts if o.op is OptOps.UPCAST and o.amt == 0]
  assert [o.axis for o in ups] == masked[::-1], k.applied_opts
  kc = Kernel(si.ast, opts=Device["CPU"].renderer)
  kc.hand_coded_optimizations()
  assert len([o for o in kc.applied_opts if o.op is OptOps.UPCAST and o.amt == 0]) <= 1
  kp = hand(si.ast, Device["PYTHON"].renderer)
  assert kp.applied_opts == k.applied_opts
  got = run_program(si.ast, kp.to_program(), {1: x.reshape(-1)}, "PYTHON")[0]
  np.testing.assert_array_equal(got.reshape(64, 7, 7), np.pad(x, ((0, 0), (1, 1), (0, 1))) + 1)

@pytest.mark.parametrize("name", ["matvec_batched_4x1024x256", "sum_rows_64x1024", "conv3x3_16x16x32", "elementwise_6x6x6"])
def test_hand_coded_gpu_kernels_match_numpy(name):
  """The opts chosen on the PYTHON device (a GPU: workgroups, local memory) compute what the AST means."""
  ast = reference_ast(KERNELS[name][0])
  k = hand(ast, Device["PYTHON"].renderer)
  assert k.applied_opts == hand(ast).applied_opts  # the same rules as on OpenCL
  from tilecraft.testing.fuzz import buffer_size, buffer_views
  rng = np.random.default_rng(0)
  views = buffer_views(ast)
  vals = {i: rng.uniform(-1, 1, buffer_size(v)).astype(np.float32) for i, v in views.items() if i >= len(ast.src)}
  want = np_eval(ast, {i: v.astype(np.float64) for i, v in vals.items()})[0]
  got = run_program(ast, k.to_program(), vals, "PYTHON")[0].reshape(want.shape)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
