"""Image buffers as UOps (functions of the LoweringState, lower_state.py): an imagef/imageh buffer of shape (H, W, 4) holds the
same elements as a flat row-major buffer of H*W*4, but is read and written one float4 texel at a
time at integer coordinates (x, y). Element i is channel i % 4 of texel (i // 4 % W, i // (4W)).

A load reads the texel of each element and picks the channel (hash-consing makes the 4 channels of
one texel one read; a channel that isn't a constant is picked by selects). A masked element reads 0
(the read is gated, so the mask holds even where the coordinates are inside the image). A store
must write whole texels: the 4 channels of each texel have to be lanes of one thread (the output's
texel axis upcast by 4, see required_optimizations), else lowering refuses the kernel."""
from __future__ import annotations
from typing import Any
from tilecraft.codegen.lower_state import LoweringState
from tilecraft.codegen.opt import KernelOptError
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, dtypes
from tilecraft.renderer import Renderer
from tilecraft.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, TernaryOps
from tilecraft.shape.symbolic import Node, sint

class ImageLoweringError(KernelOptError):
  """A kernel whose image accesses can't be expressed (a partial texel store, an image on a target
  without images): the kernel with these opts is refused, as an Opt would be (nothing is run)."""

def texel_dtype(ren: Renderer, img: ImageDType) -> DType:
  """What one texel read/write carries: half4 where the target computes in half (read_imageh), else float4."""
  return dtypes.half.vec(4) if img.base == dtypes.half and ren.half_arith else dtypes.float.vec(4)

def _coord(s: LoweringState, img: ImageDType, texel: sint) -> UOp:
  w = img.shape[1]
  x, y = texel % w, texel // w
  if s.ix.needs_int64(x) or s.ix.needs_int64(y): raise ImageLoweringError(f"image coordinates of {img} need 64-bit ints")
  return UOp(UOps.VECTORIZE, dtypes.int32.vec(2), (s.ix.sym_to_uop(x, dtypes.int32), s.ix.sym_to_uop(y, dtypes.int32)))

def image_elem(s: LoweringState, buf: UOp, mb: MemBuffer, idx: sint, valid: sint) -> UOp:
  """Element idx of the image (0 where not valid)."""
  img = mb.dtype
  assert isinstance(img, ImageDType)
  if valid == 0: return UOp.const(img.base, 0)
  tdt = texel_dtype(s.ren, img)
  src = (buf, _coord(s, img, idx // 4))
  if valid != 1: src += (s.ix.sym_bool(valid), UOp.const(tdt, 0))
  texel = UOp(UOps.LOAD, tdt, src)
  c = idx % 4
  if isinstance(c, int): v = texel.gep(c)
  else:  # the channel varies: select it
    cu = s.ix.sym_to_uop(c, dtypes.int32)
    v = texel.gep(3)
    for ch in (2, 1, 0): v = UOp.alu(TernaryOps.WHERE, UOp.alu(BinaryOps.CMPNE, cu, UOp.const(dtypes.int32, ch)), v, texel.gep(ch))
  return v.cast(img.base)

def image_load_lane(s: LoweringState, buf: UOp, mb: MemBuffer, idx: sint, valid: sint) -> UOp:
  """One lane of a load: a scalar, or a vector along the vector axis (element by element)."""
  v = s.vlane
  if v is None or not any(isinstance(x, Node) and v in x.vars() for x in (idx, valid)): return image_elem(s, buf, mb, idx, valid)
  return UOp(UOps.VECTORIZE, mb.dtype.base.vec(s.W),
             tuple(image_elem(s, buf, mb, s.at_lane(idx, i), s.at_lane(valid, i)) for i in range(s.W)))

def image_elems(s: LoweringState, mb: MemBuffer, val: dict[tuple, UOp]) -> list[tuple[sint, sint, UOp]]:
  """(index, valid, scalar value) of every element a store of `val` writes."""
  out = []
  for lane in s.lanes(False):
    v = val[lane]
    idx, valid = s.index(mb.st, lane)
    if s.vlane is not None and any(isinstance(x, Node) and s.vlane in x.vars() for x in (idx, valid)):
      out += [(s.at_lane(idx, i), s.at_lane(valid, i), v.gep(i) if v.dtype.count > 1 else v) for i in range(s.W)]
    elif v.dtype.count > 1: raise ImageLoweringError(f"image output {mb.idx} has one address for several vector lanes")
    else: out.append((idx, valid, v))
  return out

def image_stores(s: LoweringState, mb: MemBuffer, elems: list[tuple[sint, sint, UOp]]) -> list[UOp]:
  """Whole-texel stores of the elements; refused when a texel's 4 channels aren't all here with one mask."""
  img = mb.dtype
  assert isinstance(img, ImageDType)
  tdt = texel_dtype(s.ren, img)
  texels: dict[Any, dict[int, UOp]] = {}
  masks: dict[Any, sint] = {}
  hint = "upcast the output's texel axis (its unit-stride axis) by 4: required_optimizations does"
  for idx, valid, v in elems:
    if valid == 0: continue
    t, c = idx // 4, idx % 4
    if not isinstance(c, int): raise ImageLoweringError(f"image output {mb.idx}: a thread's store covers an unknown channel of a texel ({hint})")
    chans = texels.setdefault(t, {})
    if masks.setdefault(t, valid) != valid: raise ImageLoweringError(f"image output {mb.idx}: the channels of a texel have different masks (a partial texel write)")
    if c in chans: raise ImageLoweringError(f"image output {mb.idx}: two lanes store channel {c} of one texel")
    chans[c] = v
  out = []
  for t, chans in texels.items():
    if len(chans) != 4: raise ImageLoweringError(f"image output {mb.idx}: a thread writes only channels {sorted(chans)} of a texel ({hint})")
    val = UOp(UOps.VECTORIZE, tdt, tuple(chans[c].cast(tdt.scalar()) for c in range(4)))
    out.append(s.store_at(s.buf_uop(mb), _coord(s, img, t), masks[t], val))
  return out

def check_images(ast: LazyOp, ren: Renderer) -> None:
  """Image buffers need a target with images, fit its size limit, and are read-only or write-only in a kernel."""
  n_out = len(ast.src)
  bufs = [x.arg for x in ast.src] + [x.arg for x in ast.lazyops if x.op is BufferOps.LOAD]  # outputs first, as the kernel numbers them
  imgs = {b.idx: b.dtype for b in bufs if b.idx >= 0 and isinstance(b.dtype, ImageDType)}
  if not imgs: return
  if not ren.supports_images:
    raise ImageLoweringError(f"{ren.device or type(ren).__name__} has no image buffers ({', '.join(repr(d) for d in imgs.values())}): "
                             "images are an OPENCL feature (on a device with image support)")
  wmax, hmax = ren.image_max
  for i, d in imgs.items():
    if d.shape[1] > wmax or d.shape[0] > hmax: raise ImageLoweringError(f"buffer {i}: {d!r} is over the device's image limit of {wmax}x{hmax} texels")
    if i < n_out and any(x.op is BufferOps.LOAD and x.arg.idx == i for x in ast.lazyops):
      raise ImageLoweringError(f"buffer {i}: an image is read-only or write-only in one kernel, this one reads and writes it")
