"""Targets: a Renderer describes what a device can do and turns linearized UOps into source."""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any, Optional

@dataclass(frozen=True)
class TensorCore:
  """A warp-wide matrix instruction: C[N,M] += A[N,K] @ B[K,M] for `dims=(N,M,K)`, executed by `threads`
  lanes together; `layout` (renderer/tensor_cores.py) says which lane/register holds which element."""
  dims: tuple[int, int, int]
  dtype_in: Any
  dtype_out: Any
  threads: int = 32
  layout: Any = None
  def __str__(self) -> str: return f"WMMA_{'_'.join(map(str, self.dims))}_{self.dtype_in.name}_{self.dtype_out.name}"
  @property
  def thread_layout(self) -> list[tuple[int, int]]:
    """The LOCAL splits that lay out the lanes, lowest lane bit first: (0 = an N axis / 1 = an M axis, 2)."""
    return [(0 if b[0] == "n" else 1, 2) for b in self.layout.c.lanes]

class Renderer:
  """What a target supports; `render(name, uops)` writes the kernel source (API)."""
  device: str = ""
  suffix: str = ""
  supports_float4: bool = True
  has_local: bool = True
  has_shared: bool = True
  # without workgroups (has_local False): fixed-size arrays private to one thread (a C stack array);
  # TC use 3 stages a warp's fragments there, all its lanes being expanded lanes of one thread
  stack_arrays: bool = False
  global_max: Optional[tuple[int, ...]] = (0x8FFFFFFF,) * 3
  local_max: Optional[tuple[int, ...]] = (0x8FFFFFFF,) * 3
  shared_max: int = 32768
  max_threads: int = 1024  # threads in one workgroup (local x group dims together)
  tensor_cores: list[TensorCore] = []
  has_transcendentals: bool = True  # False: exp2/log2/sin are rewritten into polynomial code
  # OpenCL image2d buffers (imagef/imageh): read/written a float4 texel at a time; image_max is the
  # device's (width, height) limit in texels
  supports_images: bool = False
  image_max: tuple[int, int] = (0, 0)
  # vector loads gated per lane (LOAD whose gate is a bool vector, alt 0): a masked-off lane is not
  # read at all (it may lie outside the buffer) and reads 0; without them such loads are lane by lane
  masked_loads: bool = False
  def render(self, name: str, uops: list) -> str: raise NotImplementedError(f"{type(self).__name__} cannot render")
  def settings_key(self) -> tuple:
    """The values of the settings this renderer reads at render time (so the same kernel renders
    differently under them): part of every in-process cache key of rendered programs."""
    return ()
  def __repr__(self) -> str: return f"<{type(self).__name__} device={self.device}>"

@dataclass
class Program:
  """A kernel ready to compile and launch (API). `globals` are the kernel-argument buffer indices."""
  name: str
  src: str
  device: str
  global_size: Optional[list[int]] = None
  local_size: Optional[list[int]] = None
  uops: Optional[list] = None
  vars: list = field(default_factory=list)
  globals: list[int] = field(default_factory=list)
  outs: list[int] = field(default_factory=list)
  op_estimate: Any = 0
  mem_estimate: Any = 0
  applied_opts: tuple = ()
  def launch_dims(self, var_vals: Optional[dict] = None) -> tuple[Optional[list[int]], Optional[list[int]]]:
    """global/local sizes with symbolic entries evaluated for `var_vals`."""
    from tilecraft.shape.symbolic import sym_eval
    ev = (lambda xs: None if xs is None else [sym_eval(x, var_vals or {}) for x in xs])
    return ev(self.global_size), ev(self.local_size)
