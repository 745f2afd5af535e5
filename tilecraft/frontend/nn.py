"""Neural-network style Tensor methods (a mixin of Tensor): the softmax family, linear, layernorm,
conv2d and pooling. Convolution and pooling take sliding windows as views (pad, reshape, expand,
shrink: no copies), so a conv is one fused multiply-and-reduce kernel."""
from __future__ import annotations
import functools, math
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union
from tilecraft.dtype import dtypes, least_upper_dtype, to_dtype
from tilecraft.frontend.image import as_image, image_level
from tilecraft.frontend.nonnegative import known_nonnegative
from tilecraft.frontend.recipes import recorded
from tilecraft.frontend.shapes import memo_views, pair
from tilecraft.frontend.winograd import choose_tile, eligible, on_cpu, winograd_conv2d
if TYPE_CHECKING: from tilecraft.tensor import Tensor

def max_pad_value(x: Tensor, padding: Sequence[tuple[int, int]], k: Sequence[int], stride: Sequence[int],
                  dilation: Sequence[int], zero_ok: bool = True) -> Union[int, float]:
  """What to pad x's last len(k) dims with (`padding`: (before, after) each) before a max over windows
  k / stride / dilation: the dtype's lowest value, or 0 where x is known >= 0 (frontend/nonnegative.py)
  and every window still reaches an element of x, so the maxima agree. A zero pad is a mask on the
  pool's own loads; the lowest value is a where() the scheduler realizes as a padded copy first.
  `zero_ok=False` where a padded 0 tied with a real 0 would matter (the position of the first maximum)."""
  lowest = -math.inf if dtypes.is_float(x.dtype) else int(dtypes.min(x.dtype))
  if not zero_ok or not known_nonnegative(x.lazydata): return lowest
  for L, (before, after), kk, st, d in zip(x.shape[x.ndim - len(k):], padding, k, stride, dilation):
    if not all(isinstance(v, int) for v in (L, before, after)): return lowest
    for w in range((L + before + after - (kk - 1) * d - 1) // st + 1):
      start = w * st - before
      if not any(0 <= start + t * d < L for t in range(kk)): return lowest  # a window of padding alone: its max is the pad
  return 0

def _compacts_strided_pointwise(device: str) -> bool:
  """Whether a strided 1x1 conv on `device` first copies its kept pixels together (measured on CPUs, where
  the C and LLVM kernels vectorize along the output row; not measured on GPUs, which keep the one kernel)."""
  return on_cpu(device)

def compact_strided_pixels(x: Tensor, stride: tuple[int, int]) -> Tensor:
  """The pixels a strided 1x1 conv of x (N, C, H, W) reads, copied together: (N, C, H', W'). Such a conv reads one
  pixel in stride[0] x stride[1]: a vector of its output row is a gather, and every reduce step touches a cache line
  per pixel. Compacted first (one small copy kernel) it is a plain 1x1 conv: 1.2-1.5x for ResNet-50's downsamples."""
  kept = x._pool((1, 1), stride, (1, 1))  # n, cin, oh, ow, 1, 1
  return kept.reshape(kept.shape[:4]).contiguous()

def _wide(x: Tensor) -> tuple[Tensor, Any]:
  """x in the dtype its row statistics are computed in (float16/bfloat16: float32, rounded once at the
  end, DESIGN 12), and x's own dtype to cast the result back to."""
  return (x.cast(dtypes.float32) if x.dtype in (dtypes.float16, dtypes.bfloat16) else x), x.dtype

def _row_op(fn: Any) -> Any:
  """A softmax-style method over one axis: a 0-d tensor has none (ValueError, as numpy has for axis=0
  there), and a tensor with no elements gives an empty result of its shape (nothing to normalize)."""
  @functools.wraps(fn)
  def checked(self: Tensor, axis: int = -1) -> Tensor:
    if self.ndim == 0: raise ValueError(f"{fn.__name__} of a 0-d tensor: it has no axis to normalize over (reshape(1) first)")
    self._axis(axis)  # (IndexError for an axis out of range)
    if 0 in self.shape: return type(self).zeros(self.shape, dtype=self._float().dtype, device=self.device)
    return fn(self, axis)
  return checked

def _empty_reduce_is_log0(fn: Any) -> Any:
  """logsumexp over an empty axis is log(0) = -inf, as in scipy (max over it has no identity)."""
  @functools.wraps(fn)
  def checked(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
    if any(isinstance(self.shape[a], int) and self.shape[a] == 0 for a in self._axes(axis)):
      return self._float().sum(axis, keepdim).log()
    return fn(self, axis, keepdim)
  return checked

class NNOps:
  __slots__ = ()
  # The softmax family's row statistics (max, then the sum of exp(x - max)) are one kernel on CPU
  # targets (the scheduler fuses dependent reduces: engine/schedule.py), so the input is read twice:
  # once there, once by the elementwise output kernel.
  @_row_op
  @recorded
  def softmax(self: Tensor, axis: int = -1) -> Tensor:
    x, dt = _wide(self._float())
    e = (x - x.max(axis, keepdim=True)).exp()
    return (e * e.sum(axis, keepdim=True).reciprocal()).cast(dt)  # one reciprocal per row, a multiply per element
  @_row_op
  @recorded
  def log_softmax(self: Tensor, axis: int = -1) -> Tensor:
    x, dt = _wide(self._float())
    m = x - x.max(axis, keepdim=True)
    return (m - m.exp().sum(axis, keepdim=True).log()).cast(dt)
  @_empty_reduce_is_log0
  def logsumexp(self: Tensor, axis: Any = None, keepdim: bool = False) -> Tensor:
    x, dt = _wide(self._float())
    m = x.max(axis, keepdim=True)
    m = m.isinf().where(0.0, m)  # all -inf gives -inf and any +inf gives inf, instead of nan
    return (x - m).exp().sum(axis, keepdim=True).log().add(m).reshape(x.max(axis, keepdim).shape).cast(dt)

  def linear(self: Tensor, weight: Tensor, bias: Optional[Tensor] = None, acc_dtype: Any = None) -> Tensor:
    x = self.matmul(weight, acc_dtype)
    return x + bias if bias is not None else x
  @recorded
  def layernorm(self: Tensor, axis: Any = -1, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over `axis` (no scale or shift). The statistics are two passes
    over the row shifted by its first element (see Tensor.var): no cancellation where the values sit
    close together. float16/bfloat16 rows are computed in float32 and rounded once."""
    x, dt = _wide(self._default_float())
    x = x - _wide(self._first_along(self._axes(axis))._default_float())[0]  # (a view of the input, cast after the broadcast)
    xc = x - x.mean(axis, keepdim=True)
    return (xc * ((xc * xc).mean(axis, keepdim=True) + eps).rsqrt()).cast(dt)
  def rmsnorm(self: Tensor, axis: Any = -1, eps: float = 1e-5) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over `axis` (no scale; LLaMA's RMSNorm, ONNX's RMSNormalization).
    float16/bfloat16 rows are computed in float32 and rounded once."""
    x, dt = _wide(self._default_float())
    return (x * ((x * x).mean(axis, keepdim=True) + eps).rsqrt()).cast(dt)

  # ---- convolution and pooling ---------------------------------------------------------------------
  @memo_views
  def _pool(self: Tensor, k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
    """(..., *out_spatial, *k) windows over the last len(k) dims, as views (no copies)."""
    nd = len(k)
    for name, v in (("kernel size", k), ("stride", stride), ("dilation", dilation)):
      if len(v) != nd or not all(isinstance(x, int) and x >= 1 for x in v): raise ValueError(f"{name} must be {nd} positive integers, got {v}")
    if self.ndim < nd: raise ValueError(f"pooling over {nd} dims needs a tensor of at least {nd} dims, got shape {self.shape}")
    nlead = self.ndim - nd
    x = self
    for i, (kk, st, d) in enumerate(zip(k, stride, dilation)):
      ax = nlead + i
      m = x.ndim - 1
      x = x.permute(*[j for j in range(x.ndim) if j != ax], ax)._windows_last(kk, st, d)  # (*others, o, kk)
      x = x.permute(*range(ax), m, *range(ax, m), m + 1)
    return x
  def _windows_last(self: Tensor, kk: int, st: int, d: int) -> Tensor:
    """(*pre, L) -> (*pre, o, kk) with out[..., a, b] = x[..., a*st + b*d]."""
    pre, L = self.shape[:-1], self.shape[-1]
    o = (L - d * (kk - 1) - 1) // st + 1
    if o <= 0: raise ValueError(f"window {kk} (dilation {d}) is larger than the input length {L}")
    # repeat the row kk times; rows of length L+d then start d elements later each
    flat = self.reshape(*pre, 1, L).expand(*pre, kk, L).reshape(*pre, kk * L).pad(((0, 0),) * len(pre) + ((0, kk * d),))
    rows = flat.reshape(*pre, kk, L + d)[..., :(o - 1) * st + 1]
    if st > 1: rows = rows[..., ::st]
    return rows.transpose(-1, -2)
  @recorded
  def conv2d(self: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
             groups: int = 1, acc_dtype: Any = None) -> Tensor:
    """NCHW input, (cout, cin/groups, kh, kw) weight. float16/bfloat16 products are summed in float32
    (rounded once at the end) unless `acc_dtype` names another accumulator."""
    if self.ndim != 4 or weight.ndim != 4: raise ValueError(f"conv2d needs 4-D input and weight, got {self.shape} and {weight.shape}")
    n, cin, h, w = self.shape
    cout, cpg, kh, kw = weight.shape
    if cin != cpg * groups or cout % groups: raise ValueError(f"conv2d: input channels {cin} != weight {cpg} x groups {groups}, or {cout} % {groups} != 0")
    st, dl = pair(stride), pair(dilation)
    pd = pair(padding)
    if groups == 1 and (lvl := image_level(self)):  # IMAGE: weights (and inputs) read through images
      wi = as_image(weight.permute(2, 3, 1, 0), (kh * kw * cin, cout // 4)) if cout % 4 == 0 else None
      if wi is not None: weight = wi.permute(3, 2, 0, 1)
      xi = as_image(self.permute(0, 2, 3, 1), (n * h, w * cin // 4)) if lvl >= 2 and cin % 4 == 0 else None
      if xi is not None: self = xi.permute(0, 3, 1, 2)  # noqa: PLW0642
    if not image_level(self) and eligible(self, weight, st, dl, groups, acc_dtype) and (m := choose_tile(n, cin, cout, h + 2 * pd[0] - 2, w + 2 * pd[1] - 2)):
      return winograd_conv2d(self, weight, bias, pd, m)  # WINO: fewer multiplies for 3x3 stride-1 convs on CPUs (frontend/winograd.py)
    x = self.pad(((0, 0), (0, 0), (pd[0], pd[0]), (pd[1], pd[1]))) if any(pd) else self
    if (kh, kw) == (1, 1) and st != (1, 1) and _compacts_strided_pointwise(self.device): x, st = compact_strided_pixels(x, st), (1, 1)
    win = x._pool((kh, kw), st, dl)  # n, cin, oh, ow, kh, kw
    oh, ow = win.shape[2], win.shape[3]
    win = win.reshape(n, groups, 1, cpg, oh, ow, kh, kw)
    wt = weight.reshape(1, groups, cout // groups, cpg, 1, 1, kh, kw)
    dt = least_upper_dtype(self.dtype, weight.dtype)
    if dtypes.is_float(dt):
      acc = to_dtype(acc_dtype) if acc_dtype is not None else dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt
      full = (n, groups, cout // groups, cpg, oh, ow, kh, kw)  # (cast after the broadcast: an expanded cast would be copied first)
      prod_ = (win._expand_to(full).cast(acc) * wt._expand_to(full).cast(acc)).permute(0, 1, 2, 4, 5, 3, 6, 7)  # n g co oh ow cpg kh kw
      out = prod_.sum((5, 6, 7), acc_dtype=acc).cast(dt).reshape(n, cout, oh, ow)
    else:
      prod_ = (win.cast(dt) * wt.cast(dt)).permute(0, 1, 2, 4, 5, 3, 6, 7)
      out = prod_.sum((5, 6, 7), acc_dtype=acc_dtype).reshape(n, cout, oh, ow)
    return out + bias.reshape(1, cout, 1, 1) if bias is not None else out
  @recorded
  def max_pool2d(self: Tensor, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    k, pd, st, dl = pair(kernel_size), pair(padding), pair(stride if stride is not None else kernel_size), pair(dilation)
    pads = ((pd[0], pd[0]), (pd[1], pd[1]))
    x = self.pad(((0, 0),) * (self.ndim - 2) + pads, value=max_pad_value(self, pads, k, st, dl)) if any(pd) else self
    return x._pool(k, st, dl).max((-2, -1))
  @recorded
  def avg_pool2d(self: Tensor, kernel_size: Any = 2, stride: Any = None, padding: Any = 0) -> Tensor:
    k, pd = pair(kernel_size), pair(padding)
    x = self.pad(((0, 0),) * (self.ndim - 2) + ((pd[0], pd[0]), (pd[1], pd[1]))) if any(pd) else self
    return x._pool(k, pair(stride if stride is not None else kernel_size), (1, 1)).mean((-2, -1))
