"""The benchmark suite: real kernels written with the Tensor frontend, each with the numpy code it
is checked and timed against. `bench` times them, `tune` searches their kernels."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable
import numpy as np

@dataclass(frozen=True)
class BenchCase:
  """One benchmark: inputs, the tilecraft expression and the numpy equivalent.

  `numpy_fn` takes the same arrays as `tilecraft_fn` takes Tensors; it is timed on the float32
  inputs and, on float64 copies, gives the reference the output is checked against."""
  key: str                                       # short id, e.g. "matmul_1024"
  desc: str                                      # what it computes, e.g. "(1024x1024) @ (1024x1024) fp32"
  make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
  tilecraft_fn: Callable[..., Any]
  numpy_fn: Callable[..., np.ndarray]
  tol: float = 1e-4                              # max |out - ref| / max |ref|

def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray: return rng.standard_normal(shape, dtype=np.float32)

def np_conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """NCHW conv with zero padding 1, stride 1: im2col (sliding windows) then one matmul."""
  n, cin, h, wd = x.shape
  cout, _, kh, kw = w.shape
  p = np.pad(x, ((0, 0), (0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)))
  win = np.lib.stride_tricks.sliding_window_view(p, (kh, kw), axis=(2, 3))  # n, cin, h, w, kh, kw
  cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, cin * kh * kw, h * wd)
  return (w.reshape(cout, -1) @ cols).reshape(n, cout, h, wd)

def np_softmax(x: np.ndarray) -> np.ndarray:
  """Softmax over the last axis."""
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def np_layernorm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
  """Layernorm over the last axis, no affine."""
  xc = x - x.mean(-1, keepdims=True)
  return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)

def _matmul(n: int) -> BenchCase:
  return BenchCase(f"matmul_{n}", f"({n}x{n}) @ ({n}x{n})", lambda r: [_normal(r, n, n), _normal(r, n, n)],
                   lambda a, b: a @ b, lambda a, b: a @ b)

def _matvec(n: int) -> BenchCase:
  return BenchCase(f"matvec_{n}", f"({n}x{n}) @ ({n},)", lambda r: [_normal(r, n, n), _normal(r, n)],
                   lambda a, x: a @ x, lambda a, x: a @ x)

def _conv(c: int, hw: int) -> BenchCase:
  return BenchCase(f"conv2d_{c}x{hw}", f"conv2d 3x3 pad 1: (1,{c},{hw},{hw}) * ({c},{c},3,3)",
                   lambda r: [_normal(r, 1, c, hw, hw), _normal(r, c, c, 3, 3) * np.float32(0.1)],
                   lambda x, w: x.conv2d(w, padding=1), np_conv2d)

def _softmax(m: int, n: int) -> BenchCase:
  return BenchCase(f"softmax_{m}x{n}", f"softmax over the last axis of ({m},{n})", lambda r: [_normal(r, m, n)],
                   lambda x: x.softmax(-1), np_softmax)

def _layernorm(m: int, n: int) -> BenchCase:
  return BenchCase(f"layernorm_{m}x{n}", f"layernorm (no affine, eps 1e-5) over the last axis of ({m},{n})", lambda r: [_normal(r, m, n)],
                   lambda x: x.layernorm(-1), np_layernorm)

def _sum(n: int) -> BenchCase:
  return BenchCase(f"sum_{_size(n)}", f"sum of {n} uniform [0,1) floats", lambda r: [r.random(n, dtype=np.float32)],
                   lambda x: x.sum(), lambda x: np.asarray(x.sum()))

def _elementwise(n: int) -> BenchCase:
  return BenchCase(f"elementwise_{_size(n)}", f"(a*b+c).relu() over {n} floats", lambda r: [_normal(r, n), _normal(r, n), _normal(r, n)],
                   lambda a, b, c: (a * b + c).relu(), lambda a, b, c: np.maximum(a * b + c, 0))

def _size(n: int) -> str:
  for unit, s in ((1 << 20, "M"), (1 << 10, "K")):
    if n % unit == 0: return f"{n // unit}{s}"
  return str(n)

def suite(quick: bool = False) -> list[BenchCase]:
  """The benchmark kernels; `quick` uses small sizes (seconds, for tests and CI)."""
  if quick:
    return [_matmul(64), _matmul(128), _matvec(256), _conv(8, 16), _softmax(64, 256), _layernorm(64, 256), _sum(1 << 16),
            _elementwise(1 << 16)]
  return [_matmul(256), _matmul(512), _matmul(1024), _matvec(4096), _conv(64, 56), _softmax(4096, 1024), _layernorm(4096, 1024),
          _sum(1 << 24), _elementwise(1 << 24)]

def select(cases: list[BenchCase], only: list[str] | None) -> list[BenchCase]:
  """Cases whose key contains any of `only` (all when None/empty)."""
  if not only: return cases
  return [c for c in cases if any(s in c.key for s in only)]
