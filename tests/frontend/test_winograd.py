"""Winograd 3x3 convs (tilecraft/frontend/winograd.py) against a float64 numpy conv: the transform
matrices satisfy F(m, 3)'s identity, F(2x2) and F(4x4) on odd sizes, every padding, batch 2, with and
without bias, float64; conv2d's WINO paths (0 never, 1 the measured rule, 2 every eligible conv) and the
convs left to the direct kernel (stride, dilation, groups, 1x1, half, other devices); an ONNX Conv's
weight transform computed once at load, not per call."""
from __future__ import annotations
import numpy as np
import pytest
from tilecraft import Context, Tensor
from tilecraft.frontend import winograd as wg
from tilecraft.ops import MetaOps

def _np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pad: tuple[int, int]) -> np.ndarray:
  """3x3 stride-1 correlation in float64."""
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
  oh, ow = xp.shape[2] - 2, xp.shape[3] - 2
  out = sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3))
  return out + (b.astype(np.float64).reshape(1, -1, 1, 1) if b is not None else 0)

def _kernels(t: Tensor) -> int:
  return sum(si.ast.op is MetaOps.KERNEL for si in t.schedule())

def _close(out: np.ndarray, ref: np.ndarray, tol: float) -> None:
  assert out.shape == ref.shape
  np.testing.assert_allclose(out, ref, rtol=0, atol=tol * max(1.0, float(np.abs(ref).max())))

@pytest.mark.parametrize("m", [2, 4])
def test_transform_matrices(m: int) -> None:
  # 1-D F(m, 3): A^T [(G g) * (B^T d)] = the m outputs of correlating the a inputs d with the 3 taps g
  bt, g, at = wg.MATRICES[m]
  rng = np.random.default_rng(m)
  for _ in range(4):
    d, k = rng.standard_normal(m + 2), rng.standard_normal(3)
    np.testing.assert_allclose(at @ ((g @ k) * (bt @ d)), [d[i:i + 3] @ k for i in range(m)], rtol=1e-12, atol=1e-12)

CASES = [  # (n, cin, cout, h, w, padding, bias)
  (1, 5, 7, 9, 7, (1, 1), True), (2, 3, 4, 6, 11, (0, 0), False), (1, 4, 6, 5, 5, (2, 2), True),
  (1, 2, 3, 3, 3, (0, 0), True), (2, 6, 5, 10, 13, (1, 2), True), (1, 3, 2, 1, 4, (1, 1), False)]

@pytest.mark.parametrize("m", [2, 4])
def test_winograd_conv2d_vs_numpy(m: int) -> None:
  rng = np.random.default_rng(10 + m)
  outs, refs = [], []
  for n, cin, cout, h, w, pad, bias in CASES:
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    k = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) if bias else None
    outs.append(wg.winograd_conv2d(Tensor(x), Tensor(k), Tensor(b) if b is not None else None, pad, m))
    refs.append(_np_conv(x, k, b, pad))
  Tensor.realize(*outs)  # (one schedule: the kernels compile together)
  for o, r in zip(outs, refs): _close(o.numpy(), r, 2e-6 if m == 2 else 2e-5)

def test_float64() -> None:
  rng = np.random.default_rng(3)
  x, k, b = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((5, 4, 3, 3)), rng.standard_normal(5)
  with Context(WINO=2):
    out = Tensor(x).conv2d(Tensor(k), Tensor(b), padding=1)
    assert out.dtype == Tensor(x).dtype and _kernels(out) > 1
    _close(out.numpy(), _np_conv(x, k, b, (1, 1)), 1e-12)

def test_wino_setting_paths() -> None:
  # 32 -> 64 channels at 14^2: WINO=1's rule takes F(2x2) (49 tiles of 2x2); 8 -> 8 channels it leaves direct
  rng = np.random.default_rng(4)
  big = (rng.standard_normal((1, 32, 14, 14)).astype(np.float32), (rng.standard_normal((64, 32, 3, 3)) / 17).astype(np.float32), rng.standard_normal(64).astype(np.float32))
  small = (rng.standard_normal((1, 8, 14, 14)).astype(np.float32), rng.standard_normal((8, 8, 3, 3)).astype(np.float32), rng.standard_normal(8).astype(np.float32))
  expect = {0: (1, 1), 1: (5, 1), 2: (5, 5)}  # kernels per conv+relu: direct 1; Winograd the weight transform, input, matmul, output, NCHW copy+epilogue
  for mode, (kb, ks) in expect.items():
    with Context(WINO=mode):
      assert (wg.choose_tile(1, 32, 64, 14, 14) is not None) == (mode > 0)
      ob = Tensor(big[0]).conv2d(Tensor(big[1]), Tensor(big[2]), padding=1).relu()
      os_ = Tensor(small[0]).conv2d(Tensor(small[1]), Tensor(small[2]), padding=1).relu()
      assert (_kernels(ob), _kernels(os_)) == (kb, ks), mode
      if mode == 2: continue  # (the same graphs as mode 1's Winograd conv and test_winograd_conv2d_vs_numpy's)
      Tensor.realize(ob, os_)
      _close(ob.numpy(), np.maximum(_np_conv(*big, (1, 1)), 0), 2e-5)
      _close(os_.numpy(), np.maximum(_np_conv(*small, (1, 1)), 0), 2e-5)

def test_rule() -> None:
  with Context(WINO=1):
    assert [wg.choose_tile(1, c, c, s, s) for c, s in ((64, 56), (128, 28), (256, 14), (512, 7))] == [4, 4, 2, None]  # ResNet-50
    assert wg.choose_tile(1, 16, 64, 56, 56) is None and wg.choose_tile(1, 1024, 512, 28, 28) is None
    assert wg.choose_tile(1, 512, 512, 28, 28) == 4 and wg.choose_tile(1, 256, 512, 56, 56) == 4  # VGG-19: F(4x4) up to 512 channels,
    assert wg.choose_tile(1, 512, 512, 14, 14) is None and wg.choose_tile(1, 256, 512, 14, 14) is None  # not F(2x2)
    assert wg.choose_tile(1, 128, 32, 56, 56) == 4 and wg.choose_tile(1, 128, 32, 14, 14) is None  # DenseNet: F(4x4) only
    assert wg.choose_tile(1, 64, 256, 13, 13) is None and wg.choose_tile(1, 32, 128, 27, 27) == 4  # SqueezeNet
    assert wg.choose_tile(4, 256, 256, 8, 8) == 2 and wg.choose_tile(4, 256, 256, 7, 7) is None  # batch 4: 64 tiles of 2x2; partial tiles
  with Context(WINO=2): assert wg.choose_tile(1, 512, 512, 7, 7) == 2 and wg.choose_tile(1, 3, 3, 28, 28) == 4
  with Context(WINO=0): assert wg.choose_tile(1, 64, 64, 56, 56) is None

@pytest.mark.parametrize("kw", [dict(stride=2), dict(dilation=2), dict(groups=2), dict(ksize=1), dict(ksize=5), dict(dtype=np.float16)])
def test_not_eligible_stays_direct(kw: dict) -> None:
  rng = np.random.default_rng(5)
  ks, groups, dt = kw.get("ksize", 3), kw.get("groups", 1), kw.get("dtype", np.float32)
  x = rng.standard_normal((1, 4, 9, 9)).astype(dt)
  k = rng.standard_normal((4, 4 // groups, ks, ks)).astype(dt)
  with Context(WINO=2):
    xt, kt = Tensor(x), Tensor(k)
    assert not wg.eligible(xt, kt, (kw.get("stride", 1),) * 2, (kw.get("dilation", 1),) * 2, groups, None)
    out = xt.conv2d(kt, stride=kw.get("stride", 1), dilation=kw.get("dilation", 1), groups=groups, padding=1)
    assert _kernels(out) == 1

def test_devices_and_mixed_dtypes() -> None:
  x = Tensor(np.zeros((1, 4, 8, 8), np.float32))
  assert wg.eligible(x, Tensor(np.zeros((4, 4, 3, 3), np.float32)), (1, 1), (1, 1), 1, None)
  assert not wg.eligible(x, Tensor(np.zeros((4, 4, 3, 3), np.float64)), (1, 1), (1, 1), 1, None)  # mixed dtypes
  assert not wg.eligible(x, Tensor(np.zeros((4, 4, 3, 3), np.float32)), (1, 1), (1, 1), 1, np.float64)  # another accumulator
  xp = Tensor(np.zeros((1, 4, 8, 8), np.float32), device="PYTHON")
  assert not wg.eligible(xp, Tensor(np.zeros((4, 4, 3, 3), np.float32), device="PYTHON"), (1, 1), (1, 1), 1, None)

def test_llvm() -> None:
  pytest.importorskip("llvmlite")
  rng = np.random.default_rng(6)
  x, k = rng.standard_normal((1, 3, 7, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  with Context(WINO=2):
    out = Tensor(x, device="LLVM").conv2d(Tensor(k, device="LLVM"), padding=1)
    assert _kernels(out) == 4  # the weight transform, input, matmul, output (the NCHW result is a view of it)
    _close(out.numpy(), _np_conv(x, k, None, (1, 1)), 2e-5)

def test_onnx_weight_transform_folded_at_load() -> None:
  pytest.importorskip("onnx")
  from onnx import TensorProto, helper
  import tilecraft.onnx as tox
  from tilecraft.engine import realize
  rng = np.random.default_rng(7)
  w, b = rng.standard_normal((6, 4, 3, 3)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
  g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])], "g",
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                        initializer=[helper.make_tensor("w", TensorProto.FLOAT, list(w.shape), w.ravel()), helper.make_tensor("b", TensorProto.FLOAT, [6], b)])
  proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
  with Context(WINO=2):
    m = tox.load(proto)
    m.run({"x": x})
    k0 = realize.kernel_count
    y = m.run({"x": x})["y"]
  _close(y, np.maximum(_np_conv(x, w, b, (1, 1)), 0), 2e-5)
  # input transform, matmul, output transform, NCHW copy + bias + relu; the weight transform (a 5th kernel in
  # Tensor code) ran once, at the build (graph.py: _fold_weight_computations); load(fold=False) runs it per call
  assert realize.kernel_count - k0 == 4
