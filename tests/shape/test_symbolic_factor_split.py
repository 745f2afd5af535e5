"""The factor split of floor division and modulo by an int (symbolic.py `_split_factor`):
(f*X + R) // (f*m) == (X + q) // m and (f*X + R) mod (f*m) == f*((X + q) mod m) + R - f*q when
R // f is the single value q over R's range. It takes the channel shuffle out of the depthwise convs
that read through it (ShuffleNet): `(c*784 + row*28 + col - 29) // 3136` with the padded window's
valid rows and columns keeping row*28 + col - 29 in [0, 784) becomes `c // 4`, so the lanes of a row
differ by constants and load as one vector. Checked here by brute force over every value of small
boxes (negative ones too) against Python's // and %, every node's bounds included, where the rule
fires and where it must not; then the kernel vs numpy on CPU, LLVM and OPENCL, under random opts."""
import itertools, random
import numpy as np
import pytest
from tilecraft import Tensor
from tilecraft.codegen.kernel import Kernel
from tilecraft.device import Device
from tilecraft.shape.symbolic import Div, Mod, Node, Variable, _split_factor, _substitute, sint, sym_div, sym_mod, sym_mul, sym_sum

def V(name: str, lo: int, hi: int) -> Variable: return Variable(name, lo, hi)

def divmods(e: sint) -> list[Node]:
  """Every Div and Mod node in e."""
  if not isinstance(e, Node): return []
  return ([e] if isinstance(e, (Div, Mod)) else []) + [n for c in e.children() for n in divmods(c)]

def ev(e: sint, sub: dict) -> int: return e if isinstance(e, int) else e.substitute(sub)  # type: ignore[return-value]

def divisors(e: sint) -> set:
  return {n.b for n in divmods(e)}

def check_exhaustive(e: sint, vs: list[Variable], ref) -> None:
  """e equals ref(*values) at every point of the variables' box, and every node of e lies in its bounds."""
  for vals in itertools.product(*[range(v.vmin, v.vmax + 1) for v in vs]):
    sub = dict(zip(vs, vals))
    want = ref(*vals)
    if isinstance(e, int):
      assert e == want, f"{e} at {vals}: want {want}"
      continue
    memo: dict = {}
    got = _substitute(e, sub, memo)
    assert got == want, f"{e.render()} at {vals}: got {got}, want {want}"
    assert e.vmin <= want <= e.vmax, f"{e.render()} = {want} outside [{e.vmin}, {e.vmax}]"
    for n, val in memo.items(): assert n.vmin <= val <= n.vmax, f"{n.render()} = {val} outside [{n.vmin}, {n.vmax}] at {vals}"

# ---- where it fires -----------------------------------------------------------------------------------

def test_shuffle_index_loses_its_division():
  c, r = V("c", 0, 135), V("r", 0, 783)
  assert (c * 784 + r) // 3136 == c // 4
  assert (c * 784 + r) % 3136 == (c % 4) * 784 + r
  # the window: r = row*28 + col - 29 with row, col the padded window's valid 1..28
  row, col = V("row", 1, 28), V("col", 1, 28)
  a = c * 784 + row * 28 + col - 29
  assert a // 3136 == c // 4 and divisors(a // 3136) == {4}
  assert a % 3136 == (c % 4) * 784 + row * 28 + col - 29

def test_fires_with_a_carry_and_with_negatives():
  x, r = V("x", -5, 5), V("r", 8, 11)  # r // 4 == 2 over all of r: (4x + r) // 8 == (x + 2) // 2 == x // 2 + 1
  assert (x * 4 + r) // 8 == x // 2 + 1
  assert (x * 4 + r) % 8 == (x % 2) * 4 + r - 8
  rn = V("rn", -4, -1)  # rn // 4 == -1
  assert (x * 4 + rn) // 8 == (x + 1) // 2 - 1  # (x - 1) // 2, the constant kept in [0, 2) as sym_mod keeps it
  for e, ref in [((x * 4 + r) // 8, lambda a, b: (4 * a + b) // 8), ((x * 4 + r) % 8, lambda a, b: (4 * a + b) % 8)]:
    check_exhaustive(e, [x, r], ref)
  for e, ref in [((x * 4 + rn) // 8, lambda a, b: (4 * a + b) // 8), ((x * 4 + rn) % 8, lambda a, b: (4 * a + b) % 8)]:
    check_exhaustive(e, [x, rn], ref)
  assert (x * 4 + 3) // 8 == x // 2 and (x * 4 + 3) % 8 == (x % 2) * 4 + 3  # a constant rest

def test_factor_shared_by_several_terms():
  x, y, z = V("x", 0, 9), V("y", 0, 9), V("z", 0, 1)
  # gcd(60, 6) = 6 and gcd(60, 10) = 10 each leave the other term in the rest; their gcd 2 takes both
  assert (x * 6 + y * 10 + z) // 60 == (x * 3 + y * 5) // 30
  check_exhaustive((x * 6 + y * 10 + z) // 60, [x, y, z], lambda a, b, c: (6 * a + 10 * b + c) // 60)
  check_exhaustive((x * 6 + y * 10 + z) % 60, [x, y, z], lambda a, b, c: (6 * a + 10 * b + c) % 60)

def test_largest_factor_wins():
  c, r = V("c", 0, 30), V("r", 0, 27)
  row = V("row", 0, 27)
  # f = 784 (c, rest row*28 + r) and f = 28 (c*28 + row, rest r) both split; the larger leaves c // 4
  assert (c * 784 + row * 28 + r) // 3136 == c // 4

def test_divmod_still_recombines():
  c, r = V("c", 0, 135), V("r", 0, 783)
  a = c * 784 + r
  assert (a // 3136) * 3136 + a % 3136 == a
  x, rr = V("x", -5, 5), V("rr", 8, 11)
  b = x * 4 + rr
  assert (b // 8) * 8 + b % 8 == b

# ---- where it must not fire ---------------------------------------------------------------------------

@pytest.mark.parametrize("lo,hi", [(0, 784), (-1, 783), (-1, 0), (700, 800), (-785, -1)])
def test_rest_that_straddles_a_multiple_keeps_the_division(lo, hi):
  """R // 784 takes two values: no split by 784 (any smaller factor must still leave 3136's division
  exact); the result stays correct at every point."""
  c, r = V("c", 0, 11), V("r", lo, hi)
  d, m = (c * 784 + r) // 3136, (c * 784 + r) % 3136
  assert any(n.b == 3136 for n in divmods(d)) and any(n.b == 3136 for n in divmods(m))
  check_exhaustive(d, [c, r], lambda a, b: (784 * a + b) // 3136)
  check_exhaustive(m, [c, r], lambda a, b: (784 * a + b) % 3136)

def test_no_common_factor_no_split():
  x, y = V("x", 0, 20), V("y", 0, 2)
  assert isinstance((x * 3 + y) // 8, Div) and (x * 3 + y) // 8 == Div(x * 3 + y, 8)
  assert isinstance((x * 3 + y) % 8, Mod)

# ---- brute force on random forms ------------------------------------------------------------------------

def _random_form(rng: random.Random):
  """a = sum(f*k_i * x_i) + sum(j_i * r_i) + c and a divisor f*m, over small boxes that may be negative."""
  f, m = rng.choice([2, 3, 4, 6, 8, 12]), rng.choice([2, 3, 4, 5, 7])
  xs = [V(f"x{i}", lo := rng.randint(-6, 3), lo + rng.randint(0, 4)) for i in range(rng.randint(1, 2))]
  rs = [V(f"r{i}", lo := rng.randint(-5, 5), lo + rng.randint(0, 3)) for i in range(rng.randint(0, 2))]
  ks = [f * rng.choice([1, 1, 2, 3, -1, -2, 5]) for _ in xs]
  js = [rng.choice([1, 1, 2, 3, -1, -2, 5, f]) for _ in rs]
  c = rng.randint(-3 * f, 3 * f)
  return f * m, xs + rs, ks + js, c

def test_random_forms_exhaustively(monkeypatch):
  import tilecraft.shape.symbolic as symbolic
  splits = []
  def counted(*args):
    splits.append(r := _split_factor(*args))
    return r
  monkeypatch.setattr(symbolic, "_split_factor", counted)
  rng = random.Random(1234)
  for _ in range(300):
    b, vs, ks, c = _random_form(rng)
    a = sym_sum([sym_mul(v, k) for v, k in zip(vs, ks)] + [c])
    d, m = sym_div(a, b), sym_mod(a, b)
    check_exhaustive(d, vs, lambda *vals: (sum(k * v for k, v in zip(ks, vals)) + c) // b)
    check_exhaustive(m, vs, lambda *vals: (sum(k * v for k, v in zip(ks, vals)) + c) % b)
  assert sum(r is not None for r in splits) > 150  # the forms exercise the rule, not only the older ones

def test_random_forms_substituted():
  """The split made with stand-in ranges, then the stand-ins substituted by wider expressions (what
  expr_idxs does with a masked view's clamped indices): exact wherever the stand-in's range holds."""
  rng = random.Random(99)
  for _ in range(100):
    f, m = rng.choice([2, 4, 6, 8]), rng.choice([2, 3, 4])
    x = V("x", lo := rng.randint(-4, 2), lo + rng.randint(1, 5))
    t = V("t", 0, f - 1)  # the clamped stand-in: valid points only
    u = V("u", -2, f + 1)  # what it stands for, over a wider range
    c = rng.randint(-f, f)
    a = x * f + t + c
    d, md = (ev(e, {t: u}) for e in (sym_div(a, f * m), sym_mod(a, f * m)))
    for xv in range(x.vmin, x.vmax + 1):
      for uv in range(0, f):  # where the stand-in's range holds
        val = xv * f + uv + c
        assert ev(d, {x: xv, u: uv}) == val // (f * m), (d, xv, uv)
        assert ev(md, {x: xv, u: uv}) == val % (f * m), (md, xv, uv)

# ---- the depthwise conv after a channel shuffle, as kernels ------------------------------------------------

def _shuffle_depthwise(c: int = 24, g: int = 4, hw: int = 14, stride: int = 1):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
  w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
  xs = x.reshape(1, g, c // g, hw, hw).transpose(0, 2, 1, 3, 4).reshape(1, c, hw, hw)
  xp = np.pad(xs.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  ho = (hw + 2 - 3) // stride + 1
  ref = np.zeros((1, c, ho, ho))
  for ky in range(3):
    for kx in range(3):
      ref += xp[:, :, ky:ky + stride * (ho - 1) + 1:stride, kx:kx + stride * (ho - 1) + 1:stride] * w[None, :, 0, ky, kx, None, None]
  return x, w, ref

def _lazy(x, w, c: int, g: int, hw: int, stride: int, dev: str) -> Tensor:
  xt = Tensor(x, device=dev).reshape(1, g, c // g, hw, hw).transpose(1, 2).reshape(1, c, hw, hw)
  return xt.conv2d(Tensor(w, device=dev), groups=c, padding=1, stride=stride)

def _opencl_or_skip() -> None:
  try: Device["OPENCL"]
  except Exception as e: pytest.skip(f"OPENCL unavailable here: {type(e).__name__}: {e}")

@pytest.mark.parametrize("dev", ["CPU", "LLVM", "OPENCL"])
@pytest.mark.parametrize("stride", [1, 2])
def test_shuffle_depthwise_vs_numpy(dev, stride):
  if dev == "OPENCL": _opencl_or_skip()
  c, g, hw = 24, 4, 14
  x, w, ref = _shuffle_depthwise(c, g, hw, stride)
  got = _lazy(x, w, c, g, hw, stride, dev).numpy()
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)

def test_shuffle_depthwise_kernel_has_no_division_in_its_loads():
  c, g, hw = 24, 4, 14
  x, w, _ = _shuffle_depthwise(c, g, hw)
  sched = _lazy(x, w, c, g, hw, 1, "CPU").schedule()
  assert len(sched) == 1  # the shuffle is read through its view, in the conv's kernel
  for mb in [n.arg for n in _walk(sched[0].ast) if hasattr(getattr(n, "arg", None), "st")]:
    idx, _ = mb.st.expr_idxs()
    assert divisors(idx) <= {g}, idx  # only the channel's own c // 4 and c % 4 are left

def _walk(n, seen=None):
  seen = set() if seen is None else seen
  if id(n) in seen: return []
  seen.add(id(n))
  return [n] + [x for s in getattr(n, "src", ()) for x in _walk(s, seen)]

@pytest.mark.parametrize("dev", ["CPU", "LLVM", "OPENCL"])
def test_shuffle_depthwise_random_opts(dev):
  """Random opts (the fuzzer's sampler) vs the unoptimized kernel and numpy."""
  if dev == "OPENCL": _opencl_or_skip()
  from tilecraft.testing.corpus_build import CorpusEntry
  from tilecraft.testing.fuzz import check_opts, guarded
  from tilecraft.testing.opt_sampler import random_opts
  c, g, hw = 24, 4, 14
  x, w, ref = _shuffle_depthwise(c, g, hw)
  ast = _lazy(x, w, c, g, hw, 1, dev).schedule()[-1].ast
  # which buffer is which: the input is the one read through the shuffle (5-d first view)
  bufs = {n.arg.idx: n.arg for n in _walk(ast) if hasattr(getattr(n, "arg", None), "st") and n.arg.idx != 0}
  xi = next(i for i, mb in bufs.items() if len(mb.st.views[0].shape) == 5)
  wi = next(i for i in bufs if i != xi)
  e = CorpusEntry("shuffle_depthwise", ast, lambda rng: {xi: x.copy(), wi: w.copy()}, lambda inp, vv: [ref.astype(np.float32)])
  rng = np.random.default_rng(7)
  k0 = Kernel(guarded(ast), opts=Device[dev].renderer)
  for _ in range(4 if dev == "OPENCL" else 6):
    opts = random_opts(k0, rng, max_opts=3)
    assert check_opts(e, list(opts), e.make_inputs(rng), dev) is None, opts
