"""arange/rand as index expressions (ops.INDEX): no reduce anywhere in their schedules, values
through any view, and the marker survives pickling (search workers get ASTs pickled)."""
import pickle
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.dtype import dtypes
from tilecraft.ops import INDEX, BufferOps, ReduceOps, is_index_const

def _ops(t):
  return [x.op for si in t.schedule() for x in si.ast.lazyops]

def test_arange_schedules_no_reduce():
  for t in (Tensor.arange(1 << 20), Tensor.rand(512, 512), Tensor.arange(5, 100, 7).reshape(1, -1) + Tensor.arange(3).reshape(-1, 1)):
    ops = _ops(t)
    assert not any(op in ReduceOps for op in ops), ops
  (si,) = Tensor.arange(64).schedule()
  assert any(is_index_const(x) for x in si.ast.lazyops if x.op is BufferOps.CONST)

@pytest.mark.parametrize("args", [(10,), (2, 11, 3), (0.5, 3, 0.5), (5, 0, -1), (-3, 4), (7, 7), (0, 1, 0.1)])
def test_arange_values(args):
  got = Tensor.arange(*args).numpy()
  want = np.arange(*args)
  assert got.dtype == (np.float32 if want.dtype.kind == "f" else np.int64)
  np.testing.assert_allclose(got, want.astype(got.dtype), rtol=1e-6)

def test_index_through_views():
  a = Tensor.arange(24)
  np.testing.assert_array_equal(a.reshape(2, 3, 4).permute(2, 0, 1).numpy(), np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1))
  np.testing.assert_array_equal(a.pad(((3, 2),)).numpy(), np.pad(np.arange(24), (3, 2)))
  np.testing.assert_array_equal(a.reshape(4, 6)[1:3, ::2].numpy(), np.arange(24).reshape(4, 6)[1:3, ::2])
  np.testing.assert_array_equal(a.flip(0).numpy(), np.arange(24)[::-1])
  np.testing.assert_array_equal(a.reshape(1, 24).expand(3, 24).numpy(), np.broadcast_to(np.arange(24), (3, 24)))
  np.testing.assert_array_equal((a.reshape(4, 6).sum(1)).numpy(), np.arange(24).reshape(4, 6).sum(1))  # an index under a reduce
  np.testing.assert_array_equal(Tensor.arange(16, dtype=dtypes.uint32).contiguous().numpy(), np.arange(16, dtype=np.uint32))

def test_rand_is_uniform_and_reproducible():
  Tensor.manual_seed(3)
  a = Tensor.rand(256, 256).numpy()
  Tensor.manual_seed(3)
  np.testing.assert_array_equal(Tensor.rand(256, 256).numpy(), a)
  assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.01 and len(np.unique(a)) > 60000

def test_index_marker_pickles_to_itself():
  assert pickle.loads(pickle.dumps(INDEX)) is INDEX and repr(INDEX) == "INDEX"
  (si,) = Tensor.arange(8).schedule()
  assert pickle.loads(pickle.dumps(si.ast)).key == si.ast.key
  (sz,) = Tensor.zeros(8, dtype=dtypes.int32).contiguous().schedule()
  assert sz.ast.key != si.ast.key
