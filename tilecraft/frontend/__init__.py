"""The Tensor frontend's op families beyond the core (tilecraft/tensor.py): each module is a mixin
class of Tensor methods built only from Tensor's own ops, so everything fuses the same way.

  shapes.py    normalizing shape / pair arguments, broadcasting shapes
  nn.py        softmax family, linear, layernorm, conv2d, pooling
  random.py    rand / randn from a counter-based integer hash (computed in a kernel)
  compare.py   comparisons, logical not, bitwise ops
  indexing.py  __getitem__ (ints, slices, steps, None, ...), cat, stack
  scan.py      product trees (Tensor.prod) and the blocked running sums and products behind Tensor.cumsum / cumprod
"""
