"""tilecraft: a tensor-kernel compiler. How it is built (the pipeline, each folder's job, the invariants,
how to add a device, an Opt or a rewrite rule): docs/architecture.md."""
from tilecraft.dtype import dtypes, DType  # noqa: F401
from tilecraft.helpers import Context, getenv  # noqa: F401
from tilecraft.shape.symbolic import Variable  # noqa: F401
from tilecraft.tensor import Tensor  # noqa: F401,E402
from tilecraft.device import Device  # noqa: F401,E402
__all__ = ["Tensor", "Device", "dtypes", "DType", "Context", "getenv", "Variable"]
