"""Lowering is a function of the optimized AST and the renderer (codegen/lower_state.py, lowerer.py):
the layout it reads off the AST (full and output shape from the leaves' views, the regions from
KernelInfo) is the Kernel's own, for kernels with random opts on targets with and without
workgroups; an AST without KernelInfo is refused; and the Kernel's identity (search dedup,
opt-sampler checks) tells apart kernels that render differently."""
import numpy as np
import pytest
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.codegen.lower_state import kernel_layout
from tilecraft.codegen.lowerer import lower_kernel
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tilecraft.renderer.cstyle import CRenderer, OpenCLRenderer
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.testing.corpus import corpus
from tilecraft.testing.opt_sampler import random_opts

def _kernels(ren, seed: int, per_entry: int = 2):
  rng = np.random.default_rng(seed)
  for name, e in corpus().items():
    for _ in range(per_entry):
      seq = random_opts(Kernel(e.ast, opts=ren), rng, tc=0)
      if seq.error is None: yield name, seq.kernel  # type: ignore[attr-defined]

@pytest.mark.parametrize("ren", [CRenderer(), OpenCLRenderer()], ids=["C", "OpenCL"])
def test_layout_read_off_the_ast_is_the_kernels(ren):
  n = 0
  for name, k in _kernels(ren, seed=3):
    ast = k.get_optimized_ast()
    lay = kernel_layout(ast)
    got = (lay.full_shape, lay.output_shape, lay.first_reduce, lay.first_upcast, lay.global_dims, lay.group_for_reduces, lay.upcast_in_mid_reduce_axes)
    want = (k.full_shape, k.output_shape, k.first_reduce, k.first_upcast, k.global_dims, k.group_for_reduces, k.upcast_in_mid_reduce_axes)
    assert got == want, f"{name} {k.applied_opts}"
    assert (lay.info.reduce_block, lay.info.packed, lay.info.dont_use_locals) == (k.reduce_block, k.packed, k.dont_use_locals)
    n += 1
  assert n > 50, f"only {n} kernels checked: the sampler refused too much"

def test_lowering_refuses_an_ast_without_kernel_info():
  st = ShapeTracker.from_shape((4,))
  load = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float32, st))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(BinaryOps.ADD, (load, load)),), MemBuffer(0, dtypes.float32, st)),))
  with pytest.raises(ValueError, match="KernelInfo"): lower_kernel(ast, CRenderer())

def test_identity_tells_blocked_kernels_apart():
  """BLOCK changes only `reduce_block` and the views; the search's dedup (actions.signature) must not
  merge a blocked kernel with one that merely has the same views."""
  ren = CRenderer()
  a = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float32, ShapeTracker.from_shape((64, 256))))
  b = LazyOp(BufferOps.LOAD, (), MemBuffer(2, dtypes.float32, ShapeTracker.from_shape((64, 256))))
  r = LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (a, b)),), (1,))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (r,), MemBuffer(0, dtypes.float32, ShapeTracker.from_shape((64, 1)))),))
  k, kb = Kernel(ast, opts=ren), Kernel(ast, opts=ren)
  kb.apply_opt(Opt(OptOps.BLOCK, 0, 64))
  assert kb.reduce_block and k.identity() != kb.identity()
  same = kb.copy()
  same.reduce_block = False  # the views of a blocked kernel without BLOCK's loop order: renders differently
  assert same.identity() != kb.identity() and same.to_program().src != kb.to_program().src
  from tilecraft.engine.search.actions import signature
  from tilecraft.testing.opt_sampler import _kernel_state
  assert signature(kb) == kb.identity() and _kernel_state(kb)[:-1] == kb.identity()
