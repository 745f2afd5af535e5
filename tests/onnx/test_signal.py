"""ONNX DFT / STFT / MelWeightMatrix / Det / BitCast / ReverseSequence / SwiGLU (tilecraft/onnx/ops/signal.py)
against numpy references written here (numpy.fft and numpy.linalg.det in float64, loops for the rest): every attribute,
real and complex inputs, padding and truncation, batches, singular matrices, exact bit patterns (-0.0, nan), values
from graph inputs, errors naming the node, and onnxruntime on the same models where it runs them."""
from __future__ import annotations
import math
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
import tilecraft.onnx as tox  # noqa: E402

NP2ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.float64): TensorProto.DOUBLE,
           np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64, np.dtype(np.bool_): TensorProto.BOOL,
           np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int16): TensorProto.INT16, np.dtype(np.uint16): TensorProto.UINT16,
           np.dtype(np.uint32): TensorProto.UINT32}

def _model(op: str, inputs: dict, out_type: int, opset: int, consts: dict | None = None, order: list | None = None, **attrs) -> onnx.ModelProto:
  """One `op` node named 'nd'; `inputs` (name -> array) are graph inputs, `consts` (name -> array) initializers, `order` the
  node's input names ('' for an absent optional one)."""
  consts = consts or {}
  names = order if order is not None else list(inputs) + list(consts)
  node = helper.make_node(op, names, ["y"], name="nd", **attrs)
  vi = helper.make_tensor_value_info
  g = helper.make_graph([node], "g", [vi(k, NP2ONNX[v.dtype], list(v.shape)) for k, v in inputs.items()], [vi("y", out_type, None)],
                        initializer=[onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

def _run(m: onnx.ModelProto, feed: dict) -> np.ndarray:
  return tox.load(m).run(feed)["y"]

def _ort(m: onnx.ModelProto, feed: dict) -> np.ndarray:
  """onnxruntime's answer, or a skip where it doesn't run the model (an op or opset it lacks)."""
  rt = pytest.importorskip("onnxruntime")
  try: sess = rt.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  except Exception as e: pytest.skip(f"onnxruntime doesn't load the model: {str(e)[:120]}")  # noqa: BLE001
  return sess.run(None, feed)[0]

# ---- DFT / STFT --------------------------------------------------------------------------------------------------------

def ref_dft(x: np.ndarray, axis: int, N: int | None, inverse: bool, onesided: bool) -> np.ndarray:
  """The spec's DFT in float64 through numpy.fft, as [..., 2] (or [..., 1] for the IRFFT)."""
  z = x[..., 0].astype(np.float64) + (1j * x[..., 1].astype(np.float64) if x.shape[-1] == 2 else 0)
  ax = axis if axis >= 0 else x.ndim + axis
  if inverse and onesided: return np.fft.irfft(z, n=N if N is not None else 2 * (z.shape[ax] - 1), axis=ax)[..., None]
  y = (np.fft.ifft if inverse else np.fft.fft)(z, n=N, axis=ax)
  if onesided: y = np.take(y, range(y.shape[ax] // 2 + 1), axis=ax)
  return np.stack([y.real, y.imag], axis=-1)

def _dft_model(x: np.ndarray, opset: int, axis: int, N: int | None, inverse: int, onesided: int, n_as_input: bool = False) -> tuple:
  consts, feed = {}, {"x": x}
  if N is not None: (feed if n_as_input else consts)["n"] = np.array(N, np.int64)
  order = ["x", "n" if N is not None else ""]
  attrs = {"inverse": inverse, "onesided": onesided}
  if opset >= 20:
    consts["axis"] = np.array(axis, np.int64)
    order.append("axis")
  else: attrs["axis"] = axis
  return _model("DFT", feed, NP2ONNX[x.dtype], opset, consts, order, **attrs), feed

CASES = [  # (shape, axis, dft_length, inverse, onesided)
  ((3, 8, 1), 1, None, 0, 0), ((3, 8, 2), 1, None, 0, 0), ((2, 7, 5, 2), 1, None, 0, 0), ((2, 6, 5, 1), -2, None, 0, 0),
  ((4, 9, 1), 1, None, 0, 1), ((4, 10, 1), 1, 13, 0, 1), ((3, 12, 2), 1, 7, 0, 0), ((3, 8, 2), 1, 11, 1, 0), ((3, 9, 2), 1, None, 1, 0),
  ((3, 5, 2), 1, None, 1, 1), ((3, 5, 2), 1, 9, 1, 1), ((3, 6, 2), 1, 4, 1, 1), ((3, 4, 2), 1, 12, 1, 1), ((2, 3, 6, 2), 0, None, 0, 0),
  ((5, 6, 1), -3, 8, 1, 0), ((3, 8, 2), 1, None, 0, 1),
]

@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-ax{c[1]}-n{c[2]}-inv{c[3]}-one{c[4]}")
def test_dft_against_numpy_fft(opset, case):
  shape, axis, N, inverse, onesided = case
  x = np.random.default_rng(hash(case) % 2**32).standard_normal(shape).astype(np.float32)
  m, feed = _dft_model(x, opset, axis, N, inverse, onesided)
  got, want = _run(m, feed), ref_dft(x, axis, N, bool(inverse), bool(onesided))
  assert got.dtype == np.float32 and got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1, np.abs(want).max()))

@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_dft_dtypes(dtype):
  """float64 computed in float64 (agrees with numpy.fft to ~1e-13); float16 computed in float32 and rounded once."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 16, 2)).astype(dtype)
  for inverse, onesided, N in ((0, 0, None), (1, 0, 20), (1, 1, None)):
    m, feed = _dft_model(x, 20, 1, N, inverse, onesided)
    got, want = _run(m, feed), ref_dft(x, 1, N, bool(inverse), bool(onesided))
    assert got.dtype == dtype
    if dtype == np.float64: np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    else: np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())

def test_dft_exact_quarter_turns_and_length_from_input():
  """A length-4 DFT uses only 0, +-1 (no sin(pi) residue): integer data transforms exactly; dft_length as a graph input
  (the graph is rebuilt for each value)."""
  x = np.array([[[1.0], [2.0], [3.0], [4.0]]], np.float32)
  m, feed = _dft_model(x, 20, 1, None, 0, 0)
  np.testing.assert_array_equal(_run(m, feed)[0], [[10, 0], [-2, 2], [-2, 0], [-2, -2]])
  m, feed = _dft_model(x, 20, 1, 6, 0, 0, n_as_input=True)
  mod = tox.load(m)
  for N in (6, 2, 5):
    np.testing.assert_allclose(mod.run({"x": x, "n": np.array(N, np.int64)})["y"], ref_dft(x, 1, N, False, False), atol=1e-5)

def test_dft_refusals_name_the_node():
  x = np.zeros((2, 8, 2), np.float32)
  for shape, axis in (((2, 8, 2), 2), ((2, 8, 2), -1), ((2, 8, 3), 1)):
    m, feed = _dft_model(np.zeros(shape, np.float32), 20, axis, None, 0, 0)
    with pytest.raises(NotImplementedError, match=r"'nd' \(op DFT"):
      _run(m, feed)
  m, feed = _dft_model(x, 20, 1, 0, 0, 0)
  with pytest.raises(NotImplementedError, match=r"'nd' \(op DFT.*dft_length 0"):
    _run(m, feed)

def test_dft_matches_onnxruntime():
  x = np.random.default_rng(2).standard_normal((2, 12, 2)).astype(np.float32)
  for opset, N, inverse, onesided in ((17, None, 0, 0), (20, 16, 1, 0), (20, None, 0, 0)):
    m, feed = _dft_model(x, opset, 1, N, inverse, onesided)
    np.testing.assert_allclose(_run(m, feed), _ort(m, feed), rtol=1e-4, atol=1e-4)

def ref_stft(x: np.ndarray, step: int, window: np.ndarray | None, F: int, onesided: bool) -> np.ndarray:
  z = x[..., 0].astype(np.float64) + (1j * x[..., 1].astype(np.float64) if x.shape[-1] == 2 else 0)
  w = np.ones(F) if window is None else window.astype(np.float64)
  T = (z.shape[1] - F) // step + 1
  y = np.stack([np.fft.fft(z[:, t * step:t * step + F] * w, axis=-1) for t in range(T)], axis=1)
  if onesided: y = y[..., :F // 2 + 1]
  return np.stack([y.real, y.imag], axis=-1)

@pytest.mark.parametrize("form", ["window", "frame_length", "both", "neither", "complex_twosided", "step_over_frame"])
def test_stft_against_numpy(form):
  rng = np.random.default_rng(3)
  C = 2 if form == "complex_twosided" else 1
  x = rng.standard_normal((2, 37, C)).astype(np.float32)
  step, F = (11, 5) if form == "step_over_frame" else (4, 10)
  win = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(F) / F)).astype(np.float32)
  consts, order = {"s": np.array(step, np.int64)}, ["x", "s", "", ""]
  if form in ("window", "both", "complex_twosided"): consts["w"], order[2] = win, "w"
  if form in ("frame_length", "both", "step_over_frame"): consts["f"], order[3] = np.array(F, np.int64), "f"
  onesided = 0 if form == "complex_twosided" else 1
  m = _model("STFT", {"x": x}, TensorProto.FLOAT, 17, consts, order, onesided=onesided)
  got = _run(m, {"x": x})
  want = ref_stft(x, step, win if order[2] else None, F if form != "neither" else 37, bool(onesided))
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  if form in ("window", "both"): np.testing.assert_allclose(got, _ort(m, {"x": x}), rtol=1e-4, atol=1e-4)

def test_stft_refusals():
  x = np.zeros((1, 8, 1), np.float32)
  for consts, order in (({"s": np.array(1, np.int64), "f": np.array(9, np.int64)}, ["x", "s", "", "f"]),
                        ({"s": np.array(0, np.int64)}, ["x", "s"]),
                        ({"s": np.array(1, np.int64), "w": np.ones(4, np.float32), "f": np.array(5, np.int64)}, ["x", "s", "w", "f"])):
    with pytest.raises(NotImplementedError, match=r"'nd' \(op STFT"):
      _run(_model("STFT", {"x": x}, TensorProto.FLOAT, 17, consts, order), {"x": x})

# ---- MelWeightMatrix ---------------------------------------------------------------------------------------------------

def ref_mel(bins: int, dft_len: int, rate: int, lo: float, hi: float) -> np.ndarray:
  """Triangles between mel points (mel spacing (hi - lo) / (bins + 2), as onnxruntime), at spectrogram bins floor((n + 1) f / rate)."""
  mel = lambda f: 2595 * math.log10(1 + f / 700)  # noqa: E731
  step = (mel(hi) - mel(lo)) / (bins + 2)
  pts = [int(((dft_len + 1) * (700 * (10 ** ((mel(lo) + k * step) / 2595) - 1))) // rate) for k in range(bins + 2)]
  out = np.zeros((dft_len // 2 + 1, bins))
  for m in range(bins):
    l, c, h = pts[m:m + 3]
    for j in range(l, c + 1): out[j, m] = 1.0 if c == l else (j - l) / (c - l)
    for j in range(c, h): out[j, m] = (h - j) / (h - c)
  return out

@pytest.mark.parametrize("args,dtype", [((8, 64, 8000, 0.0, 4000.0), TensorProto.FLOAT), ((12, 400, 16000, 30.0, 7600.0), TensorProto.DOUBLE),
                                        ((5, 33, 1000, 10.0, 450.0), TensorProto.FLOAT16)])
def test_mel_weight_matrix(args, dtype):
  bins, n, rate, lo, hi = args
  consts = {"b": np.array(bins, np.int64), "n": np.array(n, np.int64), "r": np.array(rate, np.int64), "lo": np.array(lo, np.float32),
            "hi": np.array(hi, np.float32)}
  m = _model("MelWeightMatrix", {}, dtype, 17, consts, list(consts), output_datatype=dtype)
  got = _run(m, {})
  want = ref_mel(bins, n, rate, lo, hi)
  assert got.dtype == onnx.helper.tensor_dtype_to_np_dtype(dtype) and got.shape == want.shape
  np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3 if dtype == TensorProto.FLOAT16 else 1e-6, atol=1e-7)
  np.testing.assert_allclose(got, _ort(m, {}), rtol=1e-3, atol=1e-6)

def test_mel_weight_matrix_bands_past_the_spectrum_refused():
  """Bands reaching past the last spectrogram bin (upper edge above the Nyquist frequency): the reference fails on them."""
  consts = {"b": np.array(8, np.int64), "n": np.array(64, np.int64), "r": np.array(8000, np.int64), "lo": np.array(0.0, np.float32),
            "hi": np.array(9000.0, np.float32)}
  with pytest.raises(NotImplementedError, match=r"'nd' \(op MelWeightMatrix.*outside 0..32"):
    _run(_model("MelWeightMatrix", {}, TensorProto.FLOAT, 17, consts, list(consts)), {})

# ---- Det ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_det_batched_against_numpy(dtype):
  rng = np.random.default_rng(4)
  for shape in ((4, 4), (3, 1, 1), (2, 3, 2, 2), (5, 3, 3), (2, 6, 6), (9, 9)):
    x = rng.standard_normal(shape)
    if shape == (5, 3, 3):  # singular: a zero column, two equal rows, a zero first column (pivoting past it), rank 1
      x[0, :, 1] = 0; x[1, 2] = x[1, 0]; x[2, :, 0] = 0; x[3] = np.outer([1, 2, 3], [4, 5, 6])
    x = x.astype(dtype)
    got = _run(_model("Det", {"x": x}, NP2ONNX[np.dtype(dtype)], 22), {"x": x})
    want = np.linalg.det(x.astype(np.float64))
    assert got.dtype == dtype and got.shape == want.shape
    tol = {np.float64: 1e-12, np.float32: 2e-5, np.float16: 2e-3}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))

def test_det_needs_pivoting_and_matches_onnxruntime():
  """A tiny leading entry: without row swaps, float32 elimination loses everything; with partial pivoting it's accurate."""
  x = np.array([[[1e-8, 1.0, 2.0], [1.0, 3.0, 1.0], [2.0, 1.0, 5.0]], [[0, 0, 1], [0, 1, 0], [1, 0, 0]]], np.float32)
  m = _model("Det", {"x": x}, TensorProto.FLOAT, 11)
  got = _run(m, {"x": x})
  np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=1e-6)
  np.testing.assert_allclose(got, _ort(m, {"x": x}), rtol=1e-5)

def test_det_edge_shapes_and_refusals():
  z = np.zeros((3, 0, 0), np.float32)
  np.testing.assert_array_equal(_run(_model("Det", {"x": z}, TensorProto.FLOAT, 22), {"x": z}), np.ones(3, np.float32))
  for shape in ((65, 65), (2, 3)):
    x = np.zeros(shape, np.float32)
    with pytest.raises(NotImplementedError, match=r"'nd' \(op Det"):
      _run(_model("Det", {"x": x}, TensorProto.FLOAT, 22), {"x": x})

# ---- BitCast -----------------------------------------------------------------------------------------------------------

def test_bitcast_keeps_every_bit():
  f = np.array([[1.5, -0.0, np.nan, -np.inf], [np.float32(1e-45), 3.0, -2.5, 0.0]], np.float32)
  f.view(np.uint32)[0, 2] = 0x7FC12345  # a nan payload
  for x, to in ((f, np.int32), (f, np.uint32), (f.view(np.int32), np.float32), (f.astype(np.float16), np.int16),
                (np.array([True, False, True]), np.uint8), (np.arange(-3, 3, dtype=np.int16), np.uint16),
                (np.array([-1, 2**62], np.int64), np.float64)):
    m = _model("BitCast", {"x": x}, NP2ONNX[np.dtype(to)], 26, to=NP2ONNX[np.dtype(to)])
    got = _run(m, {"x": x})
    assert got.dtype == to
    np.testing.assert_array_equal(got.view(np.uint8), x.view(to).view(np.uint8))

def test_bitcast_size_change_refused():
  x = np.zeros(4, np.float32)
  with pytest.raises(NotImplementedError, match=r"'nd' \(op BitCast.*sizes differ"):
    _run(_model("BitCast", {"x": x}, TensorProto.INT64, 26, to=TensorProto.INT64), {"x": x})

def test_bitcast_matches_onnxruntime():
  x = np.random.default_rng(5).standard_normal((3, 5)).astype(np.float32)
  m = _model("BitCast", {"x": x}, TensorProto.INT32, 26, to=TensorProto.INT32)
  np.testing.assert_array_equal(_run(m, {"x": x}), _ort(m, {"x": x}))

# ---- ReverseSequence ---------------------------------------------------------------------------------------------------

def ref_reverse_sequence(x: np.ndarray, lens: np.ndarray, batch_axis: int, time_axis: int) -> np.ndarray:
  out = x.copy()
  for b, L in enumerate(lens):
    for t in range(int(L)):
      dst, src = [slice(None)] * x.ndim, [slice(None)] * x.ndim
      dst[batch_axis] = src[batch_axis] = b
      dst[time_axis], src[time_axis] = t, int(L) - 1 - t
      out[tuple(dst)] = x[tuple(src)]
  return out

@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_reverse_sequence_lengths_from_input(batch_axis, time_axis, dtype):
  rng = np.random.default_rng(6)
  shape = [0, 0, 3]
  shape[batch_axis], shape[time_axis] = 4, 6
  x = (rng.standard_normal(shape) * 4).astype(dtype)
  m = _model("ReverseSequence", {"x": x, "l": np.zeros(4, np.int64)}, NP2ONNX[np.dtype(dtype)], 10, batch_axis=batch_axis, time_axis=time_axis)
  mod = tox.load(m)
  for lens in (np.array([6, 1, 0, 3]), np.array([2, 6, 5, 4])):
    np.testing.assert_array_equal(mod.run({"x": x, "l": lens})["y"], ref_reverse_sequence(x, lens, batch_axis, time_axis))

def test_reverse_sequence_exact_bits_and_bfloat16_opset28():
  x = np.array([[-0.0, 1.0], [np.nan, -0.0], [2.0, np.inf]], np.float32)  # (time 3, batch 2)
  m = _model("ReverseSequence", {"x": x}, TensorProto.FLOAT, 28, {"l": np.array([3, 2], np.int64)})
  got = _run(m, {"x": x})
  want = ref_reverse_sequence(x, np.array([3, 2]), 1, 0)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

def test_reverse_sequence_errors_and_onnxruntime():
  x = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
  m = _model("ReverseSequence", {"x": x, "l": np.zeros(3, np.int64)}, TensorProto.FLOAT, 10, batch_axis=1, time_axis=0)
  with pytest.raises(IndexError, match=r"'nd' \(op ReverseSequence.*length 5 is out of range for axis 0 of size 4 \(valid: 0..4\)"):
    _run(m, {"x": x, "l": np.array([1, 5, 2])})
  with pytest.raises(IndexError, match=r"'nd' \(op ReverseSequence.*length -1 is out of range"):  # (a length is never counted from the end)
    _run(m, {"x": x, "l": np.array([1, -1, 2])})
  lens = np.array([4, 1, 3], np.int64)
  np.testing.assert_array_equal(_run(m, {"x": x, "l": lens}), _ort(m, {"x": x, "l": lens}))
  with pytest.raises(NotImplementedError, match=r"'nd' \(op ReverseSequence"):
    _run(_model("ReverseSequence", {"x": x, "l": np.zeros(3, np.int64)}, TensorProto.FLOAT, 10, batch_axis=1, time_axis=2), {"x": x, "l": lens})

# ---- SwiGLU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_swiglu(dtype):
  rng = np.random.default_rng(7)
  a, b = (rng.standard_normal((3, 5, 8)) * 3).astype(dtype), rng.standard_normal((3, 5, 8)).astype(dtype)
  for attrs in ({}, {"alpha": 1.702}):
    got = _run(_model("SwiGLU", {"a": a, "b": b}, NP2ONNX[np.dtype(dtype)], 28, **attrs), {"a": a, "b": b})
    A, B = a.astype(np.float64), b.astype(np.float64)
    want = A / (1 + np.exp(-float(np.float32(attrs.get("alpha", 1.0))) * A)) * B  # (the attribute is stored as a float32)
    assert got.dtype == dtype
    tol = {np.float32: 1e-5, np.float16: 1e-3, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
  with pytest.raises(NotImplementedError, match=r"'nd' \(op SwiGLU.*identical shapes"):
    _run(_model("SwiGLU", {"a": a, "b": b[:, :1]}, NP2ONNX[np.dtype(dtype)], 28), {"a": a, "b": b[:, :1]})
