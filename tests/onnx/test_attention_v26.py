"""ONNX LinearAttention, FlexAttention, CausalConvWithState and TensorScatter (tilecraft/onnx/ops/attention_v26.py)
against numpy references written here (float64 loops over the spec's recurrences and pseudocode): every update rule
with GQA/MQA, decay and beta forms, past states and float16 inputs; FlexAttention with score_mod/prob_mod subgraphs,
GQA, softmax_precision and double; causal convs of every kernel size with past state, bias and silu; cache writes in
both modes along several axes, exact for -0.0/nan/ints/bools, with index errors; unsupported forms naming the node;
onnxruntime where it implements the op (LinearAttention, CausalConvWithState, TensorScatter; it skips otherwise)."""
from __future__ import annotations
import math
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402
from tilecraft.dtype import dtypes  # noqa: E402
from tilecraft.onnx.registry import Node, lookup  # noqa: E402
from tilecraft.tensor import Tensor  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
ONNX_T = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.float64): TensorProto.DOUBLE,
          BF16: TensorProto.BFLOAT16, np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32, np.dtype(np.bool_): TensorProto.BOOL}
vi = helper.make_tensor_value_info

def _model(op: str, opset: int, ins: dict, outs: list[str], out_type: int = 0, **attrs) -> onnx.ModelProto:
  """One node `op` named 'n' over graph inputs ins (name -> array, None = an absent optional input); outputs of
  out_type (0: undeclared, tilecraft keeps what the op gives)."""
  node = helper.make_node(op, [k if v is not None else "" for k, v in ins.items()], outs, name="n", **attrs)
  g = helper.make_graph([node], "g", [vi(k, ONNX_T[v.dtype], list(v.shape)) for k, v in ins.items() if v is not None], [vi(o, out_type, None) for o in outs])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _feeds(ins: dict) -> dict: return {k: v for k, v in ins.items() if v is not None}

def _run(m: onnx.ModelProto, ins: dict) -> list[np.ndarray]:
  got = tox.load(m).run(_feeds(ins))
  return [got[o.name] for o in m.graph.output]

def _ort(m: onnx.ModelProto, ins: dict) -> list[np.ndarray]:
  """onnxruntime's outputs, or a skip where it doesn't implement the op."""
  rt = pytest.importorskip("onnxruntime")
  try: s = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  except Exception as e:  # noqa: BLE001
    pytest.skip(f"onnxruntime {rt.__version__} doesn't run this op: {str(e)[:120]}")
  return s.run(None, _feeds(ins))

# ---------------------------------------------------------------- LinearAttention

def ref_linear_attention(q, k, v, past, decay, beta, Hq, Hk, rule, scale=0.0):
  """The spec's recurrence token by token in float64."""
  B, T, _ = q.shape
  dk, dv = q.shape[2] // Hq, v.shape[2] // Hk
  q4, k4, v4 = (x.astype(np.float64).reshape(B, T, h, -1) for x, h in ((q, Hq), (k, Hk), (v, Hk)))
  S = np.zeros((B, Hk, dk, dv)) if past is None else past.astype(np.float64).copy()
  sc = scale or 1 / math.sqrt(dk)
  y = np.zeros((B, T, Hq, dv))
  for t in range(T):
    for b in range(B):
      for h in range(Hk):
        kt, vt = k4[b, t, h], v4[b, t, h]
        if rule in ("gated", "gated_delta"):
          g = decay[b, t].astype(np.float64)
          g = g[h] if decay.shape[2] == Hk else g[h * dk:(h + 1) * dk]
          S[b, h] = np.exp(g).reshape(-1, 1) * S[b, h]
        if rule in ("delta", "gated_delta"):
          bt = beta[b, t, 0 if beta.shape[2] == 1 else h]
          vt = bt * (vt - S[b, h].T @ kt)
        S[b, h] = S[b, h] + np.outer(kt, vt)
      for hq in range(Hq): y[b, t, hq] = sc * q4[b, t, hq] @ S[b, hq // (Hq // Hk)]
  return y.reshape(B, T, Hq * dv), S

def _la_inputs(rng, B, T, Hq, Hk, dk, dv, rule, decay_per_key=True, beta_shared=False, past=True, dtype=np.float32):
  k = rng.standard_normal((B, T, Hk, dk))
  k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(B, T, Hk * dk)  # (L2-normalized keys for the delta rules)
  ins = {"q": rng.standard_normal((B, T, Hq * dk)).astype(dtype), "k": k.astype(dtype), "v": rng.standard_normal((B, T, Hk * dv)).astype(dtype),
         "past": rng.standard_normal((B, Hk, dk, dv)).astype(dtype) if past else None,
         "decay": -rng.uniform(0.01, 0.5, (B, T, Hk * dk if decay_per_key else Hk)).astype(dtype) if rule in ("gated", "gated_delta") else None,
         "beta": rng.uniform(0.1, 0.9, (B, T, 1 if beta_shared else Hk)).astype(dtype) if rule in ("delta", "gated_delta") else None}
  return ins

@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("Hq,Hk,variant", [(2, 2, "a"), (4, 2, "b"), (3, 1, "c")])
def test_linear_attention_rules(rule, Hq, Hk, variant):
  """Each rule with MHA, GQA and MQA; the variants vary decay per key/per head, beta per head/shared, past/none, scale."""
  rng = np.random.default_rng(hash((rule, variant)) % 2**32)
  ins = _la_inputs(rng, 2, 5, Hq, Hk, 4, 3, rule, decay_per_key=variant != "b", beta_shared=variant == "c", past=variant != "c")
  scale = 0.7 if variant == "b" else 0.0
  m = _model("LinearAttention", 27, ins, ["y", "state"], q_num_heads=Hq, kv_num_heads=Hk, update_rule=rule, scale=scale)
  y, st = _run(m, ins)
  wy, ws = ref_linear_attention(*ins.values(), Hq, Hk, rule, scale)
  assert y.dtype == np.float32 and st.dtype == np.float32 and y.shape == wy.shape and st.shape == ws.shape
  np.testing.assert_allclose(y, wy, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(st, ws, rtol=1e-4, atol=1e-5)

def test_linear_attention_default_rule_decode_chain_and_half():
  """The default rule (gated_delta), a prefill then decode steps fed the previous present_state (the built graph rerun on
  new data) matches one prefill of the whole sequence; float16 activations with a float32 state: output in float16,
  rounded once (within half an ulp of float64 where the values allow), state float32."""
  rng = np.random.default_rng(1)
  B, T, H, dk, dv = 1, 6, 2, 4, 4
  ins = _la_inputs(rng, B, T, H, H, dk, dv, "gated_delta")
  full = _run(_model("LinearAttention", 27, ins, ["y", "s"], q_num_heads=H, kv_num_heads=H), ins)
  pre = {kk: (v[:, :3] if v is not None and kk != "past" else v) for kk, v in ins.items()}
  y0, s = _run(_model("LinearAttention", 27, pre, ["y", "s"], q_num_heads=H, kv_num_heads=H), pre)
  step = {kk: (v[:, 3:4] if kk != "past" else v) for kk, v in ins.items()}
  dm = tox.load(_model("LinearAttention", 27, step, ["y", "s"], q_num_heads=H, kv_num_heads=H))
  ys = [y0]
  for t in range(3, T):
    out = dm.run({kk: (v[:, t:t + 1] if kk != "past" else s) for kk, v in ins.items()})
    ys.append(out["y"]); s = out["s"]  # noqa: E702
  np.testing.assert_allclose(np.concatenate(ys, 1), full[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(s, full[1], rtol=1e-5, atol=1e-6)
  h = {kk: (v.astype(np.float16) if v is not None and kk != "past" else v) for kk, v in ins.items()}
  y, st = _run(_model("LinearAttention", 27, h, ["y", "s"], q_num_heads=H, kv_num_heads=H), h)
  wy, ws = ref_linear_attention(*h.values(), H, H, "gated_delta")
  assert y.dtype == np.float16 and st.dtype == np.float32
  np.testing.assert_allclose(y.astype(np.float64), wy, rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(st, ws, rtol=1e-5, atol=1e-5)
  h["past"] = None  # (no past_state: present_state in query's dtype)
  _, st = _run(_model("LinearAttention", 27, h, ["y", "s"], q_num_heads=H, kv_num_heads=H), h)
  assert st.dtype == np.float16

def test_linear_attention_refusals_name_the_node():
  rng = np.random.default_rng(2)
  ins = _la_inputs(rng, 1, 2, 2, 2, 4, 4, "gated")
  for attrs, what in ((dict(update_rule="linear"), "takes no decay"), (dict(update_rule="gated_delta"), "needs beta"),
                      (dict(update_rule="rwkv"), "update_rule 'rwkv'"),
                      (dict(update_rule="gated", q_num_heads=3), "multiple of kv_num_heads")):
    kw = dict(q_num_heads=2, kv_num_heads=2) | attrs
    with pytest.raises(NotImplementedError, match=rf"'n' \(op LinearAttention, opset 27\).*{what}"): _run(_model("LinearAttention", 27, ins, ["y"], **kw), ins)

# ---------------------------------------------------------------- FlexAttention

def ref_flex(Q, K, V, scale=None, score_mod=None, prob_mod=None):
  Q, K, V = (x.astype(np.float64) for x in (Q, K, V))
  r = Q.shape[1] // K.shape[1]
  K, V = np.repeat(K, r, 1), np.repeat(V, r, 1)
  s = Q @ K.transpose(0, 1, 3, 2) * (1 / math.sqrt(Q.shape[3]) if scale is None else scale)
  if score_mod: s = score_mod(s)
  p = np.exp(s - s.max(-1, keepdims=True))
  p = p / p.sum(-1, keepdims=True)
  if prob_mod: p = prob_mod(p)
  return p @ V

def _causal_graph(elem: int = TensorProto.FLOAT, outer: bool = False) -> onnx.GraphProto:
  """score_mod: -inf where key index > query index (Shape, Gather, Range, Reshape, GreaterOrEqual, Where), as the ONNX
  cases write it; `outer` reads a name of the outer graph instead of its own -inf."""
  I = lambda nm, v: numpy_helper.from_array(np.array(v, np.int64), nm)  # noqa: E731
  inits = [I("two", 2), I("three", 3), I("zero", 0), I("one", 1), I("qs", [1, 1, -1, 1]), I("ks", [1, 1, 1, -1])]
  if not outer: inits.append(numpy_helper.from_array(np.array(-np.inf, np.float32 if elem == TensorProto.FLOAT else np.float16), "ninf"))
  nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "two"], ["L"], axis=0),
           helper.make_node("Gather", ["sh", "three"], ["S"], axis=0),
           helper.make_node("Range", ["zero", "L", "one"], ["qr"]), helper.make_node("Reshape", ["qr", "qs"], ["qi"]),
           helper.make_node("Range", ["zero", "S", "one"], ["kr"]), helper.make_node("Reshape", ["kr", "ks"], ["ki"]),
           helper.make_node("GreaterOrEqual", ["qi", "ki"], ["ok"]), helper.make_node("Where", ["ok", "x", "ninf"], ["y"])]
  return helper.make_graph(nodes, "causal", [vi("x", elem, None)], [vi("y", elem, None)], inits)

def _affine_graph(op: str, c: float, elem: int = TensorProto.FLOAT) -> onnx.GraphProto:
  return helper.make_graph([helper.make_node(op, ["x", "c"], ["y"])], op, [vi("x", elem, None)], [vi("y", elem, None)],
                           [numpy_helper.from_array(np.array(c, np.float32 if elem == TensorProto.FLOAT else np.float64), "c")])

def _flex(Q, K, V, opset: int = 26, **attrs) -> np.ndarray:
  """FlexAttention's registered implementation called on Tensors (test_flexattention_through_load: the whole path)."""
  import tilecraft.onnx.ops  # noqa: F401  (registers the ops)
  fn = lookup("FlexAttention", opset)
  node = Node("n", "FlexAttention", opset, attrs, ["Q", "K", "V"], ["Y"], lambda i: None, "")
  ts = [Tensor(x.astype(np.float32), dtype=dtypes.bfloat16) if x.dtype == BF16 else Tensor(x) for x in (Q, K, V)]
  return fn(node, ts).numpy()

def test_flexattention_plain_gqa_scale_and_dtypes():
  rng = np.random.default_rng(3)
  Q, K, V = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 2, 7, 8)), rng.standard_normal((2, 2, 7, 6))
  for dt, tol in ((np.float32, 1e-5), (np.float64, 1e-12), (np.float16, 2e-3)):
    q, k, v = (x.astype(dt) for x in (Q, K, V))
    got = _flex(q, k, v)
    assert got.dtype == dt and got.shape == (2, 4, 5, 6)
    np.testing.assert_allclose(got.astype(np.float64), ref_flex(q, k, v), rtol=tol, atol=tol)
  got = _flex(Q.astype(np.float32), K.astype(np.float32), V.astype(np.float32), scale=0.1)
  np.testing.assert_allclose(got, ref_flex(Q, K, V, scale=0.1), rtol=1e-5, atol=1e-6)
  q, k, v = (x.astype(BF16) for x in (Q, K, V))
  got = _flex(q, k, v)
  np.testing.assert_allclose(got.astype(np.float64), ref_flex(q, k, v), rtol=8e-3, atol=8e-3)

def test_flexattention_score_and_prob_mods():
  """A causal mask written as an ONNX subgraph (a masked first row keeps key 0 only), a soft cap (Div, Tanh, Mul), a
  bias and a probability scale; softmax_precision double on float32 inputs gives the subgraphs doubles."""
  rng = np.random.default_rng(4)
  Q, K, V = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
  causal = lambda s: np.where(np.arange(4)[:, None] >= np.arange(4)[None, :], s, -np.inf)  # noqa: E731
  np.testing.assert_allclose(_flex(Q, K, V, score_mod=_causal_graph()), ref_flex(Q, K, V, score_mod=causal), rtol=1e-5, atol=1e-6)
  cap = helper.make_graph([helper.make_node("Div", ["x", "c"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]), helper.make_node("Mul", ["t", "c"], ["y"])],
                          "cap",
                          [vi("x", TensorProto.FLOAT, None)], [vi("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(np.array(0.5, np.float32), "c")])
  got = _flex(Q, K, V, score_mod=cap, prob_mod=_affine_graph("Mul", 3.0))
  np.testing.assert_allclose(got, ref_flex(Q, K, V, score_mod=lambda s: np.tanh(s / 0.5) * 0.5, prob_mod=lambda p: 3 * p), rtol=1e-5, atol=1e-6)
  got = _flex(Q, K, V, softmax_precision=TensorProto.DOUBLE, score_mod=_affine_graph("Add", 0.25, TensorProto.DOUBLE))
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, ref_flex(Q, K, V, score_mod=lambda s: s + 0.25), rtol=1e-5, atol=1e-6)

def test_flexattention_refusals_name_the_node():
  rng = np.random.default_rng(5)
  Q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
  bad = {"outer-scope": dict(score_mod=_causal_graph(outer=True)), "softmax_precision dtype double": dict(score_mod=_causal_graph(), softmax_precision=11),
         "softmax_precision 7": dict(softmax_precision=7), "not an ONNX graph": dict(prob_mod="x * 2")}
  for what, attrs in bad.items():
    with pytest.raises(NotImplementedError, match=rf"'n' \(op FlexAttention, opset 26\).*{what}"): _flex(Q, Q, Q, **attrs)
  data_shape = helper.make_graph([helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64), helper.make_node("Reshape", ["x", "i"], ["y"])], "dd",
                                 [vi("x", TensorProto.FLOAT, None)], [vi("y", TensorProto.FLOAT, None)])
  with pytest.raises(NotImplementedError, match=r"'n' \(op FlexAttention.*needs the value of 'i', computed from the score_mod input"):
    _flex(Q, Q, Q, score_mod=data_shape)
  with pytest.raises(NotImplementedError, match=r"'n' \(op FlexAttention.*rank 4"): _flex(Q[0], Q[0], Q[0])

def test_flexattention_through_load():
  """The whole path: a model with the ai.onnx.preview node and its score_mod graph attribute (graph.PREVIEW_OPS); a
  preview op tilecraft doesn't implement is still refused, naming the domain."""
  rng = np.random.default_rng(6)
  Q, K, V = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
  node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], name="n", domain="ai.onnx.preview", score_mod=_causal_graph())
  g = helper.make_graph([node], "g", [vi(nm, TensorProto.FLOAT, [1, 2, 4, 8]) for nm in "QKV"], [vi("Y", TensorProto.FLOAT, None)])
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)])
  om = tox.load(m)
  causal = lambda s: np.where(np.arange(4)[:, None] >= np.arange(4)[None, :], s, -np.inf)  # noqa: E731
  np.testing.assert_allclose(om.run({"Q": Q, "K": K, "V": V})["Y"], ref_flex(Q, K, V, score_mod=causal), rtol=1e-5, atol=1e-6)
  other = helper.make_graph([helper.make_node("Frobnicate", ["Q"], ["Y"], name="f", domain="ai.onnx.preview")], "g",
                            [vi("Q", TensorProto.FLOAT, [1])], [vi("Y", TensorProto.FLOAT, None)])
  with pytest.raises(NotImplementedError, match=r"domain 'ai.onnx.preview' is not supported"):
    tox.load(helper.make_model(other, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)]))

# ---------------------------------------------------------------- CausalConvWithState

def ref_causal_conv(x, w, bias, past, act):
  B, C, L = x.shape
  k = w.shape[2]
  full = np.concatenate([np.zeros((B, C, k - 1)) if past is None else past.astype(np.float64), x.astype(np.float64)], 2)
  y = np.stack([(full[:, :, t:t + k] * w[:, 0].astype(np.float64)).sum(-1) for t in range(L)], -1) if L else np.zeros((B, C, 0))
  if bias is not None: y = y + bias.astype(np.float64)[:, None]
  if act != "none": y = y / (1 + np.exp(-y))
  return y, full[:, :, L:]

@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("L", [1, 2, 7])
@pytest.mark.parametrize("extras", ["none", "past_bias_silu", "past_swish"])
def test_causal_conv_with_state(k, L, extras):
  """Kernel sizes 1 (no state), 2 and 4; inputs shorter than the state (L=1, 2 < k-1=3: the state keeps past values)."""
  rng = np.random.default_rng(k * 100 + L)
  B, C = 2, 3
  ins = {"x": rng.standard_normal((B, C, L)).astype(np.float32), "w": rng.standard_normal((C, 1, k)).astype(np.float32),
         "b": rng.standard_normal(C).astype(np.float32) if "bias" in extras else None,
         "past": rng.standard_normal((B, C, k - 1)).astype(np.float32) if "past" in extras else None}
  act = "silu" if "silu" in extras else "swish" if "swish" in extras else "none"
  y, st = _run(_model("CausalConvWithState", 27, ins, ["y", "st"], **({} if act == "none" else {"activation": act})), ins)
  wy, ws = ref_causal_conv(*ins.values(), act)
  assert y.shape == (B, C, L) and st.shape == (B, C, k - 1) and y.dtype == st.dtype == np.float32
  np.testing.assert_allclose(y, wy, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(st, ws.astype(np.float32))

def test_causal_conv_half_state_chain_and_refusals():
  """float16/bfloat16 rounded once (within half an ulp of float64); the state threaded through decode steps gives the
  prefill's result; an unknown activation and a weight of the wrong layout are refused naming the node."""
  rng = np.random.default_rng(7)
  x, w, b = rng.standard_normal((1, 4, 6)), rng.standard_normal((4, 1, 3)), rng.standard_normal(4)
  for dt in (np.float16, BF16):
    ins = {"x": x.astype(dt), "w": w.astype(dt), "b": b.astype(dt)}
    y, _ = _run(_model("CausalConvWithState", 27, ins, ["y", "st"], activation="silu"), ins)
    wy, _ = ref_causal_conv(*ins.values(), None, "silu")
    assert y.dtype == dt
    ulp = np.spacing(np.abs(wy).astype(dt)).astype(np.float64)
    assert np.all(np.abs(y.astype(np.float64) - wy) <= 0.5 * ulp + 1e-12)
  ins = {"x": x.astype(np.float32), "w": w.astype(np.float32), "b": None, "past": np.zeros((1, 4, 2), np.float32)}
  full, fs = _run(_model("CausalConvWithState", 27, ins, ["y", "st"]), ins)
  m = tox.load(_model("CausalConvWithState", 27, ins | {"x": ins["x"][:, :, :1]}, ["y", "st"]))
  st, ys = ins["past"], []
  for t in range(6):
    out = m.run({"x": ins["x"][:, :, t:t + 1], "w": ins["w"], "past": st})
    ys.append(out["y"]); st = out["st"]  # noqa: E702
  np.testing.assert_allclose(np.concatenate(ys, 2), full, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(st, fs)
  with pytest.raises(NotImplementedError, match=r"'n' \(op CausalConvWithState, opset 27\).*activation 'gelu'"):
    _run(_model("CausalConvWithState", 27, ins, ["y", "st"], activation="gelu"), ins)
  bad = ins | {"w": w.reshape(1, 4, 3).astype(np.float32)}
  with pytest.raises(NotImplementedError, match=r"'n' \(op CausalConvWithState.*weight of shape"):
    _run(_model("CausalConvWithState", 27, bad, ["y", "st"]), bad)

# ---------------------------------------------------------------- TensorScatter

def ref_tensor_scatter(past, upd, widx, mode, axis):
  """The spec's pseudocode (numpy indexing: a negative linear position counts from the end, as the reference's)."""
  out = past.copy()
  a = axis % past.ndim
  M, S = past.shape[a], upd.shape[a]
  w = np.zeros(past.shape[0], np.int64) if widx is None else widx
  for pre in np.ndindex(past.shape[:a]):
    for j in range(S):
      p = w[pre[0]] + j
      if mode == "circular": p %= M
      out[(*pre, p)] = upd[(*pre, j)]
  return out

@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2, -1])
def test_tensor_scatter_modes_and_axes(mode, axis):
  rng = np.random.default_rng(8)
  past = rng.standard_normal((3, 5, 6, 4)).astype(np.float32)
  a = axis % 4
  M = past.shape[a]
  ushape = list(past.shape)
  ushape[a] = 3
  upd = rng.standard_normal(ushape).astype(np.float32)
  widx = rng.integers(0, M - 2, 3) if mode == "linear" else np.array([M - 1, 2 * M + 1, -1])
  for w in (widx, None):
    ins = {"past": past, "upd": upd, "w": w}
    m = _model("TensorScatter", 24, ins, ["y"], out_type=TensorProto.FLOAT, mode=mode, axis=axis)
    got, = _run(m, ins)
    np.testing.assert_array_equal(got, ref_tensor_scatter(past, upd, w, mode, axis))
    if w is None or (w >= 0).all(): np.testing.assert_array_equal(got, _ort(m, ins)[0])

def test_tensor_scatter_exact_dtypes_rerun_and_index_errors():
  """Values copied bit for bit (-0.0, nan, ints, bools, float16); the built graph reused with new indices; a linear
  write past the cache's end (and a negative start before it) is an IndexError naming the node, checked each call."""
  past = np.full((2, 5, 3), np.nan, np.float32)
  upd = np.array([[[-0.0, 1, 2], [np.nan, 3, -0.0]], [[4, 5, 6], [7, 8, 9]]], np.float32)
  m = tox.load(_model("TensorScatter", 24, {"past": past, "upd": upd, "w": np.zeros(2, np.int64)}, ["y"], axis=1))
  for w in ([0, 3], [2, 1], [-1, 0]):
    w = np.array(w, np.int64)
    got = m.run({"past": past, "upd": upd, "w": w})["y"]
    want = ref_tensor_scatter(past, upd, w, "linear", 1)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
  for bad in ([0, 4], [-5, 0]):
    with pytest.raises(IndexError, match=r"'n' \(op TensorScatter.*index"): m.run({"past": past, "upd": upd, "w": np.array(bad, np.int64)})
  rng = np.random.default_rng(9)
  for dt in (np.int32, np.bool_, np.float16, np.int64):
    p, u = rng.integers(0, 2, (2, 3, 4, 2)).astype(dt), rng.integers(2, 5, (2, 3, 2, 2)).astype(dt)
    w = np.array([3, 1])
    ins = {"past": p, "upd": u, "w": w}
    got, = _run(_model("TensorScatter", 24, ins, ["y"], mode="circular"), ins)
    assert got.dtype == dt
    np.testing.assert_array_equal(got, ref_tensor_scatter(p, u, w, "circular", -2))

def test_tensor_scatter_refusals_name_the_node():
  past, upd = np.zeros((2, 4, 3), np.float32), np.ones((2, 2, 3), np.float32)
  ins = {"past": past, "upd": upd, "w": None}
  for attrs, what in ((dict(axis=0), "batch axis"), (dict(mode="ring"), "mode 'ring'")):
    with pytest.raises(NotImplementedError, match=rf"'n' \(op TensorScatter, opset 24\).*{what}"): _run(_model("TensorScatter", 24, ins, ["y"], **attrs), ins)
  big = {"past": past, "upd": np.ones((2, 5, 3), np.float32), "w": None}
  with pytest.raises(NotImplementedError, match=r"'n' \(op TensorScatter.*update of shape"): _run(_model("TensorScatter", 24, big, ["y"], axis=1), big)

@pytest.mark.parametrize("op", ["LinearAttention", "CausalConvWithState"])
def test_matches_onnxruntime_where_it_runs_the_op(op):
  """onnxruntime on the same model (1.32 runs both; it skips where an onnxruntime doesn't implement the op)."""
  rng = np.random.default_rng(10)
  if op == "LinearAttention":
    ins = _la_inputs(rng, 2, 3, 4, 2, 4, 4, "gated_delta")
    m = _model(op, 27, ins, ["y", "s"], out_type=TensorProto.FLOAT, q_num_heads=4, kv_num_heads=2)
  else:
    ins = {"x": rng.standard_normal((2, 3, 5)).astype(np.float32), "w": rng.standard_normal((3, 1, 4)).astype(np.float32),
           "b": rng.standard_normal(3).astype(np.float32), "past": rng.standard_normal((2, 3, 3)).astype(np.float32)}
    m = _model(op, 27, ins, ["y", "s"], out_type=TensorProto.FLOAT, activation="silu")
  want = _ort(m, ins)
  for g, w in zip(_run(m, ins), want): np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
