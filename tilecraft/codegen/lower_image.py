"""Image buffers as UOps (a mixin of the Lowerer): an imagef/imageh buffer of shape (H, W, 4) holds the
same elements as a flat row-major buffer of H*W*4, but is read and written one float4 texel at a
time at integer coordinates (x, y). Element i is channel i % 4 of texel (i // 4 % W, i // (4W)).

A load reads the texel of each element and picks the channel (hash-consing makes the 4 channels of
one texel one read; a channel that isn't a constant is picked by selects). A masked element reads 0
(the read is gated, so the mask holds even where the coordinates are inside the image). A store
must write whole texels: the 4 channels of each texel have to be lanes of one thread (the output's
texel axis upcast by 4, see required_optimizations), else lowering refuses the kernel."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any
from tilecraft.codegen.opt import KernelOptError
from tilecraft.codegen.uops import UOp, UOps
from tilecraft.dtype import DType, ImageDType, dtypes
from tilecraft.renderer import Renderer
from tilecraft.ops import BinaryOps, MemBuffer, TernaryOps
from tilecraft.shape.symbolic import Node, sint
if TYPE_CHECKING: from tilecraft.codegen.lowerer import Lowerer

class ImageLoweringError(KernelOptError):
  """A kernel whose image accesses can't be expressed (a partial texel store, an image on a target
  without images): the kernel with these opts is refused, as an Opt would be (nothing is run)."""

def texel_dtype(ren: Renderer, img: ImageDType) -> DType:
  """What one texel read/write carries: half4 where the target computes in half (read_imageh), else float4."""
  return dtypes.half.vec(4) if img.base == dtypes.half and ren.half_arith else dtypes.float.vec(4)

class ImageLowering:
  __slots__ = ()
  def _coord(self: Lowerer, img: ImageDType, texel: sint) -> UOp:
    w = img.shape[1]
    x, y = texel % w, texel // w
    if self._needs_int64(x) or self._needs_int64(y): raise ImageLoweringError(f"image coordinates of {img} need 64-bit ints")
    return UOp(UOps.VECTORIZE, dtypes.int32.vec(2), (self.sym_to_uop(x, dtypes.int32), self.sym_to_uop(y, dtypes.int32)))

  def image_elem(self: Lowerer, buf: UOp, mb: MemBuffer, idx: sint, valid: sint) -> UOp:
    """Element idx of the image (0 where not valid)."""
    img = mb.dtype
    assert isinstance(img, ImageDType)
    if valid == 0: return UOp.const(img.base, 0)
    tdt = texel_dtype(self.ren, img)
    src = (buf, self._coord(img, idx // 4))
    if valid != 1: src += (self.sym_bool(valid), UOp.const(tdt, 0))
    texel = UOp(UOps.LOAD, tdt, src)
    c = idx % 4
    if isinstance(c, int): v = texel.gep(c)
    else:  # the channel varies: select it
      cu = self.sym_to_uop(c, dtypes.int32)
      v = texel.gep(3)
      for ch in (2, 1, 0): v = UOp.alu(TernaryOps.WHERE, UOp.alu(BinaryOps.CMPNE, cu, UOp.const(dtypes.int32, ch)), v, texel.gep(ch))
    return v.cast(img.base)

  def image_load_lane(self: Lowerer, buf: UOp, mb: MemBuffer, idx: sint, valid: sint) -> UOp:
    """One lane of a load: a scalar, or a vector along the vector axis (element by element)."""
    v = self.vlane
    if v is None or not any(isinstance(x, Node) and v in x.vars() for x in (idx, valid)): return self.image_elem(buf, mb, idx, valid)
    return UOp(UOps.VECTORIZE, mb.dtype.base.vec(self.W),
               tuple(self.image_elem(buf, mb, self._at_lane(idx, i), self._at_lane(valid, i)) for i in range(self.W)))

  def image_elems(self: Lowerer, mb: MemBuffer, val: dict[tuple, UOp]) -> list[tuple[sint, sint, UOp]]:
    """(index, valid, scalar value) of every element a store of `val` writes."""
    out = []
    for lane in self.lanes(False):
      v = val[lane]
      idx, valid = self.index(mb.st, lane)
      if self.vlane is not None and any(isinstance(x, Node) and self.vlane in x.vars() for x in (idx, valid)):
        out += [(self._at_lane(idx, i), self._at_lane(valid, i), v.gep(i) if v.dtype.count > 1 else v) for i in range(self.W)]
      elif v.dtype.count > 1: raise ImageLoweringError(f"image output {mb.idx} has one address for several vector lanes")
      else: out.append((idx, valid, v))
    return out

  def image_stores(self: Lowerer, mb: MemBuffer, elems: list[tuple[sint, sint, UOp]]) -> list[UOp]:
    """Whole-texel stores of the elements; refused when a texel's 4 channels aren't all here with one mask."""
    img = mb.dtype
    assert isinstance(img, ImageDType)
    tdt = texel_dtype(self.ren, img)
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
      out.append(self._store_at(self.buf_uop(mb), self._coord(img, t), masks[t], val))
    return out
