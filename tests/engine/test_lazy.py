"""engine/lazy.py: hash-consing of the lazy graph and what realization does to it."""
import numpy as np
from tilecraft.engine import lazy
from tilecraft.tensor import Tensor

def test_identical_ops_share_one_lazybuffer_until_realized():
  rng = np.random.default_rng(0)
  an, bn = rng.random((8, 8), dtype=np.float32), rng.random((8, 8), dtype=np.float32)
  a, b = Tensor(an), Tensor(bn)
  x, y = a + b, a + b
  assert x.lazydata.base is y.lazydata.base
  assert (a * b).lazydata.base is not x.lazydata.base and (b + a).lazydata.base is not x.lazydata.base
  key = x.lazydata.base.consed_key
  assert key is not None and lazy.consed(key) is x.lazydata.base
  x.realize()
  base = x.lazydata.base
  assert base.realized and base.op is None and base.srcs == ()
  assert lazy.consed(key) is not base  # a realized value left the table (its key held ids of sources it dropped)
  z = a + b
  assert z.lazydata.base is not base and not z.lazydata.base.realized
  np.testing.assert_allclose(z.numpy(), an + bn)
  np.testing.assert_allclose(y.numpy(), an + bn)

def test_symbolic_views_are_not_keyed():
  from tilecraft.shape.symbolic import Variable
  t = Tensor(np.arange(16, dtype=np.float32))
  n = Variable("n", 1, 16)
  v = t.lazydata.shrink(((0, n),))
  assert lazy.source_key(v) is None
  assert lazy.hash_consed(("X", None, (None,)), lambda: v) is v

def test_the_table_forgets_dead_values():
  """Entries are weak: a dropped graph's values die, their entries are misses and get swept."""
  import gc
  a = Tensor(np.ones((4, 4), dtype=np.float32)).realize()
  keys = []
  for i in range(3000):  # more than a sweep's worth of dead entries
    y = a * float(i)
    keys.append(y.lazydata.base.consed_key)
    del y
  gc.collect()
  assert all(lazy.consed(k) is None for k in keys)
  assert len(lazy._consed) < 2 * lazy._sweep_at
  x = a * 2.0
  assert (a * 2.0).lazydata.base is x.lazydata.base  # live ones still share
