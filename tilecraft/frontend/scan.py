"""Products and running sums/products (Tensor.prod, Tensor.cumsum, Tensor.cumprod) built from the AST's own ops.

The kernel AST has SUM and MAX reduces only (DESIGN §4), so a product is a tree of multiplies: an axis halved
until one element is left (odd lengths padded with 1), log2(n) levels; the scheduler realizes the levels that
a kernel can't hold. Its rounding error grows with the tree's depth, as a pairwise sum's does. Running sums and
products are windowed reduces over padded views (no scan kernel): output i reduces the n-wide window that ends
at element i of the row padded with n-1 identities in front. That is O(n^2) work per row, so long rows are cut
into blocks of SCAN_BLOCK: a windowed scan inside each block, combined with the (exclusive) scan of the block
totals before it, computed by the same function on n/SCAN_BLOCK columns: O(n * block) work."""
from __future__ import annotations
from typing import TYPE_CHECKING
if TYPE_CHECKING: from tilecraft.tensor import Tensor

SCAN_BLOCK = 32  # 16-32 measured fastest for a 10M-element cumsum (0.09-0.11 s; 256 took 6.5 s)

def tree_product(x: Tensor, axis: int) -> Tensor:
  """The product over `axis` (kept as size 1) by halving: pad an odd length with 1 and multiply the two halves."""
  while (L := x.shape[axis]) > 1:
    if not isinstance(L, int): raise ValueError(f"prod over axis {axis} of symbolic size {L}: the product tree needs a known length")
    if L % 2:
      x = x.pad(tuple((0, 1) if a == axis else (0, 0) for a in range(x.ndim)), value=1)
      L += 1
    x = x.shrink(tuple((0, L // 2) if a == axis else None for a in range(x.ndim))) * x.shrink(tuple((L // 2, L) if a == axis else None for a in range(x.ndim)))
  return x

def scan_window(flat: Tensor, product: bool = False) -> Tensor:
  """Running sums (products) along axis 1 of a (rows, n) tensor as one windowed reduce: out[r, i] reduces
  padded[r, i:i+n], where padded has n-1 identities (0, or 1) in front. O(n^2) work per row: for short rows."""
  rows, n = flat.shape
  padded = flat.pad(((0, 0), (n - 1, 0)), value=1 if product else 0)  # rows x (2n-1)
  # windows[r, i, j] = padded[r, i + j]
  w = padded.reshape(rows, 1, 2 * n - 1).expand(rows, n + 1, 2 * n - 1).reshape(rows, (n + 1) * (2 * n - 1))
  win = w[:, :n * 2 * n].reshape(rows, n, 2 * n)[:, :, :n]
  return tree_product(win, 2).reshape(rows, n) if product else win.sum(2)

def scan_rows(flat: Tensor, product: bool = False) -> Tensor:
  """Running sums (products) along axis 1 of a (rows, n) tensor, in blocks of SCAN_BLOCK for long rows."""
  rows, n = flat.shape
  B, ident = SCAN_BLOCK, (1 if product else 0)
  if not isinstance(n, int) or n <= B: return scan_window(flat, product)
  nb = -(-n // B)
  inner = scan_window(flat.pad(((0, 0), (0, nb * B - n)), value=ident).reshape(rows * nb, B), product).reshape(rows, nb, B)
  totals = inner[:, :, B - 1]
  # what all earlier blocks come to: the running scan of the totals shifted right by one, not the running scan
  # undone by the block's own total (a nan or inf in a block made that nan for every element of it)
  before = scan_rows(totals.pad(((0, 0), (1, 0)), value=ident)[:, :nb], product).reshape(rows, nb, 1)
  return (inner * before if product else inner + before).reshape(rows, nb * B)[:, :n]
