"""The ONNX op implementations, one module per family; importing this package registers them all in
tilecraft.onnx.registry. Each module's ops take Tensors (None for absent optional inputs) and return a
Tensor, a list of them, or a numpy array for a value known at graph-build time (Shape, Range, Constant)."""
from tilecraft.onnx.ops import elementwise, reduce, nn, shape, resize, transformer, recurrent, scatter, spatial, signal, dynamic, attention_v26  # noqa: F401
