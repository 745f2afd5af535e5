"""The tensor-core test cases, shared by the emulator tests (which run them) and the compile checks
(which compile the same kernels for the real targets): for one core, matmuls at 64x64x64 and
32x48x64 (with extra opts), padded non-multiples 61x67x45 (tc_opt 2), a batched matmul and a 3x3
conv with several reduce axes (tc_opt 1), each with the core's dtypes (CAST(LOAD) operands, so
tc_opt >= 1, where dtype_out differs from dtype_in), with a float64 numpy reference. Also the kernels
the reference scheduled (tc_reference.py) as tilecraft ASTs, with inputs and what they mean in numpy."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
from tilecraft.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tilecraft.codegen.tensor_cores import tc_choices
from tilecraft.dtype import DType, bf16_bits_from_f32, dtypes, f32_from_bf16_bits
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps

def np_dtype(dt: DType) -> Any: return np.float32 if dt == dtypes.bfloat16 else dt.np

def held(x: np.ndarray, dt: DType) -> np.ndarray:
  """x as the values a `dt` buffer holds (as float64)."""
  if dt == dtypes.bfloat16: return f32_from_bf16_bits(bf16_bits_from_f32(x.astype(np.float32))).astype(np.float64)
  return x.astype(dt.np).astype(np.float64)

def retype(ast: LazyOp, din: DType, dout: DType) -> LazyOp:
  """STORE(SUM(MUL(LOAD, LOAD))) with din loads and a dout reduce and output (CAST(LOAD) operands when they differ)."""
  st, red = ast.src[0], ast.src[0].src[0]
  def operand(x: LazyOp) -> LazyOp:
    ld = LazyOp(BufferOps.LOAD, (), MemBuffer(x.arg.idx, din, x.arg.st))
    return ld if din == dout else LazyOp(UnaryOps.CAST, (ld,), dout)
  red = LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, tuple(operand(x) for x in red.src[0].src)),), red.arg)
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (red,), MemBuffer(0, dout, st.arg.st)),))

def _case(fn: Callable, shapes: list[tuple], din: DType, dout: DType, rng: np.random.Generator, ref: Callable) -> tuple:
  from tilecraft import Tensor
  xs = [rng.uniform(-1, 1, s) for s in shapes]
  ast = fn(*[Tensor(x.astype(np.float32)) for x in xs]).schedule()[-1].ast  # the shape of the kernel (MUL of LOADs); dtypes set by retype
  vals = [held(x, din) for x in xs]
  return retype(ast, din, dout), {i + 1: v.astype(np_dtype(din)).reshape(-1) for i, v in enumerate(vals)}, ref(*vals)

def matmul(rng: np.random.Generator, M: int, N: int, K: int, din: DType, dout: DType, batch: int = 0) -> tuple:
  b = (batch,) if batch else ()
  return _case(lambda x, y: x @ y, [b + (M, K), b + (K, N)], din, dout, rng, lambda a, w: a @ w)

def conv(rng: np.random.Generator, din: DType, dout: DType, cin: int = 16) -> tuple:
  def ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("ncijkl,ockl->noij", np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3)), w)
  return _case(lambda x, w: x.conv2d(w), [(2, cin, 18, 18), (16, cin, 3, 3)], din, dout, rng, ref)

def cases(rng: np.random.Generator, tc: Any) -> list[tuple[str, tuple, int, list[Opt]]]:
  """(name, (ast, inputs, reference), tc_opt, extra opts) for one core."""
  din, dout = tc.dtype_in, tc.dtype_out
  lo = 1 if din != dout else 0  # CAST(LOAD) operands need tc_opt 1
  up = 0 if 32 // tc.dims[0] >= 4 else 1  # 32x48x64's extra UPCAST: the N axis when LOCAL leaves it >= 2, else the next
  return [("64x64x64", matmul(rng, 64, 64, 64, din, dout), lo, []),
          ("32x48x64", matmul(rng, 32, 48, 64, din, dout), lo, [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.UPCAST, up, 2)]),
          ("61x67x45", matmul(rng, 61, 67, 45, din, dout), 2, []),
          ("batched", matmul(rng, 32, 32, 32, din, dout, batch=3), lo, []),
          ("conv3x3", conv(rng, din, dout), 1, [Opt(OptOps.UNROLL, 1, 3)])]

def accepted_axes(ast: LazyOp, ren: Any, tc_opt: int) -> list[int]:
  """The TC axis choices apply_tensor_cores accepts for this kernel on `ren`."""
  try: n = len(tc_choices(Kernel(ast, opts=ren), tc_opt)[3])
  except KernelOptError: return []
  return [ax for ax in range(n) if Kernel(ast, opts=ren).apply_tensor_cores(1, axis=ax, tc_opt=tc_opt)]

def tolerance(dout: DType, k: int) -> dict[str, float]:
  """assert_allclose's rtol/atol for sums of k products of values in [-1, 1]: half accumulation rounds
  at every step."""
  if dout == dtypes.float16: return dict(rtol=2e-2, atol=6e-3 * float(np.sqrt(k)))
  return dict(rtol=1e-4, atol=1e-4 * float(np.sqrt(k)))

def tc_kernels(ren: Any, tc: Any, seed: int = 0) -> list[tuple[str, int, int, list[Opt], LazyOp, dict, np.ndarray, Kernel]]:
  """(case, axis, tc_opt, extra, ast, inputs, reference, kernel with use 1 applied) for every case and
  accepted axis of core `tc` (which `ren` must list)."""
  out = []
  for name, (ast, inputs, want), tc_opt, extra in cases(np.random.default_rng(seed), tc):
    for ax in accepted_axes(ast, ren, tc_opt):
      k = Kernel(ast, opts=ren)
      assert k.apply_tensor_cores(1, extra_opts=list(extra), axis=ax, tc_opt=tc_opt), (name, ax, tc_opt, extra)
      if k.tensor_core != tc: continue  # another core of the target took these dtypes
      out.append((name, ax, tc_opt, extra, ast, inputs, want, k))
  return out

# ---- differential fuzzing with tensor cores -------------------------------------------------------

def fuzz_asts(tc: Any, rng: np.random.Generator) -> list[tuple[LazyOp, dict, np.ndarray]]:
  """Small kernels for fuzzing core `tc`: matmuls (one of them padded), a batched matmul, a conv."""
  din, dout = tc.dtype_in, tc.dtype_out
  n, m, k = tc.dims
  return [matmul(rng, 2 * n, 2 * m, 2 * k, din, dout), matmul(rng, 2 * n - 3, m + 5, k + 3, din, dout),
          matmul(rng, n, 2 * m, 2 * k, din, dout, batch=2), conv(rng, din, dout, cin=k)]

def fuzz_tc(ren: Any, device: str, n_pairs: int, seed: int = 0, max_opts: int = 3) -> tuple[int, list[str]]:
  """Run `n_pairs` (kernel, opt sequence) pairs whose first opt is TC (random choice, tc_opt and use
  1-3, then random opts) on `device` with renderer `ren`, against numpy. Returns (pairs run, failures)."""
  from tilecraft.helpers import Context
  from tilecraft.testing.fuzz import run_program
  from tilecraft.testing.opt_sampler import random_opts
  rng = np.random.default_rng(seed)
  pool = [(tc, case) for tc in ren.tensor_cores for case in fuzz_asts(tc, rng)]
  done, fails, tries = 0, [], 0
  while done < n_pairs and tries < 20 * n_pairs:
    tries += 1
    tc, (ast, inputs, want) = pool[int(rng.integers(len(pool)))]
    use = int(rng.choice([1, 1, 2, 3]))
    seq = random_opts(Kernel(ast, opts=ren), rng, max_opts=max_opts, tc=1.0, tc_use=use)
    if seq.error is not None:
      fails.append(f"{list(seq)}: {seq.error}")
      continue
    if not seq or seq[0].op is not OptOps.TC: continue
    k = seq.kernel  # type: ignore[attr-defined]
    try:
      with Context(TC=use): got = run_program(ast, k.to_program(), inputs, device)[0].astype(np.float64).reshape(want.shape)
    except Exception as e:  # noqa: BLE001 - any crash is a failure to report
      fails.append(f"{list(seq)} use {use}: {type(e).__name__}: {e}")
      continue
    kk = int(np.prod([s for s, o in zip(k.full_shape, k.output_shape) if s != o]))
    if not np.allclose(got, want, **tolerance(ast.src[0].arg.dtype, kk)):
      fails.append(f"{list(seq)} use {use} on {k.name}: max error {np.abs(got - want).max():.3g}")
    done += 1
  return done, fails

# ---- kernels scheduled by the reference (tinygrad 0.9.2), and what its TC opt accepts on them -----

_REF_DTYPES = {"half": dtypes.float16, "float": dtypes.float32, "__bf16": dtypes.bfloat16}

def reference_ast(x: list) -> LazyOp:
  """A tilecraft AST from the reference's, written as [op name, [sources], arg] (tc_reference.py)."""
  from tilecraft.ops import ConstBuffer
  from tilecraft.shape.shapetracker import ShapeTracker
  from tilecraft.shape.view import View
  name, srcs, arg = x
  src = tuple(reference_ast(s) for s in srcs)
  def st(views: list) -> ShapeTracker:
    return ShapeTracker(tuple(View.create(tuple(s), tuple(t), o, None if m is None else tuple(tuple(p) for p in m)) for s, t, o, m, _ in views))
  if name in ("LOAD", "STORE"): return LazyOp(BufferOps[name], src, MemBuffer(arg[1], _REF_DTYPES[arg[2]], st(arg[3])))
  if name == "CONST": return LazyOp(BufferOps.CONST, src, ConstBuffer(arg[1], _REF_DTYPES[arg[2]], st(arg[3])))
  if name == "CAST": return LazyOp(UnaryOps.CAST, src, _REF_DTYPES[arg])
  if name == "KERNEL": return LazyOp(MetaOps.KERNEL, src)
  if isinstance(arg, list): return LazyOp(ReduceOps[name], src, tuple(arg))
  for ops in (UnaryOps, BinaryOps):
    if name in ops.__members__: return LazyOp(ops[name], src)
  raise ValueError(f"reference_ast: unknown op {name}")

def np_eval(ast: LazyOp, inputs: dict[int, np.ndarray]) -> list[np.ndarray]:
  """What `ast` means, in float64 from the held input values (flat arrays by buffer index): products
  and sums exact, CASTs to half/bfloat16/float32 rounding, each output rounded to its dtype."""
  from tilecraft.testing.fuzz import st_indices
  memo: dict[LazyOp, np.ndarray] = {}
  def ev(x: LazyOp) -> np.ndarray:
    if x in memo: return memo[x]
    if x.op in (BufferOps.LOAD, BufferOps.CONST):
      idx, valid = st_indices(x.arg.st)
      vals = inputs[x.arg.idx][np.where(valid, idx, 0)] if x.op is BufferOps.LOAD else np.full(idx.shape, float(x.arg.val))
      ret = np.where(valid, vals, 0.0)
    elif x.op is UnaryOps.CAST: ret = held(ev(x.src[0]), x.arg)
    elif x.op is ReduceOps.SUM: ret = ev(x.src[0]).sum(axis=x.arg, keepdims=True)
    elif x.op in _NP_ALU: ret = _NP_ALU[x.op](*[ev(s) for s in x.src])
    else: raise NotImplementedError(f"np_eval: {x.op}")
    memo[x] = ret
    return ret
  return [held(ev(st.src[0]), st.arg.dtype) for st in ast.src]

_NP_ALU: dict = {BinaryOps.ADD: np.add, BinaryOps.MUL: np.multiply, BinaryOps.MAX: np.maximum, UnaryOps.EXP2: np.exp2}

def reference_case(name: str, seed: int = 0) -> tuple[LazyOp, dict[int, np.ndarray], np.ndarray]:
  """(tilecraft AST, inputs by buffer index, float64 expected output) of reference kernel `name`."""
  from tilecraft.testing.fuzz import buffer_size, buffer_views
  from tilecraft.testing.tc_reference import KERNELS
  ast = reference_ast(KERNELS[name][0])
  rng = np.random.default_rng(seed)
  views = buffer_views(ast)
  vals = {i: held(rng.uniform(-1, 1, buffer_size(v)), v[0].dtype) for i, v in views.items() if i >= len(ast.src)}
  return ast, {i: v.astype(np_dtype(views[i][0].dtype)) for i, v in vals.items()}, np_eval(ast, vals)[0]
