"""Deep graphs (issue 28, item 8): a long chain of elementwise ops (`x = x + 1` in a loop) must
schedule, compile and run without recursing per node. The walks over the lazy graph, the kernel
AST and the UOp graph use explicit stacks, so they work under a recursion limit far below the
graph's depth; the scheduler cuts a chain deeper than MAX_KERNEL_DEPTH into several kernels, and
nothing raises Python's recursion limit behind the user's back."""
from __future__ import annotations
import contextlib, sys, time
from typing import Iterator
import numpy as np
from tilecraft import Tensor
from tilecraft.codegen.rewrite import PatternMatcher, UPat, graph_rewrite, symbolic_rules
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import dtypes
from tilecraft.engine import schedule as sched
from tilecraft.ops import BinaryOps, MetaOps, _postorder

@contextlib.contextmanager
def recursion_limit(n: int) -> Iterator[None]:
  """Python's recursion limit set to (the current depth + n) for the block: a walk that recursed once
  per node of a deep graph would fail in it."""
  depth, f = 0, sys._getframe()
  while f is not None: depth, f = depth + 1, f.f_back
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(depth + n)
  try: yield
  finally: sys.setrecursionlimit(old)

def ast_depth(ast) -> int:
  """Ops on the longest path from the kernel's root to a leaf."""
  d: dict = {}
  for x in _postorder(ast): d[x] = 1 + max((d[s] for s in x.src), default=0)
  return d[ast]

def test_30000_chained_adds() -> None:
  x = Tensor(np.array([1.0, 2.0, -3.0], dtype=np.float32))
  for _ in range(30000): x = x + 1
  limit = sys.getrecursionlimit()
  st = time.perf_counter()
  with recursion_limit(300): out = x.numpy()
  took = time.perf_counter() - st
  np.testing.assert_allclose(out, [30001.0, 30002.0, 29997.0])
  assert sys.getrecursionlimit() == limit, "realizing must not change Python's recursion limit"
  assert took < 60, f"30000 chained adds took {took:.1f} s"

def test_deep_chain_is_cut_into_kernels_of_bounded_depth() -> None:
  a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  x = a
  for i in range(3 * sched.MAX_KERNEL_DEPTH): x = x * 1.0 + (i % 3) if i % 2 else x - 1
  kernels = [si for si in x.schedule() if si.ast.op is MetaOps.KERNEL]
  assert len(kernels) >= 3
  assert max(ast_depth(si.ast) for si in kernels) <= sched.MAX_KERNEL_DEPTH + 4  # (KERNEL, STORE, and the leaves)
  want = np.arange(6, dtype=np.float32).reshape(2, 3)
  for i in range(3 * sched.MAX_KERNEL_DEPTH): want = want * np.float32(1.0) + np.float32(i % 3) if i % 2 else want - np.float32(1)
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)

def test_deep_reduce_input_and_output() -> None:
  """A reduce with deep chains before and after it: cut too, and right."""
  a = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
  x = Tensor(a)
  for _ in range(1000): x = x + 0.5
  y = x.sum(axis=1)
  for _ in range(1000): y = y - 0.25
  with recursion_limit(300): out = y.numpy()
  np.testing.assert_allclose(out, (a + 500).sum(axis=1) - 250, rtol=1e-4)

def test_graph_rewrite_is_iterative() -> None:
  """The rewrite engine walks a 3000-deep UOp graph (and rewrites every node of it) with a
  recursion limit of a few hundred frames."""
  x = UOp(UOps.DEFINE_VAR, dtypes.int32, (), "x")
  u = x
  for _ in range(3000): u = UOp.alu(BinaryOps.ADD, u, UOp.const(dtypes.int32, 1))
  with recursion_limit(300): out = graph_rewrite(u, symbolic_rules)
  # (x + c1) + c2 -> x + (c1 + c2) for ints, all the way down
  assert out.op is UOps.ALU and out.src[0] is x and out.src[1].arg == 3000

def test_graph_rewrite_replacements_are_rewritten() -> None:
  """A rule's replacement holds new nodes: they are rewritten too, to the fixed point."""
  c = lambda v: UOp.const(dtypes.int32, v)  # noqa: E731
  pm = PatternMatcher([(UPat(UOps.ALU, BinaryOps.MUL, (UPat.var("a"), UPat.cvar("k"))),
                        lambda a, k: UOp.alu(BinaryOps.ADD, a, UOp.alu(BinaryOps.MUL, a, c(k.arg - 1))) if k.arg > 1 else None)]) + symbolic_rules
  x = UOp(UOps.DEFINE_VAR, dtypes.int32, (), "x")
  out = graph_rewrite(UOp.alu(BinaryOps.MUL, x, c(4)), pm)
  # x*4 -> x + x*3 -> x + (x + x*2) -> x + (x + (x + x*1)) -> x + (x + (x + x))
  ops = [u for u in out.toposort() if u.op is UOps.ALU]
  assert all(u.arg is BinaryOps.ADD for u in ops) and len(ops) == 3
