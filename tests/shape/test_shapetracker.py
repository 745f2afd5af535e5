"""ShapeTracker against numpy: random movement-op chains on an arange, element by element (validity
included), single-view exactness where numpy needs no copy, the index queries the Kernel uses
(real_strides, unit_stride_axes, axis_is_masked, real_size), simplify, and symbolic shapes."""
import functools, math
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import And, Div, Lt, Mod, Node, Prod, Sum, Variable, sint, sym_eval
from tilecraft.shape.view import View

MAX_SIZE = 200     # elements per array along a chain (keeps numpy and the checks fast)
MAX_RANK = 6

# ---- evaluating a tracker ----------------------------------------------------------------------------

def np_eval(x: sint, env: dict, memo: dict) -> np.ndarray:
  """Evaluate a symbolic expression on numpy arrays (floor division and modulo, like Python)."""
  if isinstance(x, int): return np.int64(x)
  if x in memo: return memo[x]
  if isinstance(x, Variable): r = env[x]
  elif isinstance(x, Sum):
    r = np.int64(x.const)
    for t, k in x.terms: r = r + np_eval(t, env, memo) * np.int64(k)
  elif isinstance(x, Prod): r = np_eval(x.a, env, memo) * np_eval(x.b, env, memo)
  elif isinstance(x, Div): r = np.floor_divide(np_eval(x.a, env, memo), np_eval(x.b, env, memo))
  elif isinstance(x, Mod): r = np.mod(np_eval(x.a, env, memo), np_eval(x.b, env, memo))
  elif isinstance(x, Lt): r = (np_eval(x.a, env, memo) < x.b).astype(np.int64)
  elif isinstance(x, And):
    r = np.int64(1)
    for n in x.nodes: r = r * (np_eval(n, env, memo) != 0)
  else:  # a node kind this evaluator doesn't know: substitute element by element
    vs = sorted(x.vars(), key=lambda v: v.expr)
    shape = np.broadcast_shapes(*[np.shape(env[v]) for v in vs])
    arrs = [np.broadcast_to(env[v], shape) for v in vs]
    r = np.array([x.substitute({v: int(a[ix]) for v, a in zip(vs, arrs)}) for ix in np.ndindex(*shape)], dtype=np.int64).reshape(shape)
  memo[x] = r
  return r

def axis_env(shape: tuple[int, ...]) -> tuple[tuple[Variable, ...], dict]:
  vs = tuple(Variable(f"i{k}", 0, s - 1) for k, s in enumerate(shape))
  env = {v: np.arange(s, dtype=np.int64).reshape([s if j == k else 1 for j in range(len(shape))]) for k, (v, s) in enumerate(zip(vs, shape))}
  return vs, env

def evaluate(stt: ShapeTracker, env_extra: dict | None = None, shape: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(address, valid) of every element of `stt`, from one symbolic expr_idxs call."""
  shape = tuple(stt.shape) if shape is None else shape
  vs, env = axis_env(shape)
  env.update(env_extra or {})
  idx, valid = stt.expr_idxs(vs)
  if env_extra: idx, valid = [x.substitute(env_extra) if isinstance(x, Node) else x for x in (idx, valid)]  # type: ignore[arg-type]
  memo: dict = {}
  addr = np.broadcast_to(np_eval(idx, env, memo), shape)
  val = np.broadcast_to(np_eval(valid, env, memo) != 0, shape)
  return addr, val

# ---- random movement-op chains ----------------------------------------------------------------------
# strategies are cached: building and validating a fresh one for every draw costs more than the check

@functools.lru_cache(maxsize=None)
def ints(lo: int, hi: int) -> st.SearchStrategy[int]: return st.integers(lo, hi)
@functools.lru_cache(maxsize=None)
def perms(n: int) -> st.SearchStrategy: return st.permutations(range(n))
@functools.lru_cache(maxsize=None)
def pick(options: tuple) -> st.SearchStrategy: return st.sampled_from(options)

def prime_factors(n: int) -> list[int]:
  out, p = [], 2
  while n > 1 and p * p <= n:
    while n % p == 0: out.append(p); n //= p  # noqa: E702
    p += 1
  return out + ([n] if n > 1 else [])

def reshape_arg(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
  size = math.prod(shape)
  kind = draw(pick(("split", "merge", "merge", "regroup", "unsqueeze", "squeeze")))
  if size == 0: kind = "zero"
  if kind == "split":
    cands = [i for i, s in enumerate(shape) if len(prime_factors(s)) > 1]
    if cands and len(shape) < MAX_RANK:
      i = draw(pick(tuple(cands)))
      f = draw(pick(tuple(d for d in range(2, shape[i]) if shape[i] % d == 0)))
      return shape[:i] + (f, shape[i] // f) + shape[i + 1:]
    kind = "regroup"
  if kind == "merge" and len(shape) > 1:
    i = draw(ints(0, len(shape) - 2))
    return shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:]
  if kind == "unsqueeze" and len(shape) < MAX_RANK:
    i = draw(ints(0, len(shape)))
    return shape[:i] + (1,) + shape[i:]
  if kind == "squeeze" and 1 in shape and len(shape) > 1:
    i = draw(pick(tuple(k for k, s in enumerate(shape) if s == 1)))
    return shape[:i] + shape[i + 1:]
  if kind == "zero":  # an empty array: any shape with a 0 in it
    rank = draw(ints(1, 4))
    dims = draw(st.lists(ints(0, 3), min_size=rank, max_size=rank))
    return tuple(dims) if 0 in dims else (0,) + tuple(dims[1:])
  # regroup: the prime factors in order, cut into consecutive groups (with size-1 dims sprinkled in)
  ps = prime_factors(size)
  cuts = sorted(set(draw(st.lists(ints(1, max(len(ps) - 1, 1)), max_size=min(len(ps), MAX_RANK - 1)))))
  groups = [math.prod(ps[a:b]) for a, b in zip([0] + cuts, cuts + [len(ps)]) if b > a]
  while len(groups) < MAX_RANK and draw(ints(0, 3)) == 0: groups.insert(draw(ints(0, len(groups))), 1)
  return tuple(groups) or (1,)

ALL_OPS = ("reshape", "reshape", "permute", "expand", "pad", "shrink", "flip", "stride")
NO_PAD_OPS = tuple(o for o in ALL_OPS if o != "pad")

def movement_op(draw, shape: tuple[int, ...], pads: bool = True) -> tuple[str, tuple]:
  size = math.prod(shape)
  op = draw(pick(ALL_OPS if pads else NO_PAD_OPS))
  if op == "reshape": return op, reshape_arg(draw, shape)
  if op == "permute": return op, tuple(draw(perms(len(shape))))
  if op == "expand":
    new = list(shape)
    for i, s in enumerate(shape):
      if s == 1 and (n := draw(ints(1, 4))) * max(math.prod(new), 1) <= MAX_SIZE: new[i] = n
    return op, tuple(new)
  if op == "pad":
    arg, grown = [], size
    for s in shape:
      b, e = draw(ints(0, 2)), draw(ints(0, 2))
      if s and grown // s * (s + b + e) > MAX_SIZE: b = e = 0
      elif s: grown = grown // s * (s + b + e)
      arg.append((b, e))
    return op, tuple(arg)
  if op == "shrink":
    arg = []
    for s in shape:
      if s == 0 or draw(ints(0, 24)) == 0:  # now and then an empty range
        b = draw(ints(0, s)); arg.append((b, b))  # noqa: E702
      else:
        b = draw(ints(0, s - 1)); arg.append((b, draw(ints(b + 1, s))))  # noqa: E702
    return op, tuple(arg)
  if op == "flip": return op, tuple(i for i in range(len(shape)) if draw(pick((False, True))))
  return op, tuple(draw(pick((1, 2, 3, -1, -2, -3))) for _ in shape)

def op_shape(shape: tuple[int, ...], op: str, arg: tuple) -> tuple[int, ...]:
  if op in ("reshape", "expand"): return arg
  if op == "permute": return tuple(shape[i] for i in arg)
  if op == "pad": return tuple(s + b + e for s, (b, e) in zip(shape, arg))
  if op == "shrink": return tuple(e - b for b, e in arg)
  if op == "stride": return tuple((s + abs(m) - 1) // abs(m) for s, m in zip(shape, arg))
  return shape

@st.composite
def chains(draw, min_ops: int = 8, max_ops: int = 14) -> tuple[tuple[int, ...], list[tuple[str, tuple]]]:
  rank = draw(ints(1, 5))
  shape: list[int] = []
  for _ in range(rank): shape.append(draw(ints(1, max(1, min(6, MAX_SIZE // max(math.prod(shape), 1))))))
  ops, cur = [], tuple(shape)
  pads = draw(pick((True, False)))  # half the chains without pads: those numpy may keep as one view
  for _ in range(draw(ints(min_ops, max_ops))):
    op, arg = movement_op(draw, cur, pads)
    ops.append((op, arg))
    cur = op_shape(cur, op, arg)
  return tuple(shape), ops

def apply_numpy(shape: tuple[int, ...], ops: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
  """(array of base indices, validity, base, whether the result is still a view of base without pads)."""
  base = np.arange(math.prod(shape), dtype=np.int64)
  arr, valid, view = base.reshape(shape), np.ones(shape, dtype=bool), True
  for op, arg in ops:
    if op == "reshape":
      arr, valid = arr.reshape(arg), valid.reshape(arg)
      view = view and (arr.size == 0 or np.may_share_memory(arr, base))
    elif op == "permute": arr, valid = arr.transpose(arg), valid.transpose(arg)
    elif op == "expand": arr, valid = np.broadcast_to(arr, arg), np.broadcast_to(valid, arg)
    elif op == "pad":
      arr, valid, view = np.pad(arr, arg, constant_values=-1), np.pad(valid, arg, constant_values=False), False
    elif op == "shrink":
      sl = tuple(slice(b, e) for b, e in arg)
      arr, valid = arr[sl], valid[sl]
    elif op == "flip": arr, valid = np.flip(arr, arg), np.flip(valid, arg)
    elif op == "stride":
      sl = tuple(slice(None, None, m) for m in arg)
      arr, valid = arr[sl], valid[sl]
  return arr, valid, base, view

def apply_st(shape: tuple[int, ...], ops: list) -> ShapeTracker:
  stt = ShapeTracker.from_shape(shape)
  for op, arg in ops: stt = getattr(stt, op)(arg)
  return stt

def check_chain(shape: tuple[int, ...], ops: list) -> None:
  arr, valid, base, is_view = apply_numpy(shape, ops)
  stt = apply_st(shape, ops)
  assert stt.shape == arr.shape, (stt, arr.shape)
  assert stt.size == arr.size
  if arr.size == 0: return
  addr, val = evaluate(stt)
  np.testing.assert_array_equal(val, valid, err_msg=f"validity differs for {ops} -> {stt}")
  np.testing.assert_array_equal(np.where(valid, addr, -1), np.where(valid, arr, -1), err_msg=f"index differs for {ops} -> {stt}")
  # the concrete path (int indices) agrees too, on a few elements
  for flat in sorted({0, arr.size - 1, arr.size // 2}):
    ix = np.unravel_index(flat, arr.shape)
    i, v = stt.expr_idxs(tuple(int(x) for x in ix))
    assert isinstance(i, int) and isinstance(v, int)
    assert bool(v) == bool(valid[ix]) and (not v or i == arr[ix]), (ops, stt, ix)
  if is_view:
    # numpy expressed it as one strided view: so must the tracker, with numpy's strides and offset
    assert len(stt.views) == 1, f"{ops} -> {stt} should be one view (numpy strides {arr.strides})"
    v = stt.views[0]
    assert v.mask is None
    item = arr.itemsize
    np_offset = (arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    assert v.offset == np_offset, (ops, stt, np_offset)
    for s, st_, nst in zip(arr.shape, v.strides, arr.strides):
      if s != 1: assert st_ == nst // item, (ops, stt, arr.strides)

_suppress = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

@settings(max_examples=1000, deadline=None, derandomize=True, database=None, suppress_health_check=_suppress)
@given(chains())
def test_chains_match_numpy(chain):
  check_chain(*chain)

@pytest.mark.slow
@settings(max_examples=30000, deadline=None, derandomize=False, database=None, suppress_health_check=_suppress)
@given(chains(8, 24))
def test_chains_match_numpy_slow(chain):
  check_chain(*chain)

# ---- the index queries, on random chains ---------------------------------------------------------------

def check_queries(shape: tuple[int, ...], ops: list) -> None:
  arr, valid, base, _ = apply_numpy(shape, ops)
  stt = apply_st(shape, ops)
  if arr.size == 0:
    assert stt.real_size() == 0
    return
  addr = np.where(valid, arr, -1)
  # real_size: 1 + the largest index read; exact for one view, an upper bound within the buffer otherwise
  rs = stt.real_size()
  expect = int(addr.max()) + 1 if valid.any() else 0
  assert expect <= rs <= base.size, (ops, stt, rs, expect)
  if len(stt.views) == 1: assert rs == expect, (ops, stt, rs, expect)
  for ignore_valid in (False, True):
    rst = stt.real_strides(ignore_valid)
    assert len(rst) == len(arr.shape)
    for ax, stride in enumerate(rst):
      if stride is None: continue
      a0, a1 = [np.take(x, range(0, arr.shape[ax] - 1), axis=ax) for x in (addr, valid)], [np.take(x, range(1, arr.shape[ax]), axis=ax) for x in (addr, valid)]
      both = a0[1] & a1[1]
      assert np.all((a1[0] - a0[0])[both] == stride), (ops, stt, ax, stride, ignore_valid)
      if not ignore_valid:
        # a number without ignore_valid means the axis doesn't enter the mask either
        assert np.array_equal(a0[1], a1[1]), (ops, stt, ax, "validity varies along an axis with a stride")
    assert stt.unit_stride_axes(ignore_valid) == [i for i, s in enumerate(rst) if s == 1]
  for ax in range(len(arr.shape)):
    varies = arr.shape[ax] > 1 and not np.all(valid == np.take(valid, [0], axis=ax))
    if varies: assert stt.axis_is_masked(ax), (ops, stt, ax)
    if len(stt.views) == 1 and valid.any():
      assert stt.axis_is_masked(ax) == varies, (ops, stt, ax)
      assert (stt.real_strides()[ax] is None) == varies
      assert stt.real_strides(True)[ax] is not None

@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=_suppress)
@given(chains())
def test_chain_queries(chain):
  check_queries(*chain)

@pytest.mark.slow
@settings(max_examples=10000, deadline=None, database=None, suppress_health_check=_suppress)
@given(chains(8, 20))
def test_chain_queries_slow(chain):
  check_queries(*chain)

# ---- views that must stay apart, and views simplify merges --------------------------------------------

def numpy_of(stt: ShapeTracker) -> np.ndarray:
  addr, valid = evaluate(stt)
  return np.where(valid, addr, -1)

def test_permute_then_merge_stays_two_views():
  stt = ShapeTracker.from_shape((2, 3)).permute((1, 0)).reshape((6,))
  assert len(stt.views) == 2
  np.testing.assert_array_equal(numpy_of(stt), np.arange(6).reshape(2, 3).T.reshape(6))
  assert stt.real_strides() == (None,) and stt.unit_stride_axes() == []
  # splitting it differently keeps two views and the right answer
  s2 = stt.reshape((2, 3))
  assert len(s2.views) == 2
  np.testing.assert_array_equal(numpy_of(s2), np.arange(6).reshape(2, 3).T.reshape(2, 3))
  assert s2.real_strides() == (None, None)

def test_reshape_then_reshape_back_is_one_view():
  p = ShapeTracker.from_shape((2, 3, 4)).permute((2, 0, 1))
  merged = p.reshape((4, 6)).reshape((24,))
  assert len(merged.views) == 2
  back = merged.reshape((4, 2, 3))
  assert back == p and len(back.views) == 1
  assert p.reshape((4, 6)) == p.reshape((4, 6)).reshape((4, 2, 3)).reshape((4, 6))

@pytest.mark.parametrize("shape, pad, new", [((3, 4), ((1, 1), (0, 0)), (20,)), ((4,), ((0, 4),), (2, 4)), ((2, 3), ((0, 0), (0, 3)), (2, 2, 3)),
                                              ((2, 3), ((0, 0), (0, 3)), (12,))])
def test_pad_then_reshape(shape, pad, new):
  stt = ShapeTracker.from_shape(shape).pad(pad).reshape(new)
  want = np.pad(np.arange(math.prod(shape)).reshape(shape), pad, constant_values=-1).reshape(new)
  np.testing.assert_array_equal(numpy_of(stt), want)
  if new != (12,): assert len(stt.views) == 1  # splits on a multiple of the padded dim: one masked view
  else: assert len(stt.views) == 2  # the valid set isn't one interval

def test_simplify_after_shrink_and_stride():
  p = ShapeTracker.from_shape((4, 4)).permute((1, 0)).reshape((16,))
  assert len(p.views) == 2
  # one column of the transposed matrix is a strided row of the original
  row = p.shrink(((4, 8),))
  assert len(row.views) == 1 and row.views[0].strides == (4,) and row.views[0].offset == 1
  assert len(p.stride((5,)).views) == 1  # the diagonal
  np.testing.assert_array_equal(numpy_of(p.stride((5,))), [0, 5, 10, 15])

def test_all_invalid_collapses_to_one_view():
  p = ShapeTracker.from_shape((4, 4)).permute((1, 0)).reshape((16,)).pad(((0, 3),)).shrink(((16, 19),))
  assert len(p.views) == 1 and p.views[0].is_all_invalid and p.real_size() == 0

def test_simplify_merges_compatible_views_by_hand():
  v1 = View.create((4, 6), (1, 4))      # a transposed 6x4
  v2 = View.create((4, 3), (6, 2), 1)   # every other column from 1
  stt = ShapeTracker((v1, v2))
  s = stt.simplify()
  assert len(s.views) == 1 and s.views[0].strides == (1, 8) and s.views[0].offset == 4
  np.testing.assert_array_equal(numpy_of(s), numpy_of(stt))
  assert ShapeTracker((View.create((2, 3), (1, 2)), View.create((6,)))).simplify().views == (View.create((2, 3), (1, 2)), View.create((6,)))

def test_add_composes():
  a = ShapeTracker.from_shape((2, 3)).permute((1, 0))
  b = ShapeTracker.from_shape((3, 2)).reshape((6,)).shrink(((1, 5),))
  c = a + b
  np.testing.assert_array_equal(numpy_of(c), np.arange(6).reshape(2, 3).T.reshape(6)[1:5])

# ---- the queries on hand-made cases -----------------------------------------------------------------

def test_real_strides_cases():
  base = ShapeTracker.from_shape((3, 4))
  assert base.real_strides() == (4, 1) and base.unit_stride_axes() == [1]
  assert base.permute((1, 0)).real_strides() == (1, 4) and base.permute((1, 0)).unit_stride_axes() == [0]
  assert ShapeTracker.from_shape((1, 4)).expand((5, 4)).real_strides() == (0, 1)
  padded = base.pad(((0, 0), (1, 1)))
  assert padded.real_strides() == (4, None) and padded.real_strides(ignore_valid=True) == (4, 1)
  assert padded.unit_stride_axes() == [] and padded.unit_stride_axes(ignore_valid=True) == [1]
  assert padded.axis_is_masked(1) and not padded.axis_is_masked(0)
  flipped = base.flip((1,))
  assert flipped.real_strides() == (4, -1)
  # a masked multi-view tracker: the linear axis keeps its stride, the merged one has none
  mv = base.permute((1, 0)).reshape((12,)).pad(((2, 0),)).reshape((2, 7))
  assert len(mv.views) >= 2 and mv.real_strides()[1] is None
  conv = ShapeTracker.from_shape((8, 8)).pad(((1, 1), (1, 1))).reshape((1, 10, 10)).expand((4, 10, 10))
  assert conv.real_strides() == (0, None, None) and conv.real_strides(True) == (0, 8, 1)

def test_real_size_cases():
  assert ShapeTracker.from_shape((3, 4)).real_size() == 12
  assert ShapeTracker.from_shape((3, 4)).shrink(((0, 3), (0, 2))).real_size() == 10
  assert ShapeTracker.from_shape((3, 4)).shrink(((1, 2), (1, 3))).real_size() == 7
  assert ShapeTracker.from_shape((4,)).pad(((3, 3),)).real_size() == 4
  assert ShapeTracker.from_shape((1, 4)).expand((100, 4)).real_size() == 4
  assert ShapeTracker.from_shape((4,)).flip((0,)).real_size() == 4
  assert ShapeTracker.from_shape((0, 4)).real_size() == 0
  assert ShapeTracker.from_shape((6,)).shrink(((2, 2),)).real_size() == 0

# ---- symbolic shapes --------------------------------------------------------------------------------

N = Variable("N", 1, 8)

def eval_symbolic(stt: ShapeTracker, n: int) -> np.ndarray:
  """Evaluate the tracker's index (built once, for every N) at N = n; -1 where invalid."""
  bound = tuple(s if isinstance(s, int) else s.vmax for s in stt.shape)
  concrete = tuple(s if isinstance(s, int) else s.substitute({N: n}) for s in stt.shape)
  vs = tuple(Variable(f"i{k}", 0, max(b - 1, 0)) for k, b in enumerate(bound))
  idx, valid = stt.expr_idxs(vs)
  env = {v: np.arange(s, dtype=np.int64).reshape([s if j == k else 1 for j in range(len(concrete))]) for k, (v, s) in enumerate(zip(vs, concrete))}
  env[N] = np.int64(n)
  memo: dict = {}
  addr, val = np.broadcast_to(np_eval(idx, env, memo), concrete), np.broadcast_to(np_eval(valid, env, memo) != 0, concrete)
  return np.where(val, addr, -1)

SYMBOLIC_CASES = {
  "reshape merge": (lambda N: ShapeTracker.from_shape((N, 4)).reshape((N * 4,)), lambda a, n: a.reshape(n, 4).reshape(n * 4), lambda n: n * 4),
  "reshape split": (lambda N: ShapeTracker.from_shape((N * 4,)).reshape((N, 2, 2)), lambda a, n: a.reshape(n, 2, 2), lambda n: n * 4),
  "permute": (lambda N: ShapeTracker.from_shape((N, 3)).permute((1, 0)), lambda a, n: a.reshape(n, 3).T, lambda n: n * 3),
  "permute merge": (lambda N: ShapeTracker.from_shape((N, 3)).permute((1, 0)).reshape((3 * N,)), lambda a, n: a.reshape(n, 3).T.reshape(-1), lambda n: n * 3),
  "expand": (lambda N: ShapeTracker.from_shape((1, 3)).expand((N, 3)), lambda a, n: np.broadcast_to(a.reshape(1, 3), (n, 3)), lambda n: 3),
  "shrink": (lambda N: ShapeTracker.from_shape((10, 2)).shrink(((1, N + 1), (0, 2))), lambda a, n: a.reshape(10, 2)[1:n + 1], lambda n: 20),
  "shrink var dim": (lambda N: ShapeTracker.from_shape((N, 5)).shrink(((0, N), (1, 4))), lambda a, n: a.reshape(n, 5)[:, 1:4], lambda n: n * 5),
  "pad": (lambda N: ShapeTracker.from_shape((N, 3)).pad(((1, 2), (0, 1))),
          lambda a, n: np.pad(a.reshape(n, 3), ((1, 2), (0, 1)), constant_values=-1), lambda n: n * 3),
  "pad by var": (lambda N: ShapeTracker.from_shape((4,)).pad(((0, N),)), lambda a, n: np.pad(a, ((0, n),), constant_values=-1), lambda n: 4),
  "flip": (lambda N: ShapeTracker.from_shape((N, 2)).flip((0,)), lambda a, n: a.reshape(n, 2)[::-1], lambda n: n * 2),
  "mixed": (lambda N: ShapeTracker.from_shape((2, N)).permute((1, 0)).pad(((0, 1), (0, 0))).reshape((N + 1, 2, 1)).expand((N + 1, 2, 3)),
            lambda a, n: np.broadcast_to(np.pad(a.reshape(2, n).T, ((0, 1), (0, 0)), constant_values=-1).reshape(n + 1, 2, 1), (n + 1, 2, 3)),
            lambda n: 2 * n),
}

@pytest.mark.parametrize("name", list(SYMBOLIC_CASES))
def test_symbolic_shapes(name):
  make, ref, size = SYMBOLIC_CASES[name]
  stt = make(N)
  assert N in stt.vars()
  for n in (1, 2, 5, 8):
    np.testing.assert_array_equal(eval_symbolic(stt, n), ref(np.arange(size(n)), n), err_msg=f"{name} at N={n}: {stt}")

def test_symbolic_queries():
  assert ShapeTracker.from_shape((N, 4)).real_strides() == (4, 1)
  assert ShapeTracker.from_shape((4, N)).real_strides() == (N, 1)
  assert ShapeTracker.from_shape((N, 3)).pad(((1, 0), (0, 0))).real_strides() == (None, 1)
  assert ShapeTracker.from_shape((N, 3)).pad(((1, 0), (0, 0))).real_strides(True) == (3, 1)
  mv = ShapeTracker.from_shape((4, N)).permute((1, 0)).reshape((4 * N,))
  assert len(mv.views) == 2 and mv.real_strides() == (None,)
  assert ShapeTracker.from_shape((N, 4)).real_size() == 32  # the largest N
  assert ShapeTracker.from_shape((N, 4)).shrink(((0, N), (0, 2))).real_size() == 30

def test_unbind():
  bound = N.bind(3)
  stt = ShapeTracker.from_shape((bound, 4)).reshape((bound * 4,))
  unbound, vals = stt.unbind()
  assert vals == {N: 3} and all(not v.is_bound for v in unbound.vars())
  assert unbound == ShapeTracker.from_shape((N * 4,))

@pytest.mark.parametrize("name", ["reshape split", "permute merge", "pad", "mixed"])
def test_symbolic_shapes_bound(name):
  """Built with a bound N, unbound for compiling, then evaluated by substituting N and the indices."""
  make, ref, size = SYMBOLIC_CASES[name]
  for n in (1, 3, 8):
    stt, var_vals = make(N.bind(n)).unbind()
    assert var_vals == {N: n}
    concrete = tuple(s if isinstance(s, int) else sym_eval(s, var_vals) for s in stt.shape)
    vs = tuple(Variable(f"i{k}", 0, max((s if isinstance(s, int) else s.vmax) - 1, 0)) for k, s in enumerate(stt.shape))
    idx, valid = stt.expr_idxs(vs)
    want = ref(np.arange(size(n)), n)
    for ix in list(np.ndindex(*concrete))[::3]:
      sub = {**var_vals, **dict(zip(vs, ix))}
      v = sym_eval(valid, sub)
      assert bool(v) == (want[ix] != -1), (name, n, ix)
      if v: assert sym_eval(idx, sub) == want[ix], (name, n, ix)

def test_bound_values_never_leak_between_trackers():
  """Variables bound to different values compare equal; no cached result may carry another's value."""
  def build(n):
    b = N.bind(n)
    return [ShapeTracker.from_shape((b, 4)).permute((1, 0)).reshape((4 * b,)).reshape((4, b)),
            ShapeTracker.from_shape((4, b)).pad(((1, 0), (0, 0))).reshape((5, b, 1)),
            ShapeTracker.from_shape((b * 4,)).reshape((b, 2, 2)).permute((2, 0, 1)).reshape((2, b * 2)),
            ShapeTracker.from_shape((3, b)) + ShapeTracker.from_shape((3 * b,))]
  for n in (5, 3, 7, 3):
    for stt in build(n):
      _, var_vals = stt.unbind()
      assert var_vals == {N: n}, stt
      assert stt.real_strides() is not None

def test_real_size_is_zero_when_a_later_view_reads_only_padding():
  """Found by the slow tier: three views where the last one only reads positions the first view
  masks off. real_size's upper bound came out negative (-3); nothing valid means 0."""
  chain = ((4, 1, 2, 4), [("flip", (0,)), ("stride", (-1, 1, 1, 1)), ("reshape", (2, 2, 1, 2, 4)),
          ("pad", ((1, 1), (0, 0), (0, 0), (0, 0), (0, 0))), ("expand", (4, 2, 1, 2, 4)), ("reshape", (2, 2, 2, 1, 2, 4)),
          ("reshape", (1, 1, 1, 1, 1, 64)), ("reshape", (2, 4, 8)), ("reshape", (2, 4, 2, 4)), ("flip", (2,)),
          ("reshape", (2, 8, 4)), ("shrink", ((0, 1), (0, 3), (0, 1)))])
  assert apply_st(*chain).real_size() == 0
  check_queries(*chain)

def _conv_window(cin: int, H: int, W: int) -> ShapeTracker:
  """A 3x3 conv's input as the kernel sees it: (y, x, cin, ky, kx) over the zero-padded image."""
  padded = ShapeTracker.from_shape((cin, H, W)).pad(((0, 0), (1, 1), (1, 1)))
  return ShapeTracker(padded.views + (View.create((H, W, cin, 3, 3), (W + 2, 1, (H + 2) * (W + 2), W + 2, 1)),)).simplify()

def _has_divmod(x: sint) -> bool:
  return isinstance(x, (Div, Mod)) or (isinstance(x, Node) and any(_has_divmod(c) for c in x.children()))

def test_masked_view_index_is_clamped_to_its_valid_range():
  """A conv row padded past its end (x in [0, 16), valid below 10, as PADTO makes it) and split into
  4 x 4 lanes is a third view over the padded window: unravelling x + kx into the padded image needs
  no div/mod once x is known to stay below 10 where the element is valid. The index agrees with the
  plain (int) evaluation on every valid element, and the validity on every element."""
  st = _conv_window(2, 3, 10).pad(((0, 0), (0, 6), (0, 0), (0, 0), (0, 0))).reshape((3, 4, 4, 2, 3, 3))
  assert len(st.views) == 3
  axes = tuple(Variable(f"a{i}", 0, s - 1) for i, s in enumerate(st.shape))
  idx, valid = st.expr_idxs(axes)
  assert not _has_divmod(idx) and not (isinstance(idx, Node) and any(v.expr.startswith("_st_clamp") for v in idx.vars()))
  n_valid = 0
  for pos in np.ndindex(*st.shape):
    want_idx, want_valid = st.expr_idxs(tuple(int(p) for p in pos))
    sub = dict(zip(axes, (int(p) for p in pos)))
    got_valid = sym_eval(valid, sub) if isinstance(valid, Node) else valid
    assert bool(got_valid) == bool(want_valid), pos
    if want_valid:
      n_valid += 1
      assert (sym_eval(idx, sub) if isinstance(idx, Node) else idx) == want_idx, pos
  assert 0 < n_valid < math.prod(st.shape)
