"""Collects the reference's tensor-core (and GPU hand-coded) decisions as test data: run with tinygrad 0.9.2 in a venv of
its own (never a tilecraft dependency):

  python3 -m venv /tmp/tg && /tmp/tg/bin/pip install tinygrad==0.9.2 numpy
  /tmp/tg/bin/python scripts/tc_reference_collect.py > tilecraft/testing/tc_reference.py
  /tmp/tg/bin/python scripts/tc_reference_collect.py --hand-coded > tilecraft/testing/heuristic_reference.py

It schedules kernels on the reference (half/float/bfloat16 matmuls, a padded one, batched ones, a
bias+relu epilogue, 3x3 convs, CAST operands), and for each of the reference's CUDA (sm_80), METAL
and AMD renderers, each tc_opt and each TC axis, records whether its apply_tensor_cores accepts
(use 1, no extra opts) and on which core, plus the (N, M, K) axes each axis number picks and
the opts its hand-coded TC extras add. The ASTs are written as plain nested lists that
tilecraft.testing.tc_cases.reference_ast turns into tilecraft ASTs. With --hand-coded: the opts the reference's GPU hand-coded optimizations choose on
kernels that exercise each of its rules (grouped reduces, matvec, unrolls, locals)."""
import os, pprint, sys
os.environ.setdefault("CLANG", "1")  # scheduling only: nothing is compiled
from tinygrad import Tensor, dtypes
from tinygrad.codegen.kernel import Kernel
from tinygrad.ops import BufferOps, ReduceOps, UnaryOps
from tinygrad.renderer.cstyle import AMDRenderer, CUDARenderer, MetalRenderer

def plain(op) -> list:
  """[op name, [sources], arg] with MemBuffer/ConstBuffer as [kind, idx or value, dtype, views]."""
  a = op.arg
  views = lambda st: [[list(v.shape), list(v.strides), v.offset, None if v.mask is None else [list(m) for m in v.mask], v.contiguous] for v in st.views]  # noqa: E731
  if op.op in (BufferOps.LOAD, BufferOps.STORE): arg = ["mem", a.idx, a.dtype.name, views(a.st)]
  elif op.op is BufferOps.CONST: arg = ["const", a.val, a.dtype.name, views(a.st)]
  elif op.op is UnaryOps.CAST: arg = a.name
  elif op.op in (ReduceOps.SUM, ReduceOps.MAX): arg = list(a)
  else: arg = None
  return [op.op.name, [plain(s) for s in op.src], arg]

def renderers() -> dict:
  metal = MetalRenderer()
  metal.tensor_cores = MetalRenderer.tensor_cores  # (listed only on arm64 hosts)
  return {"CUDA": CUDARenderer("sm_80"), "METAL": metal, "AMD": AMDRenderer()}

def E(*shape, dt=dtypes.half) -> Tensor: return Tensor.empty(*shape, dtype=dt)

def kernels() -> dict:
  out = {}
  for dt, dn in ((dtypes.half, "half"), (dtypes.float, "float"), (dtypes.bfloat16, "bf16")):
    out[f"matmul_64x64x64_{dn}"] = E(64, 64, dt=dt) @ E(64, 64, dt=dt)
    out[f"matmul_32x48x64_{dn}"] = E(32, 64, dt=dt) @ E(64, 48, dt=dt)
    out[f"matmul_61x67x45_{dn}"] = E(61, 45, dt=dt) @ E(45, 67, dt=dt)
    if dt == dtypes.bfloat16: continue
    out[f"batched_3x32x32x32_{dn}"] = E(3, 32, 32, dt=dt) @ E(3, 32, 32, dt=dt)
    out[f"bias_relu_64x32x64_{dn}"] = (E(64, 64, dt=dt) @ E(64, 32, dt=dt) + E(32, dt=dt)).relu()
    out[f"conv3x3_{dn}"] = E(2, 16, 18, 18, dt=dt).conv2d(E(16, 16, 3, 3, dt=dt))
    out[f"conv3x3_pad1_{dn}"] = E(1, 8, 10, 10, dt=dt).conv2d(E(12, 8, 3, 3, dt=dt), padding=1)
  out["matmul_acc_half"] = E(32, 32).dot(E(32, 32), acc_dtype=dtypes.half)
  out["matmul_float_cast_to_half"] = E(32, 32, dt=dtypes.float).cast(dtypes.half) @ E(32, 32, dt=dtypes.float).cast(dtypes.half)
  out["matmul_16x8x3_half"] = E(16, 3) @ E(3, 8)
  out["matmul_16x8x5_half"] = E(16, 5) @ E(5, 8)
  out["matmul_5x6x40_half"] = E(5, 40) @ E(40, 6)
  out["matmul_b_batched_32x32x32x3_half"] = E(32, 32) @ E(3, 32, 32)
  out["matmul_a_batched_3x32x32x32_half"] = E(3, 32, 32) @ E(32, 32)
  out["matmul_at_b_48x32x64_half"] = E(64, 48).T @ E(64, 32)
  return {name: t.schedule()[-1].ast for name, t in out.items()}

def main() -> None:
  data = {}
  for name, ast in kernels().items():
    accepted: dict = {}
    for vendor, ren in renderers().items():
      for tc_opt in (0, 1, 2):
        for axis in range(24):
          k = Kernel(ast, opts=ren)
          if k.apply_tensor_cores(1, extra_opts=[], axis=axis, tc_opt=tc_opt): accepted.setdefault(vendor, {}).setdefault(tc_opt, []).append((axis, str(k.tensor_core)))
    choices = []
    for axis in range(24):  # the (N, M, K) axes of each axis number (the same for every core whose pattern matches)
      k = Kernel(ast, opts=renderers()["METAL"])
      tcs = renderers()["METAL"].tensor_cores + renderers()["CUDA"].tensor_cores
      found = next((o for tc in tcs if (o := k._create_tc_opts(k.reduceop, tc, axis, 2)) is not None), None)
      if found is None: break
      choices.append(tuple(found.axes))
    extras = {}  # the reference's hand-coded opts after TC (extra_opts None), at axis 0 and the lowest tc_opt accepted
    for vendor, ren in renderers().items():
      for tc_opt in (0, 1, 2):
        k = Kernel(ast, opts=ren)
        if k.apply_tensor_cores(1, axis=0, tc_opt=tc_opt):
          extras[vendor] = [(o.op.name, o.axis, o.amt) for o in k.applied_opts]
          break
    data[name] = (plain(ast), tuple(Kernel(ast).full_shape), choices, accepted, extras)
  print('"""Generated by scripts/tc_reference_collect.py from tinygrad 0.9.2 (do not edit): kernels the reference')
  print("schedules, and which Opt(TC, axis, tc_opt) its CUDA (sm_80), METAL and AMD renderers accept (use 1, no")
  print("extra opts) on which core. KERNELS[name] = (AST as nested lists, full_shape, (N, M, K) axes of each TC")
  print("axis number, {vendor: {tc_opt: [(axis, core), ...]}}, {vendor: the opts its apply_tensor_cores(1) applies with")
  print('its hand-coded extras, at axis 0 and the lowest tc_opt it accepts, as (op, axis, amt)})."""')
  print("# flake8: noqa")
  print("KERNELS = " + pprint.pformat(data, width=200, compact=True))

def hand_coded() -> None:
  """The reference's GPU hand-coded opts (its OpenCL renderer) on kernels that exercise each rule."""
  from tinygrad.renderer.cstyle import OpenCLRenderer
  f = dtypes.float
  ts = {"sum_4096": E(4096, dt=f).sum(), "sum_rows_8x1024": E(8, 1024, dt=f).sum(1), "sum_rows_32x4096": E(32, 4096, dt=f).sum(1),
        "sum_rows_64x1024": E(64, 1024, dt=f).sum(1), "sum_cols_1024x64": E(1024, 64, dt=f).sum(0),
        "matvec_4096": E(1, 4096, dt=f) @ E(4096, 4096, dt=f), "matvec_t_4096": E(4096, 4096, dt=f) @ E(4096, 1, dt=f),
        "matvec_batched_4x1024x256": E(4, 1, 1024, dt=f) @ E(4, 1024, 256, dt=f), "matvec_batched_t_4x256x1024": E(4, 256, 1024, dt=f) @ E(4, 1024, 1, dt=f),
        "conv3x3_16x16x32": E(1, 16, 34, 34, dt=f).conv2d(E(16, 16, 3, 3, dt=f)), "elementwise_6x6x6": E(6, 6, 6, dt=f).exp(),
        "elementwise_3x96x64": E(3, 96, 64, dt=f) * E(3, 1, 64, dt=f), "matmul_64_float": E(64, 64, dt=f) @ E(64, 64, dt=f)}
  data = {}
  for name, t in ts.items():
    ast = t.schedule()[-1].ast
    k = Kernel(ast, opts=OpenCLRenderer()).hand_coded_optimizations()
    data[name] = (plain(ast), tuple(Kernel(ast).full_shape), [(o.op.name, o.axis, o.amt) for o in k.applied_opts])
  print('"""Generated by scripts/tc_reference_collect.py --hand-coded from tinygrad 0.9.2 (do not edit): kernels the')
  print("reference schedules and the opts its hand_coded_optimizations applies on its OpenCL renderer. KERNELS[name] =")
  print('(AST as nested lists, full_shape, [(op, axis, amt), ...])."""')
  print("# flake8: noqa")
  print("KERNELS = " + pprint.pformat(data, width=200, compact=True))

if __name__ == "__main__": sys.exit(hand_coded() if "--hand-coded" in sys.argv else main())
