"""Comparisons, logical not and bitwise ops (a mixin of Tensor). numpy's rules: comparisons
broadcast and promote like arithmetic and give bool tensors; <= and >= on floats are spelled as
< or == so nan compares false; bitwise ops need integer or bool tensors; ~ of an integer is an
xor with all ones, of a bool a logical not."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any
from tilecraft.dtype import dtypes
from tilecraft.ops import BinaryOps, UnaryOps
if TYPE_CHECKING: from tilecraft.tensor import Tensor

class ComparisonOps:
  __slots__ = ()
  def _cmp(self: Tensor, op: Any, y: Any, reverse: bool = False) -> "Tensor":
    x, y = self._broadcasted(y, reverse, cmp=True)
    return x._e(op, y)
  def __lt__(self: Tensor, y: Any) -> "Tensor": return self._cmp(BinaryOps.CMPLT, y)
  def __gt__(self: Tensor, y: Any) -> "Tensor": return self._cmp(BinaryOps.CMPLT, y, reverse=True)
  def __le__(self: Tensor, y: Any) -> "Tensor": return (self > y).logical_not() if not dtypes.is_float(self.dtype) else self._le(y)
  def __ge__(self: Tensor, y: Any) -> "Tensor": return (self < y).logical_not() if not dtypes.is_float(self.dtype) else self._ge(y)
  def _le(self: Tensor, y: Any) -> "Tensor":
    x, yy = self._broadcasted(y, cmp=True)
    return (x < yy) | (x == yy)
  def _ge(self: Tensor, y: Any) -> "Tensor":
    x, yy = self._broadcasted(y, cmp=True)
    return (yy < x) | (x == yy)
  def __eq__(self: Tensor, y: Any) -> "Tensor": return self._cmp(BinaryOps.CMPNE, y).logical_not()  # type: ignore[override]
  def __ne__(self: Tensor, y: Any) -> "Tensor": return self._cmp(BinaryOps.CMPNE, y)  # type: ignore[override]
  __hash__ = object.__hash__
  def logical_not(self: Tensor) -> "Tensor": return self.cast(dtypes.bool)._e(UnaryOps.NEG) if self.dtype != dtypes.bool else self._e(UnaryOps.NEG)
  def __invert__(self: Tensor) -> "Tensor":
    if self.dtype == dtypes.bool: return self.logical_not()
    if not dtypes.is_int(self.dtype): raise TypeError(f"~ needs an integer or bool tensor, got {self.dtype}")
    return self ^ -1 if not dtypes.is_unsigned(self.dtype) else self ^ int(dtypes.max(self.dtype))
  def _bit(self: Tensor, op: Any, y: Any, reverse: bool = False) -> "Tensor":
    x, y = self._broadcasted(y, reverse)
    if dtypes.is_float(x.dtype): raise TypeError(f"bitwise {op.name} needs integer or bool tensors, got {x.dtype}")
    return x._e(op, y)
  def __and__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.AND, y)
  def __or__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.OR, y)
  def __xor__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.XOR, y)
  def __rand__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.AND, y, True)
  def __ror__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.OR, y, True)
  def __rxor__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.XOR, y, True)
  def __lshift__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.SHL, y)
  def __rshift__(self: Tensor, y: Any) -> "Tensor": return self._bit(BinaryOps.SHR, y)
