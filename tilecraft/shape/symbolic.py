"""The one symbolic integer system: symbolic shapes (Variables) and all index arithmetic.

Expressions are immutable trees simplified eagerly when built. Constants are plain Python ints:
any operation whose result is known returns an int, so `sint = int | Node`. Every node knows its
bounds (`vmin`, `vmax`), and division, modulo and comparison fold by range analysis.

Canonical form: a linear combination is a `Sum` of (term, coefficient) pairs plus an int
constant, where terms are Variables, products, divisions, modulos and comparisons. Like terms are
collected, so `x*4 + x - x*5` is `0`. Division and modulo use Python's floor semantics.
"""
from __future__ import annotations
import functools, math
from typing import Any, Iterable, Optional, Union

sint = Union[int, "Node"]

def _unpickle_node(cls: type, state: dict) -> "Node":
  n = object.__new__(cls)
  for k, v in state.items(): object.__setattr__(n, k, v)
  n._hash, n._render, n._vars = hash(n.key), None, None
  return n

class Node:
  """A symbolic integer expression. Compare structurally with ==; use `lt`/`<` to build comparisons."""
  __slots__ = ("key", "_hash", "vmin", "vmax", "_render", "_vars", "__weakref__")
  key: tuple
  vmin: int
  vmax: int
  def _init(self, key: tuple, vmin: int, vmax: int) -> None:
    self.key, self._hash, self.vmin, self.vmax, self._render, self._vars = key, hash(key), vmin, vmax, None, None
  def __hash__(self) -> int: return self._hash
  def __eq__(self, other: object) -> bool:
    return self is other or (type(other) is type(self) and self._hash == other._hash and self.key == other.key)  # type: ignore
  def __reduce__(self) -> tuple:
    # the cached hash is per process (string hashes are salted): unpickling recomputes it
    slots = [s for c in type(self).__mro__ for s in getattr(c, "__slots__", ()) if s not in ("_hash", "_render", "_vars", "__weakref__")]
    return _unpickle_node, (type(self), {s: getattr(self, s) for s in slots if hasattr(self, s)})
  def __ne__(self, other: object) -> bool: return not self.__eq__(other)
  def __bool__(self) -> bool:
    if self.vmin > 0 or self.vmax < 0: return True
    if self.vmin == self.vmax == 0: return False
    raise TypeError(f"truth value of {self.render()} is not known from its range [{self.vmin}, {self.vmax}]")
  # arithmetic
  def __add__(self, b: sint) -> sint: return sym_sum((self, b))
  def __radd__(self, b: sint) -> sint: return sym_sum((b, self))
  def __sub__(self, b: sint) -> sint: return sym_sum((self, sym_mul(b, -1)))
  def __rsub__(self, b: sint) -> sint: return sym_sum((b, sym_mul(self, -1)))
  def __neg__(self) -> sint: return sym_mul(self, -1)
  def __mul__(self, b: sint) -> sint: return sym_mul(self, b)
  def __rmul__(self, b: sint) -> sint: return sym_mul(self, b)
  def __floordiv__(self, b: sint) -> sint: return sym_div(self, b)
  def __rfloordiv__(self, b: int) -> sint: return sym_div(b, self)
  def __mod__(self, b: sint) -> sint: return sym_mod(self, b)
  def __rmod__(self, b: int) -> sint: return sym_mod(b, self)
  # comparisons build expressions (0/1); their truth is asked with bool() and must be decidable
  def __lt__(self, b: sint) -> sint: return sym_lt(self, b)
  def __gt__(self, b: sint) -> sint: return sym_lt(b, self)
  def __le__(self, b: sint) -> sint: return sym_lt(self, sym_sum((b, 1)))
  def __ge__(self, b: sint) -> sint: return sym_lt(b, sym_sum((self, 1)))
  def __repr__(self) -> str: return f"<{self.render()}>"
  def __str__(self) -> str: return self.render()
  def render(self) -> str:
    if self._render is None: self._render = self._render_impl()
    return self._render
  def _render_impl(self) -> str: raise NotImplementedError
  def children(self) -> tuple[Node, ...]: return ()
  def vars(self) -> frozenset["Variable"]:
    """The Variables in the expression (cached: nodes are immutable)."""
    if self._vars is None:
      self._vars = frozenset((self,)) if isinstance(self, Variable) else frozenset().union(*[c.vars() for c in self.children()])
    return self._vars
  def substitute(self, sub: dict[Node, sint]) -> sint:
    """Replace Variables (or any sub-expression) and re-simplify."""
    return _substitute(self, sub, {})
  def eval(self, var_vals: dict["Variable", int]) -> int:
    """The value with var_vals; Variables missing from var_vals use their bound value."""
    r = self.substitute(var_vals)  # type: ignore[arg-type]
    if not isinstance(r, int) and (bound := {v: v.val for v in r.vars() if v.is_bound}): r = r.substitute(bound)  # type: ignore[union-attr]
    if not isinstance(r, int): raise ValueError(f"cannot evaluate {self.render()}: unbound {sorted(v.expr for v in r.vars())}")
    return r
  def bounds(self) -> tuple[int, int]: return self.vmin, self.vmax

class Variable(Node):
  """A named integer in [vmin, vmax] (API). `bind(val)` gives a bound copy for a concrete run."""
  __slots__ = ("expr", "_val")
  def __init__(self, expr: str, vmin: int, vmax: int):
    if not isinstance(vmin, int) or not isinstance(vmax, int) or vmin > vmax:
      raise ValueError(f"Variable {expr!r} needs int bounds with min <= max, got [{vmin}, {vmax}]")
    self.expr, self._val = expr, None
    self._init(("V", expr, vmin, vmax), vmin, vmax)
  def bind(self, val: int) -> "Variable":
    if not isinstance(val, int) or not self.vmin <= val <= self.vmax:
      raise ValueError(f"cannot bind {self.expr} to {val!r}: outside [{self.vmin}, {self.vmax}]")
    v = Variable(self.expr, self.vmin, self.vmax)
    v._val = val
    return v
  @property
  def val(self) -> int:
    if self._val is None: raise ValueError(f"Variable {self.expr} is not bound")
    return self._val
  @property
  def is_bound(self) -> bool: return self._val is not None
  def unbind(self) -> tuple["Variable", Optional[int]]: return Variable(self.expr, self.vmin, self.vmax), self._val
  def _render_impl(self) -> str: return self.expr
  def __repr__(self) -> str: return f"Variable({self.expr!r}, {self.vmin}, {self.vmax}" + (f", val={self._val})" if self._val is not None else ")")

class Sum(Node):
  """const + sum(coeff * term). Never built directly: use sym_sum / arithmetic."""
  __slots__ = ("terms", "const")
  def __init__(self, terms: tuple[tuple[Node, int], ...], const: int):
    self.terms, self.const = terms, const
    lo = hi = const
    for t, c in terms:
      if c > 0: lo, hi = lo + c * t.vmin, hi + c * t.vmax
      else: lo, hi = lo + c * t.vmax, hi + c * t.vmin
    self._init(("S", terms, const), lo, hi)
  def children(self) -> tuple[Node, ...]: return tuple(t for t, _ in self.terms)
  def _render_impl(self) -> str:
    parts = [t.render() if c == 1 else f"{t.render()}*{c}" for t, c in self.terms]
    if self.const: parts.append(str(self.const))
    return "(" + "+".join(parts).replace("+-", "-") + ")"

class Prod(Node):
  """A product of two non-constant expressions, e.g. a stride N*M of symbolic dims."""
  __slots__ = ("a", "b")
  def __init__(self, a: Node, b: Node):
    self.a, self.b = a, b
    ps = (a.vmin * b.vmin, a.vmin * b.vmax, a.vmax * b.vmin, a.vmax * b.vmax)
    self._init(("P", a, b), min(ps), max(ps))
  def children(self) -> tuple[Node, ...]: return (self.a, self.b)
  def _render_impl(self) -> str: return f"({self.a.render()}*{self.b.render()})"

class Div(Node):
  """floor(a / b), b > 0."""
  __slots__ = ("a", "b")
  def __init__(self, a: sint, b: sint):
    self.a, self.b = a, b
    (amin, amax), (bmin, bmax) = _bounds(a), _bounds(b)
    if amin >= 0: lo, hi = amin // bmax, amax // bmin
    else: lo, hi = min(amin // bmin, amin // bmax), max(amax // bmin, amax // bmax)
    self._init(("D", a, b), lo, hi)
  def children(self) -> tuple[Node, ...]: return tuple(x for x in (self.a, self.b) if isinstance(x, Node))
  def _render_impl(self) -> str: return f"({_r(self.a)}//{_r(self.b)})"

class Mod(Node):
  """a mod b (result in [0, b)), b > 0."""
  __slots__ = ("a", "b")
  def __init__(self, a: sint, b: sint):
    self.a, self.b = a, b
    (amin, amax), (_, bmax) = _bounds(a), _bounds(b)
    hi = bmax - 1 if amin < 0 else min(bmax - 1, amax)
    self._init(("M", a, b), 0, hi)
  def children(self) -> tuple[Node, ...]: return tuple(x for x in (self.a, self.b) if isinstance(x, Node))
  def _render_impl(self) -> str: return f"({_r(self.a)}%{_r(self.b)})"

class Lt(Node):
  """1 if a < b else 0."""
  __slots__ = ("a", "b")
  def __init__(self, a: Node, b: int):
    self.a, self.b = a, b
    self._init(("L", a, b), 0, 1)
  def children(self) -> tuple[Node, ...]: return (self.a,)
  def _render_impl(self) -> str: return f"({self.a.render()}<{self.b})"

class And(Node):
  """1 if every operand is nonzero (operands are 0/1 valued)."""
  __slots__ = ("nodes",)
  def __init__(self, nodes: tuple[Node, ...]):
    self.nodes = nodes
    self._init(("A", nodes), 0, 1)
  def children(self) -> tuple[Node, ...]: return self.nodes
  def _render_impl(self) -> str: return "(" + " and ".join(n.render() for n in self.nodes) + ")"

def _bounds(x: sint) -> tuple[int, int]: return (x, x) if isinstance(x, int) else (x.vmin, x.vmax)
def _r(x: sint) -> str: return x.render() if isinstance(x, Node) else str(x)

# ---- construction with simplification -------------------------------------------------------------

def _linear(x: sint) -> tuple[tuple[tuple[Node, int], ...], int]:
  if isinstance(x, int): return (), x
  if isinstance(x, Sum): return x.terms, x.const
  return ((x, 1),), 0

def _make_sum(coeffs: dict[Node, int], const: int) -> sint:
  """The canonical Sum for coeffs (a fresh dict, edited in place) + const."""
  if len(coeffs) > 1 and any(type(t) is Mod for t in coeffs): const += _fold_divmod(coeffs)
  terms = tuple(sorted(((t, c) for t, c in coeffs.items() if c != 0), key=lambda tc: tc[0].render()))
  if not terms: return const
  if len(terms) == 1 and terms[0][1] == 1 and const == 0: return terms[0][0]
  return Sum(terms, const)

def sym_sum(xs: Iterable[sint]) -> sint:
  """Sum of ints and expressions, with like terms collected."""
  if type(xs) is tuple and len(xs) == 2:  # fast path: expression + int keeps the terms as they are
    a, b = xs
    if isinstance(a, int) and isinstance(b, Node): a, b = b, a
    if isinstance(b, int) and isinstance(a, Node):
      if b == 0: return a
      if type(a) is not Sum: return Sum(((a, 1),), int(b))
      if (c := a.const + b) == 0 and len(a.terms) == 1 and a.terms[0][1] == 1: return a.terms[0][0]
      return Sum(a.terms, c)
  coeffs: dict[Node, int] = {}
  const = 0
  for x in xs:
    if isinstance(x, int): const += x; continue
    if not isinstance(x, Node): raise TypeError(f"cannot add {type(x).__name__} {x!r} to a symbolic expression")
    terms, c = _linear(x)
    const += c
    for t, k in terms: coeffs[t] = coeffs.get(t, 0) + k
  return _make_sum(coeffs, const)

def _fold_divmod(coeffs: dict[Node, int]) -> int:
  """k*(a//b)*b + k*(a%b) == k*a (an index split into quotient and remainder, put back together).
  Edits coeffs in place and returns the constant to add. Only exact structural matches fold."""
  const = 0
  for m in [t for t in coeffs if type(t) is Mod]:
    k = coeffs[m]
    if not k: continue
    d: sint = Div(m.a, m.b)
    if isinstance(m.b, int): want = k * m.b
    else:
      d, want = sym_mul(d, m.b), k
      if type(d) is not Prod: continue
    if coeffs.get(d, 0) != want: continue  # type: ignore[call-overload]
    coeffs[m] = coeffs[d] = 0  # type: ignore[index]
    terms, c = _linear(m.a)
    const += c * k
    for t, j in terms: coeffs[t] = coeffs.get(t, 0) + j * k
  return const

def sym_mul(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int): return a * b
  if isinstance(a, int): a, b = b, a
  if not isinstance(a, Node) or not isinstance(b, (int, Node)): raise TypeError(f"cannot multiply {a!r} by {b!r}")
  if isinstance(b, int):
    if b == 0: return 0
    if b == 1: return a
    # scaling keeps the terms' order and their canonical form: no re-sort
    if type(a) is not Sum: return Sum(((a, b),), 0)
    if len(a.terms) == 1 and a.terms[0][1] * b == 1 and a.const == 0: return a.terms[0][0]
    return Sum(tuple((t, k * b) for t, k in a.terms), a.const * b)
  # expression * expression: distribute constants and sums so the result stays linear where it can
  ta, ca = _linear(a)
  tb, cb = _linear(b)
  parts: list[sint] = [ca * cb]
  for t, k in ta: parts.append(sym_mul(t, cb * k) if cb else 0)
  for t, k in tb: parts.append(sym_mul(t, ca * k) if ca else 0)
  for t1, k1 in ta:
    for t2, k2 in tb:
      x, y = (t1, t2) if t1.render() <= t2.render() else (t2, t1)
      parts.append(sym_mul(Prod(x, y), k1 * k2))
  return sym_sum(parts)

def _check_divisor(b: sint, what: str) -> None:
  if isinstance(b, int) and b <= 0: raise ZeroDivisionError(f"symbolic {what} by {b}: divisor must be positive")
  if isinstance(b, Node) and b.vmin <= 0: raise ZeroDivisionError(f"symbolic {what} by {b.render()}, which may be <= 0")

def sym_div(a: sint, b: sint) -> sint:
  """floor(a / b) for b > 0."""
  if isinstance(a, int) and isinstance(b, int): return a // b
  _check_divisor(b, "division")
  if b == 1: return a
  if isinstance(b, Node):
    if isinstance(a, int):
      return lo if (lo := a // b.vmax) == a // b.vmin else Div(a, b)
    if a == b: return 1
    if a.vmin >= 0 and a.vmax < b.vmin: return 0
    if isinstance(a, Mod) and a.b == b: return 0  # (x % b) // b
    terms, c = _linear(a)
    # (x*b + y) // b -> x + y // b
    exact = [t for t, k in terms if _has_factor(t, b)]
    if exact:
      q = sym_sum(sym_mul(_drop_factor(t, b), k) for t, k in terms if t in exact)
      return sym_sum((q, sym_div(sym_sum([sym_mul(t, k) for t, k in terms if t not in exact] + [c]), b)))
    return Div(a, b)
  assert isinstance(a, Node)
  if (lo := a.vmin // b) == a.vmax // b: return lo
  if isinstance(a, Div) and isinstance(a.b, int): return sym_div(a.a, a.b * b)
  terms, c = _linear(a)
  # split off the part that divides exactly: (b*x + r) // b == x + r // b (floor semantics)
  quot: dict[Node, int] = {}
  rest: dict[Node, int] = {}
  for t, k in terms:
    if k % b == 0: quot[t] = k // b
    else: rest[t] = k
  qc, rc = divmod(c, b)
  if quot:
    return sym_sum((_make_sum(quot, qc), sym_div(_make_sum(rest, rc), b)))
  # common factor: (g*x + g*y) // (g*m) == (x + y) // m
  g = math.gcd(b, c, *rest.values())
  if g > 1: return sym_div(_make_sum({t: k // g for t, k in rest.items()}, c // g), b // g)
  # the small terms stay within one quotient of a factor f of b: (f*X + R) // (f*m) == (X + q) // m
  if (split := _split_factor(rest, c, b)) is not None:
    f, big, q, _ = split
    m = b // f  # (whole multiples of m leave the quotient as they leave sym_mod's remainder: the two recombine)
    return sym_sum((sym_div(sym_sum((big, q % m)), m), q // m))
  return Div(a, b)

def _split_factor(terms: dict[Node, int], c: int, b: int) -> Optional[tuple[int, sint, int, sint]]:
  """For a = sum(k*t) + c and an int divisor b: the largest f with 1 < f < b, f | b, that splits a
  into f*X + R (X: the terms whose coefficient f divides, over f; R: the rest with c) where R // f is
  one value q over R's range, as (f, X, q, R); None if there is none. Then, in floor semantics and for
  every value (negative ones too), a // b == (X + q) // (b/f) and a mod b == f*((X + q) mod (b/f)) +
  R - f*q: floor(a / (f*m)) == floor(floor(a / f) / m), and floor((f*X + R) / f) == X + q.
  The f tried are the gcds of b with the coefficients and with each other (a factor shared by
  several terms is found too). R may be the constant alone: (4*x + 3) // 8 == x // 2. It takes a
  channel shuffle out of a depthwise conv's index: (c*784 + R) // 3136 with R in [0, 784) is c // 4."""
  cands = {g for k in terms.values() if 1 < (g := math.gcd(b, k)) < b}
  if not cands: return None
  todo = list(cands)
  while todo:  # close under gcd: a factor common to a subset of the terms
    x = todo.pop()
    for y in list(cands):
      if (g := math.gcd(x, y)) > 1 and g not in cands: cands.add(g); todo.append(g)
  for f in sorted(cands, reverse=True):
    big = {t: k // f for t, k in terms.items() if k % f == 0}
    r = _make_sum({t: k for t, k in terms.items() if k % f}, c)
    lo, hi = _bounds(r)
    if (q := lo // f) == hi // f: return f, _make_sum(big, 0), q, r
  return None

def _has_factor(t: Node, f: Node) -> bool: return t == f or (isinstance(t, Prod) and (t.a == f or t.b == f))
def _drop_factor(t: Node, f: Node) -> sint: return 1 if t == f else (t.b if t.a == f else t.a)  # type: ignore[attr-defined]

def sym_mod(a: sint, b: sint) -> sint:
  """a mod b for b > 0 (Python semantics: result in [0, b))."""
  if isinstance(a, int) and isinstance(b, int): return a % b
  _check_divisor(b, "modulo")
  if b == 1: return 0
  if isinstance(b, Node):
    if isinstance(a, int):
      return a if 0 <= a < b.vmin else Mod(a, b)
    if a == b: return 0
    if a.vmin >= 0 and a.vmax < b.vmin: return a
    if isinstance(a, Mod) and a.b == b: return a  # (x % b) % b
    terms, c = _linear(a)
    keep = [sym_mul(t, k) for t, k in terms if not _has_factor(t, b)]
    if len(keep) < len(terms): return sym_mod(sym_sum(keep + [c]), b)
    return Mod(a, b)
  assert isinstance(a, Node)
  # range within one period: a mod b == a - k*b
  if (q := a.vmin // b) == a.vmax // b: return sym_sum((a, -q * b))
  if isinstance(a, Mod) and isinstance(a.b, int) and a.b % b == 0: return sym_mod(a.a, b)
  terms, c = _linear(a)
  reduced = {t: k % b for t, k in terms if k % b}
  new = _make_sum(reduced, c % b)
  if isinstance(new, int): return new % b
  if new != a: return sym_mod(new, b)
  # common factor: (g*x) mod (g*m) == g * (x mod m)
  g = math.gcd(b, c, *reduced.values())
  if g > 1: return sym_mul(sym_mod(_make_sum({t: k // g for t, k in reduced.items()}, c // g), b // g), g)
  # the same split as sym_div's: (f*X + R) mod (f*m) == f*((X + q) mod m) + R - f*q
  if (split := _split_factor(reduced, c % b, b)) is not None:
    f, big, q, r = split
    return sym_sum((sym_mul(sym_mod(sym_sum((big, q % (b // f))), b // f), f), r, -f * q))
  return Mod(a, b)

def sym_lt(a: sint, b: sint) -> sint:
  """1 if a < b else 0 (as an expression when not decidable)."""
  if isinstance(a, int) and isinstance(b, int): return int(a < b)
  d = sym_sum((a, sym_mul(b, -1)))  # a < b  <=>  a - b < 0
  if isinstance(d, int): return int(d < 0)
  if d.vmax < 0: return 1
  if d.vmin >= 0: return 0
  terms, c = _linear(d)
  if all(k < 0 for _, k in terms):  # -A + c < 0  <=>  not (A < c + 1): keep comparisons in the A < k form
    return sym_sum((1, sym_mul(sym_lt(_make_sum({t: -k for t, k in terms}, 0), c + 1), -1)))
  # x*g + c < 0  <=>  x < ceil(-c / g) for g = gcd of the coefficients
  g = math.gcd(*(k for _, k in terms))
  lhs = _make_sum({t: k // g for t, k in terms}, 0)
  bound = -(c // g)  # integer lhs*g < -c  <=>  lhs < ceil(-c/g)
  if isinstance(lhs, int): return int(lhs < bound)
  if lhs.vmax < bound: return 1
  if lhs.vmin >= bound: return 0
  # m*X + R < bound with 0 <= R < m and m | bound  <=>  X < bound/m  (R can never carry)
  lterms, _ = _linear(lhs)
  for m in sorted({abs(k) for _, k in lterms if abs(k) > 1}, reverse=True):
    if bound % m: continue
    big = {t: k // m for t, k in lterms if k % m == 0}
    rest = _make_sum({t: k for t, k in lterms if k % m}, 0)
    if big and (isinstance(rest, int) or (rest.vmin >= 0 and rest.vmax < m)): return sym_lt(_make_sum(big, 0), bound // m)
  # x // d < B  <=>  x < B*d  (floor division by a positive int)
  if type(lhs) is Div and isinstance(lhs.b, int): return sym_lt(lhs.a, bound * lhs.b)
  return Lt(lhs, bound)

def sym_and(*xs: sint) -> sint:
  """Logical and of 0/1 expressions, flattened, with known operands folded."""
  nodes: list[Node] = []
  for x in xs:
    if isinstance(x, int):
      if not x: return 0
      continue
    if x.vmin > 0 or x.vmax < 0: continue  # never zero: true
    if x.vmin == x.vmax == 0: return 0
    for n in (x.nodes if isinstance(x, And) else (x,)):
      if n not in nodes: nodes.append(n)
  if not nodes: return 1
  # a lone operand stands for itself only when it is already 0/1 valued (e.g. a comparison)
  if len(nodes) == 1 and nodes[0].vmin >= 0 and nodes[0].vmax <= 1: return nodes[0]
  return And(tuple(sorted(nodes, key=lambda n: n.render())))

def _substitute(n: sint, sub: dict, memo: dict) -> sint:
  if isinstance(n, int): return n
  if n in sub: return sub[n]
  if n in memo: return memo[n]
  s = functools.partial(_substitute, sub=sub, memo=memo)
  if isinstance(n, Variable): r: sint = n
  elif isinstance(n, Sum): r = sym_sum([sym_mul(s(t), k) for t, k in n.terms] + [n.const])
  elif isinstance(n, Prod): r = sym_mul(s(n.a), s(n.b))
  elif isinstance(n, Div): r = sym_div(s(n.a), s(n.b))
  elif isinstance(n, Mod): r = sym_mod(s(n.a), s(n.b))
  elif isinstance(n, Lt): r = sym_lt(s(n.a), n.b)
  elif isinstance(n, And): r = sym_and(*[s(x) for x in n.nodes])
  else: raise TypeError(f"unknown node {n!r}")
  memo[n] = r
  return r

# ---- helpers used everywhere shapes may be symbolic ------------------------------------------------

def sym_eval(x: sint, var_vals: dict[Variable, int]) -> int:
  """The value of x with the Variables in var_vals (API for launch sizes and shapes)."""
  return x if isinstance(x, int) else x.eval(var_vals)

def sym_vars(x: Any) -> set[Variable]:
  if isinstance(x, Node): return x.vars()
  if isinstance(x, (tuple, list)): return set().union(*[sym_vars(y) for y in x]) if x else set()
  return set()

def sym_render(x: sint) -> str: return _r(x)

def smax(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int): return max(a, b)
  d = sym_sum((a, sym_mul(b, -1)))
  if isinstance(d, int): return a if d >= 0 else b
  if d.vmin >= 0: return a
  if d.vmax <= 0: return b
  raise ValueError(f"max({_r(a)}, {_r(b)}) is not decidable from the variables' ranges")

def smin(a: sint, b: sint) -> sint:
  r = smax(a, b)
  return b if r is a else a

def unbind_all(x: Any) -> tuple[Any, dict[Variable, int]]:
  """Replace bound Variables by unbound ones, returning their values."""
  vals: dict[Variable, int] = {}
  if not isinstance(x, Node): return x, vals
  sub: dict[Node, sint] = {}
  for v in x.vars():
    if v.is_bound:
      u, val = v.unbind()
      vals[u] = val  # type: ignore[assignment]
      sub[v] = u
  return (x.substitute(sub) if sub else x), vals
