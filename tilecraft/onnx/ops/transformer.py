"""ONNX transformer ops (opset 23+): RotaryEmbedding and Attention (scaled dot-product attention with
grouped KV heads, additive or boolean masks, causal and sliding-window masks aligned to the cache, past
key/value caches, softcap, and the qk_matmul_output of each mode). Contract: computed in float32 for
float16/bfloat16 (float64 stays) and rounded once to the input's dtype; a query row no key may attend
gives 0, not nan; anything outside the spec's forms is NotImplementedError naming the node."""
from __future__ import annotations
import math
from typing import Optional
from tilecraft.dtype import dtypes
from tilecraft.onnx.ops.common import gather_axis, wide, wrap_index
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

@op("RotaryEmbedding", since=23)
def _rotary_embedding(n: Node, i: list) -> Tensor:
  """Rotary position embedding: each pair (x1, x2) of a head's first rotary_embedding_dim features (the two
  halves, or even/odd features if interleaved) turns by the angle whose cos and sin the caches hold for its
  position: (x1 cos - x2 sin, x1 sin + x2 cos). x is (batch, heads, seq, head) or (batch, seq, hidden)
  with num_heads; the caches are (batch, seq, dim/2), or (max_position, dim/2) indexed by position_ids."""
  x, cos, sin = i[0], i[1], i[2]
  pos = i[3] if len(i) > 3 and n.has(3) else None
  if x.ndim == 4: xs = x.permute(0, 2, 1, 3)
  elif x.ndim == 3:
    heads = int(n.attr("num_heads", 0))
    if heads <= 0 or x.shape[2] % heads: raise unsupported(n, f"3-D input of hidden size {x.shape[2]} needs num_heads dividing it, got {heads}")
    xs = x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)
  else: raise unsupported(n, f"a {x.ndim}-D input (3-D or 4-D)")
  B, S, H, D = xs.shape
  rd = int(n.attr("rotary_embedding_dim", 0)) or D
  if rd % 2 or rd > D: raise unsupported(n, f"rotary_embedding_dim {rd} for heads of {D}")
  if pos is not None:
    n.check_indices(3, cos.shape[0], 0)
    cos, sin = gather_axis(cos, wrap_index(pos, cos.shape[0]), 0), gather_axis(sin, wrap_index(pos, sin.shape[0]), 0)
  if tuple(cos.shape) != (B, S, rd // 2) or tuple(sin.shape) != (B, S, rd // 2):
    raise unsupported(n, f"caches of shapes {cos.shape} and {sin.shape} for (batch, seq, dim/2) = {(B, S, rd // 2)}")
  w = wide(xs)
  c, s = (t.cast(w.dtype).reshape(B, S, 1, rd // 2) for t in (cos, sin))
  rot = w.shrink((None, None, None, (0, rd)))
  if n.attr("interleaved", 0):
    pairs = rot.reshape(B, S, H, rd // 2, 2)
    x1, x2 = (pairs.shrink((None, None, None, None, (k, k + 1))).reshape(B, S, H, rd // 2) for k in (0, 1))
  else: x1, x2 = rot.shrink((None, None, None, (0, rd // 2))), rot.shrink((None, None, None, (rd // 2, rd)))
  real, imag = x1 * c - x2 * s, x1 * s + x2 * c
  out = Tensor.stack(real, imag, axis=-1).reshape(B, S, H, rd) if n.attr("interleaved", 0) else real.cat(imag, axis=-1)
  if rd < D: out = out.cat(w.shrink((None, None, None, (rd, D))), axis=-1)
  out = out.cast(x.dtype)
  return out.permute(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)

def _heads(n: Node, t: Tensor, heads: Optional[int], what: str) -> Tensor:
  """(batch, heads, seq, head_size) from a 4-D input as it is, or from a 3-D (batch, seq, heads * head_size)."""
  if t.ndim == 4: return t
  if t.ndim != 3: raise unsupported(n, f"a {t.ndim}-D {what} (3-D or 4-D)")
  if not heads or t.shape[2] % heads: raise unsupported(n, f"3-D {what} of hidden size {t.shape[2]} needs its num_heads attribute dividing it")
  return t.reshape(t.shape[0], t.shape[1], heads, t.shape[2] // heads).permute(0, 2, 1, 3)

def _allowed_bias(allowed: Tensor, like: Tensor) -> Tensor:
  """0 where `allowed`, -inf elsewhere, in like's dtype."""
  return allowed.where(like._const_like(0.0), like._const_like(-math.inf))

@op("Attention", since=23)
def _attention(n: Node, i: list) -> list:
  q_in = i[0]
  if not dtypes.is_float(q_in.dtype): raise unsupported(n, f"inputs of dtype {q_in.dtype.name}")
  Q = wide(_heads(n, q_in, n.attr("q_num_heads", 0), "Q"))
  K = wide(_heads(n, i[1], n.attr("kv_num_heads", 0), "K"))
  V = wide(_heads(n, i[2], n.attr("kv_num_heads", 0), "V"))
  mask = i[3] if n.has(3) else None
  if n.has(4) != n.has(5): raise unsupported(n, "past_key without past_value (or the other way)")
  past = n.has(4)
  nonpad = i[6] if n.has(6) else None
  if nonpad is not None and past: raise unsupported(n, "nonpad_kv_seqlen with a past cache")
  if past: K, V = wide(i[4]).cat(K, axis=2), wide(i[5]).cat(V, axis=2)
  present_k, present_v = K, V  # (outputs 1 and 2: the cache with this call's keys and values appended)
  B, Hq, Sq, D = Q.shape
  Hk, Skv = K.shape[1], K.shape[2]
  if Hq != Hk:
    if Hq % Hk or V.shape[1] != Hk: raise unsupported(n, f"{Hq} query heads over {Hk} key and {V.shape[1]} value heads")
    r = Hq // Hk  # grouped-query attention: each KV head serves r consecutive query heads
    K, V = (t.unsqueeze(2).expand(B, Hk, r, Skv, t.shape[3]).reshape(B, Hq, Skv, t.shape[3]) for t in (K, V))
  scale = n.attr("scale", None)
  s = math.sqrt(1 / math.sqrt(D) if scale is None else scale)
  qk = (Q * s) @ (K * s).permute(0, 1, 3, 2)  # (B, Hq, Sq, Skv)
  softcap = n.attr("softcap", 0.0)
  if softcap and softcap > 0: qk = (qk * (1 / softcap)).tanh() * softcap

  # the additive bias (B or 1, Hq or 1, Sq, Skv): the mask (padded to Skv keys), causal and window limits, padding
  dev = qk.device
  bias = Tensor.zeros(1, 1, Sq, Skv, dtype=qk.dtype, device=dev)
  if mask is not None:
    if mask.shape[-1] < Skv:  # a mask shorter than the keys: the missing keys are masked
      pad = [(0, 0)] * (mask.ndim - 1) + [(0, Skv - mask.shape[-1])]
      mask = mask.pad(pad, value=False) if mask.dtype == dtypes.bool else mask.pad(pad, value=-math.inf)
    mb = _allowed_bias(mask, qk) if mask.dtype == dtypes.bool else mask.cast(qk.dtype)
    bias = bias + mb.reshape(*(1,) * (4 - mb.ndim), *mb.shape)
  qi, kj = Tensor.arange(Sq, dtype=dtypes.int64, device=dev).reshape(Sq, 1), Tensor.arange(Skv, dtype=dtypes.int64, device=dev).reshape(1, Skv)
  if nonpad is not None:  # keys from nonpad_kv_seqlen[b] on are padding; queries end at the last real key
    valid = nonpad.cast(dtypes.int64).reshape(B, 1, 1, 1)
    offset = valid - Sq
    bias = bias + _allowed_bias(kj.reshape(1, 1, 1, Skv) < valid, qk)
  else: offset = i[4].shape[2] if past else 0
  diff = qi + offset - kj  # how far key j is behind query i's position
  if n.attr("is_causal", 0): bias = bias + _allowed_bias(diff >= 0, qk)
  left, right = n.attr("left_window_size", -1), n.attr("right_window_size", -1)
  if left >= 0: bias = bias + _allowed_bias(diff <= left, qk)
  if right >= 0: bias = bias + _allowed_bias(-diff <= right, qk)

  qkb = qk + bias
  # softmax over the keys; a row no key may attend (its bias all -inf) is 0, not nan
  m = qkb.max(-1, keepdim=True)
  e = (qkb - (m == -math.inf).where(0.0, m)).exp()
  tot = e.sum(-1, keepdim=True)
  p = e / (tot == 0).where(1.0, tot)
  p = (bias.max(-1, keepdim=True) == -math.inf).where(0.0, p)
  y = p @ V  # (B, Hq, Sq, Dv)
  if q_in.ndim == 3: y = y.permute(0, 2, 1, 3).reshape(B, Sq, Hq * y.shape[3])
  mode = n.attr("qk_matmul_output_mode", 0)
  if mode not in (0, 1, 2, 3): raise unsupported(n, f"qk_matmul_output_mode {mode}")
  qk_out = {0: qk, 1: qk, 2: qkb, 3: p}[mode]
  dt = q_in.dtype
  return [y.cast(dt), present_k.cast(dt), present_v.cast(dt), qk_out.cast(dt)]
