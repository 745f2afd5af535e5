"""Vector compares and selects on the C renderer (bool vectors as int lane vectors): relu and
where(a < b, ...) stay vector code, and agree with numpy bit for bit, NaN and -0.0 included, on
every vector dtype and both vector widths."""
import re
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from op_checks import require_arch

ARCHS = ("native", "haswell")
SPECIAL = [np.nan, -0.0, 0.0, -1.0, 1.0, np.inf, -np.inf, 1e-45, -1e-45]

def _src(t: Tensor) -> str:
  return Kernel(t.schedule()[-1].ast, Device["CPU"].renderer).hand_coded_optimizations().to_program().src

def _same(got, want):
  assert got.dtype == want.dtype and got.shape == want.shape
  assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), np.nonzero(got != want)  # bit for bit: -0.0 and NaN too

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_relu_is_vector_code_and_exact(arch, dt, rng):
  require_arch(arch)
  x = np.concatenate([np.array(SPECIAL * 8), rng.standard_normal(952)]).astype(dt)
  with Context(CPU_ARCH=arch):
    assert "tc_where_" in _src(Tensor(x).relu())
    got = Tensor(x).relu().numpy()
  _same(got, np.where(x < 0, dt(0), x))

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32, np.int64])
def test_compare_select_matches_numpy(arch, dt, rng):
  require_arch(arch)
  a = (rng.integers(-4, 4, (33, 64)) * (1.5 if dt in (np.float32, np.float64) else 1)).astype(dt)
  b = (rng.integers(-4, 4, (33, 64)) * (1.5 if dt in (np.float32, np.float64) else 1)).astype(dt)
  if dt in (np.float32, np.float64): a.flat[::17], b.flat[::23] = np.nan, -0.0
  A, B = Tensor(a), Tensor(b)
  with Context(CPU_ARCH=arch):
    assert "tc_where_" in _src((A < B).where(A, B))
    _same((A < B).where(A, B).numpy(), np.where(a < b, a, b))
    _same((A != B).where(B, 3).numpy(), np.where(a != b, b, dt(3)))
    # a bool vector read out lane by lane (cast, logic) is 0/1, not the compare's -1
    _same(((A < B).cast(a.dtype.name) * 5).numpy(), (a < b).astype(dt) * dt(5))
    _same(((A < B) & (B < A + 1)).where(A, B).numpy(), np.where((a < b) & (b < a + dt(1)), a, b))
    _same((A < B).numpy(), a < b)

def test_compare_of_a_value_with_itself_folds_to_a_vector():
  # CMPLT(x, x) folds to false, and to a vector of false for a vector compare (a scalar there is a C type error)
  from tilecraft.codegen.rewrite import graph_rewrite, symbolic_rules
  from tilecraft.codegen.uops import UOp, UOps
  from tilecraft.dtype import dtypes
  from tilecraft.ops import BinaryOps
  buf = UOp(UOps.DEFINE_GLOBAL, dtypes.float32.ptr(), (), 1)
  x = UOp(UOps.LOAD, dtypes.float32.vec(8), (buf, UOp.const(dtypes.int32, 0)))
  for op in (BinaryOps.CMPLT, BinaryOps.CMPNE):
    v = x if op is BinaryOps.CMPLT else UOp(UOps.LOAD, dtypes.int32.vec(8), (buf, UOp.const(dtypes.int32, 0)))
    got = graph_rewrite(UOp.alu(op, v, v), symbolic_rules)
    assert got.dtype == dtypes.bool.vec(8) and all(s.op is UOps.CONST and s.arg is False for s in got.src), got

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_bool_logic_and_reciprocals_stay_vector_code(arch, dt, rng):
  """and / or / not of bool vectors (a float abs's x <= 0 is x < 0 or not x != 0), with lanes of 1 from a bool
  constant (a concatenation's piece mask) as well as a compare's -1, and 1 / x: one vector op each, not one per
  lane; bit for bit with numpy, NaN, -0.0 and subnormals included."""
  require_arch(arch)
  x = np.concatenate([np.array(SPECIAL * 8), rng.standard_normal(952)]).astype(dt)
  y = rng.standard_normal(1024).astype(dt)
  X, Y = Tensor(x), Tensor(y)
  with Context(CPU_ARCH=arch):
    for t in (X.abs(), X.reciprocal(), ((X <= 0) | (Y < 0)).where(X, Y), ((X < Y) & (Y < 1)).logical_not().where(X, Y)):
      src = _src(t)
      assert not re.search(r"\b(alu|val|vec)\d+\[\d+\]", src), src  # (no lane read out of a vector)
    _same(X.abs().numpy(), np.abs(x))
    with np.errstate(divide="ignore", over="ignore"): _same(X.reciprocal().numpy(), (dt(1) / x).astype(dt))
    _same(((X <= 0) | (Y < 0)).where(X, Y).numpy(), np.where((x <= 0) | (y < 0), x, y))
    _same(((X < Y) & (Y < 1)).logical_not().where(X, Y).numpy(), np.where(~((x < y) & (y < 1)), x, y))
    # a bool constant's lanes (1, not -1) or-ed and negated with a compare's
    pieces = Tensor.cat(X[:512] < 0, Y[512:] < 5)
    _same((pieces.logical_not() | (X > 1)).where(X, Y).numpy(), np.where(~np.concatenate([x[:512] < 0, y[512:] < 5]) | (x > 1), x, y))

@pytest.mark.parametrize("arch", ARCHS)
def test_a_blocked_matmuls_epilogue_runs_in_the_last_block_only(arch, rng):
  """BLOCK stores the bare partial sum from every block but the last, and the epilogue from the last:
  one condition for every lane, on the block index alone, so C's ?: picks the side and the costly
  side (GELU's exp and division) is computed once, not per block (1.05x on GPT-2's 128x768x3072)."""
  require_arch(arch)
  x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((32, 4096), (4096, 512), (512,)))
  with Context(CPU_ARCH=arch):
    t = (Tensor(x) @ Tensor(w) + Tensor(b)).gelu()
    k = Kernel(t.schedule()[-1].ast, Device["CPU"].renderer).hand_coded_optimizations()
    assert any(o.op.name == "BLOCK" for o in k.applied_opts), k.applied_opts
    src = k.to_program().src
    store = [ln for ln in src.splitlines() if "*((float" in ln and "exp2" in ln]
    assert store and all(re.search(r"= \(alu\d+\?acc\d+:", ln) for ln in store), store[:2]
    assert "tc_where_" not in src.split("void ", 1)[1]
    got = t.numpy()
  h = x.astype(np.float64) @ w + b
  want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)

def test_a_select_on_loaded_data_stays_a_blend(rng):
  """A row mask loaded from memory (one value per row, so one condition for the row's lanes) is data:
  a branch on it could be mispredicted, so the select stays vector code."""
  m = rng.standard_normal((64, 1)).astype(np.float32)
  a, b = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((64, 256)).astype(np.float32)
  t = (Tensor(m).expand(64, 256) > 0).where(Tensor(a), Tensor(b))
  assert "tc_where_" in _src(t)
  np.testing.assert_array_equal(t.numpy(), np.where(m > 0, a, b))
