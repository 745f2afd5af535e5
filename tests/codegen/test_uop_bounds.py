"""The range analysis over UOps (codegen/uop_bounds.py) against brute force: random small integer UOp
expressions over loop counters, thread ids, variables and constants are evaluated at every point of
their leaves' ranges (with the wrap-around of their dtypes), and every value must lie in the bounds,
be a multiple of the known divisor, and overflow only where the analysis says the node wraps."""
from __future__ import annotations
import itertools
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from tilecraft.codegen.uop_bounds import Bound, bound, multiple_of
from tilecraft.codegen.uops import UOp, UOps, python_alu
from tilecraft.dtype import dtypes, truncate
from tilecraft.helpers import prod
from tilecraft.ops import BinaryOps, TernaryOps, UnaryOps
from tilecraft.renderer.analysis import overflowing_int_alus
from tilecraft.shape.symbolic import Variable

INT_DTYPES = (dtypes.int8, dtypes.int32, dtypes.uint8)
MAX_POINTS = 400  # leaf assignments evaluated per expression

# ---- random expressions ----------------------------------------------------------------------------

def _free_leaves(dt) -> list[UOp]:
  """A few loop counters, thread ids and variables (a small pool, so expressions share them)."""
  signed = not dtypes.is_unsigned(dt)
  loops = [(0, 4), (-3, 1) if signed else (2, 5), (5, 7)]
  out = [UOp(UOps.RANGE, dt, (UOp.const(dt, a), UOp.const(dt, b)), ("loop", i)) for i, (a, b) in enumerate(loops)]
  out += [UOp(UOps.SPECIAL, dt, (), (f"lidx{i}", n, i, "local")) for i, n in enumerate((3, 4))]
  out += [UOp(UOps.DEFINE_VAR, dtypes.int64, (), Variable(f"v{i}", a, b)).cast(dt) for i, (a, b) in enumerate([(-2 if signed else 0, 1), (1, 3)])]
  return out

@st.composite
def leaves(draw, dt):
  if draw(st.integers(0, 2)) == 0: return UOp.const(dt, draw(st.integers(0 if dtypes.is_unsigned(dt) else -6, 40)))
  return draw(st.sampled_from(_free_leaves(dt)))

def _shift_amount(draw, dt):
  if draw(st.booleans()): return UOp.const(dt, draw(st.integers(0, 6)))
  return UOp(UOps.RANGE, dt, (UOp.const(dt, 0), UOp.const(dt, draw(st.integers(1, 6)))), ("shift", 0))

@st.composite
def int_exprs(draw, dt, depth=3):
  if depth == 0 or draw(st.integers(0, 3)) == 0: return draw(leaves(dt))
  sub = lambda: draw(int_exprs(dt, depth - 1))  # noqa: E731
  op = draw(st.sampled_from(["add", "sub", "mul", "neg", "mulacc", "max", "where", "idiv", "mod", "shl", "shr", "and", "or", "xor",
                             "cast", "gep", "bigconst"]))
  if op == "neg": return UOp.alu(UnaryOps.NEG, sub())
  if op == "mulacc": return UOp.alu(TernaryOps.MULACC, sub(), sub(), sub())
  if op == "where": return UOp.alu(TernaryOps.WHERE, draw(bool_exprs(dt, depth - 1)), sub(), sub())
  if op in ("shl", "shr"): return UOp.alu(BinaryOps.SHL if op == "shl" else BinaryOps.SHR, sub(), _shift_amount(draw, dt))
  if op == "cast":  # through another integer type (narrowing wraps) or a bool
    other = draw(st.sampled_from([d for d in INT_DTYPES if d != dt] + [dtypes.bool]))
    inner = draw(int_exprs(other, depth - 1)) if other != dtypes.bool else draw(bool_exprs(dt, depth - 1))
    return inner.cast(dt)
  if op == "gep":
    vec = UOp(UOps.VECTORIZE, dt.vec(2), (sub(), sub()))
    return vec.gep(draw(st.integers(0, 1))) if draw(st.booleans()) else UOp.alu(BinaryOps.ADD, vec, vec).gep(0)
  if op == "bigconst": return UOp.alu(BinaryOps.MUL, sub(), UOp.const(dt, draw(st.sampled_from([2**6, 2**29, 3 * 2**28, 12]))))
  alu = {"add": BinaryOps.ADD, "sub": BinaryOps.SUB, "mul": BinaryOps.MUL, "max": BinaryOps.MAX, "idiv": BinaryOps.IDIV,
         "mod": BinaryOps.MOD, "and": BinaryOps.AND, "or": BinaryOps.OR, "xor": BinaryOps.XOR}[op]
  return UOp.alu(alu, sub(), sub())

@st.composite
def bool_exprs(draw, dt, depth=2):
  kind = draw(st.sampled_from(["lt", "ne", "and", "or", "not", "cast"]))
  if kind in ("lt", "ne"):
    return UOp.alu(BinaryOps.CMPLT if kind == "lt" else BinaryOps.CMPNE, draw(int_exprs(dt, max(depth - 1, 0))), draw(int_exprs(dt, max(depth - 1, 0))))
  if kind == "cast": return draw(int_exprs(dt, max(depth - 1, 0))).cast(dtypes.bool)
  if depth == 0 or kind == "not":
    return UOp.alu(UnaryOps.NEG, UOp.alu(BinaryOps.CMPLT, draw(leaves(dt)), draw(leaves(dt))))
  return UOp.alu(BinaryOps.AND if kind == "and" else BinaryOps.OR, draw(bool_exprs(dt, depth - 1)), draw(bool_exprs(dt, depth - 1)))

# ---- brute force -----------------------------------------------------------------------------------

def _points(root: UOp):
  """Every assignment of values to the expression's free leaves (loop counters, thread ids, variables)."""
  free = [u for u in root.toposort() if u.op in (UOps.RANGE, UOps.SPECIAL, UOps.DEFINE_VAR)]
  def values(u: UOp) -> range:
    if u.op is UOps.RANGE: return range(u.src[0].arg, u.src[1].arg)
    if u.op is UOps.SPECIAL: return range(u.arg[1])
    return range(u.arg.vmin, u.arg.vmax + 1)
  ranges = [values(u) for u in free]
  total = 1
  for r in ranges: total *= len(r)
  # at most about MAX_POINTS of them, spread over the whole product
  for vals in itertools.islice(itertools.product(*ranges), 0, None, -(-total // MAX_POINTS)): yield dict(zip(free, vals))

def _evaluate(root: UOp, env: dict) -> dict:
  """{uop: (value as the hardware holds it, the exact value before wrapping)}; vectors: a tuple per lane."""
  out: dict = {}
  for u in root.toposort():
    if u in env: v = env[u]; out[u] = (v, v); continue
    if u.op is UOps.CONST: out[u] = (u.arg, u.arg); continue
    srcs = [out[s][0] for s in u.src]
    if u.op is UOps.VECTORIZE: out[u] = (tuple(srcs), tuple(srcs)); continue
    if u.op is UOps.GEP: out[u] = (srcs[0][u.arg],) * 2; continue
    if u.op is UOps.CAST:
      exact = int(srcs[0]) if u.dtype != dtypes.bool else bool(srcs[0])
    elif u.dtype.count > 1:
      exact = tuple(python_alu[u.arg](*[s[i] for s in srcs]) for i in range(u.dtype.count))
    else: exact = python_alu[u.arg](*srcs)
    held = tuple(truncate(u.dtype.scalar())(x) for x in exact) if isinstance(exact, tuple) else truncate(u.dtype.scalar())(exact)
    out[u] = (held, exact)
  return out

def _lanes(v) -> tuple: return v if isinstance(v, tuple) else (v,)

def check_against_brute_force(root: UOp) -> int:
  nodes = [u for u in root.toposort() if dtypes.is_int(u.dtype) or u.dtype.scalar() == dtypes.bool]
  bounds = {u: bound(u) for u in nodes}
  n = 0
  for env in _points(root):
    vals = _evaluate(root, env)
    for u in nodes:
      b = bounds[u]
      held, exact = vals[u]
      for h, e in zip(_lanes(held), _lanes(exact)):
        h = int(h)
        assert b.vmin <= h <= b.vmax, f"{u} = {h} outside [{b.vmin}, {b.vmax}] at {env}"
        assert (h == 0 if b.divisor == 0 else h % b.divisor == 0), f"{u} = {h} is no multiple of {b.divisor} at {env}"
        if dtypes.is_int(u.dtype) and int(e) != h: assert b.wraps, f"{u}: {e} wraps to {h} but the bound {b} says it can't"
      n += 1
  return n

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(INT_DTYPES).flatmap(lambda dt: int_exprs(dt)))
def test_bounds_hold_at_every_point(root):
  check_against_brute_force(root)

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(INT_DTYPES).flatmap(lambda dt: bool_exprs(dt)))
def test_bool_bounds_hold_at_every_point(root):
  check_against_brute_force(root)

# ---- the facts the renderers rely on -------------------------------------------------------------

def _c(v: int, dt=dtypes.int32) -> UOp: return UOp.const(dt, v)
def _loop(n: int, dt=dtypes.int32, tag: int = 0) -> UOp: return UOp(UOps.RANGE, dt, (_c(0, dt), _c(n, dt)), ("loop", tag))

def test_bounds_are_tight_where_the_structure_allows():
  i, j = _loop(10), _loop(4, tag=1)
  idx = i * _c(16) + j * _c(4) + _c(8)
  assert bound(idx) == Bound(8, 8 + 9 * 16 + 3 * 4, 4)
  assert multiple_of(idx, 4) and not multiple_of(idx, 8)
  assert bound(UOp.alu(BinaryOps.MOD, idx, _c(32))) == Bound(0, 31, 4)
  assert bound(UOp.alu(BinaryOps.IDIV, i, _c(4))) == Bound(0, 2, 1)
  assert bound(UOp.alu(BinaryOps.SHL, i, _c(3))).divisor == 8
  assert bound(i.lt(_c(10))) == Bound(1, 1, 1) and bound(i.lt(_c(0))) == Bound(0, 0, 0)
  lid = UOp(UOps.SPECIAL, dtypes.int32, (), ("lidx0", 8, 0, "local"))
  assert bound(lid) == Bound(0, 7, 1)

def test_unknown_values_have_the_whole_type():
  buf = UOp(UOps.DEFINE_GLOBAL, dtypes.int32.ptr() if hasattr(dtypes.int32, "ptr") else dtypes.int32, (), 0)
  ld = UOp(UOps.LOAD, dtypes.int32, (buf, _c(0)))
  assert bound(ld) == Bound(-2**31, 2**31 - 1, 1)
  assert bound(ld + _c(1)).wraps and not bound(UOp.alu(BinaryOps.AND, ld, _c(255))).wraps
  with pytest.raises(ValueError, match="not an integer"): bound(UOp.const(dtypes.float32, 1.0))

def test_overflow_of_id_only_math_is_found():
  """arange(8) * 2**30 leaves int32 (numpy wraps it), arange(8) * 4 doesn't."""
  i = _loop(8)
  big, small = i * _c(2**30), i * _c(4)
  ops = frozenset({BinaryOps.MUL, BinaryOps.ADD})
  assert overflowing_int_alus([i, big, small, big + _c(1)], ops) == frozenset({big, big + _c(1)})

def test_deep_graphs_need_no_recursion():
  x = _loop(3)
  for k in range(5000): x = x + _c(k % 3)
  assert bound(x).vmax == 2 + sum(k % 3 for k in range(5000))

@pytest.mark.parametrize("dt", INT_DTYPES + (dtypes.int64,), ids=lambda d: d.name)
def test_wrapping_is_found_exactly_at_the_type_edges(dt):
  lo, hi = int(dtypes.min(dt)), int(dtypes.max(dt))
  bottom = UOp(UOps.RANGE, dt, (_c(lo, dt), _c(lo + 2, dt)), ("edge", 0))  # lo, lo + 1
  top = UOp(UOps.RANGE, dt, (_c(hi - 2, dt), _c(hi, dt)), ("edge", 1))  # hi - 2, hi - 1
  assert not bound(UOp.alu(BinaryOps.SUB, bottom, _c(0, dt))).wraps and not bound(top + _c(1, dt)).wraps
  assert bound(UOp.alu(BinaryOps.SUB, bottom, _c(1, dt))).wraps and bound(top + _c(2, dt)).wraps
  for e in (UOp.alu(BinaryOps.SUB, bottom, _c(1, dt)), top + _c(2, dt), top + _c(1, dt)): check_against_brute_force(e)

@pytest.mark.parametrize("shape", [(1000, 64), (2**17, 2**15)], ids=["int32", "past-2^31"])
def test_the_lowerers_index_width_never_wraps(shape):
  """The lowerer picks int32 or int64 for index math on the symbolic expression (lower_index.py);
  this analysis, run on the UOps it built, agrees: no UOp an address is computed from wraps, and an
  index past 2^31 (a 2^32-element elementwise kernel, only lowered) is int64."""
  from tilecraft import Tensor
  from tilecraft.codegen.kernel import Kernel
  from tilecraft.device import Device
  si = (Tensor.empty(*shape, device="CPU") + 1).schedule()[-1]
  k = Kernel(si.ast, opts=Device["CPU"].renderer).hand_coded_optimizations()
  k.linearize()
  addrs = [u.src[1] for u in k.uops if u.op in (UOps.LOAD, UOps.STORE)]
  assert addrs and all(a.dtype.scalar() == (dtypes.int64 if shape[0] * shape[1] > 2**31 else dtypes.int32) for a in addrs)
  lanes = prod(k.full_shape[k.first_upcast:])  # a vector's first address: 8 lanes on AVX2, 16 on AVX-512
  assert max(bound(a).vmax for a in addrs) >= shape[0] * shape[1] - lanes
  wrapped = [u for a in addrs for u in a.toposort() if (dtypes.is_int(u.dtype) or u.dtype.scalar() == dtypes.bool) and bound(u).wraps]
  assert not wrapped, wrapped

def test_needs_int64_with_headroom():
  """The closed-form count of a masked arange sum (lower_reduce._count) subtracts two bounds: each must
  fit int32 twice over, so the one int32 check (lower_index.IndexUOps.needs_int64) takes a headroom."""
  from tilecraft.codegen.lower_index import IndexUOps
  ix = IndexUOps()
  big = Variable("b", 0, 2**30 + 5)
  assert not ix.needs_int64(2**30) and ix.needs_int64(2**30, headroom=2) and not ix.needs_int64(2**30 - 1, headroom=2)
  assert not ix.needs_int64(big) and ix.needs_int64(big, headroom=2) and not ix.needs_int64(Variable("s", 0, 1000), headroom=2)
  assert ix.needs_int64(-(2**31)) and ix.needs_int64(2**31)
