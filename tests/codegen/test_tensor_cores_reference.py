"""Tensor cores on kernels the reference (tinygrad 0.9.2) scheduled (tilecraft/testing/tc_reference.py,
collected by scripts/tc_reference_collect.py): the same shapes, the same (N, M, K) axes for each
Opt(TC, axis, tc_opt), every TC opt the reference accepts accepted here on the same core, and
each of them run with the real instruction on the PYTHON device under EMULATE=CUDA|METAL|AMD
against numpy. Also the issue-27 reproductions: the reference's SUM(CAST(MUL)) form, the
frontend's half matmul getting a tensor core on every vendor, and what WMMA's product means."""
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.codegen.tensor_cores import tc_choices
from tilecraft.codegen.uops import UOps
from tilecraft.device import Device
from tilecraft.dtype import dtypes
from tilecraft.helpers import Context
from tilecraft.ops import BinaryOps, BufferOps, ReduceOps, UnaryOps
from tilecraft.testing.fuzz import run_program
from tilecraft.testing.tc_cases import reference_ast, reference_case
from tilecraft.testing.tc_reference import KERNELS

VENDORS = ("CUDA", "METAL", "AMD")
# tilecraft accepts more than the reference only here: a half reduce (acc_dtype=half) on CUDA, which has
# no half -> half core, runs on the half -> float core and is rounded to half once at the end
EXTRA = {("matmul_acc_half", "CUDA", tc_opt, 0) for tc_opt in (0, 1, 2)}

def core_name(name: str) -> str: return name.replace("__bf16", "bfloat16")  # the reference's name for bfloat16

def ours(ast, vendor, n_axes):
  """{(tc_opt, axis): core} of every TC opt apply_tensor_cores accepts here (use 1, no extra opts)."""
  out = {}
  with Context(EMULATE=vendor):
    ren = Device["PYTHON"].renderer
    for tc_opt in (0, 1, 2):
      for axis in range(n_axes + 1):
        k = Kernel(ast, opts=ren)
        if k.apply_tensor_cores(1, axis=axis, tc_opt=tc_opt): out[(tc_opt, axis)] = str(k.tensor_core)
  return out

@pytest.mark.parametrize("name", sorted(KERNELS))
def test_same_shape_and_axis_numbering(name):
  """Our Kernel sees the reference's shape, and each TC axis number picks the reference's (N, M, K)
  axes: N where the MUL's first operand is broadcast, M where the second is, counted from the end."""
  ast_data, full_shape, choices, accepted, _ = KERNELS[name]
  ast = reference_ast(ast_data)
  assert Kernel(ast).full_shape == full_shape
  for vendor in accepted:
    with Context(EMULATE=vendor): assert tc_choices(Kernel(ast, opts=Device["PYTHON"].renderer), 2)[3] == choices, vendor

@pytest.mark.parametrize("vendor", VENDORS)
def test_accepts_what_the_reference_accepts(vendor):
  """Every (axis, tc_opt) the reference's apply_tensor_cores accepts is accepted here on the same core,
  and the rest is declined (False) except the one documented extension (EXTRA)."""
  for name, (ast_data, _, choices, accepted, _) in KERNELS.items():
    want = {(tc_opt, axis): core_name(core) for tc_opt, lst in accepted.get(vendor, {}).items() for axis, core in lst}
    got = ours(reference_ast(ast_data), vendor, len(choices))
    assert {key: got.get(key) for key in want} == want, name
    assert {(name, vendor) + key for key in got if key not in want} <= EXTRA, name

def _check_runs(vendor, names):
  """Run every TC opt the reference accepts on these kernels (each distinct layout once: tc_opts that
  lay a kernel out alike run once) with use 1 on PYTHON, against numpy."""
  for name in names:
    ast, inputs, want = reference_case(name, seed=VENDORS.index(vendor))
    done = set()
    for tc_opt, axis in [(t, a) for t, lst in sorted(KERNELS[name][3].get(vendor, {}).items()) for a, _ in lst]:
      with Context(EMULATE=vendor):
        k = Kernel(ast, opts=Device["PYTHON"].renderer)
        assert k.apply_tensor_cores(1, axis=axis, tc_opt=tc_opt), (name, tc_opt, axis)
        key = (tuple(k.sts), str(k.tensor_core))
        if key in done: continue
        done.add(key)
        p = k.to_program()
        got = run_program(ast, p, inputs, "PYTHON")[0].astype(np.float64).reshape(want.shape)
      assert any(u.op is UOps.WMMA for u in p.uops), (name, tc_opt, axis)
      half = ast.src[0].arg.dtype != dtypes.float32 or any(x.dtype == dtypes.float16 for x in ast.lazyops if x.op is BufferOps.LOAD)
      np.testing.assert_allclose(got, want, rtol=1e-2 if half else 1e-4, atol=1e-2 if half else 1e-4,
                                 err_msg=f"{name} on {vendor}, Opt(TC, {axis}, {tc_opt}): {k.colored_shape()}")

# a default-tier selection that covers each pattern (SUM(CAST(MUL)), SUM(MUL), CAST operands, bfloat16),
# several reduce axes, padding, a batched and a broadcast-batch matmul, an epilogue; the rest is slow
QUICK = ["matmul_64x64x64_half", "matmul_61x67x45_half", "batched_3x32x32x32_half", "bias_relu_64x32x64_half", "conv3x3_half",
         "matmul_acc_half", "matmul_float_cast_to_half", "matmul_b_batched_32x32x32x3_half", "matmul_64x64x64_float", "matmul_61x67x45_bf16"]

@pytest.mark.parametrize("vendor", VENDORS)
def test_reference_tc_opts_match_numpy(vendor):
  _check_runs(vendor, QUICK)

@pytest.mark.slow
@pytest.mark.parametrize("vendor", VENDORS)
def test_reference_tc_opts_match_numpy_all(vendor):
  _check_runs(vendor, sorted(set(KERNELS) - set(QUICK)))

# ---- the reproductions ----------------------------------------------------------------------

def test_sum_of_cast_of_mul_gets_a_tensor_core_at_every_tc_opt():
  """The reference's half matmul with float accumulation, SUM(CAST(MUL(LOAD half, LOAD half)) -> float),
  was refused on CUDA, METAL and AMD at every tc_opt ("the reduce must be a SUM of a MUL, found CAST")."""
  ast = reference_ast(KERNELS["matmul_32x48x64_half"][0])
  red = next(x for x in ast.lazyops if x.op is ReduceOps.SUM)
  assert red.src[0].op is UnaryOps.CAST and red.src[0].arg == dtypes.float32 and red.src[0].src[0].op is BinaryOps.MUL
  assert all(s.op is BufferOps.LOAD and s.dtype == dtypes.float16 for s in red.src[0].src[0].src)
  for vendor in VENDORS:
    with Context(EMULATE=vendor):
      for tc_opt in (0, 1, 2):
        k = Kernel(ast, opts=Device["PYTHON"].renderer)
        assert k.apply_tensor_cores(1, tc_opt=tc_opt), (vendor, tc_opt)
        assert k.tensor_core.dtype_in == dtypes.float16 and k.tensor_core.dtype_out == dtypes.float32

@pytest.mark.parametrize("vendor", VENDORS)
def test_frontend_half_matmul_gets_a_tensor_core(vendor, rng):
  """a @ b of half tensors (float32 products of the half values, summed in float32: SUM(MUL(CAST(LOAD),
  CAST(LOAD)))) takes the half -> float core with the default settings (TC=1, TC_OPT=0) on every vendor,
  and is as accurate as numpy's float32-accumulating matmul (within 1e-3 of the exact product)."""
  from tilecraft.engine import plan_cache
  a, b = rng.uniform(-1, 1, (64, 256)).astype(np.float16), rng.uniform(-1, 1, (256, 48)).astype(np.float16)
  with Context(EMULATE=vendor):
    out = (Tensor(a, device="PYTHON") @ Tensor(b, device="PYTHON")).numpy()
    progs = [r.p for r in plan_cache.runners.values() if r.p.device == "PYTHON" and r.p.applied_opts and r.p.applied_opts[0].op is OptOps.TC
             and r.p.applied_opts[0] == Opt(OptOps.TC, 0, 0) and any(u.op is UOps.WMMA and "half_float" in u.arg[0] for u in r.p.uops)]
  assert progs, f"no half -> float WMMA program ran on {vendor}"
  exact = a.astype(np.float64) @ b.astype(np.float64)
  assert np.linalg.norm(out.astype(np.float64) - exact) / np.linalg.norm(exact) < 1e-3

def test_wmma_product_is_exact_where_the_ast_rounds_it_to_half():
  """SUM(CAST(MUL(half, half)) -> float) says: round each product to half, then sum in float. A tensor
  core doesn't round the product (half x half is exact in float32): use 1 gives the exact sum, use 2
  (plain MUL/SUM in the same layout) the AST's. Documented in docs/architecture.md."""
  ast = _float_output(reference_ast(KERNELS["matmul_64x64x64_half"][0]))  # STORE(CAST half(SUM(CAST float(MUL(half, half))))) -> float
  x = np.full(64 * 64, 1 + 2 ** -10, np.float16)  # x*x = 1 + 2^-9 + 2^-20: half keeps 1 + 2^-9
  inputs = {1: x, 2: x}
  with Context(EMULATE="CUDA"):
    res = {}
    for use in (1, 2):
      k = Kernel(ast, opts=Device["PYTHON"].renderer)
      assert k.apply_tensor_cores(use)
      res[use] = run_program(ast, k.to_program(), inputs, "PYTHON")[0].astype(np.float64)
  exact, rounded = 64 * float(np.float32((1 + 2 ** -10) ** 2)), 64 * (1 + 2 ** -9)
  assert np.all(res[1] == exact) and np.all(res[2] == rounded) and exact != rounded

def _float_output(ast):
  """The same kernel storing the float32 sum (no final CAST to half)."""
  from tilecraft.ops import LazyOp, MemBuffer
  st = ast.src[0]
  red = st.src[0].src[0]
  return LazyOp(ast.op, (LazyOp(st.op, (red,), MemBuffer(st.arg.idx, dtypes.float32, st.arg.st)),), ast.arg)

# ---- the hand-coded opts after TC (issue 27 item 8) -------------------------------------------------

@pytest.mark.parametrize("vendor", VENDORS)
def test_hand_coded_tc_extras_are_the_reference(vendor):
  """Where the hand-coded opts take the TC opt the reference's take (axis 0, the lowest tc_opt that
  applies: every matmul here), the opts after it are the reference's too: UPCAST what is left of M,
  then of N, by the largest of 5, 4, 3, 2 dividing it, then LOCAL 4 (or 2) of what is left of N.
  (tilecraft tries each axis choice at the lowest tc_opt first, so where the reference pads a conv's
  3-wide axis at tc_opt 2, it takes an unpadded choice at tc_opt 1: not compared.)"""
  compared = 0
  for name, (ast_data, _, _, _, extras) in KERNELS.items():
    if vendor not in extras: continue
    with Context(EMULATE=vendor, TC_OPT=2):
      k = Kernel(reference_ast(ast_data), opts=Device["PYTHON"].renderer).hand_coded_optimizations()
    got = [(o.op.name, o.axis, o.amt) for o in k.applied_opts]
    if got[0] != tuple(extras[vendor][0]): continue
    assert got == [tuple(o) for o in extras[vendor]], name
    compared += 1
  assert compared >= 12
