"""The ONNX recurrent ops (ops/recurrent.py: RNN, GRU, LSTM) against a float64 numpy reference written from the
spec's equations, one batch row and one valid step at a time (an independent formulation of sequence_lens: the
op masks all rows together): peepholes, clip, initial states, input_forget, both GRU resets, every activation,
layout 1, runtime sequence_lens in both directions (and a rerun of the built graph with other lengths), float16
computed in float32 and rounded once, refused forms, and one model of all three ops against onnxruntime."""
from __future__ import annotations
from typing import Callable, Optional
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402

K = {"RNN": 1, "GRU": 3, "LSTM": 4}
NP_DT = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16}

def _sig(x: np.ndarray) -> np.ndarray: return 1 / (1 + np.exp(-x))
def _np_act(name: str, a: Optional[float] = None, b: Optional[float] = None) -> Callable[[np.ndarray], np.ndarray]:
  return {"Relu": lambda x: np.maximum(x, 0), "Tanh": np.tanh, "Sigmoid": _sig, "Affine": lambda x: a * x + b,
          "LeakyRelu": lambda x: np.where(x < 0, a * x, x), "ThresholdedRelu": lambda x: np.where(x > a, x, 0),
          "ScaledTanh": lambda x: a * np.tanh(b * x), "HardSigmoid": lambda x: np.clip(a * x + b, 0, 1),
          "Elu": lambda x: np.where(x < 0, a * np.expm1(x), x), "Softsign": lambda x: x / (1 + np.abs(x)),
          "Softplus": lambda x: np.logaddexp(0, x)}[name]
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}

def reference(kind: str, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: Optional[np.ndarray] = None, lens: Optional[np.ndarray] = None,
              h0: Optional[np.ndarray] = None, c0: Optional[np.ndarray] = None, p: Optional[np.ndarray] = None, direction: str = "forward",
              acts: Optional[list] = None, clip: Optional[float] = None, lbr: int = 0, input_forget: int = 0, layout: int = 0) -> tuple:
  """(Y, Y_h, Y_c) in float64 from the spec's equations; acts: numpy functions, f, g, h per direction."""
  x, w, r = (np.asarray(v, np.float64) for v in (x, w, r))
  if layout: x, h0, c0 = x.transpose(1, 0, 2), (None if h0 is None else h0.transpose(1, 0, 2)), (None if c0 is None else c0.transpose(1, 0, 2))
  S, N, _ = x.shape
  nd, k, H = w.shape[0], K[kind], r.shape[2]
  lens = np.full(N, S) if lens is None else lens
  acts = acts or [_np_act(a) for a in DEFAULT_ACTS[kind]] * nd
  per = len(DEFAULT_ACTS[kind])
  cl = (lambda v: np.clip(v, -clip, clip)) if clip is not None else (lambda v: v)
  Y, Yh, Yc = np.zeros((S, nd, N, H)), np.zeros((nd, N, H)), np.zeros((nd, N, H))
  for d in range(nd):
    f, g, hf = (acts[d * per:(d + 1) * per] + [None, None])[:3]
    wb, rb = (np.zeros(k * H), np.zeros(k * H)) if b is None else (b[d, :k * H], b[d, k * H:])
    pi, po, pf = (np.zeros(H),) * 3 if p is None else (p[d, :H], p[d, H:2 * H], p[d, 2 * H:])
    for row in range(N):
      h = np.zeros(H) if h0 is None else np.asarray(h0[d, row], np.float64)
      c = np.zeros(H) if c0 is None else np.asarray(c0[d, row], np.float64)
      steps = range(lens[row]) if direction == "forward" or (direction == "bidirectional" and d == 0) else reversed(range(lens[row]))
      for t in steps:
        xw, hr = w[d] @ x[t, row] + wb, r[d] @ h
        if kind == "RNN": h = f(cl(xw + hr + rb))
        elif kind == "LSTM":
          gi, go, gf, gc = np.split(xw + hr + rb, 4)
          i = f(cl(gi + pi * c))
          fg = 1 - i if input_forget else f(cl(gf + pf * c))
          c = fg * c + i * g(cl(gc))
          h = f(cl(go + po * c)) * hf(c)
        else:
          z = f(cl(xw[:H] + hr[:H] + rb[:H]))
          rs = f(cl(xw[H:2 * H] + hr[H:2 * H] + rb[H:2 * H]))
          if lbr: hh = g(cl(xw[2 * H:] + rs * (hr[2 * H:] + rb[2 * H:])))
          else: hh = g(cl(xw[2 * H:] + r[d, 2 * H:] @ (rs * h) + rb[2 * H:]))
          h = (1 - z) * hh + z * h
        Y[t, d, row] = h
      Yh[d, row], Yc[d, row] = h, c
  if layout: return Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
  return Y, Yh, Yc

def _weights(rng: np.random.Generator, kind: str, nd: int, H: int, I: int, dt: type = np.float32, bias: bool = True, peep: bool = False) -> dict:
  k = K[kind]
  out = {"W": rng.standard_normal((nd, k * H, I)) * 0.5, "R": rng.standard_normal((nd, k * H, H)) * 0.5}
  if bias: out["B"] = rng.standard_normal((nd, 2 * k * H)) * 0.5
  if peep: out["P"] = rng.standard_normal((nd, 3 * H)) * 0.5
  return {nm: v.astype(dt) for nm, v in out.items()}

INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]

def _node_model(kind: str, feeds: dict, consts: dict, outputs: tuple = ("Y", "Y_h"), opset: int = 14, name: str = "rnn0",
                **attrs: object) -> onnx.ModelProto:
  """One node of `kind` whose inputs are named by INPUTS: feeds become graph inputs, consts initializers, the rest absent."""
  last = max(INPUTS.index(nm) for nm in (*feeds, *consts))
  ins = [nm if nm in feeds or nm in consts else "" for nm in INPUTS[:last + 1]]
  tp = {np.dtype(v): t for t, v in NP_DT.items()} | {np.dtype(np.int32): TensorProto.INT32}
  node = helper.make_node(kind, ins, list(outputs), name=name, **attrs)
  g = helper.make_graph([node], "g", [helper.make_tensor_value_info(nm, tp[v.dtype], list(v.shape)) for nm, v in feeds.items()],
                        [helper.make_tensor_value_info(o, tp[feeds["X"].dtype], None) for o in outputs if o],
                        [helper.make_tensor(nm, tp[v.dtype], list(v.shape), v.ravel()) for nm, v in consts.items()])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _close(got: dict, want: tuple, names: tuple = ("Y", "Y_h", "Y_c"), rtol: float = 1e-5, atol: float = 1e-6) -> None:
  for nm, v in zip(names, want):
    if nm in got: np.testing.assert_allclose(got[nm], v, rtol=rtol, atol=atol, err_msg=nm)

def test_lstm_bidirectional_peepholes_clip_initial_states() -> None:
  rng = np.random.default_rng(0)
  S, N, I, H = 5, 3, 4, 6
  wts = _weights(rng, "LSTM", 2, H, I, np.float64, peep=True)
  x, h0, c0 = (rng.standard_normal(s) for s in ((S, N, I), (2, N, H), (2, N, H)))
  feeds = {"X": x, "initial_h": h0, "initial_c": c0}
  m = tox.load(_node_model("LSTM", feeds, wts, ("Y", "Y_h", "Y_c"), direction="bidirectional", hidden_size=H, clip=1.5))
  want = reference("LSTM", x, wts["W"], wts["R"], wts["B"], None, h0, c0, wts["P"], "bidirectional", clip=1.5)
  assert not np.allclose(want[0], reference("LSTM", x, wts["W"], wts["R"], wts["B"], None, h0, c0, wts["P"], "bidirectional")[0])  # (clip matters)
  for _ in range(2): _close(m.run(feeds), want, rtol=1e-10, atol=1e-12)  # (float64: tight; the rerun too)

def test_lstm_input_forget_reverse_only_y_c() -> None:
  rng = np.random.default_rng(1)
  wts = _weights(rng, "LSTM", 1, 5, 3, peep=True)
  x = rng.standard_normal((4, 2, 3)).astype(np.float32)
  m = tox.load(_node_model("LSTM", {"X": x}, wts, ("", "", "Y_c"), direction="reverse", hidden_size=5, input_forget=1))
  got = m.run({"X": x})
  assert list(got) == ["Y_c"]
  _close(got, reference("LSTM", x, wts["W"], wts["R"], wts["B"], p=wts["P"], direction="reverse", input_forget=1))

@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr: int) -> None:
  rng = np.random.default_rng(2 + lbr)
  wts = _weights(rng, "GRU", 2, 4, 3)
  x, h0 = rng.standard_normal((6, 2, 3)).astype(np.float32), rng.standard_normal((2, 2, 4)).astype(np.float32)
  m = tox.load(_node_model("GRU", {"X": x}, {**wts, "initial_h": h0}, direction="bidirectional", hidden_size=4, linear_before_reset=lbr))
  want = reference("GRU", x, wts["W"], wts["R"], wts["B"], h0=h0, direction="bidirectional", lbr=lbr)
  assert not np.allclose(want[0], reference("GRU", x, wts["W"], wts["R"], wts["B"], h0=h0, direction="bidirectional", lbr=1 - lbr)[0])
  _close(m.run({"X": x}), want)

def test_every_activation() -> None:
  # one RNN node per activation (the spec's list), each bidirectional with the other direction on Sigmoid, in one model
  rng = np.random.default_rng(4)
  acts = [("Relu", None, None), ("Tanh", None, None), ("Sigmoid", None, None), ("Affine", 0.7, -0.2), ("LeakyRelu", 0.2, None),
          ("ThresholdedRelu", 0.3, None), ("ScaledTanh", 1.3, 0.6), ("HardSigmoid", 0.3, 0.4), ("Elu", 0.8, None), ("Softsign", None, None),
          ("Softplus", None, None), ("LeakyRelu", None, None), ("HardSigmoid", None, None), ("ThresholdedRelu", None, None), ("Elu", None, None)]
  defaults = {"LeakyRelu": (0.01, None), "HardSigmoid": (0.2, 0.5), "ThresholdedRelu": (1.0, None), "Elu": (1.0, None)}
  x = rng.standard_normal((4, 2, 3)).astype(np.float32)
  wts = _weights(rng, "RNN", 2, 5, 3)
  nodes, outs, wants = [], [], []
  for j, (a, al, be) in enumerate(acts):
    attrs = {"activation_alpha": [al]} if al is not None else {}
    if be is not None: attrs["activation_beta"] = [be]
    nodes.append(helper.make_node("RNN", ["X", "W", "R", "B"], [f"y{j}", ""], hidden_size=5, direction="bidirectional", activations=[a, "Sigmoid"],
                                  **attrs))
    outs.append(helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, None))
    al, be = (al, be) if al is not None else defaults.get(a, (None, None))
    wants.append(reference("RNN", x, wts["W"], wts["R"], wts["B"], direction="bidirectional", acts=[_np_act(a, al, be), _sig])[0])
  inits = [helper.make_tensor(nm, TensorProto.FLOAT, list(v.shape), v.ravel()) for nm, v in wts.items()]
  g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))], outs, inits)
  got = tox.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])).run({"X": x})
  for j, (a, _, _) in enumerate(acts): np.testing.assert_allclose(got[f"y{j}"], wants[j], rtol=1e-5, atol=1e-6, err_msg=f"{j}: {a}")

def test_lstm_layout_batch_first() -> None:
  rng = np.random.default_rng(5)
  N, S, I, H = 3, 4, 2, 5
  wts = _weights(rng, "LSTM", 2, H, I)
  x, h0, c0 = (rng.standard_normal(s).astype(np.float32) for s in ((N, S, I), (N, 2, H), (N, 2, H)))
  feeds = {"X": x, "initial_h": h0, "initial_c": c0}
  got = tox.load(_node_model("LSTM", feeds, wts, ("Y", "Y_h", "Y_c"), direction="bidirectional", hidden_size=H, layout=1)).run(feeds)
  want = reference("LSTM", x, wts["W"], wts["R"], wts["B"], None, h0, c0, direction="bidirectional", layout=1)
  assert got["Y"].shape == (N, S, 2, H) and got["Y_h"].shape == got["Y_c"].shape == (N, 2, H)
  _close(got, want)

@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_sequence_lens_both_directions(kind: str) -> None:
  # lengths as a graph input (runtime): Y is 0 past each row's length, Y_h is each row's state at its last valid step
  # (the reverse direction starts from each row's own end); the built graph reruns for other lengths
  rng = np.random.default_rng(6)
  S, N, I, H = 5, 4, 3, 4
  wts = _weights(rng, kind, 2, H, I, peep=kind == "LSTM")
  x, h0 = rng.standard_normal((S, N, I)).astype(np.float32), rng.standard_normal((2, N, H)).astype(np.float32)
  outs = ("Y", "Y_h", "Y_c") if kind == "LSTM" else ("Y", "Y_h")
  lens0 = np.array([5, 2, 0, 3], np.int32)
  m = tox.load(_node_model(kind, {"X": x, "sequence_lens": lens0}, {**wts, "initial_h": h0}, outs, direction="bidirectional", hidden_size=H))
  for lens in (lens0, np.array([1, 5, 4, 2], np.int32), lens0):
    got = m.run({"X": x, "sequence_lens": lens})
    want = reference(kind, x, wts["W"], wts["R"], wts["B"], lens, h0, p=wts.get("P"), direction="bidirectional")
    _close(got, want)
    for row, L in enumerate(lens): assert not got["Y"][L:, :, row].any()
  assert len(m._captures) == 1  # one build: the lengths are masks computed in the graph
  with pytest.raises(IndexError, match="rnn0.*length 6 is out of range"): m.run({"X": x, "sequence_lens": np.array([6, 1, 1, 1], np.int32)})
  with pytest.raises(IndexError, match="rnn0.*length -2 is out of range"): m.run({"X": x, "sequence_lens": np.array([1, -2, 1, 1], np.int32)})

def test_float16_computes_in_float32() -> None:
  # the state is carried in float32 and rounded to float16 once: within ~half an ulp of the float64 result
  rng = np.random.default_rng(7)
  wts = _weights(rng, "LSTM", 1, 8, 4, np.float16)
  x = rng.standard_normal((12, 2, 4)).astype(np.float16)
  got = tox.load(_node_model("LSTM", {"X": x}, wts, ("Y", "Y_h", "Y_c"), hidden_size=8)).run({"X": x})
  want = reference("LSTM", x, *(wts[nm].astype(np.float64) for nm in ("W", "R", "B")))
  for nm, v in zip(("Y", "Y_h", "Y_c"), want):
    assert got[nm].dtype == np.float16
    err = np.abs(got[nm].astype(np.float64) - v) / np.spacing(np.abs(v).astype(np.float16)).astype(np.float64)
    assert err.max() <= 0.51, (nm, err.max())

@pytest.mark.parametrize("attrs, match", [({"activations": ["Gelu"]}, "activation 'Gelu'"), ({"activations": ["Affine"]}, "Affine without"),
                                          ({"activations": ["LeakyRelu"], "activation_alpha": [0.1, 0.2]}, "left over"),
                                          ({"direction": "sideways"}, "direction")])
def test_unsupported_forms_name_the_node(attrs: dict, match: str) -> None:
  rng = np.random.default_rng(8)
  x = rng.standard_normal((2, 1, 3)).astype(np.float32)
  m = tox.load(_node_model("RNN", {"X": x}, _weights(rng, "RNN", 1, 2, 3), hidden_size=2, **attrs))
  with pytest.raises(NotImplementedError, match=rf"node 'rnn0' \(op RNN, opset 14\).*{match}"): m.run({"X": x})

def test_constant_lengths_out_of_range() -> None:
  rng = np.random.default_rng(10)
  x = rng.standard_normal((3, 2, 2)).astype(np.float32)
  m = tox.load(_node_model("RNN", {"X": x}, {**_weights(rng, "RNN", 1, 2, 2), "sequence_lens": np.array([3, 4], np.int32)}, hidden_size=2))
  with pytest.raises(IndexError, match=r"node 'rnn0'.*sequence_lens \[3, 4\] outside 0\.\.3"): m.run({"X": x})

def test_against_onnxruntime() -> None:
  # a bidirectional LSTM (peepholes, clip, initial states, lengths), a GRU with linear_before_reset and a reverse RNN in one model
  ort = pytest.importorskip("onnxruntime")
  rng = np.random.default_rng(9)
  S, N, I, H = 6, 3, 4, 5
  x, lens = rng.standard_normal((S, N, I)).astype(np.float32), np.array([6, 3, 4], np.int32)
  lw, gw, rw = _weights(rng, "LSTM", 2, H, I, peep=True), _weights(rng, "GRU", 1, H, I), _weights(rng, "RNN", 1, H, I)
  h0, c0 = (rng.standard_normal((2, N, H)).astype(np.float32) for _ in range(2))
  consts = {**{f"l{k}": v for k, v in lw.items()}, **{f"g{k}": v for k, v in gw.items()}, **{f"r{k}": v for k, v in rw.items()}, "h0": h0, "c0": c0}
  nodes = [helper.make_node("LSTM", ["X", "lW", "lR", "lB", "lens", "h0", "c0", "lP"], ["ly", "lh", "lc"], direction="bidirectional", hidden_size=H,
                            clip=2.0),
           helper.make_node("GRU", ["X", "gW", "gR", "gB", "lens"], ["gy", "gh"], hidden_size=H, linear_before_reset=1),
           helper.make_node("RNN", ["X", "rW", "rR", "rB"], ["ry", "rh"], hidden_size=H, direction="reverse", activations=["Relu"])]
  outs = ["ly", "lh", "lc", "gy", "gh", "ry", "rh"]
  ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape)), helper.make_tensor_value_info("lens", TensorProto.INT32, [N])]
  g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                        [helper.make_tensor(nm, TensorProto.FLOAT, list(v.shape), v.ravel()) for nm, v in consts.items()])
  model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(outs, {"X": x, "lens": lens})
  got = tox.load(model).run({"X": x, "lens": lens})
  for o, v in zip(outs, want): np.testing.assert_allclose(got[o], v, rtol=1e-5, atol=1e-5, err_msg=o)
