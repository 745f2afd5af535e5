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
  """What a target supports; `render(name, uops)` writes the kernel source (API).

  The capabilities are the class fields below, each with a default every target can live with; a
  target's renderer overrides the ones it has. Lowering, the heuristics and the search read them as
  plain attributes (a capability that isn't declared here doesn't exist)."""
  device: str = ""
  suffix: str = ""
  supports_float4: bool = True  # the heuristics may upcast buffers into 4-wide float vectors
  has_local: bool = True  # workgroups (local axes, GROUP/GROUPTOP reduces); False: one thread's serial loops (CPU, LLVM)
  has_shared: bool = True  # workgroup-shared memory (grouped reduces stage partials there)
  # without workgroups (has_local False): fixed-size arrays private to one thread (a C stack array);
  # TC use 3 stages a warp's fragments there, all its lanes being expanded lanes of one thread
  stack_arrays: bool = False
  global_max: Optional[tuple[int, ...]] = (0x8FFFFFFF,) * 3  # the launch grid's limit per dimension
  local_max: Optional[tuple[int, ...]] = (0x8FFFFFFF,) * 3  # a workgroup's limit per dimension
  shared_max: int = 32768  # bytes of shared memory one workgroup may use
  max_threads: int = 1024  # threads in one workgroup (local x group dims together)
  tensor_cores: list[TensorCore] = []  # the matrix instructions the target has (none: no TC opts)
  # vector values: the scalar dtypes a vector of which (UOp dtype .vec(n)) the target can load, store
  # and hold, and the ALU ops it computes lane-wise on such vectors; others are computed lane by lane
  vector_dtypes: frozenset = frozenset()
  vector_alu: frozenset = frozenset()
  vector_width: int = 4  # float32 lanes of one SIMD register: the heuristics size upcasts by it (CPU renderers: CPU_ARCH's)
  # bool vectors as the target's int vectors (a vector compare's lanes): a gate or WHERE over a bool
  # vector stays one vector op where the op is in vector_alu
  vector_masks: bool = False
  has_prefetch: bool = False  # PREFETCH uops (a hint that never faults): the lowerer may emit them for the next outer iteration
  half_arith: bool = False  # float16 arithmetic (else half values are computed in float32, e.g. OpenCL without cl_khr_fp16)
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
