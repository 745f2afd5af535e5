"""Checking Tensor ops against numpy, shared by tests/test_tensor_ops.py and tests/frontend/ (the
tests' `pythonpath` in pyproject.toml makes this importable as `op_checks`).

Compiling a kernel costs ~0.2 s on CPU and ~0.7 s on OPENCL (PoCL), so tables of elementwise cases
are checked in ONE kernel each (`check_many`: case i is row i, selected with `where`), and
`on_devices` runs every case of a parametrization on CPU and a representative few on OPENCL.
Also numpy references for the frontend's composite ops (softmax, conv2d, pooling)."""
from __future__ import annotations
import os, warnings
from typing import Any, Callable, Optional
import numpy as np
import pytest
from tilecraft import Tensor, dtypes

def gpu_test_devices() -> list[str]:
  """The devices named in env TEST_GPU (comma-separated, e.g. CUDA): every case OPENCL runs, they run
  too. For a machine with a GPU (bench/gpu_check.sh sets it); tests/conftest.py skips their cases where
  the device can only render and compile (no GPU)."""
  return [d.strip().upper() for d in os.environ.get("TEST_GPU", "").split(",") if d.strip()]

def on_devices(argnames: str, cases: list, opencl: Any = "all") -> Any:
  """Parametrize `device` and `argnames` over `cases`: every case on CPU, and on OPENCL (and the
  devices of `gpu_test_devices`) the cases at the indices in `opencl` ("all" for every one)."""
  params = []
  for i, case in enumerate(cases):
    vals = case if len(argnames.split(",")) > 1 else (case,)
    cid = "-".join(v.__name__ if isinstance(v, type) else str(v).replace(" ", "") for v in vals)
    params.append(pytest.param("CPU", *vals, id=f"CPU-{cid}"))
    if opencl == "all" or i in opencl:
      params.append(pytest.param("OPENCL", *vals, id=f"OPENCL-{cid}", marks=pytest.mark.opencl))
      params += [pytest.param(d, *vals, id=f"{d}-{cid}") for d in gpu_test_devices()]
  return pytest.mark.parametrize(f"device,{argnames}", params)

F32 = np.float32

def _np_dtype(dt: Any) -> np.dtype: return np.dtype(dt.np) if hasattr(dt, "np") else np.dtype(dt)

def _expected(f_np: Callable, arrays: tuple, dtype: Any) -> np.ndarray:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    exp = np.asarray(f_np(*arrays))
    return exp.astype(_np_dtype(dtype)) if dtype is not None else exp

def _compare(got: np.ndarray, exp: np.ndarray, atol: float, rtol: float, what: str = "") -> None:
  assert got.shape == exp.shape, f"{what}shape {got.shape} != numpy {exp.shape}"
  if exp.dtype.kind in "fc": np.testing.assert_allclose(got, exp, atol=atol, rtol=rtol, equal_nan=True, err_msg=what)
  else: np.testing.assert_array_equal(got, exp, err_msg=what)

def check(f_t: Callable, f_np: Callable, *arrays: Any, device: str = "CPU", dtype: Any = None, atol: float = 1e-5, rtol: float = 1e-5) -> np.ndarray:
  """f_t on Tensors (made from `arrays` on `device`) matches f_np on the arrays: shape, dtype and values
  (NaN where numpy has NaN, inf with its sign). `dtype` overrides the expected numpy dtype."""
  ts = [Tensor(a, device=device) if isinstance(a, np.ndarray) else a for a in arrays]
  out = f_t(*ts)
  assert isinstance(out, Tensor), f"expected a Tensor, got {type(out).__name__}"
  assert out.device == device
  got = out.numpy()
  exp = _expected(f_np, arrays, dtype)
  assert got.dtype == exp.dtype, f"dtype {got.dtype} != numpy {exp.dtype}"
  _compare(got, exp, atol, rtol)
  return got

def check_many(cases: dict, *arrays: np.ndarray, device: str = "CPU", atol: float = 1e-5, rtol: float = 1e-5) -> None:
  """Every case, an elementwise function of the arrays given as (f_t, f_np) or (f_t, f_np, expected dtype),
  in ONE kernel: the inputs are expanded to (len(cases), ...) first, case i is computed everywhere and row i
  of the result selects it with `where`. Each case's dtype is checked (it is known before running), then
  its values against numpy (ints exactly)."""
  nd = max(a.ndim for a in arrays)
  k = len(cases)
  ts = [Tensor(a, device=device).reshape(1, *(1,) * (nd - a.ndim), *a.shape) for a in arrays]
  shape = (k,) + tuple(int(s) for s in np.broadcast_shapes(*(a.shape for a in arrays)))
  ts = [t.expand(k, *t.shape[1:]) for t in ts]
  outs, exps = [], []
  for name, case in cases.items():
    f_t, f_np, dt = case if len(case) == 3 else (*case, None)
    out, exp = f_t(*ts), _expected(f_np, arrays, dt)
    assert out.dtype.np is not None and np.dtype(out.dtype.np) == exp.dtype, f"{name}: dtype {out.dtype} != numpy {exp.dtype}"
    assert out.shape == (k, *(1,) * (nd - exp.ndim), *exp.shape), f"{name}: shape {out.shape[1:]} != numpy {exp.shape}"
    outs.append(out); exps.append(exp)
  # one dtype holds every case exactly: int64 for ints, else float64 (float32 where a device has no float64)
  common = dtypes.int64 if all(e.dtype.kind in "biu" and e.dtype != np.uint64 for e in exps) else dtypes.float64 if _has_f64(device) else dtypes.float32
  got = select_rows([o.cast(common).expand(*shape) for o in outs]).numpy()
  for i, (name, exp) in enumerate(zip(cases, exps)):
    want = np.broadcast_to(exp, shape[1:])
    _compare(got[i].astype(exp.dtype) if exp.dtype.kind in "biu" else got[i], want.astype(got.dtype) if exp.dtype.kind == "f" else want,
             atol, rtol, f"case {name!r}: ")

def select_rows(outs: list[Tensor]) -> Tensor:
  """One tensor whose row i is outs[i] (each of shape (k, ...), the same for all, k = len(outs)), in ONE
  kernel: every out is computed everywhere and `where` on the row index picks it. A kernel per case would
  cost a build and a launch each (on PoCL ~0.5 s)."""
  k = len(outs)
  sel = Tensor(np.arange(k, dtype=np.int32).reshape(k, *(1,) * (outs[0].ndim - 1)), device=outs[0].device).expand(*outs[0].shape)
  res = outs[-1]
  for i in range(k - 2, -1, -1): res = (sel == i).where(outs[i], res)
  return res

def _has_f64(device: str) -> bool:
  try: Tensor([0.0], dtype=dtypes.float64, device=device)
  except TypeError: return False
  return True

def randf(rng: np.random.Generator, *shape: int, lo: float = -3, hi: float = 3) -> np.ndarray:
  return rng.uniform(lo, hi, shape).astype(F32)

def randi(rng: np.random.Generator, *shape: int, lo: int = -20, hi: int = 20, dt: Any = np.int32) -> np.ndarray:
  return rng.integers(lo, hi, shape).astype(dt)

def _np_softmax(x: np.ndarray, axis: int) -> np.ndarray:
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)

def _pair(x: Any) -> tuple[int, int]: return (x, x) if isinstance(x, int) else tuple(x)

def np_conv2d(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> np.ndarray:
  """Direct convolution (cross-correlation, NCHW), written out window by window."""
  (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
  x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
  n, cin, h, wd = x.shape
  cout, cpg, kh, kw = w.shape
  oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (wd - dw * (kw - 1) - 1) // sw + 1
  out = np.zeros((n, cout, oh, ow))
  opg = cout // groups
  for oc in range(cout):
    g = oc // opg
    for i in range(oh):
      for j in range(ow):
        patch = x[:, g * cpg:(g + 1) * cpg, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
        out[:, oc, i, j] = (patch * w[oc]).sum((1, 2, 3))
  if b is not None: out += b.reshape(1, -1, 1, 1)
  return out.astype(F32)

def np_pool(x: np.ndarray, k: Any, stride: Any, padding: Any, dilation: Any, op: str) -> np.ndarray:
  (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pair(k), _pair(stride), _pair(padding), _pair(dilation)
  fill = -np.inf if op == "max" else 0.0
  x = np.pad(x, ((0, 0),) * (x.ndim - 2) + ((ph, ph), (pw, pw)), constant_values=fill)
  h, w = x.shape[-2:]
  oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
  out = np.zeros(x.shape[:-2] + (oh, ow), x.dtype)
  for i in range(oh):
    for j in range(ow):
      win = x[..., i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
      out[..., i, j] = win.max((-2, -1)) if op == "max" else win.mean((-2, -1))  # avg counts the padding (count_include_pad)
  return out

def require_arch(arch: str) -> None:
  """Skip (naming why) unless this host can execute code built for CPU_ARCH=arch: a test that runs
  kernels at another ISA skips where the host lacks it (tests that only build and inspect code don't call this)."""
  from tilecraft.host import _arch_target, find_c_compiler, missing_features
  try: target = _arch_target(find_c_compiler(), arch)
  except (ValueError, RuntimeError) as e: pytest.skip(f"CPU_ARCH={arch}: {e}")
  if (missing := missing_features(target)): pytest.skip(f"this host can't execute CPU_ARCH={arch} (lacks {', '.join(missing)})")
