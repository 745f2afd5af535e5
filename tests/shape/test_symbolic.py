"""The symbolic integer system: identities, bounds, range-based folding and a differential property test."""
import itertools
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from tilecraft.shape.symbolic import (And, Div, Lt, Mod, Node, Prod, Sum, Variable, sint, smax, smin, sym_and, sym_div, sym_eval,
                                      sym_lt, sym_mod, sym_mul, sym_render, sym_sum, sym_vars, unbind_all, _substitute)

def V(name: str, lo: int, hi: int) -> Variable: return Variable(name, lo, hi)

def all_values(e: sint, vs: list[Variable]) -> list[tuple[dict, int]]:
  out = []
  for vals in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs]):
    sub = dict(zip(vs, vals))
    out.append((sub, sym_eval(e, sub)))
  return out

def bounds_of(e: sint) -> tuple[int, int]: return (e, e) if isinstance(e, int) else (e.vmin, e.vmax)

def exact_bounds(e: sint, vs: list[Variable]) -> tuple[int, int]:
  vals = [r for _, r in all_values(e, vs)]
  return min(vals), max(vals)

# ---- identities ------------------------------------------------------------------------------------

x, y, z = V("x", 0, 10), V("y", 0, 3), V("z", -5, 5)
N, M = V("N", 1, 16), V("M", 4, 32)

def test_identities():
  assert x + 0 is x and 0 + x is x
  assert x * 1 is x and 1 * x is x
  assert x * 0 == 0 and isinstance(x * 0, int)
  assert x - x == 0 and isinstance(x - x, int)
  assert x * 4 + x - x * 5 == 0
  assert (x + y) - y is x or (x + y) - y == x
  assert -(-x) == x
  assert x // 1 is x and x % 1 == 0
  assert sym_sum([]) == 0 and sym_sum([1, 2, 3]) == 6

def test_like_terms_and_constants():
  e = x * 3 + y + 2 + x * -3 + 5
  assert e == y + 7
  assert isinstance(e, Sum) and e.const == 7 and e.terms == ((y, 1),)
  assert (x + 1) - (x + 1) == 0
  assert (x + y) * 2 - x * 2 == y * 2

def test_distribution():
  assert (x + y) * 3 == x * 3 + y * 3
  assert 3 * (x + y + 1) == x * 3 + y * 3 + 3
  assert -(x - y) == y - x
  # expression * expression distributes sums, keeping products of plain terms
  e = (x + 2) * (y + 3)
  assert e == x * y + x * 3 + y * 2 + 6
  assert x * y == y * x
  assert isinstance(x * y, Prod)
  for sub, r in all_values(e, [x, y]): assert r == (sub[x] + 2) * (sub[y] + 3)

def test_canonical_order_is_independent_of_construction():
  a = x * 2 + y - z + 3
  b = 3 - z + y + 2 * x
  c = sym_sum([y, 3, -z, x, x])
  assert a == b == c and hash(a) == hash(b) == hash(c)
  assert a.render() == b.render() == c.render()
  assert sym_and(x < 3, y < 2) == sym_and(y < 2, x < 3)

def test_render_readable_and_deterministic():
  assert x.render() == "x"
  assert (x * 4 + y).render() == "(x*4+y)"
  assert (x + y - 3).render() == "(x+y-3)"
  assert (x // 4).render() == "(x//4)"
  assert (x % 4).render() == "(x%4)"
  assert (x < 4).render() == "(x<4)"
  assert sym_and(x < 4, y < 2).render() == "((x<4) and (y<2))"
  assert (x * N).render() == "(N*x)"
  assert str(x + 1) == "(x+1)" and repr(x + 1) == "<(x+1)>"
  assert sym_render(5) == "5" and sym_render(x) == "x"
  # same expression built twice renders the same
  assert ((x * 3 + y) // 2).render() == ((y + 3 * x) // 2).render()

# ---- bounds ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("e, vs", [
  (x * -2 + y * 3 - 1, [x, y]),
  (z * -3 + 4, [z]),
  (x * y, [x, y]),
  (z * y, [z, y]),
  (z * z, [z]),
  (x // 3, [x]),
  (z // 3, [z]),
  ((z - 2) // 4, [z]),
  (x // N, [x, N]),
  (z // N, [z, N]),
  (x % 4, [x]),
  (z % 4, [z]),
  (y % 7, [y]),
  (x % N, [x, N]),
  (z < 2, [z]),
  (x < y, [x, y]),
  (sym_and(x < 3, y < 2), [x, y]),
])
def test_bounds_sound(e, vs):
  lo, hi = exact_bounds(e, vs)
  assert e.vmin <= lo and hi <= e.vmax

def test_bounds_exact_for_linear():
  assert (x * -2 + y * 3 - 1).bounds() == (-21, 8)
  assert (z * -3 + 4).bounds() == (-11, 19)
  assert (x * y).bounds() == (0, 30)
  assert (z * y).bounds() == (-15, 15)
  assert (x // 3).bounds() == (0, 3)
  assert (z // 3).bounds() == (-2, 1)
  assert (x % 4).bounds() == (0, 3)
  assert (y % 7).bounds() == (0, 3)
  assert (x < y).bounds() == (0, 1)
  assert sym_and(x < 3, y < 2).bounds() == (0, 1)
  assert (x // N).bounds() == (0, 10)
  assert (x % N).bounds() == (0, 10)

# ---- div / mod / lt by range -----------------------------------------------------------------------

def test_div_mod_split_exact_part():
  assert (x * 4 + y) // 4 == x
  assert (x * 4 + y) % 4 == y
  assert (x * 4 + y + 8) // 4 == x + 2
  assert (x * 6 + 3) // 3 == x * 2 + 1
  assert (x * 6 + 3) % 3 == 0
  assert (x * 8 + y * 2) // 2 == x * 4 + y
  assert (x * 4 + 5) % 4 == 1

def test_div_mod_nested():
  assert (x % 8) % 4 == x % 4
  w = V("w", 0, 30)
  assert (w % 12) % 5 != w % 5  # 5 does not divide 12: no fold
  assert (x % 12) % 5 == x % 5  # x < 12: the inner mod is x
  assert (x // 4) // 2 == x // 8
  assert (x % 4) // 4 == 0
  assert y // 4 == 0 and y % 4 is y

def test_div_mod_common_factor():
  assert (x * 2) // 4 == x // 2
  assert (x * 6 + y * 6) // 4 == (x * 3 + y * 3) // 2
  assert (x * 2) % 4 == (x % 2) * 2
  for e in [(x * 2) // 4, (x * 6 + 2) % 4, (x * 6 + 2) // 4]:
    for sub, r in all_values(e, [x]): assert r == eval_ref(e, sub)

def eval_ref(e, sub):  # evaluate a simplified expression directly with Python ints (a second opinion on eval)
  if isinstance(e, int): return e
  if isinstance(e, Variable): return sub[e]
  if isinstance(e, Sum): return sum(eval_ref(t, sub) * k for t, k in e.terms) + e.const
  if isinstance(e, Prod): return eval_ref(e.a, sub) * eval_ref(e.b, sub)
  if isinstance(e, Div): return eval_ref(e.a, sub) // eval_ref(e.b, sub)
  if isinstance(e, Mod): return eval_ref(e.a, sub) % eval_ref(e.b, sub)
  if isinstance(e, Lt): return int(eval_ref(e.a, sub) < e.b)
  if isinstance(e, And): return int(all(eval_ref(n, sub) for n in e.nodes))
  raise TypeError(e)

def test_divmod_recombines():
  K = V("K", 4, 16)
  assert (x // 4) * 4 + x % 4 is x
  assert (x // N) * N + x % N is x
  assert ((x // 4) * 4 + x % 4) * 2 + 1 == x * 2 + 1
  assert (x // 4) * 8 + (x % 4) * 2 == x * 2
  assert ((x + y) // 3) * 3 + (x + y) % 3 - y is x
  assert x % 4 + y + (x // 4) * 4 == x + y
  assert (z // 3) * 3 + z % 3 is z
  assert ((x * K + y) // 5) * 5 + (x * K + y) % 5 == x * K + y
  # no fold when the coefficients do not match
  e = (x // 4) * 4 + (x % 4) * 2
  assert isinstance(e, Sum) and len(e.terms) == 2
  assert (x // 4) * 3 + x % 4 != x

def test_mod_div_of_mod_symbolic():
  assert (x % N) // N == 0
  assert (x % N) % N == x % N
  assert (x % 8) // 8 == 0

def test_lt_of_div():
  w = V("w", 0, 40)
  assert (w // 4 < 3) == (w < 12)
  assert (z // 3 < 0) == (z < 0)
  assert (w // 4 >= 2) == 1 - (w < 8)
  assert (x // 4 < 3) == 1
  for e in [w // 4 < 3, z // 3 < 0, z // 4 < -1, (w * 3 + y) // 4 < 5, (z - w) // 7 < -2]:
    assert isinstance(e, Node)
    for sub, r in all_values(e, sorted(e.vars(), key=lambda v: v.expr)): assert r == eval_ref(e, sub)

def test_div_mod_symbolic_divisor():
  K = V("K", 4, 16)
  assert (K * 4 + y) // K == 4  # 0 <= y < 4 <= K
  assert (K * 4 + y) % K is y
  assert (K * x + y) // K == x
  assert (K * x + y) % K is y
  assert (x * K) // K is x
  assert N // N == 1 and N % N == 0
  assert 3 // K == 0 and 3 % K == 3
  assert isinstance(N // N * 2, int)
  assert (N * 4 + y) // N == y // N + 4  # y may exceed N: stays symbolic
  for e in [(N * 4 + y) // N, (N * x + z) // N, (N * x + z) % N, 7 // N, 7 % N]:
    for sub, r in all_values(e, sorted(sym_vars(e), key=lambda v: v.expr)): assert r == eval_ref(e, sub)

def test_div_mod_negative_floor_semantics():
  assert (z * 4 - 1) // 4 == z + (-1) // 4
  assert (z * 4 - 1) // 4 == z - 1
  assert (z * 4 - 1) % 4 == 3
  w = V("w", -3, -1)
  assert w // 4 == -1 and w % 4 == w + 4
  for e in [z // 3, z % 3, (z * 3 - 2) // 6, (z - 7) % 5]:
    for sub, r in all_values(e, [z]): assert r == eval_ref(e, sub)

def test_divide_by_nonpositive_raises():
  with pytest.raises(ZeroDivisionError): x // 0
  with pytest.raises(ZeroDivisionError): x % -2
  with pytest.raises(ZeroDivisionError): x // z
  with pytest.raises(ZeroDivisionError): x % z

def test_lt_folds():
  assert ((x * 4 + y) < 8) == (x < 2)
  assert (x < 11) == 1 and (x < 0) == 0 and isinstance(x < 11, int)
  assert (y < x + 4) == 1
  assert (x * 2 < 7) == (x < 4)
  assert (x * 2 < 8) == (x < 4)
  assert (x >= 3) == 1 - (x < 3)
  assert (x > 3) == 1 - (x < 4)
  assert (x <= 3) == (x < 4)
  assert (x < 3) * 1 == (x < 3)
  assert (x - 1 < 3) == (x < 4)
  assert (3 < x) == (x > 3)
  y4 = V("y4", 0, 4)  # may carry into the next multiple of 4: no fold
  assert (x * 4 + y4 < 8) != (x < 2)
  for sub, r in all_values(x * 4 + y4 < 8, [x, y4]): assert r == int(sub[x] * 4 + sub[y4] < 8)

def test_and_folds():
  assert sym_and(x < 11, y < 2) == (y < 2)
  assert sym_and(x < 0, y < 2) == 0
  assert sym_and() == 1 and sym_and(1, 1) == 1 and sym_and(1, 0) == 0
  a = sym_and(x < 3, y < 2)
  assert sym_and(a, z < 1) == sym_and(x < 3, y < 2, z < 1)
  assert isinstance(sym_and(a, z < 1), And) and len(sym_and(a, z < 1).nodes) == 3
  assert sym_and(x < 3, x < 3) == (x < 3)
  w = V("w", -2, -1)
  assert sym_and(w, x < 3) == (x < 3)  # w is never 0: true
  u = V("u", -1, 0)
  assert sym_and(u, x < 3) != 0  # u may be -1 (true) or 0 (false): not foldable
  for sub, r in all_values(sym_and(u, x < 3), [u, x]): assert r == int(sub[u] != 0 and sub[x] < 3)

def test_bool_of_comparisons():
  assert bool(x < 11) and not bool(x < 0)
  assert bool(x + 1) and not bool(x - x)
  with pytest.raises(TypeError): bool(x < 5)
  with pytest.raises(TypeError): bool(z)
  with pytest.raises(TypeError):
    if x < y: pass
  assert bool(V("p", 1, 5))

# ---- variables, substitute, eval ------------------------------------------------------------------

def test_variable_bind_unbind():
  n = V("n", 1, 64)
  b = n.bind(7)
  assert b.val == 7 and b.is_bound and not n.is_bound
  assert b == n and hash(b) == hash(n)
  u, val = b.unbind()
  assert val == 7 and not u.is_bound and u == n
  assert n.unbind() == (n, None)
  with pytest.raises(ValueError): n.val
  for bad in (0, 65, -1, 3.0, "3"):
    with pytest.raises(ValueError, match="n"): n.bind(bad)
  with pytest.raises(ValueError): V("q", 3, 2)
  with pytest.raises(ValueError): V("q", 0, 2.5)
  assert "val=7" in repr(b)

def test_unbind_all():
  n, m = V("n", 1, 64), V("m", 1, 8)
  e = n.bind(5) * 4 + m.bind(3)
  u, vals = unbind_all(e)
  assert vals == {n: 5, m: 3}
  assert all(not v.is_bound for v in u.vars())
  assert u == n * 4 + m
  assert unbind_all(3) == (3, {})
  assert unbind_all(n * 2) == (n * 2, {})

def test_substitute_and_eval():
  e = (x * 4 + y) // 3 + z % 2
  assert e.substitute({x: 1}) == (y + 4) // 3 + z % 2
  assert e.substitute({x: 2, y: 3, z: -3}) == 11 // 3 + (-3) % 2
  assert e.eval({x: 2, y: 3, z: -3}) == 4
  assert sym_eval(e, {x: 2, y: 3, z: -3}) == 4 and sym_eval(7, {}) == 7
  assert (x * N).substitute({N: 4}) == x * 4
  assert (x + y).substitute({x: y}) == y * 2
  assert (x // 4).substitute({x: y}) == 0  # re-simplified with y's range
  assert e.vars() == {x, y, z} and sym_vars([e, 3, N]) == {x, y, z, N} and sym_vars(3) == set()

def test_eval_errors_name_unbound_variables():
  e = x * 2 + N
  with pytest.raises(ValueError, match="N"): e.eval({x: 1})
  with pytest.raises(ValueError, match="x") as ei: e.eval({})
  assert "N" in str(ei.value)

def test_eval_uses_bound_values():
  n = V("n", 1, 64).bind(6)
  e = n * 2 + x
  assert e.eval({x: 1}) == 13
  assert e.eval({x: 1, n: 3}) == 7  # explicit values win over bound ones

def test_smax_smin():
  assert smax(3, 5) == 5 and smin(3, 5) == 3
  assert smax(x, 0) is x and smin(x, 0) == 0
  assert smax(x + 1, x) == x + 1 and smin(x + 1, x) is x
  assert smax(N, 1) is N and smin(N, 1) == 1
  assert smin(x, 11) is x and smax(x, 11) == 11
  with pytest.raises(ValueError): smax(x, 5)
  with pytest.raises(ValueError): smin(x, y)

# ---- differential property test -------------------------------------------------------------------

@st.composite
def variables(draw):
  n = draw(st.integers(2, 3))
  vs = []
  for name in "abc"[:n]:
    lo = draw(st.integers(-4, 4))
    vs.append(V(name, lo, lo + draw(st.sampled_from([1, 2, 3, 4, 0]))))
  return vs

def divisors(nv: int):
  return st.one_of(st.tuples(st.just("int"), st.integers(1, 9)), st.tuples(st.just("var"), st.integers(0, nv - 1)),
                   st.tuples(st.just("shift"), st.integers(0, nv - 1), st.integers(1, 3)))

OPS = ["add", "sub", "mul", "mulc", "neg", "div", "mod", "div", "mod", "lt", "le", "ltc", "and", "split"]

@st.composite
def trees(draw, nv: int, depth: int):
  """A random expression tree as nested tuples; inner nodes are much likelier than leaves near the root."""
  if depth == 0 or draw(st.integers(0, 9)) >= 8:
    if draw(st.integers(0, 3)) == 0: return ("const", draw(st.integers(-6, 6)))
    return ("var", draw(st.integers(0, nv - 1)))
  op = draw(st.sampled_from(OPS))
  a = draw(trees(nv, depth - 1))
  if op == "neg": return (op, a)
  if op == "mulc": return (op, a, draw(st.integers(-5, 5)))
  if op == "ltc": return (op, a, draw(st.integers(-10, 10)))
  if op in ("div", "mod", "split"): return (op, a, draw(divisors(nv)))
  return (op, a, draw(trees(nv, depth - 1)))

@st.composite
def problems(draw, depth=5):
  vs = draw(variables())
  return vs, draw(trees(len(vs), depth))

def _divisor(d, vs, symbolic: bool, vals=None):
  if d[0] == "int": return d[1]
  v = vs[d[1]]
  val = v if symbolic else vals[d[1]]
  if d[0] == "var":  # only positive variables divide; others fall back to a constant
    return val if v.vmin > 0 else 3
  return val - v.vmin + d[2]

def build(t, vs, vals=None):
  """The tree as a symbolic expression (vals is None) or its value with Python int arithmetic."""
  symbolic = vals is None
  op = t[0]
  if op == "var": return vs[t[1]] if symbolic else vals[t[1]]
  if op == "const": return t[1]
  a = build(t[1], vs, vals)
  if op == "neg": return -a
  if op == "mulc": return a * t[2]
  if op in ("div", "mod"):
    d = _divisor(t[2], vs, symbolic, vals)
    return a // d if op == "div" else a % d
  if op == "split":  # (a // d) * d + a % d, with a and d built as separate expressions
    d = _divisor(t[2], vs, symbolic, vals)
    return (a // d) * d + a % _divisor(t[2], vs, symbolic, vals)
  if op == "ltc": return sym_lt(a, t[2]) if symbolic else int(a < t[2])
  b = build(t[2], vs, vals)
  if op == "add": return a + b
  if op == "sub": return a - b
  if op == "mul": return a * b
  if op == "lt": return sym_lt(a, b) if symbolic else int(a < b)
  if op == "le": return sym_lt(a, sym_sum((b, 1))) if symbolic else int(a <= b)
  if op == "and": return sym_and(a, b) if symbolic else int(a != 0 and b != 0)
  raise ValueError(op)

def check_node_bounds(e: Node, sub: dict):
  memo: dict = {}
  r = _substitute(e, sub, memo)
  for n, val in memo.items():
    assert isinstance(val, int), f"{n.render()} did not evaluate"
    assert n.vmin <= val <= n.vmax, f"{n.render()} = {val} outside [{n.vmin}, {n.vmax}] at {sub}"
  return r

def check_tree(vs, t):
  e = build(t, vs)
  assert isinstance(e, (int, Node))
  if isinstance(e, Node): assert e.vars() <= set(vs)
  assert e == build(t, vs) and sym_render(e) == sym_render(build(t, vs))  # deterministic
  for vals in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs]):
    want = build(t, vs, list(vals))
    sub = dict(zip(vs, vals))
    got = check_node_bounds(e, sub) if isinstance(e, Node) else e
    assert got == want, f"{sym_render(e)} at {sub}: got {got}, want {want}"
    assert bounds_of(e)[0] <= want <= bounds_of(e)[1], f"{sym_render(e)} = {want} outside {bounds_of(e)} at {sub}"
  # partial substitution of a variable by an expression within its range re-simplifies soundly
  if isinstance(e, Node) and len(vs) >= 2:
    v0, v1 = vs[0], vs[1]
    span = v0.vmax - v0.vmin + 1
    repl = sym_sum((sym_mod(v1, span), v0.vmin))
    e2 = e.substitute({v0: repl})
    for vals in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs[1:]]):
      full = [vals[0] % span + v0.vmin, *vals]
      want = build(t, vs, full)
      sub = dict(zip(vs[1:], vals))
      got = check_node_bounds(e2, sub) if isinstance(e2, Node) else e2
      assert got == want, f"{sym_render(e2)} at {sub}: got {got}, want {want}"

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

@pytest.mark.fuzz
@PROPERTY
@given(problems())
def test_random_expressions_match_python(p):
  check_tree(*p)

@pytest.mark.slow
@pytest.mark.fuzz
@settings(max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck))
@given(problems(depth=6))
def test_random_expressions_match_python_slow(p):
  check_tree(*p)

@st.composite
def linear_problems(draw):
  """Linear forms sum(k_i * v_i) + c compared, divided or taken modulo: the shapes index arithmetic is made of."""
  vs = [V(name, lo := draw(st.sampled_from([0, 0, 1, -1, -3])), lo + draw(st.integers(0, 8))) for name in "abc"[:draw(st.integers(1, 3))]]
  ks = [draw(st.sampled_from([1, 1, -1, 2, 3, 4, -4, 6, 8, 16])) for _ in vs]
  c = draw(st.integers(-20, 20))
  op = draw(st.sampled_from(["lt", "div", "mod", "gt"]))
  return vs, ks, c, op, draw(st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16]))

@pytest.mark.fuzz
@PROPERTY
@given(linear_problems())
def test_linear_forms_match_python(p):
  vs, ks, c, op, n = p
  lin = sym_sum([sym_mul(v, k) for v, k in zip(vs, ks)] + [c])
  e = {"lt": lambda: sym_lt(lin, n), "div": lambda: sym_div(lin, n), "mod": lambda: sym_mod(lin, n), "gt": lambda: sym_lt(n, lin)}[op]()
  ref = {"lt": lambda a: int(a < n), "div": lambda a: a // n, "mod": lambda a: a % n, "gt": lambda a: int(n < a)}[op]
  for vals in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs]):
    sub = dict(zip(vs, vals))
    got = check_node_bounds(e, sub) if isinstance(e, Node) else e
    assert got == ref(sum(k * v for k, v in zip(ks, vals)) + c), f"{sym_render(e)} at {sub}"

def check_smax(vs, ta, tb):
  a, b = build(ta, vs), build(tb, vs)
  for f, ref in ((smax, max), (smin, min)):
    try: r = f(a, b)
    except ValueError:
      # undecidable: the difference must really change sign over the variables' box... or its bounds were too loose
      continue
    assert r is a or r is b or r == a or r == b
    for vals in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs]):
      sub = dict(zip(vs, vals))
      assert sym_eval(r, sub) == ref(sym_eval(a, sub), sym_eval(b, sub)), f"{f.__name__}({sym_render(a)}, {sym_render(b)}) at {sub}"

@pytest.mark.fuzz
@PROPERTY
@given(variables().flatmap(lambda vs: st.tuples(st.just(vs), trees(len(vs), 3), trees(len(vs), 3))))
def test_smax_smin_match_python(p):
  check_smax(*p)

def test_smax_decides_linear_differences():
  # when the difference is linear and the ranges are exact, smax must decide whenever Python's max is one side everywhere
  vs = [V("a", -2, 2), V("b", 0, 3)]
  a, b = vs
  for ea, eb in [(a + 5, b), (b + 3, a + 1), (a * 2 + 10, b * 2), (b, a - 3), (a - 3, b)]:
    for f, ref in ((smax, max), (smin, min)):
      r = f(ea, eb)
      for sub, val in all_values(r, vs): assert val == ref(sym_eval(ea, sub), sym_eval(eb, sub))
