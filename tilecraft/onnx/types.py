"""ONNX element types as tilecraft dtypes. Contract: `onnx_dtype(elem_type, where)` is the tilecraft
dtype of a TensorProto.DataType, or NotImplementedError naming `where` for types tilecraft has none of
(string, complex, float8, int4/uint4, float4, int2/uint2); `attr_value(a, where)` decodes a node attribute."""
from __future__ import annotations
from typing import Any, Optional
from tilecraft.dtype import DType, dtypes

# TensorProto.DataType -> tilecraft dtype (None: no tilecraft dtype)
_ONNX_DTYPES: dict[int, Optional[DType]] = {
  1: dtypes.float32, 2: dtypes.uint8, 3: dtypes.int8, 4: dtypes.uint16, 5: dtypes.int16, 6: dtypes.int32, 7: dtypes.int64,
  9: dtypes.bool, 10: dtypes.float16, 11: dtypes.float64, 12: dtypes.uint32, 13: dtypes.uint64, 16: dtypes.bfloat16,
}
_ONNX_TYPE_NAMES = {0: "UNDEFINED", 8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ",
                    19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1"}

def onnx_dtype(elem_type: int, where: str) -> DType:
  """The tilecraft dtype of an ONNX element type, or NotImplementedError naming `where`."""
  dt = _ONNX_DTYPES.get(elem_type)
  if dt is None: raise NotImplementedError(f"tilecraft.onnx: {where}: element type {_ONNX_TYPE_NAMES.get(elem_type, elem_type)} is not supported")
  return dt

def attr_value(a: Any, where: str) -> Any:
  """A node attribute (AttributeProto) as Python: numbers, strings, their lists, a numpy array for a tensor, the GraphProto
  of a subgraph; other kinds are NotImplementedError naming `where`."""
  import onnx
  from onnx import numpy_helper
  t = a.type
  A = onnx.AttributeProto
  if t == A.FLOAT: return float(a.f)
  if t == A.INT: return int(a.i)
  if t == A.STRING: return a.s.decode("utf-8", "replace")
  if t == A.FLOATS: return [float(x) for x in a.floats]
  if t == A.INTS: return [int(x) for x in a.ints]
  if t == A.STRINGS: return [s.decode("utf-8", "replace") for s in a.strings]
  if t == A.TENSOR:
    onnx_dtype(a.t.data_type, where)
    return numpy_helper.to_array(a.t)
  if t == A.GRAPH: return a.g  # (a subgraph, for the op to build from: FlexAttention's score_mod; ops that take none never read it)
  raise NotImplementedError(f"tilecraft.onnx: {where}: attribute {a.name!r} of type {A.AttributeType.Name(t)} (graph lists, sparse tensors, type protos) is not supported")
