"""ONNX ops of the newest opsets for recurrent and flexible attention and KV caches: LinearAttention (opset 27),
FlexAttention (ai.onnx.preview, registered for default opsets 26 on), CausalConvWithState (opset 27) and
TensorScatter (opset 24). Contract:
- LinearAttention: every update_rule (linear, gated, delta, gated_delta) with its recurrence run token by token,
  unrolled while the graph is built (the sequence length is static from the input's shape); GQA/MQA (query head h
  reads KV head h // (q_num_heads / kv_num_heads)); decay per head (B, T, H_kv) or per key feature (B, T, H_kv*d_k);
  beta per head (B, T, H_kv) or shared (B, T, 1); past_state or zeros; scale 0 = 1/sqrt(d_k). The state is carried in
  float32 (float16/bfloat16 inputs and states are widened, each output rounded once): output in query's dtype,
  present_state in past_state's dtype (query's without one), as the reference does. chunk_size is a tuning hint (no
  effect). An input a rule doesn't take (decay for linear/delta, beta for linear/gated) or lacks is refused.
- FlexAttention: softmax((Q K^T) * scale) V per (batch, head), K/V heads shared by groups of query heads, with the
  score_mod and prob_mod subgraphs (onnx GraphProto attribute values) evaluated with tilecraft's own op
  implementations: each must have one input and one output of the softmax_precision dtype and the scores' shape, and
  must not need a value computed from the scores to build the graph (shapes, Range bounds and the like come from
  Shape and constants) nor read names of the outer graph. Computed in float32 (float64 for double inputs or a double
  softmax_precision); the scores and probabilities are rounded to softmax_precision only where a subgraph sees them.
  A row whose scores are all -inf is nan, as Softmax gives (the reference's too).
- CausalConvWithState: the depthwise causal conv over past_state (or zeros) followed by the input, as a sum of k
  shifted slices times the per-channel taps (float32 for float16/bfloat16, rounded once after bias and the fused
  silu/swish); present_state is the last k-1 positions of that concatenation (a copy, exact).
- TensorScatter: update written into the cache along `axis` from each batch row's write index (0 without
  write_indices), modulo max_sequence_length in circular mode; computed as an exact select of the update element
  each cache position receives (scatter.scatter_along: no data-dependent indexing; -0.0 and nan copied as they are).
  Linear mode needs write_index + sequence_length <= max_sequence_length: a larger index is an IndexError naming the
  node (the guard reports it against an axis of max_sequence_length - sequence_length + 1 valid start positions).
  A negative index counts from the end per written position as in the reference (numpy indexing; floor modulo in
  circular mode); onnxruntime refuses negative indices.
Anything else (shapes off the spec, non-float attention inputs, unknown attribute values, subgraph forms above) is
NotImplementedError naming the node."""
from __future__ import annotations
import math
from typing import Any, Optional
import numpy as np
from tilecraft.dtype import DType, dtypes
from tilecraft.onnx.ops.common import arange_along, at, cat_exact, norm_axis, wide
from tilecraft.onnx.ops.scatter import scatter_along
from tilecraft.onnx.registry import Node, check_host, lookup, op, unsupported
from tilecraft.tensor import Tensor

def _floats(n: Node, ts: list[tuple[Optional[Tensor], str]]) -> None:
  for t, what in ts:
    if t is not None and not dtypes.is_float(t.dtype): raise unsupported(n, f"{what} of dtype {t.dtype.name} (float16, bfloat16, float32)")

# ---------------------------------------------------------------- LinearAttention

RULES = ("linear", "gated", "delta", "gated_delta")

@op("LinearAttention", since=27)
def _linear_attention(n: Node, i: list) -> list:
  q_in, k_in, v_in = i[0], i[1], i[2]
  past, decay, beta = (i[j] if n.has(j) else None for j in (3, 4, 5))
  rule = n.attr("update_rule", "gated_delta")
  if rule not in RULES: raise unsupported(n, f"update_rule {rule!r} (one of {', '.join(RULES)})")
  Hq, Hk = int(n.attr("q_num_heads", 0)), int(n.attr("kv_num_heads", 0))
  if Hq <= 0 or Hk <= 0 or Hq % Hk: raise unsupported(n, f"q_num_heads {Hq} must be a positive multiple of kv_num_heads {Hk}")
  _floats(n, [(q_in, "query"), (k_in, "key"), (v_in, "value"), (past, "past_state"), (decay, "decay"), (beta, "beta")])
  if q_in.ndim != 3 or k_in.ndim != 3 or v_in.ndim != 3:
    raise unsupported(n, f"query/key/value of shapes {q_in.shape}, {k_in.shape}, {v_in.shape} (3-D packed)")
  B, T, qw = q_in.shape
  if qw % Hq: raise unsupported(n, f"query's last axis {qw} is not a multiple of q_num_heads {Hq}")
  dk, G = qw // Hq, Hq // Hk
  if tuple(k_in.shape) != (B, T, Hk * dk) or tuple(v_in.shape[:2]) != (B, T) or v_in.shape[2] % Hk:
    raise unsupported(n, f"key {k_in.shape} and value {v_in.shape} for query {q_in.shape} ({Hq} query, {Hk} KV heads of {dk} features)")
  dv = v_in.shape[2] // Hk
  gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
  if gated != (decay is not None): raise unsupported(n, f"update_rule {rule!r} {'needs' if gated else 'takes no'} decay input")
  if delta != (beta is not None): raise unsupported(n, f"update_rule {rule!r} {'needs' if delta else 'takes no'} beta input")
  # everything time-major: (T, B, Hk, ...)
  q = wide(q_in).reshape(B, T, Hk, G, dk).permute(1, 0, 2, 3, 4)  # query head h = KV head h // G, member h % G
  k = wide(k_in).reshape(B, T, Hk, dk).permute(1, 0, 2, 3)
  v = wide(v_in).reshape(B, T, Hk, dv).permute(1, 0, 2, 3)
  if decay is not None:
    if decay.ndim != 3 or tuple(decay.shape[:2]) != (B, T) or decay.shape[2] not in (Hk, Hk * dk):
      raise unsupported(n, f"decay of shape {decay.shape} (({B}, {T}, {Hk}) or ({B}, {T}, {Hk * dk}))")
    gate = wide(decay).reshape(B, T, Hk, decay.shape[2] // Hk, 1).permute(1, 0, 2, 3, 4).exp()  # multiplies the state's rows
  if beta is not None:
    if beta.ndim != 3 or tuple(beta.shape[:2]) != (B, T) or beta.shape[2] not in (Hk, 1):
      raise unsupported(n, f"beta of shape {beta.shape} (({B}, {T}, {Hk}) or ({B}, {T}, 1))")
    rate = wide(beta).reshape(B, T, beta.shape[2], 1).permute(1, 0, 2, 3)
  if past is not None:
    if tuple(past.shape) != (B, Hk, dk, dv): raise unsupported(n, f"past_state of shape {past.shape} (expected {(B, Hk, dk, dv)})")
    S = wide(past)
  else: S = Tensor.zeros(B, Hk, dk, dv, dtype=q.dtype, device=q_in.device)
  scale = float(n.attr("scale", 0.0)) or 1 / math.sqrt(dk)
  outs = []
  for t in range(T):
    kt, vt = at(k, t), at(v, t)
    if gated: S = S * at(gate, t)
    if delta: vt = at(rate, t) * (vt - (kt.unsqueeze(-1) * S).sum(-2))  # beta (v - S^T k)
    S = S + kt.unsqueeze(-1) * vt.unsqueeze(-2)
    o = (at(q, t).unsqueeze(-1) * S.unsqueeze(2)).sum(-2) * scale  # (B, Hk, G, dv)
    outs.append(o.reshape(B, 1, Hq * dv))
  y = Tensor.cat(*outs, axis=1) if outs else Tensor.zeros(B, 0, Hq * dv, dtype=q.dtype, device=q_in.device)
  return [y.cast(q_in.dtype), S.cast(past.dtype if past is not None else q_in.dtype)]

# ---------------------------------------------------------------- FlexAttention

_PRECISIONS = {1: dtypes.float32, 10: dtypes.float16, 16: dtypes.bfloat16, 11: dtypes.float64}

def _subgraph(n: Node, g: Any, x: Tensor, what: str) -> Tensor:
  """The modifier subgraph g applied to x, built with the registered op implementations. Values known when the graph
  is built (initializers, Shape, Constant, what ops compute from them as numpy) stay numpy for the ops that read them
  (n.static); a value computed from x can't be read so (it would bake this call's data into the built graph)."""
  import onnx
  from onnx import numpy_helper
  from tilecraft.onnx.types import attr_value, onnx_dtype
  if not isinstance(g, onnx.GraphProto): raise unsupported(n, f"{what} given as {type(g).__name__}, not an ONNX graph")
  if len(g.input) != 1 or len(g.output) != 1: raise unsupported(n, f"{what} with {len(g.input)} inputs and {len(g.output)} outputs (1 and 1)")
  if len(g.sparse_initializer): raise unsupported(n, f"{what} with sparse initializers")
  tt = g.input[0].type
  if tt.WhichOneof("value") != "tensor_type" or onnx_dtype(tt.tensor_type.elem_type, f"{n.describe()} {what}") != x.dtype:
    raise unsupported(n, f"{what}'s input must be a tensor of the softmax_precision dtype {x.dtype.name}")
  known: dict[str, np.ndarray] = {}
  for init in g.initializer:
    onnx_dtype(init.data_type, f"{n.describe()} {what} initializer {init.name!r}")
    known[init.name] = numpy_helper.to_array(init)
  env: dict[str, Tensor] = {g.input[0].name: x}
  dyn = {g.input[0].name}  # values computed from x
  def tensor(arr: np.ndarray) -> Tensor:
    if arr.dtype.name == "bfloat16": return Tensor(arr.astype(np.float32), device=x.device, dtype=dtypes.bfloat16)
    return Tensor(arr, device=x.device)
  def value(name: str) -> Optional[Tensor]:
    if name == "": return None
    if name not in env:
      if name not in known: raise unsupported(n, f"{what} reads {name!r}, which it doesn't compute (outer-scope values are not supported)")
      env[name] = tensor(known[name])
    return env[name]
  for idx, sn in enumerate(g.node):
    where = f"{n.describe()} {what} node {sn.name or idx!r} (op {sn.op_type})"
    if sn.domain not in ("", "ai.onnx"): raise unsupported(n, f"{what} node {sn.name or idx!r}: domain {sn.domain!r}")
    fn = lookup(sn.op_type, n.opset)
    if fn is None: raise unsupported(n, f"{what} uses op {sn.op_type}, which tilecraft.onnx doesn't implement at opset {n.opset}")
    attrs = {a.name: attr_value(a, where) for a in sn.attribute}
    ins = [value(nm) for nm in sn.input]
    def host_value(j: int, _sn: Any = sn, _ins: list = ins) -> np.ndarray:
      nm = _sn.input[j]
      if nm in known: return known[nm]
      if nm in dyn:
        raise unsupported(n, f"{what} node {_sn.name or _sn.op_type!r} needs the value of {nm!r}, computed from the {what} input, to build the graph")
      return _ins[j].numpy()  # (computed from constants alone)
    def static(j: int, _sn: Any = sn) -> Optional[np.ndarray]:
      return None if j >= len(_sn.input) or _sn.input[j] == "" else host_value(j)
    def const(j: int, _sn: Any = sn) -> Optional[np.ndarray]:
      return known.get(_sn.input[j]) if j < len(_sn.input) else None
    def guard(node: Node, j: int, size: int, axis: int, column: Optional[int], lengths: bool = False) -> None:
      a = np.asarray(host_value(j))
      check_host(node, a[..., column] if column is not None else a, size, axis, column, lengths)
    node = Node(f"{n.name}/{what}/{sn.name or sn.op_type}", sn.op_type, n.opset, attrs, list(sn.input), list(sn.output), static, n.device, const, guard)
    outs = fn(node, ins)
    if not isinstance(outs, (list, tuple)): outs = [outs]
    reads_x = any(nm in dyn for nm in sn.input if nm)
    for j, oname in enumerate(sn.output):
      if oname == "": continue
      if j >= len(outs) or outs[j] is None: raise unsupported(n, f"{what} node {sn.name or sn.op_type!r}: output {j} is not produced")
      o = outs[j]
      if isinstance(o, np.ndarray): known[oname] = o; o = tensor(o)  # noqa: E702  (a value known at build time: no data read)
      elif reads_x: dyn.add(oname)
      env[oname] = o
  y = value(g.output[0].name)
  if tuple(y.shape) != tuple(x.shape) or y.dtype != x.dtype:
    raise unsupported(n, f"{what} gives {y.dtype.name} {y.shape} for {x.dtype.name} {x.shape} (it must keep shape and dtype)")
  return y

@op("FlexAttention", since=26)
def _flex_attention(n: Node, i: list) -> Tensor:
  Q, K, V = i[0], i[1], i[2]
  _floats(n, [(Q, "Q"), (K, "K"), (V, "V")])
  if Q.ndim != 4 or K.ndim != 4 or V.ndim != 4: raise unsupported(n, f"Q, K, V of shapes {Q.shape}, {K.shape}, {V.shape} (rank 4)")
  B, Hq, L, E = Q.shape
  Hk, S = K.shape[1], K.shape[2]
  if K.shape[0] != B or tuple(V.shape[:3]) != (B, Hk, S) or K.shape[3] != E or Hq % Hk:
    raise unsupported(n, f"K {K.shape} and V {V.shape} for Q {Q.shape} (same batch, KV heads dividing the query heads, same keys)")
  sp = n.attr("softmax_precision", None)
  if sp is None: P = dtypes.float64 if Q.dtype == dtypes.float64 else dtypes.float32
  elif sp in _PRECISIONS: P = _PRECISIONS[sp]
  else: raise unsupported(n, f"softmax_precision {sp} (1 float, 10 float16, 16 bfloat16, 11 double)")
  C: DType = dtypes.float64 if dtypes.float64 in (Q.dtype, P) else dtypes.float32  # what is computed in
  Dv = V.shape[3]
  Kc, Vc = K.cast(C), V.cast(C)
  if Hq != Hk:  # query head h reads KV head h // (Hq / Hk)
    r = Hq // Hk
    Kc, Vc = (t.unsqueeze(2).expand(B, Hk, r, S, t.shape[3]).reshape(B, Hq, S, t.shape[3]) for t in (Kc, Vc))
  scale = n.attr("scale", None)
  s = math.sqrt(1 / math.sqrt(E) if scale is None else float(scale))
  scores = (Q.cast(C) * s) @ (Kc * s).permute(0, 1, 3, 2)  # (B, Hq, L, S)
  if (g := n.attr("score_mod", None)) is not None: scores = _subgraph(n, g, scores.cast(P), "score_mod").cast(C)
  e = (scores - scores.max(-1, keepdim=True)).exp()
  probs = e / e.sum(-1, keepdim=True)
  if (g := n.attr("prob_mod", None)) is not None: probs = _subgraph(n, g, probs.cast(P), "prob_mod").cast(C)
  return (probs @ Vc).reshape(B, Hq, L, Dv).cast(V.dtype)

# ---------------------------------------------------------------- CausalConvWithState

@op("CausalConvWithState", since=27)
def _causal_conv_with_state(n: Node, i: list) -> list:
  x, w = i[0], i[1]
  bias, past = (i[j] if n.has(j) else None for j in (2, 3))
  act = n.attr("activation", "none")
  if act not in ("none", "silu", "swish"): raise unsupported(n, f"activation {act!r} (none, silu, swish)")
  _floats(n, [(x, "input"), (w, "weight"), (bias, "bias"), (past, "past_state")])
  if any(t is not None and t.dtype != x.dtype for t in (w, bias, past)): raise unsupported(n, "inputs of different dtypes")
  if x.ndim != 3: raise unsupported(n, f"input of shape {x.shape} (batch, channels, length)")
  B, C, L = x.shape
  if w.ndim != 3 or tuple(w.shape[:2]) != (C, 1) or w.shape[2] < 1: raise unsupported(n, f"weight of shape {w.shape} (expected ({C}, 1, k))")
  k = w.shape[2]
  if bias is not None and tuple(bias.shape) != (C,): raise unsupported(n, f"bias of shape {bias.shape} (expected ({C},))")
  if past is not None and tuple(past.shape) != (B, C, k - 1): raise unsupported(n, f"past_state of shape {past.shape} (expected {(B, C, k - 1)})")
  if k == 1: full = x
  else: full = cat_exact([past if past is not None else Tensor.zeros(B, C, k - 1, dtype=x.dtype, device=x.device), x], 2)
  xw, ww = wide(full), wide(w).reshape(1, C, k)
  acc = None
  for j in range(k):  # output t = sum_j w[j] * full[t + j]: tap k-1 meets the current position
    term = ww.shrink((None, None, (j, j + 1))) * xw.shrink((None, None, (j, j + L)))
    acc = term if acc is None else acc + term
  if bias is not None: acc = acc + wide(bias).reshape(1, C, 1)
  if act != "none": acc = acc * acc.sigmoid()
  return [acc.cast(x.dtype), full.shrink((None, None, (L, L + k - 1)))]

# ---------------------------------------------------------------- TensorScatter

@op("TensorScatter", since=24)
def _tensor_scatter(n: Node, i: list) -> Tensor:
  past, upd = i[0], i[1]
  widx = i[2] if n.has(2) else None
  mode = n.attr("mode", "linear")
  if mode not in ("linear", "circular"): raise unsupported(n, f"mode {mode!r} (linear, circular)")
  nd = past.ndim
  try: a = norm_axis(int(n.attr("axis", -2)), nd)
  except ValueError as e: raise unsupported(n, str(e)) from None
  if nd < 2 or a == 0: raise unsupported(n, f"axis {n.attr('axis', -2)} of a rank-{nd} cache (the sequence axis can't be the batch axis 0)")
  if upd.dtype != past.dtype: raise unsupported(n, f"update of dtype {upd.dtype.name} for a {past.dtype.name} cache")
  if upd.ndim != nd or any(upd.shape[d] != past.shape[d] for d in range(nd) if d != a) or upd.shape[a] > past.shape[a]:
    raise unsupported(n, f"update of shape {upd.shape} for a cache of shape {past.shape} along axis {a}")
  B, M, S = past.shape[0], past.shape[a], upd.shape[a]
  if S == 0: return past
  if widx is None:  # every row writes positions 0..S-1 (both modes): a join of views
    return upd if S == M else cat_exact([upd, past.shrink(tuple((S, M) if d == a else None for d in range(nd)))], a)
  if tuple(widx.shape) != (B,) or widx.dtype not in (dtypes.int64, dtypes.int32):
    raise unsupported(n, f"write_indices of shape {widx.shape} and dtype {widx.dtype.name} (int64 of shape ({B},))")
  if mode == "linear": n.check_indices(2, M - S + 1, a)  # start + S <= M
  pos = widx.cast(dtypes.int64).reshape(B, *([1] * (nd - 1))) + arange_along(S, a, nd, past.device)
  pos = pos % M
  pos = (pos < 0).where(pos + M, pos)  # (floor modulo, whatever the sign convention of %)
  return scatter_along(past, pos.expand(*upd.shape), upd, a, "none")
