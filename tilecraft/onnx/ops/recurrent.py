"""ONNX recurrent ops: RNN, GRU and LSTM (opset 7 on; `layout` from opset 14), unrolled over the sequence
while the graph is built (seq_length is static from X's shape). Contract:
- X @ W^T for every step and both directions is one matmul ahead of the loop (with the biases that don't
  depend on the state folded in); each step adds H @ R^T and applies the gates in ONNX's orders (LSTM i, o, f, c;
  GRU z, r, h; peepholes i, o, f), with `clip` on every gate's pre-activation, LSTM `input_forget` (f = 1 - i),
  GRU `linear_before_reset` 0 and 1, and directions forward, reverse and bidirectional.
- activations: every one the spec lists (Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh,
  HardSigmoid, Elu, Softsign, Softplus; names case-insensitive). activation_alpha/activation_beta are consumed in
  order by the activations that take them (as onnxruntime does); one that runs out takes the default of the ONNX op
  of that name, as the spec says (LeakyRelu 0.01, ThresholdedRelu 1.0 where onnxruntime takes 0, HardSigmoid 0.2/0.5,
  Elu 1.0). A bidirectional node may give one direction's list, used for both. Refused as ambiguous: Affine and
  ScaledTanh without their alpha and beta (no live op gives their defaults, onnxruntime takes 0), values left over,
  and one direction's list with alpha/beta.
- sequence_lens: masks computed from the tensor (runtime values are fine; the built graph is reused): a row's
  state is not updated past its length and Y there is 0; the reverse direction starts at each row's own last step.
  A row of length 0 keeps its initial state in Y_h/Y_c (onnxruntime gives 0 there). A length outside 0..seq_length is
  an IndexError naming the node (registry.Node.check_lengths, on every call).
- layout 1: X, Y, Y_h, Y_c, initial_h and initial_c are batch-first. Unrequested outputs are not built.
- float16/bfloat16 compute in float32 and round once at the end (the state is carried in float32); float64 stays.
Anything else (integer inputs, mixed dtypes, shapes that don't match the spec, unknown activations) is
NotImplementedError naming the node."""
from __future__ import annotations
import math
from typing import Callable, Optional
from tilecraft.dtype import dtypes
from tilecraft.onnx.ops.common import at, wide
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

Act = Callable[[Tensor], Tensor]
# activation (lower case) -> (takes alpha, takes beta); defaults of the ONNX ops of those names
_PARAMS: dict[str, tuple[bool, bool]] = {"relu": (False, False), "tanh": (False, False), "sigmoid": (False, False), "affine": (True, True),
                                         "leakyrelu": (True, False), "thresholdedrelu": (True, False), "scaledtanh": (True, True),
                                         "hardsigmoid": (True, True), "elu": (True, False), "softsign": (False, False), "softplus": (False, False)}
_DEFAULTS: dict[str, tuple[Optional[float], Optional[float]]] = {"leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None), "hardsigmoid": (0.2, 0.5),
                                                                 "elu": (1.0, None)}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}

def _act(key: str, a: Optional[float], b: Optional[float]) -> Act:
  """The activation `key` on a float32/float64 tensor (softplus exact over the whole range: no threshold)."""
  fns: dict[str, Act] = {"relu": lambda x: x.relu(), "tanh": lambda x: x.tanh(), "sigmoid": lambda x: x.sigmoid(), "affine": lambda x: x * a + b,
                         "leakyrelu": lambda x: x.leaky_relu(a), "thresholdedrelu": lambda x: (x > a).where(x, 0.0),
                         "scaledtanh": lambda x: (x * b).tanh() * a, "hardsigmoid": lambda x: x.hardsigmoid(a, b), "elu": lambda x: x.elu(a),
                         "softsign": lambda x: x.softsign(), "softplus": lambda x: x.softplus(threshold=math.inf)}
  return fns[key]

def _activations(n: Node, nd: int) -> list[list[Act]]:
  """Each direction's activation functions (f, g, h order), from the attributes."""
  per = len(_DEFAULT_ACTS[n.op])
  names = list(n.attr("activations", None) or _DEFAULT_ACTS[n.op] * nd)
  alphas, betas = [float(v) for v in n.attr("activation_alpha", None) or []], [float(v) for v in n.attr("activation_beta", None) or []]
  if nd == 2 and len(names) == per:
    if alphas or betas: raise unsupported(n, "one direction's activations with activation_alpha/activation_beta for a bidirectional node (ambiguous)")
    names = names * 2
  if len(names) != per * nd: raise unsupported(n, f"{len(names)} activations (expected {per * nd})")
  fns = []
  for name in names:
    key = str(name).lower()
    if key not in _PARAMS: raise unsupported(n, f"activation {name!r}")
    takes_a, takes_b = _PARAMS[key]
    da, db = _DEFAULTS.get(key, (None, None))
    a = (alphas.pop(0) if alphas else da) if takes_a else None
    b = (betas.pop(0) if betas else db) if takes_b else None
    if (takes_a and a is None) or (takes_b and b is None):
      raise unsupported(n, f"activation {name} without its activation_alpha and activation_beta (no default)")
    fns.append(_act(key, a, b))
  if alphas or betas:
    raise unsupported(n, f"{len(alphas)} activation_alpha and {len(betas)} activation_beta values left over after the activations took theirs")
  return [fns[d * per:(d + 1) * per] for d in range(nd)]

def _cols(t: Tensor, lo: int, hi: int) -> Tensor:
  """t[..., lo:hi]."""
  return t.shrink(tuple([None] * (t.ndim - 1) + [(lo, hi)]))

def _check_shape(n: Node, t: Optional[Tensor], want: tuple, what: str) -> None:
  if t is not None and tuple(t.shape) != want: raise unsupported(n, f"{what} of shape {tuple(t.shape)} (expected {want})")

@op("RNN", "GRU", "LSTM", since=7)
def _recurrent(n: Node, i: list) -> list:
  kind, k = n.op, _GATES[n.op]
  def opt(j: int) -> Optional[Tensor]: return i[j] if j < len(i) and n.has(j) else None
  x, w, r, b, lens, h0 = i[0], i[1], i[2], opt(3), opt(4), opt(5)
  c0, p = (opt(6), opt(7)) if kind == "LSTM" else (None, None)
  if not dtypes.is_float(x.dtype): raise unsupported(n, f"inputs of dtype {x.dtype.name}")
  if any(t is not None and t.dtype != x.dtype for t in (w, r, b, h0, c0, p)): raise unsupported(n, "inputs of differing dtypes")
  direction, layout = n.attr("direction", "forward"), int(n.attr("layout", 0))
  if direction not in ("forward", "reverse", "bidirectional"): raise unsupported(n, f"direction {direction!r}")
  if layout not in (0, 1): raise unsupported(n, f"layout {layout}")
  if x.ndim != 3: raise unsupported(n, f"a {x.ndim}-D X (3-D)")
  nd = 2 if direction == "bidirectional" else 1
  xs = x.permute(1, 0, 2) if layout else x  # (seq, batch, input)
  S, N, I = xs.shape
  Hs = int(n.attr("hidden_size", 0) or r.shape[-1])
  state_shape = (N, nd, Hs) if layout else (nd, N, Hs)
  for t, want, what in ((w, (nd, k * Hs, I), "W"), (r, (nd, k * Hs, Hs), "R"), (b, (nd, 2 * k * Hs), "B"), (p, (nd, 3 * Hs), "P"),
                        (h0, state_shape, "initial_h"), (c0, state_shape, "initial_c"), (lens, (N,), "sequence_lens")):
    _check_shape(n, t, want, what)
  if lens is not None and dtypes.is_float(lens.dtype): raise unsupported(n, f"sequence_lens of dtype {lens.dtype.name}")
  acts = _activations(n, nd)
  clip = n.attr("clip", None)
  if clip is not None and not clip > 0: raise unsupported(n, f"clip {clip} (a positive threshold)")
  input_forget = kind == "LSTM" and bool(n.attr("input_forget", 0))
  lbr = kind == "GRU" and bool(n.attr("linear_before_reset", 0))
  want_y, want_c = len(n.outputs) > 0 and n.outputs[0] != "", kind == "LSTM" and len(n.outputs) > 2 and n.outputs[2] != ""

  # the masks of sequence_lens: step t updates row j where t < lens[j] (none where the lengths are all seq_length)
  steps_mask: Optional[Tensor] = None
  if lens is not None:
    known = n.const(4)
    if known is not None and ((known < 0) | (known > S)).any():
      raise IndexError(f"tilecraft.onnx: {n.describe()}: sequence_lens {[int(v) for v in known]} outside 0..{S} (seq_length)")
    n.check_lengths(4, S, 0)  # a runtime length outside 0..seq_length: an IndexError naming the node
    if known is None or (known < S).any():
      steps_mask = Tensor.arange(S, dtype=dtypes.int64, device=x.device).reshape(S, 1, 1) < lens.cast(dtypes.int64).reshape(1, N, 1)

  xw_all = None
  if S:  # X @ W^T for all steps and directions: (seq, batch, directions * k * hidden)
    xw_all = (wide(xs).reshape(S * N, I) @ wide(w).reshape(nd * k * Hs, I).permute(1, 0)).reshape(S, N, nd * k * Hs)
  def pre(t: Tensor) -> Tensor: return t.clip(-clip, clip) if clip is not None else t
  def init(s: Optional[Tensor], d: int) -> Tensor:
    if s is None: return Tensor.zeros(N, Hs, dtype=wide(x).dtype, device=x.device)
    s = wide(s)
    return at(s.permute(1, 0, 2) if layout else s, d)

  ys, hs, cs = [], [], []
  for d in range(nd):
    f, g, hact = (acts[d] + [None, None])[:3]
    rt = at(wide(r), d).permute(1, 0)  # (hidden, k * hidden)
    bx, rbh = None, None  # bias added to X @ W^T; GRU linear_before_reset's Rb_h, added inside the reset
    if b is not None:
      bd = at(wide(b), d)
      wb, rb = _cols(bd, 0, k * Hs), _cols(bd, k * Hs, 2 * k * Hs)
      if lbr:
        rbh = _cols(rb, 2 * Hs, 3 * Hs)
        bx = wb + _cols(rb, 0, 2 * Hs).pad(((0, Hs),))
      else: bx = wb + rb
    pd = at(wide(p), d) if p is not None else None
    def peep(j: int, s: Tensor, pd: Optional[Tensor] = pd) -> Tensor | int: return s * _cols(pd, j * Hs, (j + 1) * Hs) if pd is not None else 0
    xw = _cols(xw_all, d * k * Hs, (d + 1) * k * Hs) if xw_all is not None else None
    if xw is not None and bx is not None: xw = xw + bx
    h, c = init(h0, d), init(c0, d) if kind == "LSTM" else None
    y_steps: list[Optional[Tensor]] = [None] * S
    reverse = direction == "reverse" or d == 1
    for t in (reversed(range(S)) if reverse else range(S)):
      gx = at(xw, t)  # (batch, k * hidden)
      if kind == "RNN": hn, cn = f(pre(gx + h @ rt)), None
      elif kind == "LSTM":
        gs = gx + h @ rt
        gi, go, gf, gc = (_cols(gs, j * Hs, (j + 1) * Hs) for j in range(4))
        it = f(pre(gi + peep(0, c)))
        ft = (1 - it) if input_forget else f(pre(gf + peep(2, c)))
        cn = ft * c + it * g(pre(gc))
        hn = f(pre(go + peep(1, cn))) * hact(cn)
      else:  # GRU
        if lbr:
          hr = h @ rt
          zr = _cols(gx, 0, 2 * Hs) + _cols(hr, 0, 2 * Hs)
          hr_h = _cols(hr, 2 * Hs, 3 * Hs)
          rs = f(pre(_cols(zr, Hs, 2 * Hs)))  # the reset gate
          hh = g(pre(_cols(gx, 2 * Hs, 3 * Hs) + rs * (hr_h + rbh if rbh is not None else hr_h)))
        else:
          zr = _cols(gx, 0, 2 * Hs) + h @ _cols(rt, 0, 2 * Hs)
          rs = f(pre(_cols(zr, Hs, 2 * Hs)))
          hh = g(pre(_cols(gx, 2 * Hs, 3 * Hs) + (rs * h) @ _cols(rt, 2 * Hs, 3 * Hs)))
        z = f(pre(_cols(zr, 0, Hs)))
        hn, cn = (1 - z) * hh + z * h, None
      if steps_mask is not None:
        m = at(steps_mask, t)  # (batch, 1)
        hn, cn = m.where(hn, h), (m.where(cn, c) if cn is not None else None)
        if want_y: y_steps[t] = m.where(hn, 0.0)
      elif want_y: y_steps[t] = hn
      h, c = hn, cn
    hs.append(h); cs.append(c)  # noqa: E702
    if want_y: ys.append(Tensor.stack(*y_steps, axis=0) if S else Tensor.zeros(0, N, Hs, dtype=h.dtype, device=x.device))

  dt = x.dtype
  def states(ss: list[Tensor]) -> Tensor:
    out = Tensor.stack(*ss, axis=0) if nd > 1 else ss[0].reshape(1, N, Hs)
    return (out.permute(1, 0, 2) if layout else out).cast(dt)
  y = None
  if want_y:
    y = Tensor.stack(*ys, axis=1) if nd > 1 else ys[0].reshape(S, 1, N, Hs)  # (seq, directions, batch, hidden)
    y = (y.permute(2, 0, 1, 3) if layout else y).cast(dt)
  outs = [y, states(hs)]
  if kind == "LSTM": outs.append(states(cs) if want_c else None)
  return outs
