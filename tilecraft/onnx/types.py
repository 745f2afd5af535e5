"""ONNX element types as tilecraft dtypes. Contract: `onnx_dtype(elem_type, where)` is the tilecraft
dtype of a TensorProto.DataType, or NotImplementedError naming `where` for types tilecraft has none of
(string, complex, float8, int4/uint4, float4, int2/uint2)."""
from __future__ import annotations
from typing import Optional
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
