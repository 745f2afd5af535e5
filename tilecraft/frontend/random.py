"""Random tensors: Tensor.manual_seed / rand / randn (a mixin of Tensor).

The numbers come from a counter-based hash computed in a kernel: element i of the k-th draw is
hash(i ^ key(seed, k)), so a draw needs no state on the device and is the same on every device."""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Optional
from tilecraft.dtype import dtypes
from tilecraft.frontend.shapes import norm_shape
from tilecraft.helpers import prod
if TYPE_CHECKING: from tilecraft.tensor import Tensor

def mix32(x: int) -> int:
  """A 32-bit integer mix (xor-shift-multiply), on a python int."""
  x ^= x >> 16; x = (x * 0x7FEB352D) & 0xFFFFFFFF; x ^= x >> 15; x = (x * 0x846CA68B) & 0xFFFFFFFF; x ^= x >> 16  # noqa: E702
  return x

def hash_u32(x: Tensor) -> Tensor:
  """The same mix as mix32, as tensor ops on a uint32 tensor (uint32 arithmetic wraps)."""
  T = type(x)
  x = x ^ (x >> 16)
  x = x * T(0x7FEB352D, dtype=dtypes.uint32, device=x.device)
  x = x ^ (x >> 15)
  x = x * T(0x846CA68B, dtype=dtypes.uint32, device=x.device)
  return x ^ (x >> 16)

class RandomOps:
  __slots__ = ()
  _seed: int = 0x5EED
  _rng_counter: int = 0

  @classmethod
  def manual_seed(cls, seed: int = 0) -> None:
    cls._seed, cls._rng_counter = int(seed), 0

  @classmethod
  def rand(cls, *shape: Any, dtype: Any = None, device: Optional[str] = None) -> Tensor:
    """Uniform [0, 1): an integer hash of (seed, call, element index), computed in a kernel."""
    shape = norm_shape(shape)
    if any(isinstance(s, int) and s < 0 for s in shape): raise ValueError(f"negative dimension in shape {shape}")
    n = int(prod(shape))
    cls._rng_counter += 1
    key = mix32((cls._seed * 0x9E3779B1 + cls._rng_counter * 0x85EBCA77) & 0xFFFFFFFF)
    if n == 0: return cls.zeros(*shape, dtype=dtype, device=device)  # type: ignore[attr-defined]
    ctr = cls.arange(n, dtype=dtypes.uint32, device=device)  # type: ignore[attr-defined]
    bits = hash_u32(ctr ^ cls(key, dtype=dtypes.uint32, device=device).expand(n))  # type: ignore[call-arg]
    out = (bits >> 8).cast(dtypes.float32) * (1.0 / (1 << 24))
    return out.reshape(shape).cast(dtype if dtype is not None else dtypes.default_float)

  @classmethod
  def randn(cls, *shape: Any, dtype: Any = None, device: Optional[str] = None) -> Tensor:
    """Standard normal via Box-Muller on two uniform draws."""
    shape = norm_shape(shape)
    u1, u2 = cls.rand(*shape, device=device), cls.rand(*shape, device=device)
    z = (1 - u1).log().mul(-2).sqrt() * (u2 * (2 * math.pi)).cos()
    return z.cast(dtype if dtype is not None else dtypes.default_float)
