"""View: canonical form (View.create), movement ops on one view, and clear errors for bad arguments."""
import itertools
import numpy as np
import pytest
from tilecraft.shape.shapetracker import ShapeTracker
from tilecraft.shape.symbolic import Variable
from tilecraft.shape.view import View, strides_for_shape

def elements(v: View) -> dict[tuple[int, ...], int]:
  """{index: address} of every valid element of a concrete view."""
  out = {}
  for ix in itertools.product(*[range(s) for s in v.shape]):
    idx, valid = v.expr(ix)
    if valid: out[ix] = idx
  return out

# ---- canonical form ------------------------------------------------------------------------------------

def test_default_strides_are_row_major():
  v = View.create((2, 3, 4))
  assert v.strides == (12, 4, 1) and v.offset == 0 and v.mask is None and v.contiguous
  assert strides_for_shape((2, 1, 4)) == (4, 0, 1)
  assert View.create(()).contiguous and View.create(()).strides == ()

def test_size_one_dims_get_stride_zero():
  v = View.create((3, 1, 2), (7, 5, 1))
  assert v.strides == (7, 0, 1)
  assert View.create((1, 1), (9, 9), 4).strides == (0, 0)
  # size-1 dims don't break contiguity
  assert View.create((1, 4, 1), (100, 1, 100)).contiguous

def test_full_mask_becomes_none():
  v = View.create((3, 4), mask=((0, 3), (0, 4)))
  assert v.mask is None and v.contiguous
  # int mask bounds are clipped to the shape first
  assert View.create((3, 4), mask=((-2, 3), (0, 9))).mask is None
  assert View.create((3, 4), mask=((0, 2), (0, 9))).mask == ((0, 2), (0, 4))

def test_contiguous_flag():
  assert View.create((2, 3)).contiguous
  assert not View.create((2, 3), offset=1).contiguous
  assert not View.create((2, 3), (1, 2)).contiguous
  assert not View.create((2, 3), mask=((0, 1), (0, 3))).contiguous
  assert not View.create((2, 3), (3, -1), 2).contiguous
  assert View.create((2, 3), (3, 1)).contiguous

@pytest.mark.parametrize("shape, mask", [((0,), None), ((3, 0, 2), None), ((2, 3), ((1, 1), (0, 3))), ((2, 3), ((0, 2), (3, 1))),
                                         ((4,), ((5, 9),))])
def test_empty_dim_or_mask_is_all_invalid(shape, mask):
  v = View.create(shape, tuple(7 for _ in shape), 5, mask)
  assert v.shape == shape and v.strides == (0,) * len(shape) and v.offset == 0
  assert v.mask == ((0, 0),) * len(shape) and not v.contiguous and v.is_all_invalid
  assert elements(v) == {}
  # every movement op keeps it all-invalid
  assert v.permute(tuple(reversed(range(len(shape))))).is_all_invalid
  assert v.pad(tuple((1, 1) for _ in shape)).is_all_invalid
  assert v.stride(tuple(-1 for _ in shape)).is_all_invalid
  assert v.reshape((v.size,) if v.size else (0,)).is_all_invalid

def test_single_element_mask_folds_into_offset():
  v = View.create((4, 3), (3, 1), 0, ((2, 3), (0, 3)))
  assert v.strides == (0, 1) and v.offset == 6 and v.mask == ((2, 3), (0, 3))
  assert elements(v) == {(2, j): 6 + j for j in range(3)}

def test_canonical_views_compare_equal():
  assert View.create((2, 1, 3), (3, 99, 1)) == View.create((2, 1, 3))
  assert hash(View.create((2, 1, 3), (3, 99, 1))) == hash(View.create((2, 1, 3)))
  assert View.create((3,), mask=((0, 3),)) == View.create((3,))

def test_create_rejects_bad_arguments():
  with pytest.raises(ValueError): View.create((2, -1))
  with pytest.raises(ValueError): View.create((2, 3), (1,))
  with pytest.raises(ValueError): View.create((2, 3), mask=((0, 1),))
  with pytest.raises(TypeError): View.create((2, 3.0))

# ---- movement ops on one view ----------------------------------------------------------------------------

def test_permute_expand_shrink_pad_stride():
  v = View.create((2, 3))
  assert v.permute((1, 0)).strides == (1, 3)
  assert View.create((1, 3)).expand((4, 3)).strides == (0, 1)
  s = v.shrink(((1, 2), (1, 3)))
  assert s.shape == (1, 2) and s.offset == 4 and s.strides == (0, 1)
  p = v.pad(((1, 0), (0, 2)))
  assert p.shape == (3, 5) and p.mask == ((1, 3), (0, 3)) and p.offset == -3
  f = v.stride((-1, 2))
  assert f.shape == (2, 2) and f.strides == (-3, 2) and f.offset == 3
  assert elements(f) == {(0, 0): 3, (0, 1): 5, (1, 0): 0, (1, 1): 2}

def test_expand_of_masked_view_keeps_mask():
  v = View.create((1, 3)).pad(((0, 0), (1, 0))).expand((2, 4))
  assert v.mask == ((0, 2), (1, 4)) and v.strides == (0, 1)
  assert elements(v) == {(i, j): j - 1 for i in range(2) for j in range(1, 4)}

def test_shrink_of_padded_view_clips_mask():
  v = View.create((4,)).pad(((2, 2),))
  assert v.shrink(((1, 4),)).mask == ((1, 3),)
  assert v.shrink(((2, 6),)).mask is None and v.shrink(((2, 6),)).contiguous
  assert v.shrink(((0, 2),)).is_all_invalid

def test_stride_of_masked_view():
  v = View.create((5,)).pad(((2, 1),))  # valid 2..6 of 8
  assert elements(v.stride((3,))) == {(1,): 1, (2,): 4}
  assert elements(v.stride((-2,))) == {(1,): 3, (2,): 1}

@pytest.mark.parametrize("shape, strides, new, one_view", [
  ((2, 3), (3, 1), (6,), True), ((2, 3), (1, 2), (6,), False), ((4, 6), (6, 1), (2, 2, 3, 2), True), ((4, 6), (1, 4), (2, 2, 6), True),
  ((4, 6), (1, 4), (2, 12), False), ((3, 4), (0, 1), (3, 2, 2), True), ((3, 4), (0, 1), (12,), False), ((3, 4), (0, 0), (2, 6), True),
  ((6,), (-1,), (2, 3), True), ((2, 1, 3), (-3, 0, -1), (6, 1), True), ((2, 1, 3), (-3, 0, 1), (6, 1), False), ((2, 3, 4), (12, 1, 3), (6, 4), False), ((2, 3, 4), (12, 1, 3), (2, 12), False),
  ((2, 3, 4), (24, 4, 1), (2, 12), True), ((2, 3, 4), (24, 4, 1), (6, 4), False)])
def test_reshape_matches_elements(shape, strides, new, one_view):
  v = View.create(shape, strides, offset=sum(abs(s) * n for s, n in zip(strides, shape)))
  r = v.reshape(new)
  assert (r is not None) == one_view
  if r is not None: assert elements(r) == reshaped_elements(v, new)
  # numpy agrees on which reshapes need a copy
  a = np.lib.stride_tricks.as_strided(np.zeros(200), shape, [8 * s for s in strides])
  if all(s >= 0 for s in strides): assert np.shares_memory(a.reshape(new), a) == one_view

def reshaped_elements(v: View, new: tuple[int, ...]) -> dict:
  """What `v.reshape(new)` must hold: the valid elements of v renumbered in row-major order."""
  out = {}
  for n, ix in enumerate(itertools.product(*[range(s) for s in v.shape])):
    idx, valid = v.expr(ix)
    if valid: out[tuple(int(x) for x in np.unravel_index(n, new))] = idx
  return out

@pytest.mark.parametrize("shape, pad, new, mask", [
  ((3, 4), ((1, 1), (0, 0)), (20,), ((4, 16),)),
  ((4,), ((0, 4),), (2, 4), ((0, 1), (0, 4))),
  ((3, 4), ((2, 2), (0, 0)), (7, 2, 2), ((2, 5), (0, 2), (0, 2))),
  ((3, 4), ((0, 0), (0, 4)), (3, 2, 4), ((0, 3), (0, 1), (0, 4))),
  ((3, 4), ((0, 0), (4, 0)), (3, 2, 4), ((0, 3), (1, 2), (0, 4))),
  ((2, 3), ((1, 0), (0, 0)), (9,), ((3, 9),)),
  ((2, 3), ((1, 0), (0, 0)), (1, 3, 3, 1), ((0, 1), (1, 3), (0, 3), (0, 1))),
])
def test_masked_reshape_stays_one_view(shape, pad, new, mask):
  v = View.create(shape).pad(pad)
  r = v.reshape(new)
  assert r is not None and r.mask == mask
  assert elements(r) == reshaped_elements(v, new)

def test_masked_reshape_that_needs_two_views():
  v = View.create((3,)).pad(((0, 1),))  # 4 elements, the last invalid: (2, 2) would need an L-shaped mask
  assert v.reshape((2, 2)) is None
  w = View.create((3, 3)).pad(((0, 0), (0, 1)))  # (3, 4): valid columns 0..2 of every row
  assert w.reshape((12,)) is None  # the valid set {0,1,2,4,5,6,8,9,10} isn't one interval
  assert w.reshape((3, 2, 2)) is None

def test_reshape_only_size_one_dims():
  v = View.create((3, 4), (1, 3), 2, ((1, 3), (0, 4)))
  r = v.reshape((1, 3, 1, 4, 1))
  assert r.strides == (0, 1, 0, 3, 0) and r.offset == 2 and r.mask == ((0, 1), (1, 3), (0, 1), (0, 4), (0, 1))
  assert r.reshape((3, 4)) == v

def test_symbolic_view():
  n = Variable("n", 1, 10)
  v = View.create((n, 4))
  assert v.strides == (4, 1) and v.contiguous
  assert v.reshape((n * 4,)).contiguous
  assert v.reshape((n, 2, 2)).strides == (4, 2, 1)
  t = View.create((4, n))
  assert t.strides == (n, 1)
  assert t.permute((1, 0)).reshape((4 * n,)) is None
  assert View.create((n,)).stride((-1,)).offset == n - 1
  with pytest.raises(ValueError): View.create((n,)).stride((2,))

# ---- errors --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [View.create, lambda s: ShapeTracker.from_shape(s)])
def test_movement_errors(make):
  x = make((2, 1, 3))
  for bad in [(0, 1), (0, 1, 1), (0, 1, 3), (2, 1, 0, 3)]:
    with pytest.raises(ValueError, match="permut"): x.permute(bad)
  with pytest.raises(ValueError, match="size-1"): x.expand((4, 1, 3))
  with pytest.raises(ValueError, match="rank"): x.expand((2, 3))
  with pytest.raises(ValueError, match="negative"): x.pad(((0, 0), (-1, 0), (0, 0)))
  with pytest.raises(ValueError, match="pad"): x.pad(((0, 0), (0, 0)))
  with pytest.raises(ValueError, match="out of bounds"): x.shrink(((0, 3), (0, 1), (0, 3)))
  with pytest.raises(ValueError, match="out of bounds"): x.shrink(((-1, 1), (0, 1), (0, 3)))
  with pytest.raises(ValueError, match="out of bounds"): x.shrink(((1, 0), (0, 1), (0, 3)))
  with pytest.raises(ValueError, match="nonzero"): x.stride((1, 0, 1))
  with pytest.raises(ValueError, match="nonzero"): x.stride((1, 1.5, 1))
  with pytest.raises(ValueError, match="stride"): x.stride((1, 1))
  with pytest.raises(ValueError, match="sizes"): x.reshape((7,))
  with pytest.raises(ValueError, match="sizes"): x.reshape((2, 2))
  with pytest.raises(ValueError, match="negative"): x.reshape((-6, -1))

def test_all_invalid_stays_invalid_without_dims() -> None:
  """A view with no valid element keeps that when reshaped to shape () (mask () is the 0-d
  all-invalid form; an unmasked 0-d view has mask None), through every route a kernel takes."""
  from tilecraft.shape.shapetracker import ShapeTracker
  from tilecraft.shape.view import View
  bad = View.create((1,), (0,), 0, ((0, 0),))
  assert bad.is_all_invalid
  zero_d = bad.reshape(())
  assert zero_d.is_all_invalid and zero_d.expr(())[1] == 0
  assert View.create((), (), 0, ()).is_all_invalid and not View.create(()).is_all_invalid
  assert ShapeTracker((bad, View.create(()))).simplify().expr_idxs()[1] == 0
  assert zero_d.reshape((1, 1)).is_all_invalid and zero_d.permute(()).is_all_invalid

def test_padded_then_shrunk_to_the_padding_gives_the_fill() -> None:
  """Regression (found by the tensor fuzzer): shrinking a padded tensor to only padding, then to a
  0-d or size-1 kernel, read the buffer instead of the fill."""
  import numpy as np
  from tilecraft import Tensor
  x = np.array([2.0, 3.0], np.float32)
  assert Tensor(x).pad(((0, 1),), value=1.5).shrink(((2, 3),)).numpy().tolist() == [1.5]
  assert Tensor(x).pad(((1, 1),)).shrink(((0, 1),)).sum().numpy() == 0.0
  assert Tensor(x).pad(((0, 1),)).shrink(((2, 3),)).reshape(()).numpy() == 0.0
  assert Tensor(np.zeros(0, np.float32)).sum().reshape(1).pad(((0, 1),), value=1.5).shrink(((1, 2),)).numpy().tolist() == [1.5]

def test_valid_element_of_a_masked_view_stays_valid_without_dims() -> None:
  """Regression (found by the tensor fuzzer): merging a 0-d view over a masked view gave the 0-d
  mask () (all-invalid) for a VALID element, so `x.pad(...)[i]` read the fill's zero for every i."""
  import numpy as np
  from tilecraft import Tensor
  from tilecraft.shape.shapetracker import ShapeTracker
  from tilecraft.shape.view import View
  padded = View.create((2,), (0,), 0, ((0, 1),))  # a 1-element tensor padded by one on the right
  first, second = View.create(()), View.create((), (), 1)
  assert ShapeTracker((padded, first)).simplify().expr_idxs()[1] == 1
  assert ShapeTracker((padded, second)).simplify().expr_idxs()[1] == 0
  assert ShapeTracker((View.create((3,), (1,), -1, ((1, 2),)), View.create((), (), 1))).simplify().expr_idxs() == (0, 1)
  x = np.array([0.5, -2.0], np.float32)
  for i in range(4): assert Tensor(x).pad(((1, 1),), value=1.5)[i].numpy() == np.pad(x, (1, 1), constant_values=1.5)[i], i
  assert Tensor(x[:1]).pad(((0, 1),), value=1.5)[0].item() == 0.5
  assert Tensor(x).reshape(2, 1).pad(((0, 1), (1, 0)), value=7.0)[1, 1].item() == -2.0
