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

def test_long_reduces_into_small_outputs_are_split_even_where_no_chunk_count_divides():
  """A reduce of a prime length (1000003) or a vocabulary's 50257 into a few outputs: partial reduces over the first
  c * (n // c) elements and the remainder's own reduce, combined (one scalar loop on one thread before: 16x slower),
  for SUM and MAX (argmax's index reduce too); SPLIT_REDUCE=0 keeps one kernel. Against numpy."""
  from tilecraft import Context
  from tilecraft.ops import MetaOps
  rng = np.random.default_rng(0)
  def kernels(t): return [si for si in t.schedule() if si.ast.op is MetaOps.KERNEL]
  for shape, axis in (((1000003,), None), ((4, 50257), 1)):
    x = rng.standard_normal(shape, dtype=np.float32)
    x.flat[-1] = 9.0  # (the maximum in the remainder)
    for f, want in ((lambda t: t.sum(axis), x.astype(np.float64).sum(axis)), (lambda t: t.max(axis), x.max(axis)),
                    (lambda t: t.argmax(axis if axis is not None else 0), np.argmax(x, axis if axis is not None else 0))):
      t = f(Tensor(x))
      n_split = len(kernels(t))
      np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-3)
      with Context(SPLIT_REDUCE=0):
        one = f(Tensor(x))
        assert len(kernels(one)) + 2 <= n_split, (len(kernels(one)), n_split)  # (per reduce: partials, remainder, combine)
        np.testing.assert_allclose(one.numpy(), want, rtol=1e-4, atol=1e-2)
