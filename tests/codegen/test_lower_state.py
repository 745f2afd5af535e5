"""Lowering is a function of the optimized AST and the renderer (codegen/lower_state.py, lowerer.py):
the layout it reads off the AST (full and output shape from the leaves' views, the regions from
KernelInfo) is the Kernel's own, for kernels with random opts on targets with and without
workgroups; an AST without KernelInfo is refused; and the Kernel's identity (search dedup,
opt-sampler checks) tells apart kernels that render differently."""
import re
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

def _strided_conv(x, w, seq, arch):
  """A 3x3 stride-2 padded conv's kernel with the opts `seq`, its C source and its output (on this host's ISA or the
  one named: both vector widths are rendered, only the host's is run)."""
  from tilecraft import Context, Tensor
  from tilecraft.device import Device
  with Context(CPU_ARCH=arch):
    t = Tensor(x).conv2d(Tensor(w), stride=2, padding=1)
    si = [s for s in t.schedule() if s.ast.op is MetaOps.KERNEL][-1]
    k = Kernel(si.ast, opts=Device["CPU"].renderer)
    for op, axis, amt in seq: k.apply_opt(Opt(op, axis, amt))
    return k.to_program().src, k

_LANE_STORE = re.compile(r"\]\s*=\s*\w+\[\d+\];")  # one lane of a vector value stored alone (the output is strided along the vector)

@pytest.mark.parametrize("arch,vw", [("haswell", 8), ("skylake-avx512", 16)])
def test_gathered_output_axis_gives_way_to_packed_channels(arch, vw, rng):
  """A 3x3 stride-2 conv's output pixels are stride 2 in the image (a gather per vector), its output channels run
  along the packed weights: the accumulators are vectors of output channels, a broadcast pixel each, and the store
  after the reduce writes their lanes one by one (1.3-1.8x faster than vectors of pixels, AVX2 and AVX-512).
  STRIDED_STORE_VECTORS off, and a reduce too short to repay lane-by-lane stores (4 channels x 9 < 64), keep the
  vectors along the output's contiguous pixels."""
  import tilecraft.codegen.lower_state as lower_state
  U, D, P, R = OptOps.UPCAST, OptOps.PADTO, OptOps.PACK, OptOps.UNROLL
  seq = [(U, 0, vw), (D, 2, 8), (U, 2, 8), (U, 0, 2), (P, 2, 0), (R, 2, 0)]
  for cin, switched in ((32, True), (4, False)):
    x, w = rng.standard_normal((1, cin, 34, 34), dtype=np.float32), rng.standard_normal((32, cin, 3, 3), dtype=np.float32)
    src, k = _strided_conv(x, w, seq, arch)
    assert f"float{vw if switched else 8} acc" in src and bool(_LANE_STORE.search(src)) == switched, src
    if switched:
      keep = lower_state.STRIDED_STORE_VECTORS
      lower_state.STRIDED_STORE_VECTORS = False
      try: old, _ = _strided_conv(x, w, seq, arch)
      finally: lower_state.STRIDED_STORE_VECTORS = keep
      assert "float8 acc" in old and not _LANE_STORE.search(old) and old != src

def test_vectors_of_packed_channels_match_numpy(rng):
  """The same layout on this host's ISA, run: vectors of output channels (40, padded to 2 vectors: masked lanes), a
  bias and relu epilogue along them, and the lane-by-lane stores give the conv numpy computes."""
  from tilecraft import Tensor
  from tilecraft.device import CompiledRunner, Device
  vw = Device["CPU"].renderer.vector_width
  U, D, P, R = OptOps.UPCAST, OptOps.PADTO, OptOps.PACK, OptOps.UNROLL
  x, w, b = rng.standard_normal((1, 24, 30, 30), dtype=np.float32), rng.standard_normal((40, 24, 3, 3), dtype=np.float32), rng.standard_normal(40, dtype=np.float32)
  (si,) = Tensor(x).realize().conv2d(Tensor(w).realize(), Tensor(b).realize(), stride=2, padding=1).relu().schedule()
  k = Kernel(si.ast, opts=Device["CPU"].renderer)
  for op, axis, amt in [(D, 0, 2 * vw), (U, 0, vw), (D, 2, 8), (U, 2, 8), (U, 0, 2), (P, 2, 0), (R, 2, 0)]: k.apply_opt(Opt(op, axis, amt))
  prg = k.to_program()
  assert f"float{vw} acc" in prg.src and _LANE_STORE.search(prg.src), prg.src
  si.bufs[0].allocate()
  CompiledRunner(prg)(list(si.bufs), si.var_vals)
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + 29:2, j:j + 29:2], w[:, :, i, j]) for i in range(3) for j in range(3))
  np.testing.assert_allclose(si.bufs[0].numpy().reshape(ref.shape), np.maximum(ref + b.reshape(1, 40, 1, 1), 0), rtol=1e-4, atol=1e-4)

def _random_strided_conv_case(seed: int) -> None:
  """One random conv (stride 1-3, 1x1 or 3x3, padded or not, with or without a bias + relu epilogue) under a
  random packed tile: output channels upcast (one vector, or lanes of 2-8) and padded where they don't divide, the
  output row upcast (padded where needed), maybe a second column vector, the image rows and the unrolled kernel row.
  Wherever the lowering takes vectors along the strided output channels (gathered rows at stride 2-3, rows of 5 or 7
  no vector size divides at stride 1), and wherever it doesn't, the kernel must give the conv numpy computes."""
  from tilecraft import Tensor
  from tilecraft.codegen.kernel import KernelOptError
  from tilecraft.device import CompiledRunner, Device
  rng = np.random.default_rng(seed)
  vw = Device["CPU"].renderer.vector_width
  U, D, P, R = OptOps.UPCAST, OptOps.PADTO, OptOps.PACK, OptOps.UNROLL
  ks, stride = int(rng.choice([1, 3])), int(rng.integers(1, 4))
  pad = int(rng.integers(0, 2)) if ks == 3 else 0
  cin, cout, hw = int(rng.integers(3, 40)), int(rng.integers(5, 48)), int(rng.integers(9, 30))
  x, w = rng.standard_normal((1, cin, hw, hw), dtype=np.float32), rng.standard_normal((cout, cin, ks, ks), dtype=np.float32)
  b = rng.standard_normal(cout, dtype=np.float32) if rng.random() < 0.5 else None
  from tilecraft.frontend import nn
  keep, nn._compacts_strided_pointwise = nn._compacts_strided_pointwise, lambda device: False  # (the strided 1x1 kernel itself)
  try: t = Tensor(x).realize().conv2d(Tensor(w).realize(), None if b is None else Tensor(b).realize(), stride=stride, padding=pad)
  finally: nn._compacts_strided_pointwise = keep
  if b is not None: t = t.relu()
  (si,) = t.schedule()
  k = Kernel(si.ast, opts=Device["CPU"].renderer)
  lanes, rows = int(rng.choice([vw, vw, 2, 4, 8])), int(rng.choice([2, 4, 5, 7, 8]))
  seq = [(D, 0, lanes * 2)] if rng.random() < 0.5 else [(D, 0, lanes)]
  seq += [(U, 0, lanes), (D, 2, rows), (U, 2, rows)] + ([(U, 0, 2)] if seq[0][2] == lanes * 2 else []) + \
         ([(U, 1, 2)] if rng.random() < 0.3 else []) + [(P, 2, 0)] + ([(R, 2, 0)] if ks == 3 and rng.random() < 0.5 else [])
  try:
    for op, axis, amt in seq: k.apply_opt(Opt(op, axis, amt))
  except KernelOptError: return  # (refused as a whole case: an opt that doesn't fit this shape)
  prg = k.to_program()
  si.bufs[0].allocate()
  CompiledRunner(prg)(list(si.bufs), si.var_vals)
  o = (hw + 2 * pad - ks) // stride + 1
  xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
  ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + stride * (o - 1) + 1:stride, j:j + stride * (o - 1) + 1:stride], w[:, :, i, j])
            for i in range(ks) for j in range(ks))
  if b is not None: ref = np.maximum(ref + b.reshape(1, cout, 1, 1), 0)
  np.testing.assert_allclose(si.bufs[0].numpy().reshape(ref.shape), ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())),
                             err_msg=f"seed {seed}: {seq} on x {x.shape} w {w.shape} stride {stride} pad {pad}\n{prg.src}")

@pytest.mark.parametrize("seed", range(6))
def test_random_packed_strided_conv_tiles_match_numpy(seed):
  _random_strided_conv_case(seed)

@pytest.mark.fuzz
@pytest.mark.parametrize("seed", range(6, 126))
def test_fuzz_packed_strided_conv_tiles_match_numpy(seed):
  _random_strided_conv_case(seed)

def test_vectors_along_strided_axis_rules():
  """The one test of where a strided output axis may carry the vectors, on strides alone. Axes: (output channels
  a=0, pixels 1, input channels 2 = the reduce); the output is (channels, 49 pixels), the pixels upcast by 7 (no lanes)."""
  from tilecraft.codegen.lower_state import vectors_along_strided_axis as ok
  out, contiguous, red = (49, 1, 0), [(1, False)], [2]
  image, laid_out, model_weight, bias, residual = (0, 1, 49), (1, 0, 64), (512, 0, 1), (1, 0, 0), (49, 1, 0)
  assert ok(out, [], [image, laid_out], contiguous, 0, red)                 # a weight laid out with the channels innermost
  assert ok(out, [model_weight], [image], contiguous, 0, red)              # the model's weight, packed
  assert not ok(out, [], [image, model_weight], contiguous, 0, red)        # ... not packed: gathers in the reduce
  assert not ok(out, [], [image, model_weight, bias], contiguous, 0, red)  # a bias runs along the channels, but outside the reduce
  assert ok(out, [], [image, laid_out, bias, residual], contiguous, 0, red)  # epilogue inputs: any strides (gathered once per output)
  assert not ok(out, [], [image, laid_out], [(1, True)], 0, red)           # 8 pixels could be lanes, and the image runs along them
  assert not ok((1, 49, 0), [], [image, laid_out], contiguous, 0, red)     # the output contiguous along the axis: not this rule
