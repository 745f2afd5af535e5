"""tilecraft: a tensor-kernel compiler. See DESIGN.md for the architecture."""
from tilecraft.dtype import dtypes, DType  # noqa: F401
from tilecraft.helpers import Context, getenv  # noqa: F401
from tilecraft.shape.symbolic import Variable  # noqa: F401
