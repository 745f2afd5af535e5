"""The kernel AST: LazyOp identity (equality, hash, dedup), dtype rules, full_shape, the stable key,
the printed tree, and verify_ast accepting valid kernels and naming what is wrong with invalid ones."""
import os, subprocess, sys
import pytest
from tilecraft.dtype import dtypes
from tilecraft.ops import (BinaryOps, BufferOps, ConstBuffer, InvalidASTError, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps,
                           UnaryOps, verify_ast)
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable

F, I = dtypes.float32, dtypes.int32
ST = ShapeTracker.from_shape
def ld(idx, shape, dt=F, st=None): return LazyOp(BufferOps.LOAD, (), MemBuffer(idx, dt, st or ST(shape)))
def const(val, shape, dt=F): return LazyOp(BufferOps.CONST, (), ConstBuffer(val, dt, ST((1,) * len(shape)).expand(shape)))
def store(idx, x, shape, dt=F): return LazyOp(BufferOps.STORE, (x,), MemBuffer(idx, dt, ST(shape)))
def alu(op, *src): return LazyOp(op, src)
def red(op, x, axes): return LazyOp(op, (x,), axes)
def kernel(*stores): return LazyOp(MetaOps.KERNEL, stores)

def ew_kernel(shape=(4, 5)):
  return kernel(store(0, alu(BinaryOps.ADD, ld(1, shape), alu(BinaryOps.MUL, ld(2, shape), const(2.0, shape))), shape))

# ---- identity -------------------------------------------------------------------------------------

def test_equality_and_hash_are_structural():
  a, b = ew_kernel(), ew_kernel()
  assert a is not b and a == b and hash(a) == hash(b)
  assert a != ew_kernel((4, 6)) and a != 3
  assert ld(1, (4,)) != ld(2, (4,)) and ld(1, (4,)) != ld(1, (4,), I)
  assert alu(BinaryOps.ADD, ld(1, (4,)), ld(2, (4,))) != alu(BinaryOps.ADD, ld(2, (4,)), ld(1, (4,)))
  assert red(ReduceOps.SUM, ld(1, (4,)), (0,)) != red(ReduceOps.MAX, ld(1, (4,)), (0,))
  assert len({a, b, ew_kernel((4, 6))}) == 2

def test_const_identity():
  assert const(0.0, (4,)) != const(-0.0, (4,))          # 1/x tells them apart
  assert const(float("nan"), (4,)) == const(float("nan"), (4,))
  assert hash(const(float("nan"), (4,))) == hash(const(float("nan"), (4,)))
  assert const(1, (4,), I) != const(1.0, (4,), I)
  v = Variable("n", 1, 8)
  assert const(v, (4,), I) == const(Variable("n", 1, 8), (4,), I)

def test_lazyops_dedups_in_preorder():
  x, y = ld(1, (4,)), ld(2, (4,))
  s = alu(BinaryOps.ADD, alu(BinaryOps.MUL, x, y), alu(BinaryOps.MUL, ld(1, (4,)), ld(2, (4,))))  # the same product built twice
  ops = s.lazyops
  assert ops == [s, alu(BinaryOps.MUL, x, y), x, y]
  k = kernel(store(0, s, (4,)))
  assert [o.op for o in k.lazyops] == [MetaOps.KERNEL, BufferOps.STORE, BinaryOps.ADD, BinaryOps.MUL, BufferOps.LOAD, BufferOps.LOAD]

def test_deep_and_shared_asts_stay_cheap():
  x = ld(1, (4,))
  for _ in range(80): x = alu(BinaryOps.ADD, x, x)  # 2**80 paths, 81 distinct ops
  k = kernel(store(0, x, (4,)))
  assert len(k.lazyops) == 83 and k.dtype == dtypes.void and x.dtype == F
  y = ld(1, (4,))
  for _ in range(80): y = alu(BinaryOps.ADD, y, y)
  assert kernel(store(0, y, (4,))) == k and kernel(store(0, y, (4,))).key == k.key
  assert len(repr(k).splitlines()) < 300
  assert verify_ast(k)
  deep = ld(1, (4,))
  for _ in range(5000): deep = alu(UnaryOps.NEG, deep)
  assert deep.dtype == F and len(deep.lazyops) == 5001 and len(deep.key) == 32
  deep2 = ld(1, (4,))
  for _ in range(5000): deep2 = alu(UnaryOps.NEG, deep2)
  assert deep == deep2
  assert verify_ast(kernel(store(0, deep, (4,))))

# ---- dtype and full_shape ---------------------------------------------------------------------------

def test_dtype_rules():
  a, b = ld(1, (4,)), ld(2, (4,))
  i = ld(3, (4,), I)
  assert a.dtype == F and i.dtype == I and const(1, (4,), I).dtype == I
  assert alu(BinaryOps.ADD, a, b).dtype == F and alu(UnaryOps.SQRT, a).dtype == F
  assert alu(BinaryOps.CMPLT, a, b).dtype == dtypes.bool and alu(BinaryOps.CMPNE, i, i).dtype == dtypes.bool
  assert LazyOp(UnaryOps.CAST, (a,), dtypes.float16).dtype == dtypes.float16
  assert LazyOp(UnaryOps.BITCAST, (a,), I).dtype == I
  assert alu(TernaryOps.WHERE, alu(BinaryOps.CMPLT, a, b), i, i).dtype == I
  assert red(ReduceOps.SUM, i, (0,)).dtype == I and red(ReduceOps.MAX, a, (0,)).dtype == F
  assert store(0, a, (4,), dtypes.float32).dtype == F
  assert kernel(store(0, a, (4,))).dtype == dtypes.void

def test_full_shape():
  x = ld(1, (4, 5))
  k = kernel(store(0, red(ReduceOps.SUM, x, (1,)), (4, 1)))
  assert k.full_shape == (4, 5)
  assert ew_kernel((3, 7)).full_shape == (3, 7)
  n = Variable("n", 1, 16)
  ks = kernel(store(0, red(ReduceOps.SUM, ld(1, (n, 5)), (0,)), (1, 5)))
  assert ks.full_shape == (n, 5) and ks.vars() == {n}

# ---- key and repr -------------------------------------------------------------------------------------

BUILD = """
from tilecraft.dtype import dtypes
from tilecraft.ops import *
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable
n = Variable("n", 1, 32)
st = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((24,)).pad(((1, 1),)).reshape((2, 13))
x = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float32, st))
c = LazyOp(BufferOps.CONST, (), ConstBuffer(0.5, dtypes.float32, ShapeTracker.from_shape((1, 1)).expand((2, 13))))
r = LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (x, c)),), (1,))
v = LazyOp(BufferOps.LOAD, (), MemBuffer(2, dtypes.int32, ShapeTracker.from_shape((n, 3))))
AST = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (r,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape((2, 1)))),), KernelInfo(1, 2))
AST2 = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(UnaryOps.NEG, (v,)),), MemBuffer(0, dtypes.int32, ShapeTracker.from_shape((n, 3)))),))
"""

def build() -> dict:
  env: dict = {}
  exec(BUILD, env)
  return env

def test_key_is_stable_across_processes():
  env = build()
  code = BUILD + "\nprint(AST.key.hex()); print(AST2.key.hex())"
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for seed in ("0", "12345"):
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}).stdout.split()
    assert out == [env["AST"].key.hex(), env["AST2"].key.hex()]
  assert isinstance(env["AST"].key, bytes) and len(env["AST"].key) == 32

def test_key_differs_for_different_asts():
  base = ew_kernel()
  variants = [ew_kernel((4, 6)),
              kernel(store(0, alu(BinaryOps.ADD, ld(1, (4, 5)), alu(BinaryOps.MUL, ld(2, (4, 5)), const(3.0, (4, 5)))), (4, 5))),
              kernel(store(0, alu(BinaryOps.ADD, ld(2, (4, 5)), alu(BinaryOps.MUL, ld(1, (4, 5)), const(2.0, (4, 5)))), (4, 5))),
              kernel(store(0, alu(BinaryOps.MAX, ld(1, (4, 5)), alu(BinaryOps.MUL, ld(2, (4, 5)), const(2.0, (4, 5)))), (4, 5))),
              kernel(store(0, alu(BinaryOps.ADD, ld(1, (4, 5), st=ST((5, 4)).permute((1, 0))), alu(BinaryOps.MUL, ld(2, (4, 5)), const(2.0, (4, 5)))), (4, 5))),
              LazyOp(MetaOps.KERNEL, base.src, KernelInfo(local_dims=1))]
  keys = {v.key for v in variants} | {base.key}
  assert len(keys) == len(variants) + 1
  assert ew_kernel().key == base.key

def test_repr_is_an_indented_tree():
  k = ew_kernel()
  lines = repr(k).splitlines()
  assert [ln.split()[0] for ln in lines] == ["KERNEL", "STORE", "ADD", "LOAD", "MUL", "LOAD", "CONST"]
  depth = [(len(ln) - len(ln.lstrip())) // 2 for ln in lines]
  assert depth == [0, 1, 2, 3, 3, 4, 4]
  assert "MemBuffer(idx=1" in lines[3] and "0.0" not in lines[0]
  # a shared non-leaf op is printed once and referred to after
  m = alu(BinaryOps.MUL, ld(1, (4,)), ld(2, (4,)))
  text = repr(alu(BinaryOps.ADD, m, m))
  assert text.count("MUL") == 2 and "[0] MUL" in text and "<0> MUL" in text and text.count("LOAD") == 2

# ---- verify_ast: valid kernels --------------------------------------------------------------------------

def test_verify_elementwise():
  k = ew_kernel()
  sts = verify_ast(k)
  assert all(st.shape == (4, 5) for st in sts.values())

def test_verify_reduce_returns_input_and_output_trackers():
  x = ld(1, (4, 5))
  r = red(ReduceOps.SUM, alu(UnaryOps.EXP2, x), (1,))
  k = kernel(store(0, alu(BinaryOps.MUL, r, const(2.0, (4, 1))), (4, 1)))
  sts = verify_ast(k)
  assert sts[r.src[0]].shape == (4, 5) and sts[r].shape == (4, 1)
  assert sts[k.src[0]].shape == (4, 1)

def test_verify_multi_output():
  x = ld(2, (3, 4))
  k = kernel(store(0, alu(UnaryOps.NEG, x), (3, 4)), store(1, alu(BinaryOps.CMPLT, x, const(0.0, (3, 4))), (3, 4), dtypes.bool))
  sts = verify_ast(k)
  assert sts[k.src[0]].shape == sts[k.src[1]].shape == (3, 4)
  # a reduce and another reduce as two outputs of one kernel
  k2 = kernel(store(0, red(ReduceOps.SUM, x, (1,)), (3, 1)), store(1, red(ReduceOps.MAX, x, (1,)), (3, 1)))
  assert verify_ast(k2)

def test_verify_two_reduces():
  x = ld(1, (4, 8))
  mx = red(ReduceOps.MAX, x, (1,))
  # two reduces side by side, combined at the output (a reduce's output can't be expanded inside the AST)
  e = alu(UnaryOps.EXP2, alu(BinaryOps.ADD, x, ld(2, (4, 8), st=ST((4, 1)).expand((4, 8)))))
  s = red(ReduceOps.SUM, e, (1,))
  k = kernel(store(0, alu(BinaryOps.ADD, s, mx), (4, 1)))
  sts = verify_ast(k)
  assert sts[mx.src[0]].shape == (4, 8) and sts[mx].shape == (4, 1)
  assert sts[s.src[0]].shape == (4, 8) and sts[s].shape == (4, 1)
  # reducing everything, in two steps
  k2 = kernel(store(0, red(ReduceOps.SUM, red(ReduceOps.MAX, x, (1,)), (0,)), (1, 1)))
  sts2 = verify_ast(k2)
  assert [sts2[o].shape for o in k2.lazyops if o.op in ReduceOps] == [(1, 1), (4, 1)]

def test_verify_symbolic_and_grouped_reduce():
  n = Variable("n", 1, 64)
  x = ld(1, (4, n))
  assert verify_ast(kernel(store(0, red(ReduceOps.SUM, x, (1,)), (4, 1))))
  # an optimized AST: a grouped reduce's first stage through a local buffer, then the second stage
  y = ld(1, (4, 16))
  stage1 = red(ReduceOps.SUM, y, ())
  local = MemBuffer(-1, F, ST((1, 16)))
  back = LazyOp(BufferOps.LOAD, (LazyOp(BufferOps.STORE, (stage1,), local),), local)
  k = kernel(store(0, red(ReduceOps.SUM, back, (1,)), (4, 1)))
  sts = verify_ast(k)
  assert sts[back].shape == (4, 16)

# ---- verify_ast: invalid kernels --------------------------------------------------------------------------

def bad(ast, *words):
  with pytest.raises(InvalidASTError) as e: verify_ast(ast)
  for w in words: assert w in str(e.value), (w, str(e.value))

def test_rejects_implicit_reshape():
  bad(kernel(store(0, alu(BinaryOps.ADD, ld(1, (4, 5)), ld(2, (20,))), (4, 5))), "implicit reshape")
  bad(kernel(store(0, alu(BinaryOps.ADD, ld(1, (4, 5)), ld(2, (5, 4))), (4, 5))), "implicit reshape")
  bad(kernel(store(0, ld(1, (4, 5)), (20,))), "implicit reshape")

def test_dependent_reduce_is_valid():
  """A reduced value may be broadcast over its axes into another reduce over the same axes (softmax's
  sum(exp(x - max(x)))); the kernel's shape is the input's."""
  x = ld(2, (4, 5))
  m = red(ReduceOps.MAX, x, (1,))
  d = alu(BinaryOps.ADD, x, alu(UnaryOps.NEG, m))
  sts = verify_ast(kernel(store(0, red(ReduceOps.SUM, alu(UnaryOps.EXP2, d), (1,)), (4, 1)), store(1, m, (4, 1))))
  assert sts[d].shape == (4, 5) and sts[m].shape == (4, 1)

def test_rejects_broadcast_reduced_values_elsewhere():
  x = ld(1, (4, 5))
  m = red(ReduceOps.MAX, x, (1,))
  d = alu(BinaryOps.ADD, x, alu(UnaryOps.NEG, m))
  bad(kernel(store(0, d, (4, 5))), "implicit expand", "STORE")  # the broadcast reaches the output: no reduce around it
  y = ld(1, (4, 5, 6))
  m2 = red(ReduceOps.MAX, y, (1,))  # (4, 1, 6), broadcast into a reduce over axis 2
  bad(kernel(store(0, red(ReduceOps.SUM, alu(BinaryOps.ADD, y, m2), (2,)), (4, 5, 1))), "implicit expand", "over axes (2,)")
  bad(kernel(store(0, red(ReduceOps.SUM, alu(BinaryOps.ADD, x, ld(2, (4, 1))), (1,)), (4, 1))), "implicit expand")  # a load isn't a reduced value

def test_rejects_implicit_expand():
  bad(kernel(store(0, alu(BinaryOps.ADD, ld(1, (4, 5)), ld(2, (4, 1))), (4, 5))), "implicit expand")
  bad(kernel(store(0, alu(BinaryOps.ADD, ld(2, (1, 5)), ld(3, (4, 5))), (4, 5))), "implicit expand")
  bad(kernel(store(0, ld(2, (4, 5)), (4, 5)), store(1, ld(3, (4, 1)), (4, 1))), "mismatched output sizes")

def test_rejects_two_sizes_in_one_dim():
  # a (4,5) and a (4,7) never meet in one op, but they would share one loop nest
  bad(kernel(store(0, red(ReduceOps.SUM, ld(2, (4, 5)), (1,)), (4, 1)), store(1, red(ReduceOps.SUM, ld(3, (4, 7)), (1,)), (4, 1))),
      "dimension 1 has sizes")

def test_rejects_mismatched_output_sizes():
  bad(kernel(store(0, ld(2, (4, 5)), (4, 5)), store(1, red(ReduceOps.SUM, ld(2, (4, 5)), (1,)), (4, 1))), "mismatched output sizes")
  bad(kernel(store(0, ld(2, (4, 1)), (4, 1)), store(1, ld(3, (1, 4)), (1, 4))), "mismatched output sizes")
  bad(kernel(store(0, ld(2, (4,)), (4,)), store(1, ld(3, (4, 1)), (4, 1))), "mismatched output sizes")

def test_rejects_non_store_output():
  bad(kernel(alu(UnaryOps.NEG, ld(1, (4,)))), "not STORE")
  bad(kernel(), "at least one STORE")

@pytest.mark.parametrize("idxs", [(1, 0), (0, 2), (1,), (0, 0)])
def test_rejects_wrong_output_index(idxs):
  bad(kernel(*[store(i, ld(5, (4,)), (4,)) for i in idxs]), "wrong output index")

def test_rejects_non_kernel_root():
  bad(store(0, ld(1, (4,)), (4,)), "root must be KERNEL")
  bad(alu(UnaryOps.NEG, ld(1, (4,))), "root must be KERNEL")

def test_rejects_mixed_dtypes():
  bad(kernel(store(0, alu(BinaryOps.ADD, ld(1, (4,)), ld(2, (4,), I)), (4,))), "mixed dtypes", "ADD")
  bad(kernel(store(0, alu(TernaryOps.WHERE, ld(1, (4,)), ld(2, (4,)), ld(3, (4,))), (4,))), "WHERE condition")
  cond = alu(BinaryOps.CMPLT, ld(1, (4,)), ld(2, (4,)))
  bad(kernel(store(0, alu(TernaryOps.WHERE, cond, ld(2, (4,)), ld(3, (4,), I)), (4,))), "mixed dtypes")
  bad(kernel(store(0, ld(1, (4,), I), (4,))), "mixed dtypes", "STORE")
  bad(kernel(store(0, LazyOp(UnaryOps.BITCAST, (ld(1, (4,)),), dtypes.float16), (4,), dtypes.float16)), "BITCAST")

@pytest.mark.parametrize("axes", [(2,), (-1,), (0, 0), 1, (1.0,), None])
def test_rejects_bad_reduce_axes(axes):
  bad(kernel(store(0, red(ReduceOps.SUM, ld(1, (4, 5)), axes), (4, 1))), "bad reduce axes")

def test_rejects_other_invalid_asts():
  bad(kernel(store(0, LazyOp(BufferOps.LOAD, (ld(1, (4,)),), MemBuffer(1, F, ST((4,)))), (4,))), "leaf")
  bad(kernel(store(0, LazyOp(BufferOps.LOAD, (), ConstBuffer(1.0, F, ST((4,)))), (4,))), "MemBuffer")
  bad(kernel(store(0, alu(UnaryOps.NEG, ld(0, (4,), st=ST((4,)).flip((0,)))), (4,))), "race")
  assert verify_ast(kernel(store(0, alu(UnaryOps.NEG, ld(0, (4,))), (4,))))  # in-place through the same view is fine

def test_asts_unpickled_from_another_process_are_equal_to_fresh_ones():
  """LazyOp and symbolic Nodes cache hash(); string hashes are salted per process, so a pickle made
  under another PYTHONHASHSEED must still give an AST that == (and hashes like) the one built here."""
  import os, pickle, subprocess, sys
  code = ("import pickle, sys\n"
          "from tilecraft.testing.corpus import corpus\n"
          "sys.stdout.buffer.write(pickle.dumps({n: e.ast for n, e in corpus().items()}))\n")
  blob = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                        env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
  from tilecraft.testing.corpus import corpus
  theirs, ours = pickle.loads(blob), {n: e.ast for n, e in corpus().items()}
  assert theirs.keys() == ours.keys()
  symbolic = 0
  for name in ours:
    assert theirs[name] == ours[name] and hash(theirs[name]) == hash(ours[name]), name
    assert {theirs[name]: 1}.get(ours[name]) == 1
    symbolic += bool(ours[name].vars())
  assert symbolic > 0  # the corpus has kernels over Variables, so Nodes crossed too
