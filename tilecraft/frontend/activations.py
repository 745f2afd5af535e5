"""Neural-network activations composed from the core ops (a mixin of Tensor), with torch's names and
default parameters; the ONNX frontend's activation ops call these with the node's attributes.

Contract: float inputs keep their dtype; integer and bool inputs compute in the default float (as
`sigmoid` does). float16 and bfloat16 compute in float32 and are rounded once at the end, so an
activation built of several steps doesn't round after each. Each formula avoids overflow and
cancellation over the whole float range: softplus (and mish, log_sigmoid through it) never takes
exp of a positive number and keeps its far tail's digits (log1p); elu, celu and selu use expm1; nan
stays nan."""
from __future__ import annotations
import math
from typing import TYPE_CHECKING
from tilecraft.dtype import dtypes
from tilecraft.frontend.math import computed_wide as wide
if TYPE_CHECKING: from tilecraft.tensor import Tensor

# SELU's constants (Klambauer et al. 2017), as ONNX and torch give them
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

def _softplus(x: "Tensor") -> "Tensor":
  """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow, and exp(x)'s digits kept far below 0
  (log(1 + tiny) would round to 0)."""
  return x.maximum(0) + (-x.abs()).exp().log1p()

class ActivationOps:
  def relu(self: "Tensor") -> "Tensor": return self.maximum(0) if not dtypes.is_float(self.dtype) else (self < 0).where(0.0, self)  # nan stays nan
  def relu6(self: "Tensor") -> "Tensor": return self.hardtanh(0.0, 6.0)
  def hardtanh(self: "Tensor", min_val: float = -1.0, max_val: float = 1.0) -> "Tensor":
    """x clamped to [min_val, max_val]; nan stays nan."""
    x = self._float()
    return (x < min_val).where(min_val, (x > max_val).where(max_val, x))
  def leaky_relu(self: "Tensor", negative_slope: float = 0.01) -> "Tensor":
    x = self._float()
    return (x < 0).where(x * negative_slope, x)
  def elu(self: "Tensor", alpha: float = 1.0) -> "Tensor": return wide(self, lambda x: (x < 0).where(x.expm1() * alpha, x))
  def celu(self: "Tensor", alpha: float = 1.0) -> "Tensor": return wide(self, lambda x: (x < 0).where((x * (1 / alpha)).expm1() * alpha, x))
  def selu(self: "Tensor", alpha: float = SELU_ALPHA, scale: float = SELU_SCALE) -> "Tensor":
    """scale * (x if x > 0 else alpha (exp(x) - 1)); the constants of SELU's paper by default (ONNX's Selu
    passes its own)."""
    return wide(self, lambda x: (x <= 0).where(x.expm1() * (alpha * scale), x * scale))
  def swish(self: "Tensor", beta: float = 1.0) -> "Tensor":
    """x * sigmoid(beta x)."""
    return wide(self, lambda x: x * (x * beta).sigmoid())
  def silu(self: "Tensor") -> "Tensor": return self.swish(1.0)
  def quick_gelu(self: "Tensor") -> "Tensor": return self.swish(1.702)
  def gelu(self: "Tensor", approximate: str = "tanh") -> "Tensor":
    """approximate="tanh" (the default, as GPT-2 and BERT use it): 0.5 x (1 + tanh(u)), u = sqrt(2/pi)
    (x + 0.044715 x^3), as x * sigmoid(2u) (the same function: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))):
    one exp and one reciprocal, u read once, so it fuses into one kernel (and a matmul's epilogue)
    where tanh's branches were three kernels; and no cancellation in 1 + tanh(u) for negative u.
    approximate="none": the exact 0.5 x (1 + erf(x / sqrt(2)))."""
    if approximate == "tanh": return wide(self, lambda x: x * (1 + ((x + 0.044715 * x * x * x) * (-2 * math.sqrt(2 / math.pi))).exp()).reciprocal())
    if approximate == "none": return wide(self, lambda x: x * 0.5 * (1 + (x * (1 / math.sqrt(2))).erf()))
    raise ValueError(f"gelu: approximate must be 'tanh' or 'none', not {approximate!r}")
  def hardsigmoid(self: "Tensor", alpha: float = 1 / 6, beta: float = 0.5) -> "Tensor":
    """clamp(alpha x + beta, 0, 1); torch's defaults (ONNX's HardSigmoid defaults to alpha 0.2)."""
    return wide(self, lambda x: (x * alpha + beta).hardtanh(0.0, 1.0))
  def hardswish(self: "Tensor") -> "Tensor": return wide(self, lambda x: x * x.hardsigmoid())
  def softplus(self: "Tensor", beta: float = 1.0, threshold: float = 20.0) -> "Tensor":
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's)."""
    return wide(self, lambda x: (x * beta > threshold).where(x, _softplus(x * beta) * (1 / beta)))
  def softsign(self: "Tensor") -> "Tensor": return wide(self, lambda x: x / (1 + x.abs()))
  def mish(self: "Tensor") -> "Tensor": return wide(self, lambda x: x * _softplus(x).tanh())
  def log_sigmoid(self: "Tensor") -> "Tensor": return wide(self, lambda x: -_softplus(-x))
