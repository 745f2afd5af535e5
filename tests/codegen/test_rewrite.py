"""The rewrite rules (tilecraft/codegen/rewrite.py) keep IEEE semantics: an identity is folded only
where it holds for every value, signed zeros and NaN included."""
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.codegen.rewrite import graph_rewrite, symbolic_rules
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps

def _rewrite(op: BinaryOps, dt, c: float) -> UOp:
  x = UOp(UOps.DEFINE_VAR, dt, (), "x")
  return graph_rewrite(UOp.alu(op, x, UOp.const(dt, c)), symbolic_rules)

@pytest.mark.parametrize("op,c,folds", [(BinaryOps.ADD, 0.0, False), (BinaryOps.ADD, -0.0, True),
                                        (BinaryOps.SUB, 0.0, True), (BinaryOps.SUB, -0.0, False)])
def test_float_zero_identities(op: BinaryOps, c: float, folds: bool) -> None:
  """-0.0 + 0.0 is +0.0, so x + 0.0 is not x; x + -0.0 and x - 0.0 are, for every float x."""
  r = _rewrite(op, dtypes.float32, c)
  assert (r.op is UOps.DEFINE_VAR) == folds, r

def test_int_zero_identities_fold() -> None:
  assert _rewrite(BinaryOps.ADD, dtypes.int32, 0).op is UOps.DEFINE_VAR
  assert _rewrite(BinaryOps.SUB, dtypes.int32, 0).op is UOps.DEFINE_VAR

def test_negative_zero_plus_zero_is_positive_zero() -> None:
  x = np.array([-0.0, 1.0, -0.0, 2.0] * 8, np.float32)  # 32: the vector path too
  for f in (lambda t: t + 0.0, lambda t: 0.0 + t, lambda t: t - (-0.0)):
    got = f(Tensor(x)).numpy()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(f(x)))
  np.testing.assert_array_equal(np.signbit((Tensor(x) + (-0.0)).numpy()), np.signbit(x))
