"""Tests for tilecraft.dtype: dtype objects, numpy mapping, promotion, value ranges, truncation, bfloat16 bits."""
import itertools, math, pickle, warnings
from fractions import Fraction
import numpy as np
import pytest
from hypothesis import given, strategies as st
from tilecraft.dtype import (DType, PtrDType, ImageDType, dtypes, to_dtype, least_upper_dtype, least_upper_float,
                             bf16_bits_from_f32, f32_from_bf16_bits, truncate)

# (dtype, C name, itemsize, numpy dtype or None)
SCALARS = [
  (dtypes.bool, "bool", 1, np.bool_), (dtypes.int8, "char", 1, np.int8), (dtypes.uint8, "uchar", 1, np.uint8),
  (dtypes.int16, "short", 2, np.int16), (dtypes.uint16, "ushort", 2, np.uint16), (dtypes.int32, "int", 4, np.int32),
  (dtypes.uint32, "uint", 4, np.uint32), (dtypes.int64, "long", 8, np.int64), (dtypes.uint64, "ulong", 8, np.uint64),
  (dtypes.float16, "half", 2, np.float16), (dtypes.bfloat16, "bfloat16", 2, None),
  (dtypes.float32, "float", 4, np.float32), (dtypes.float64, "double", 8, np.float64),
]
ALL = [s[0] for s in SCALARS]
NUMPY_ABLE = [s[0] for s in SCALARS if s[3] is not None]
INTS = [d for d in ALL if dtypes.is_int(d)]
FLOATS = [d for d in ALL if dtypes.is_float(d)]

# ---- dtype objects ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dt,name,itemsize,npdt", SCALARS)
def test_scalar_basics(dt, name, itemsize, npdt):
  assert (dt.name, dt.itemsize, dt.count) == (name, itemsize, 1)
  assert repr(dt) == f"dtypes.{name}" and eval(repr(dt)) is dt
  assert dt.scalar() is dt and to_dtype(name) is dt and to_dtype(dt) is dt

def test_aliases():
  assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64
  assert (dtypes.char, dtypes.uchar, dtypes.short, dtypes.ushort) == (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)
  assert (dtypes.int, dtypes.uint, dtypes.long, dtypes.ulong) == (dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64)
  assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32
  for n in ["float32", "float16", "half", "bfloat16", "int8", "uint64", "double", "bool"]: assert to_dtype(n) is getattr(dtypes, n)

def test_to_dtype_errors():
  with pytest.raises(ValueError, match="float8"): to_dtype("float8")
  with pytest.raises(ValueError): to_dtype(3)
  with pytest.raises(ValueError): to_dtype("default_float")

def test_fields():
  f = dtypes.fields()
  assert set(f.values()) == set(ALL) and all(d.count == 1 for d in f.values())
  assert f["float32"] is f["float"] is dtypes.float and "default_int" not in f
  f.clear()
  assert dtypes.fields()  # a copy, not our table

def test_priorities_order_kinds():
  assert len({d.priority for d in ALL}) == len(ALL)
  assert all(dtypes.bool.priority < i.priority < f.priority for i in INTS for f in FLOATS)

@pytest.mark.parametrize("dt", ALL)
@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_vec(dt, n):
  v = dt.vec(n)
  assert (v.count, v.itemsize, v.name, v.fmt, v.priority) == (n, dt.itemsize * n, f"{dt.name}{n}", dt.fmt, dt.priority)
  assert v.scalar() is dt and v is dt.vec(n) and v != dt and v != dt.vec(n + 1)
  assert repr(v) == f"dtypes.{dt.name}.vec({n})" and eval(repr(v)) == v
  assert v.np is None and dtypes.is_float(v) == dtypes.is_float(dt) and dtypes.is_int(v) == dtypes.is_int(dt)

def test_vec_edge_cases():
  assert dtypes.float.vec(1) is dtypes.float
  for bad in [0, -1, 2.0, True]:
    with pytest.raises(ValueError): dtypes.float.vec(bad)
  with pytest.raises(ValueError): dtypes.float.vec(4).vec(2)
  with pytest.raises(ValueError): dtypes.float.ptr().vec(4)
  # equal-but-separately-built scalars share the cached vectors, whose scalar() is the canonical object
  assert DType(11, 4, "float", "f", 1).vec(4).scalar() is dtypes.float

def test_ptr():
  p = dtypes.float.ptr()
  assert isinstance(p, PtrDType) and p.base is dtypes.float and not p.local and p.size == -1
  assert p != dtypes.float and dtypes.float != p and hash(p) != hash(dtypes.float) and p in {p} and dtypes.float not in {p}
  assert p is dtypes.float.ptr() and p == PtrDType(11, 4, "float", "f", 1, base=dtypes.float)
  assert p != dtypes.float.ptr(local=True) != dtypes.float.ptr(local=True, size=16) and p != dtypes.half.ptr()
  assert (p.itemsize, p.name, p.np) == (4, "float", np.dtype(np.float32)) and p.scalar() is p
  assert repr(p) == "dtypes.float.ptr()" and repr(dtypes.half.ptr(local=True)) == "dtypes.half.ptr(local=True)"
  assert repr(dtypes.int.ptr(size=16)) == "dtypes.int.ptr(size=16)"
  v = dtypes.float.vec(4).ptr(local=True, size=8)
  assert v.base == dtypes.float.vec(4) and v.itemsize == 16 and eval(repr(v)) == v
  assert not dtypes.is_float(p) and not dtypes.is_int(dtypes.int.ptr())
  with pytest.raises(ValueError): p.ptr()
  with pytest.raises(ValueError): least_upper_dtype(p, dtypes.float)

def test_image():
  im = dtypes.imagef((8, 16, 4))
  assert isinstance(im, ImageDType) and im.shape == (8, 16, 4) and im.base is dtypes.float and im.itemsize == 4
  assert im == dtypes.imagef((8, 16, 4)) and im != dtypes.imagef((8, 8, 4)) and im != dtypes.imageh((8, 16, 4))
  assert im != dtypes.float and hash(im) == hash(dtypes.imagef([8, 16, 4]))
  ih = dtypes.imageh((2, 3, 4))
  assert ih.base is dtypes.half and ih.itemsize == 2 and ih.np == np.dtype(np.float16)
  assert repr(im) == "dtypes.imagef((8, 16, 4))" and eval(repr(ih)) == ih
  for bad in [(8, 16), (8, 16, 3), (0, 4, 4), (2, 2, 2, 4)]:
    with pytest.raises(ValueError): dtypes.imagef(bad)
  with pytest.raises(ValueError): im.vec(4)
  with pytest.raises(ValueError): im.ptr()

def test_pickle():
  for dt in ALL + [dtypes.float.vec(4), dtypes.half.ptr(local=True, size=4), dtypes.imageh((1, 2, 4))]:
    assert pickle.loads(pickle.dumps(dt)) == dt
  assert pickle.loads(pickle.dumps(dtypes.float.vec(4))).scalar() == dtypes.float

def test_predicates():
  assert [d for d in ALL if dtypes.is_float(d)] == [dtypes.half, dtypes.bfloat16, dtypes.float, dtypes.double]
  assert [d for d in ALL if dtypes.is_unsigned(d)] == [dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]
  assert len(INTS) == 8 and not dtypes.is_int(dtypes.bool) and not dtypes.is_unsigned(dtypes.bool)
  assert [d for d in ALL if dtypes.is_bool(d)] == [dtypes.bool] and dtypes.is_bool(dtypes.bool.vec(4))

# ---- numpy mapping ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dt,name,itemsize,npdt", SCALARS)
def test_numpy_mapping(dt, name, itemsize, npdt):
  if npdt is None:
    assert dt.np is None and dt.fmt is None
    return
  assert dt.np == np.dtype(npdt) and dt.np.itemsize == dt.itemsize and np.dtype(dt.fmt) == dt.np
  assert dtypes.from_np(dt.np) is dt and dtypes.from_np(npdt) is dt

def test_from_np_platform_spellings():
  assert dtypes.from_np(np.dtype("l")) is dtypes.int64 and dtypes.from_np(np.intc) is dtypes.int32
  assert dtypes.from_np(bool) is dtypes.bool and dtypes.from_np("float32") is dtypes.float32

@pytest.mark.parametrize("bad,msg", [(np.complex64, "complex64"), (np.dtype("U3"), "str"), (object, "object"),
                                     (np.dtype(">f4"), "float32"), (np.dtype("datetime64[s]"), "datetime64"),
                                     (np.dtype([("a", "f4")]), "void")])
def test_from_np_unsupported(bad, msg):
  with pytest.raises(ValueError, match=f"unsupported numpy dtype.*{msg}"): dtypes.from_np(bad)

def test_from_np_not_a_dtype():
  for bad in [None, "not_a_dtype", 3.5]:
    with pytest.raises(ValueError): dtypes.from_np(bad)

def test_from_np_longdouble():
  if np.dtype(np.longdouble).itemsize == 8: pytest.skip("longdouble is float64 on this platform")
  with pytest.raises(ValueError, match="float"): dtypes.from_np(np.longdouble)

def test_from_py():
  assert dtypes.from_py(True) is dtypes.bool and dtypes.from_py(3) is dtypes.default_int
  assert dtypes.from_py(3.0) is dtypes.default_float and dtypes.from_py(np.float16(1)) is dtypes.half
  assert dtypes.from_py(np.float64(1)) is dtypes.double and dtypes.from_py(np.bool_(True)) is dtypes.bool
  assert dtypes.from_py([1, 2]) is dtypes.int32 and dtypes.from_py((True, 1)) is dtypes.int32
  assert dtypes.from_py([1, [2.0, False]]) is dtypes.float32 and dtypes.from_py([]) is dtypes.default_float
  assert dtypes.from_py([True, False]) is dtypes.bool
  assert dtypes.from_py([1, 2.5]) is dtypes.default_float  # not numpy's int32+float32 -> float64
  with pytest.raises(TypeError): dtypes.from_py("x")

# ---- value ranges and constants --------------------------------------------------------------------
@pytest.mark.parametrize("dt", NUMPY_ABLE)
def test_min_max_vs_numpy(dt):
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  if dt == dtypes.bool: assert (lo, hi) == (False, True) and type(lo) is bool
  elif dtypes.is_int(dt): assert (lo, hi) == (np.iinfo(dt.np).min, np.iinfo(dt.np).max) and type(lo) is int
  else: assert (lo, hi) == (-math.inf, math.inf) and -np.finfo(dt.np).max > lo
  assert (dtypes.min(dt.vec(4)), dtypes.max(dt.vec(4))) == (lo, hi)

def test_min_max_bfloat16_and_errors():
  assert (dtypes.min(dtypes.bfloat16), dtypes.max(dtypes.bfloat16)) == (-math.inf, math.inf)
  with pytest.raises(ValueError): dtypes.min(dtypes.float.ptr())

def test_as_const():
  assert dtypes.as_const(3, dtypes.float) == 3.0 and type(dtypes.as_const(3, dtypes.half)) is float
  assert dtypes.as_const(3.7, dtypes.int8) == 3 and type(dtypes.as_const(True, dtypes.int)) is int
  assert dtypes.as_const(2, dtypes.bool) is True and dtypes.as_const(0.0, dtypes.bool) is False
  assert dtypes.as_const(300, dtypes.int8) == 300  # coercion only; wrapping is truncate's job
  assert dtypes.as_const([1, 2.5], dtypes.float.vec(2)) == (1.0, 2.5)

# ---- promotion ---------------------------------------------------------------------------------------
# np.promote_types on two dtypes follows the same table in numpy 1.x and 2.x: NEP 50 (numpy 2) only removed
# value-based promotion of python/numpy *scalars*, which least_upper_dtype doesn't model. So the numpy-2 results
# we match include int64+uint64 -> float64, int8+uint8 -> int16, int16+float16 -> float32 (only 8-bit ints fit
# float16) and int32/int64 + float32 -> float64.
@pytest.mark.parametrize("a,b", list(itertools.combinations_with_replacement(NUMPY_ABLE, 2)))
def test_promotion_matches_numpy(a, b):
  want = dtypes.from_np(np.promote_types(a.np, b.np))
  assert least_upper_dtype(a, b) is want and least_upper_dtype(b, a) is want

def test_promotion_numpy2_landmarks():
  assert np.promote_types(np.int64, np.uint64) == np.float64  # the numpy-2 behaviour the table above pins
  L = least_upper_dtype
  assert L(dtypes.int8, dtypes.uint8) is dtypes.int16 and L(dtypes.int32, dtypes.uint32) is dtypes.int64
  assert L(dtypes.int64, dtypes.uint64) is dtypes.float64 and L(dtypes.uint8, dtypes.half) is dtypes.half
  assert L(dtypes.int16, dtypes.half) is dtypes.float and L(dtypes.int32, dtypes.float) is dtypes.double

@given(st.lists(st.sampled_from(NUMPY_ABLE), min_size=1, max_size=6))
def test_promotion_many_matches_numpy(dts):
  assert least_upper_dtype(*dts) is dtypes.from_np(np.result_type(*[d.np for d in dts]))

@given(st.lists(st.sampled_from(ALL), min_size=1, max_size=5), st.sampled_from(ALL))
def test_promotion_laws(dts, extra):
  lub = least_upper_dtype(*dts)
  assert least_upper_dtype(*dts, lub) is lub and least_upper_dtype(*reversed(dts)) is lub  # upper bound, order-free
  # not associative, like numpy: (int8, uint8, half) -> half but ((int8, uint8) -> int16, half) -> float32;
  # promoting the partial result can only go as high or higher
  both = least_upper_dtype(lub, extra)
  assert least_upper_dtype(both, least_upper_dtype(*dts, extra)) is both
  assert least_upper_dtype(dtypes.bool, *dts) is lub and lub.priority >= max(d.priority for d in dts)

def test_promotion_is_not_associative_like_numpy():
  assert least_upper_dtype(dtypes.int8, dtypes.uint8, dtypes.half) is dtypes.half is dtypes.from_np(np.result_type(np.int8, np.uint8, np.float16))
  assert least_upper_dtype(least_upper_dtype(dtypes.int8, dtypes.uint8), dtypes.half) is dtypes.float32

@pytest.mark.parametrize("other,want", [
  (dtypes.bool, dtypes.bfloat16), (dtypes.int8, dtypes.bfloat16), (dtypes.uint8, dtypes.bfloat16),
  (dtypes.int16, dtypes.float32), (dtypes.uint16, dtypes.float32), (dtypes.int32, dtypes.float64),
  (dtypes.uint32, dtypes.float64), (dtypes.int64, dtypes.float64), (dtypes.uint64, dtypes.float64),
  (dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.bfloat16), (dtypes.float32, dtypes.float32),
  (dtypes.float64, dtypes.float64)])
def test_promotion_bfloat16(other, want):
  # bfloat16 behaves like float16 (it holds 8-bit ints exactly) but neither holds the other: they meet at float32
  assert least_upper_dtype(dtypes.bfloat16, other) is want and least_upper_dtype(other, dtypes.bfloat16) is want

def test_promotion_vectors_and_errors():
  assert least_upper_dtype(dtypes.half.vec(4), dtypes.float.vec(4)) is dtypes.float.vec(4)
  assert least_upper_dtype(dtypes.int8.vec(2), dtypes.uint8.vec(2)) is dtypes.int16.vec(2)
  assert least_upper_dtype(dtypes.float) is dtypes.float
  with pytest.raises(ValueError): least_upper_dtype()
  with pytest.raises(ValueError): least_upper_dtype(dtypes.float.vec(4), dtypes.float)
  with pytest.raises(ValueError): least_upper_dtype(dtypes.imagef((1, 1, 4)), dtypes.float)

def test_least_upper_float():
  for d in FLOATS: assert least_upper_float(d) is d and least_upper_float(d.vec(4)) is d.vec(4)
  for d in INTS + [dtypes.bool]: assert least_upper_float(d) is dtypes.default_float
  assert least_upper_float(dtypes.int.vec(4)) is dtypes.float.vec(4)

# ---- bfloat16 bits -----------------------------------------------------------------------------------
def _bf16_reference(x: float) -> int:
  """Exact round-to-nearest-even of a finite float to bfloat16 bits, with Fractions."""
  sign = 0x8000 if math.copysign(1, x) < 0 else 0
  if math.isinf(x): return sign | 0x7F80
  mag = Fraction(abs(x))
  lo = 0
  for bit in range(14, -1, -1):  # largest bf16 magnitude <= mag, by binary search on the bit pattern
    cand = lo | (1 << bit)
    if cand <= 0x7F7F and Fraction(float(f32_from_bf16_bits(np.uint16(cand)))) <= mag: lo = cand
  lo_v = Fraction(float(f32_from_bf16_bits(np.uint16(lo))))
  hi_v = Fraction(2) ** 128 if lo == 0x7F7F else Fraction(float(f32_from_bf16_bits(np.uint16(lo + 1))))
  up = mag - lo_v > hi_v - mag or (mag - lo_v == hi_v - mag and lo & 1)
  return sign | (lo + 1 if up else lo)

def test_bf16_all_patterns_round_trip():
  bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
  f = f32_from_bf16_bits(bits)
  assert f.dtype == np.float32 and f.shape == bits.shape
  back, nan = bf16_bits_from_f32(f), np.isnan(f)
  assert back.dtype == np.uint16 and np.array_equal(back[~nan], bits[~nan])
  assert np.isnan(f32_from_bf16_bits(back[nan])).all() and np.array_equal(back[nan] >> 15, bits[nan] >> 15)

def test_bf16_rounding_cases():
  xs = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -0.0, np.inf, -np.inf, 3.4028235e38, -3.4e38,
                 1e-45, 2.0**-133], dtype=np.float32)
  want = [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x8000, 0x7F80, 0xFF80, 0x7F80, 0xFF80, 0x0000, 0x0001]
  assert bf16_bits_from_f32(xs).tolist() == want
  assert bf16_bits_from_f32(np.zeros((2, 3), np.float32)).shape == (2, 3)

def test_bf16_nan_preserved():
  nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFF800001], np.uint32).view(np.float32)
  out = bf16_bits_from_f32(nans)
  assert np.isnan(f32_from_bf16_bits(out)).all() and (out >> 15).tolist() == [0, 1, 0, 0, 1]

@given(st.floats(width=32, allow_nan=False))
def test_bf16_rounding_matches_exact(x):
  assert int(bf16_bits_from_f32(np.array([x], np.float32))[0]) == _bf16_reference(x)

# ---- truncate ----------------------------------------------------------------------------------------
@given(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.sampled_from(INTS))
def test_truncate_int_matches_numpy_cast(x, dt):
  assert truncate(dt)(x) == int(np.array(x, np.int64).astype(dt.np))

@given(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from(INTS))
def test_truncate_int_wraps(x, dt):
  y = truncate(dt)(x)
  assert dtypes.min(dt) <= y <= dtypes.max(dt) and (y - x) % (1 << (8 * dt.itemsize)) == 0 and type(y) is int

def test_truncate_examples():
  assert truncate(dtypes.int8)(300) == 44 and truncate(dtypes.uint32)(-1) == 4294967295
  assert truncate(dtypes.int8)(-129) == 127 and truncate(dtypes.uint8)(3.9) == 3 and truncate(dtypes.int64)(2**63) == -(2**63)
  assert truncate(dtypes.bool)(2) is True and truncate(dtypes.bool)(0.0) is False
  assert truncate(dtypes.float)(0.1) == float(np.float32(0.1)) and truncate(dtypes.double)(0.1) == 0.1
  assert truncate(dtypes.int8.vec(2))((300, 1)) == (44, 1)
  with pytest.raises(ValueError): truncate(dtypes.float.ptr())

def test_truncate_float_overflow_is_silent():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert truncate(dtypes.half)(70000.0) == math.inf and truncate(dtypes.float)(-1e39) == -math.inf
    bf16_max = float(f32_from_bf16_bits(np.uint16(0x7F7F)))
    assert truncate(dtypes.bfloat16)(1e39) == math.inf and truncate(dtypes.bfloat16)(3.39e38) == bf16_max
  assert math.isnan(truncate(dtypes.half)(math.nan)) and math.isnan(truncate(dtypes.bfloat16)(math.nan))

@given(st.floats(allow_nan=False), st.sampled_from([(dtypes.float32, np.float32), (dtypes.float16, np.float16)]))
def test_truncate_float_matches_numpy(x, dt_np):
  dt, npt = dt_np
  with np.errstate(over="ignore"): assert truncate(dt)(x) == float(np.array(x).astype(npt))

def test_truncate_bfloat16_no_double_rounding():
  # just above the halfway point between 1 and 1+2**-7: float32 rounds it *to* the halfway point, after which
  # a naive second rounding ties to even (1.0); the right answer is up
  x = 1 + 2**-8 + 2**-40
  assert float(np.float32(x)) == 1 + 2**-8 and truncate(dtypes.bfloat16)(x) == 1 + 2**-7

@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-3e38, max_value=3e38))
def test_truncate_bfloat16_exact(x):
  assert truncate(dtypes.bfloat16)(x) == float(f32_from_bf16_bits(np.uint16(_bf16_reference(x))))
