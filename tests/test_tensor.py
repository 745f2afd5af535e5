"""The Tensor API around the ops (DESIGN §8): constructors, getting data out (numpy/tolist/item),
realize/contiguous/to, dtypes a device can't hold, missing devices, seeded random numbers computed
by kernels, and symbolic shapes through Variable (one compiled kernel reused for every value)."""
from __future__ import annotations
from typing import Any, Optional
import numpy as np
import pytest
from tilecraft import Context, Tensor, Variable, dtypes
from tilecraft.device import Device, DeviceUnavailable
from tilecraft.engine import plan_cache
from tilecraft.ops import MetaOps, UnaryOps

def same(got: Any, want: np.ndarray) -> None:
  """Equal values and dtype (NaN equal to NaN)."""
  got = got.numpy() if isinstance(got, Tensor) else got
  assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
  assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
  np.testing.assert_array_equal(got, want)

# ---- constructors ----------------------------------------------------------------------------------------

NP_ARRAYS = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([[1, -2], [3, 4]], np.int64), np.array([True, False, True]),
             np.array([1.5, -2.25, np.inf, np.nan], np.float64), np.array([1, 2, 65535], np.uint16), np.array([2**63 + 5], np.uint64),
             np.array([-1.5, 65504.0], np.float16), np.array(3.5, np.float32), np.zeros((0, 3), np.int8), np.zeros((2, 0, 1), np.float32),
             np.arange(24, dtype=np.int32).reshape(2, 3, 4).transpose(2, 0, 1), np.arange(10, dtype=np.int16)[::3]]

@pytest.mark.parametrize("arr", NP_ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_from_numpy_roundtrip(device: str, arr: np.ndarray) -> None:
  t = Tensor(arr, device=device)
  assert t.shape == arr.shape and t.dtype == dtypes.from_np(arr.dtype) and t.device == device and t.ndim == arr.ndim
  same(t, arr)
  if arr.dtype.kind == "f" and np.isnan(arr).any(): np.testing.assert_array_equal(np.array(t.tolist(), dtype=arr.dtype), arr)
  else: assert t.tolist() == arr.tolist()
  arr2 = arr.copy()
  t2 = Tensor(arr2, device=device)
  if arr2.size: arr2.reshape(-1)[0] = 0  # the tensor holds a copy
  same(t2, arr)

def test_from_lists_and_scalars() -> None:
  same(Tensor([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]], np.int32))  # python ints: default_int
  same(Tensor([1.5, 2]), np.array([1.5, 2], np.float32))  # python floats: default_float
  same(Tensor([True, False]), np.array([True, False]))
  same(Tensor([2**40, 1]), np.array([2**40, 1], np.int64))  # ints that don't fit int32 widen
  same(Tensor((1, 2, 3)), np.array([1, 2, 3], np.int32))
  same(Tensor([]), np.zeros((0,), np.float32))
  same(Tensor([[], []]), np.zeros((2, 0), np.float32))
  same(Tensor([1, 2], dtype=dtypes.float16), np.array([1, 2], np.float16))
  same(Tensor([1, 2], dtype="int8"), np.array([1, 2], np.int8))
  same(Tensor(np.float32(2.5)), np.array(2.5, np.float32))  # numpy scalars keep their dtype and are 0-d
  assert Tensor(3).shape == () and Tensor(3).dtype == dtypes.int32 and Tensor(3).item() == 3
  assert Tensor(2.5).dtype == dtypes.float32 and Tensor(2.5).item() == 2.5
  assert Tensor(True).dtype == dtypes.bool and Tensor(True).item() is True
  assert Tensor(2**40).dtype == dtypes.int64 and Tensor(2**40).item() == 2**40
  assert Tensor(7, dtype=dtypes.float64).item() == 7.0 and Tensor(7, dtype=dtypes.float64).tolist() == 7.0
  with pytest.raises(ValueError, match="ragged"): Tensor([[1, 2], [3]])
  with pytest.raises(TypeError): Tensor(["a", "b"])
  with pytest.raises(TypeError): Tensor(np.array([1 + 2j]))
  with pytest.raises(TypeError): Tensor({1: 2})

def test_from_tensor() -> None:
  a = Tensor([1, 2, 3])
  assert Tensor(a).lazydata is a.lazydata
  same(Tensor(a, dtype=dtypes.float32), np.array([1, 2, 3], np.float32))

@pytest.mark.opencl
def test_from_tensor_to_other_device() -> None:
  b = Tensor(Tensor([1.5, 2.5]) * 2, device="OPENCL")
  assert b.device == "OPENCL"
  same(b, np.array([3.0, 5.0], np.float32))

def test_full_zeros_ones_empty() -> None:
  device = "CPU"
  same(Tensor.zeros(2, 3, device=device), np.zeros((2, 3), np.float32))
  same(Tensor.zeros((2, 3), dtype=dtypes.int32, device=device), np.zeros((2, 3), np.int32))
  same(Tensor.ones(4, device=device), np.ones(4, np.float32))
  same(Tensor.full((2, 1, 3), 7, device=device), np.full((2, 1, 3), 7, np.int32))
  same(Tensor.full((3,), 2.5, dtype=dtypes.float16, device=device), np.full(3, 2.5, np.float16))
  same(Tensor.full((2,), True, device=device), np.array([True, True]))
  same(Tensor.full((), -1.5, device=device), np.array(-1.5, np.float32))
  same(Tensor.zeros(0, 3, device=device), np.zeros((0, 3), np.float32))
  same(Tensor.full((2, 0), 1, device=device), np.zeros((2, 0), np.int32))
  e = Tensor.empty(3, 4, dtype=dtypes.int16, device=device)
  assert e.shape == (3, 4) and e.dtype == dtypes.int16 and e.numpy().shape == (3, 4)
  assert Tensor.empty(0, device=device).numpy().shape == (0,)
  with pytest.raises(ValueError, match="negative"): Tensor.zeros(2, -1)
  with pytest.raises(TypeError, match="non-integer"): Tensor.zeros(2, 1.5)

@pytest.mark.parametrize("args,kw", [((5,), {}), ((2, 11, 3), {}), ((10, 2, -3), {}), ((0, 1, 0.25), {}), ((0.5, 3), {}), ((0,), {}),
                                     ((1,), {}), ((-3, 4), {"dtype": dtypes.int16}), ((3,), {"dtype": dtypes.float64}), ((5, 1), {})], ids=str)
def test_arange(args: tuple, kw: dict) -> None:
  want = np.arange(*args)
  want = want.astype(kw["dtype"].np if "dtype" in kw else np.float32 if want.dtype.kind == "f" else np.int64)  # numpy: int64 for python ints
  same(Tensor.arange(*args, **kw), want)

@pytest.mark.parametrize("args", [(0, 3 * 2**30, 2**30), (2**31 + 5, 2**31 + 10), (-2**40, 2**40, 2**39), (2**63 - 3, 2**63 - 1), (10, -2**40, -2**39)], ids=str)
def test_arange_python_ints_are_int64(args: tuple) -> None:
  """int32 wrapped: arange(0, 3*2**30, 2**30) ended negative and arange(2**31+5, 2**31+10) raised OverflowError."""
  same(Tensor.arange(*args), np.arange(*args, dtype=np.int64))
  with pytest.raises(OverflowError, match="int64"): Tensor.arange(2**63, 2**63 + 2)

@pytest.mark.parametrize("n,m", [(3, None), (2, 4), (4, 2), (1, None), (0, None), (0, 3)], ids=str)
def test_eye(n: int, m: Optional[int]) -> None:
  same(Tensor.eye(n, m), np.eye(n, m, dtype=np.float32))

def test_constructors_on_devices(device: str) -> None:
  same(Tensor.arange(1, 8, 2, device=device), np.arange(1, 8, 2, dtype=np.int64))
  same(Tensor.eye(3, 2, dtype=dtypes.int32, device=device), np.eye(3, 2, dtype=np.int32))
  same(Tensor.full((2, 1, 3), 7, device=device), np.full((2, 1, 3), 7, np.int32))
  same(Tensor.zeros(0, 3, device=device), np.zeros((0, 3), np.float32))
  assert Tensor.empty(2, device=device).numpy().shape == (2,)

# ---- getting data out, realize, contiguous, to --------------------------------------------------------------

def test_item_tolist_numpy() -> None:
  t = Tensor(np.array([[1.5]], np.float32))
  assert t.item() == 1.5 and isinstance(t.item(), float)
  assert Tensor([7]).item() == 7 and isinstance(Tensor([7]).item(), int)
  assert Tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
  assert (Tensor([1, 2]) + 1).tolist() == [2, 3]
  assert Tensor(np.zeros((0, 2), np.float32)).tolist() == []
  with pytest.raises(ValueError, match=r"exactly one element.*\(2,\)"): Tensor([1, 2]).item()
  with pytest.raises(ValueError, match=r"\(0,\)"): Tensor([]).item()
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  same(x.T, np.arange(6, dtype=np.float32).reshape(2, 3).T)  # a strided view reads back in logical order
  assert len(x) == 2 and x.numel() == 6 and "(2, 3)" in repr(x)
  with pytest.raises(TypeError): len(Tensor(1.0))

def test_realize_and_contiguous() -> None:
  a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  b = (a * 2).exp2()
  assert len(b.schedule()) == 1
  assert b.realize() is b
  assert b.schedule() == []  # realized: nothing left to run, and nothing recomputed by readers
  sched = (b + 1).schedule()
  assert len(sched) == 1 and not any(op.op is UnaryOps.EXP2 for op in sched[0].ast.lazyops)
  same(b, np.exp2(np.arange(6, dtype=np.float32).reshape(2, 3) * 2))
  c = a.T.contiguous()
  assert len(c.schedule()) == 1  # a copy kernel into a new buffer in the permuted order
  c.realize()
  assert c.lazydata.realized and not c.lazydata.is_view
  same(c, np.arange(6, dtype=np.float32).reshape(2, 3).T.copy())
  assert a.contiguous().schedule() == []  # already a contiguous buffer: no copy
  assert Tensor(np.zeros((0, 3), np.float32)).realize().numpy().shape == (0, 3)
  r1, r2 = (a + 1), (a - 1)
  r1.realize(r2)  # several at once
  assert r1.schedule() == [] and r2.schedule() == []

@pytest.mark.opencl
def test_to_device_and_back() -> None:
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  a = Tensor(x)
  assert a.to("cpu") is a
  b = (a.T * 2).to("OPENCL")
  assert b.device == "OPENCL"
  c = (b + 1).to("CPU")
  assert c.device == "CPU"
  same(c, x.T * 2 + 1)
  same(Tensor(np.zeros((0, 2), np.int32)).to("OPENCL"), np.zeros((0, 2), np.int32))
  with pytest.raises(ValueError, match="CPU and OPENCL"): a + b

def test_missing_devices() -> None:
  with pytest.raises(DeviceUnavailable, match="METAL"): Tensor([1, 2], device="METAL")
  with pytest.raises(DeviceUnavailable, match="METAL"): Tensor.zeros(2, device="METAL").realize()
  with pytest.raises(DeviceUnavailable, match="CUDA"): Tensor([1, 2]).to("CUDA")
  with pytest.raises(DeviceUnavailable, match="HIP"): Tensor.rand(3, device="HIP")
  with pytest.raises(ValueError, match="unknown device 'FOO'"): Tensor([1, 2], device="FOO")
  with pytest.raises(ValueError, match="unknown device"): Tensor([1]).to("gpu0")

# ---- dtypes a tensor or device can't hold ----------------------------------------------------------------------

@pytest.mark.parametrize("bad", [dtypes.float32.vec(4), dtypes.void, dtypes.float32.ptr()], ids=repr)
def test_non_tensor_dtypes(bad: Any) -> None:
  with pytest.raises(TypeError, match="can't hold"): Tensor([1, 2], dtype=bad)
  with pytest.raises(TypeError, match="can't hold"): Tensor([1, 2]).cast(bad)
  with pytest.raises(TypeError, match="can't hold"): Tensor.zeros(2, dtype=bad)

def test_dtype_unsupported_on_device(monkeypatch: pytest.MonkeyPatch) -> None:
  """A device whose renderer has no float64 type rejects float64 tensors up front, naming both."""
  import tilecraft.tensor as tensor_mod
  renderer = Device["CPU"].renderer
  names = dict(renderer.type_names)
  del names[dtypes.float64]
  monkeypatch.setattr(renderer, "type_names", names)
  tensor_mod._check_dtype.cache_clear()
  try:
    with pytest.raises(TypeError, match="double.*CPU|float64.*CPU|CPU.*double"): Tensor([1.0, 2.0], dtype=dtypes.float64)
    with pytest.raises(TypeError, match="CPU"): Tensor(np.array([1.0]))
    with pytest.raises(TypeError, match="CPU"): Tensor([1.0]).cast(dtypes.float64)
    with pytest.raises(TypeError, match="CPU"): Tensor([1, 2]) / Tensor(np.array([1.0]))
    same(Tensor([1.0, 2.0]) * 2, np.array([2.0, 4.0], np.float32))  # other dtypes still work
  finally:
    monkeypatch.undo()
    tensor_mod._check_dtype.cache_clear()

def test_a_device_fact_rules_out_a_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
  """A dtype the renderer names but the device can't compute with (an OpenCL device without
  cl_khr_fp64: `Compiled.missing_dtypes`) is rejected up front with the device's reason."""
  import tilecraft.tensor as tensor_mod
  monkeypatch.setattr(Device["CPU"], "missing_dtypes", {"double": "this CPU has no double precision (a test)"})
  tensor_mod._check_dtype.cache_clear()
  try:
    with pytest.raises(TypeError, match="no double precision \\(a test\\)"): Tensor(np.array([1.0]))
    same(Tensor([1.0, 2.0]) * 2, np.array([2.0, 4.0], np.float32))
  finally:
    monkeypatch.undo()
    tensor_mod._check_dtype.cache_clear()

def test_bitcast() -> None:
  x = np.array([1.0, -2.0, np.inf], np.float32)
  same(Tensor(x).bitcast(dtypes.uint32), x.view(np.uint32))
  same(Tensor(x.view(np.int32)).bitcast("float"), x)
  with pytest.raises(ValueError, match="item sizes"): Tensor(x).bitcast(dtypes.int16)

# ---- random numbers ----------------------------------------------------------------------------------------

def test_rand_is_seedable_and_computed_by_kernels() -> None:
  Tensor.manual_seed(1234)
  a, b = Tensor.rand(200), Tensor.rand(200)
  sched = a.schedule()
  produced = {id(si.bufs[0]) for si in sched}
  for si in sched:  # everything is computed on the device: no input comes from the host
    assert si.ast.op is MetaOps.KERNEL and all(id(x) in produced for x in si.inputs)
  an, bn = a.numpy(), b.numpy()
  Tensor.manual_seed(1234)
  same(Tensor.rand(200), an)  # same seed, same numbers
  same(Tensor.rand(200), bn)
  assert not np.array_equal(an, bn)  # different calls, different numbers
  Tensor.manual_seed(1235)
  assert not np.array_equal(Tensor.rand(200).numpy(), an)
  assert an.dtype == np.float32 and ((an >= 0) & (an < 1)).all()

def test_rand_statistics() -> None:
  Tensor.manual_seed(7)
  u = Tensor.rand(40, 50).numpy().reshape(-1)
  assert u.shape == (2000,)
  assert abs(u.mean() - 0.5) < 0.03 and abs(u.var() - 1 / 12) < 0.01
  hist = np.histogram(u, bins=10, range=(0, 1))[0]
  assert hist.min() > 140 and hist.max() < 260, hist  # ~200 per bin
  assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.1  # neighbours are not correlated
  z = Tensor.randn(2000).numpy()
  assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1 and np.isfinite(z).all()
  assert 0.6 < np.mean(np.abs(z) < 1) < 0.76  # ~68% within one sigma

def test_rand_shapes_dtypes() -> None:
  device = "CPU"
  Tensor.manual_seed(3)
  r = Tensor.rand(2, 3, dtype=dtypes.float16, device=device)
  assert r.shape == (2, 3) and r.dtype == dtypes.float16 and r.device == device
  v = r.numpy()
  assert ((v >= 0) & (v <= 1)).all()
  assert Tensor.rand(0, 4, device=device).numpy().shape == (0, 4)
  assert Tensor.randn((3,), device=device).shape == (3,)

@pytest.mark.opencl
def test_rand_same_on_every_device() -> None:
  Tensor.manual_seed(99)
  a = Tensor.rand(5, 7).numpy()
  Tensor.manual_seed(99)
  same(Tensor.rand(5, 7, device="OPENCL"), a)
  assert Tensor.rand(0, 4, device="OPENCL").numpy().shape == (0, 4)

# ---- symbolic shapes -----------------------------------------------------------------------------------------

def test_symbolic_shrink_reuses_one_kernel(device: str) -> None:
  """A bound Variable in shrink: the kernel compiled for one value runs for every other value."""
  x = np.arange(40, dtype=np.float32).reshape(5, 8)
  X = Tensor(x, device=device)
  n = Variable("n", 1, 8)
  def f(v: int) -> Tensor: return (X.shrink(((0, 5), (0, n.bind(v)))) * 2 + 1).sum(1)
  same(f(3), (x[:, :3] * 2 + 1).sum(1))
  before = plan_cache.counts.runner_misses
  for v in (5, 8, 1):
    same(f(v), (x[:, :v] * 2 + 1).sum(1))
  assert plan_cache.counts.runner_misses == before, "a new value of the Variable compiled a new kernel"

def test_symbolic_reshape_and_numpy() -> None:
  n = Variable("m", 1, 8)
  base = Tensor(np.arange(24, dtype=np.float32))
  def g(v: int) -> Tensor: return base.shrink(((0, n.bind(v) * 3),)).reshape(n.bind(v), 3)
  t = g(4)
  assert isinstance(t.shape[0], Variable) and t.shape[1] == 3
  same(t.sum(0), np.arange(12, dtype=np.float32).reshape(4, 3).sum(0))
  same(t * 2, np.arange(12, dtype=np.float32).reshape(4, 3) * 2)  # numpy() uses the bound value
  before = plan_cache.counts.runner_misses
  same(g(7).sum(0), np.arange(21, dtype=np.float32).reshape(7, 3).sum(0))
  same(g(7) * 2, np.arange(21, dtype=np.float32).reshape(7, 3) * 2)
  assert plan_cache.counts.runner_misses == before
  same(g(5).mean(0), np.arange(15, dtype=np.float32).reshape(5, 3).mean(0))  # the count is the Variable
  unbound = base.shrink(((0, Variable("k", 1, 8) * 3),))
  with pytest.raises(ValueError, match="bind"): unbound.numpy()

def test_symbolic_matmul() -> None:
  n = Variable("s", 1, 8)
  a, b = np.random.rand(4, 8).astype(np.float32), np.random.rand(8, 3).astype(np.float32)
  A, B = Tensor(a), Tensor(b)
  def mm(v: int) -> Tensor: return A.shrink(((0, 4), (0, n.bind(v)))) @ B.shrink(((0, n.bind(v)), (0, 3)))
  np.testing.assert_allclose(mm(5).numpy(), a[:, :5] @ b[:5], rtol=1e-5)
  before = plan_cache.counts.runner_misses
  np.testing.assert_allclose(mm(2).numpy(), a[:, :2] @ b[:2], rtol=1e-5)
  assert plan_cache.counts.runner_misses == before

def test_variable_as_value() -> None:
  v = Variable("c", 0, 10)
  same(Tensor.ones(3, dtype=dtypes.int32) * Tensor(v.bind(4)), np.full(3, 4, np.int32))
  same(Tensor.ones(3, dtype=dtypes.int32) + v.bind(6), np.full(3, 7, np.int32))

# ---- settings ------------------------------------------------------------------------------------------------

def test_debug2_prints_a_line_per_kernel(capsys: pytest.CaptureFixture) -> None:
  a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  out = (a - a.max(1, keepdim=True)).exp()
  n = len(out.schedule())
  with Context(DEBUG=2): out.realize()
  lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("***")]
  assert len(lines) == n == 2

# ---- truth values and bad arguments (numpy's rules, clear errors) ------------------------------------------

def test_bool_of_a_tensor_is_numpys() -> None:
  assert bool(Tensor([0.])) is False and bool(Tensor([3])) is True and bool(Tensor(True)) is True and bool(Tensor([[0]])) is False
  for t in (Tensor([1., 2.]), Tensor.zeros(0), Tensor.ones(2, 3)):
    with pytest.raises(ValueError, match="truth value of a tensor of shape"): bool(t)
  t = Tensor([1., -2.])
  assert not (t.sum() > 0) and (t.sum() < 0) and bool(t.max() == 1)  # a 0-d comparison works in an `if`

def test_in_list_compares_values_not_length() -> None:
  a, b = Tensor([1.]), Tensor([2.])
  assert a not in [b] and a in [a] and Tensor([2.]) in [a, b]
  with pytest.raises(ValueError, match="ambiguous"): Tensor([1., 2.]) in [Tensor([3., 4.])]  # noqa: B015 (numpy raises too)

def test_sign_of_nan_is_nan(device: str) -> None:
  x = np.array([np.nan, -np.inf, -2.5, -0.0, 0.0, 3.0, np.inf], np.float32)
  same(Tensor(x, device=device).sign(), np.sign(x))
  same(Tensor(x.astype(np.float64), device=device).sign(), np.sign(x.astype(np.float64)))
  same(Tensor(np.array([-3, 0, 4], np.int32), device=device).sign(), np.array([-1, 0, 1], np.int32))

@pytest.mark.parametrize("call, match", [(lambda: Tensor.cat(), "cat needs at least one tensor"), (lambda: Tensor.stack(), "stack needs at least one tensor"),
                                         (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(stride=0), "stride must be 2 positive"),
                                         (lambda: Tensor.ones(1, 1, 4, 4).avg_pool2d(kernel_size=(2, 0)), "kernel size must be 2 positive"),
                                         (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(dilation=-1), "dilation must be 2 positive"),
                                         (lambda: Tensor.ones(4).max_pool2d(), "at least 2 dims"),
                                         (lambda: Tensor.arange(0, 10, 0), "step must not be zero"), (lambda: Tensor.arange(0, 10, 0.0), "step must not be zero"),
                                         (lambda: Tensor.arange(0, float("inf")), "finite"), (lambda: Tensor.arange(float("nan")), "finite")],
                         ids=["cat", "stack", "pool-stride0", "pool-k0", "pool-dil", "pool-1d", "arange-step0", "arange-step0.0", "arange-inf", "arange-nan"])
def test_bad_arguments_name_the_problem(call: Any, match: str) -> None:
  with pytest.raises(ValueError, match=match): call()

@pytest.mark.parametrize("call, exc, match", [
  (lambda: Tensor(3.0).cumsum(), ValueError, "cumsum.*0-d"), (lambda: Tensor(3.0).softmax(), ValueError, "softmax of a 0-d"),
  (lambda: Tensor(3.0).log_softmax(), ValueError, "log_softmax of a 0-d"), (lambda: Tensor.eye(-1), ValueError, "non-negative"),
  (lambda: Tensor.eye(2, -3), ValueError, "non-negative"), (lambda: Tensor.ones(3).pad(((-5, 0),)), ValueError, "remove 5 elements from an axis of 3"),
  (lambda: Tensor.ones(3).pad(((-2, -2),)), ValueError, "remove 4"), (lambda: Tensor.ones(3).pad(((1.5, 0),)), TypeError, "integers"),
  (lambda: Tensor.ones(3).unsqueeze(7), IndexError, "axis 7"), (lambda: Tensor.ones(3).unsqueeze(-3), IndexError, "axis -3"),
  (lambda: Tensor.rand(-1), ValueError, "negative"), (lambda: Tensor.randn(2, -1), ValueError, "negative")],
  ids=["cumsum-0d", "softmax-0d", "log_softmax-0d", "eye-1", "eye-m", "pad-neg", "pad-neg-both", "pad-float", "unsqueeze7", "unsqueeze-3", "rand-1", "randn-1"])
def test_bad_arguments_raise_clear_errors(call: Any, exc: type, match: str) -> None:
  """These crashed deep inside (IndexError: tuple index out of range, 'cannot add float 1.5 to a symbolic
  expression', a shrink out of range) or were silently accepted (unsqueeze(7) on a 1-d tensor, rand(-1))."""
  with pytest.raises(exc, match=match): call()

def test_numpy_dtypes_and_byte_orders_are_accepted() -> None:
  """cast(np.float16) and dtype=np.int16 name numpy dtypes; big-endian arrays are read by value."""
  same(Tensor.ones(3).cast(np.float16), np.ones(3, np.float16))
  same(Tensor([1, 2], dtype=np.int16), np.array([1, 2], np.int16))
  same(Tensor.ones(2).cast(np.dtype("float64")), np.ones(2))
  for a in (np.arange(5, dtype=">i4"), np.array([1.5, -2.0, np.inf], dtype=">f8"), np.arange(6, dtype=">u2").reshape(2, 3)[:, ::2]):
    same(Tensor(a) * 1, (a * 1).astype(a.dtype.newbyteorder("=")))
  same(Tensor(3.0).cumsum(None), np.cumsum(np.float32(3.0)))

def test_softmax_family_of_empty_tensors() -> None:
  """softmax over an empty axis has nothing to normalize: an empty result (max over it had 'no identity');
  logsumexp over one is log(0) = -inf, as in scipy."""
  for shape, axis in (((3, 0), -1), ((0, 3), 1), ((2, 0, 4), 1)):
    for op in ("softmax", "log_softmax"):
      same(getattr(Tensor.zeros(*shape), op)(axis), np.zeros(shape, np.float32))
  same(Tensor.zeros(3, 0).logsumexp(1), np.full(3, -np.inf, np.float32))
  same(Tensor.zeros(3, 0).logsumexp(), np.float32(-np.inf).reshape(()))
  same(Tensor.zeros(0, 3).logsumexp(1), np.zeros(0, np.float32))
