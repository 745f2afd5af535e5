"""1x1 convolutions against a constant weight stored in panels of output channels: (Cout / P, Cin, P), each panel
P = PANEL output channels innermost, one contiguous run of Cin x P values.

Why. On a CPU with 32 vector registers (AVX-512) a 1x1 conv over a small image (14x14, 7x7: 196 or 49 pixels,
which 16-lane vectors of pixels pad by 6% or 30%) runs fastest as vectors of output channels times a few
pixels, each pixel a broadcast (heuristic_cpu.py: _laid_out_columns_tile). Those vectors are loads from the
weight along its output channels, which the model's (Cout, Cin) layout keeps Cin apart: the kernel would have
to pack (transpose) the whole weight in every call. ONNX models know their weights at load, so the layout is one
numpy copy then. In panels as wide as the tile, each tile's weight is one sequential stream: a plain (Cin, Cout)
transpose, the tile reading 256 bytes of each row Cout apart, ran 0.8-1.0x as fast as the panels with the weight
from memory (a flushed cache) and 0.9-1.04x warm.

Measured in ResNet-50 on AVX-512 (Zen 4), each kernel timed as the model runs it, the model with and without the
layout alternating in one process, 3 runs: its 12 such convs at 14^2 and 7^2 1.07-1.18x (one run's 512 -> 2048 at
7^2 0.99x), the strided 512 -> 1024 projection from 28^2 0.91-1.10x; the sum of all its kernels 0.99-1.04x (a noisy
host). Convs of fewer than 512 input channels are left alone where vectors pad the pixels little (196 -> 208): with a
residual added in the epilogue (gathered lane by lane) 256 -> 1024 at 14^2 ran 0.92x, alone; below 256 channels the
padded tiles of the model's layout were as fast (heuristic_cpu.py: laid_out_min_reduce). Where they pad more (49 -> 64)
the layout pays from 64 input channels, 1.2-1.6x alone: MobileNet-v2's expansion convs at 7^2 (160 -> 960, 3 of them)
and its 320 -> 1280 head; in the model's call the three 160 -> 960 ran 1.9-2.0x and its kernel sum 1.07x (AVX-512,
the layout on and off in one process).

Contract: `pointwise_eligible(x_shape, w_shape, stride, groups, dtype, device)` says where the layout is taken:
a CPU device (winograd.on_cpu) whose float32 vectors have 16 lanes (32 registers), float32, a 2-D 1x1 conv of
one group, output channels a multiple of PANEL, output pixels a multiple of the tile's rows but not of 16 (x_shape
is the padded input's), and at least POINTWISE_MIN_CIN input channels, or where 16-lane vectors would pad the pixels
by more than 1/8, as many as the tile takes there (laid_out_min_reduce: 64). `pointwise_layout(w)` is the panel array
of a (Cout, Cin, 1, 1) weight; `pointwise_conv(x, wp, stride)` equals x.conv2d(w, stride=stride) (the same
products; the kernel's opts choose the summation order)."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Sequence
import numpy as np
from tilecraft.codegen.heuristic_cpu import LAID_OUT_MIN_REDUCE, LAID_OUT_ROWS, LAID_OUT_VECTORS, laid_out_min_reduce
from tilecraft.dtype import dtypes
from tilecraft.frontend.winograd import on_cpu
if TYPE_CHECKING: from tilecraft.tensor import Tensor

POINTWISE_MIN_CIN = 512
LANES = 16  # float32 lanes of the vectors the tile is for
PANEL = LAID_OUT_VECTORS * LANES  # output channels per panel: the tile's columns

def pointwise_eligible(x_shape: Sequence[Any], w_shape: Sequence[Any], stride: Sequence[int], groups: int, dtype: Any, device: str) -> bool:
  """Whether conv2d(x (x_shape, padded), w (w_shape, a constant), stride) takes the panel layout (see the module docstring)."""
  if not on_cpu(device) or dtype != dtypes.float32 or groups != 1 or len(w_shape) != 4 or len(x_shape) != 4: return False
  if not all(isinstance(s, int) for s in (*x_shape, *w_shape)) or tuple(w_shape[2:]) != (1, 1): return False
  from tilecraft.device import Device
  if getattr(Device[device].renderer, "vector_width", 0) < LANES: return False
  cout, cin = w_shape[0], w_shape[1]
  pixels = ((x_shape[2] - 1) // stride[0] + 1) * ((x_shape[3] - 1) // stride[1] + 1)
  least = laid_out_min_reduce(pixels, LANES)  # (below LAID_OUT_MIN_REDUCE where vectors would pad the pixels much)
  return x_shape[1] == cin >= (least if least < LAID_OUT_MIN_REDUCE else POINTWISE_MIN_CIN) and cout % PANEL == 0 and \
    pixels % LAID_OUT_ROWS == 0 and pixels % LANES != 0

def pointwise_layout(w: np.ndarray) -> np.ndarray:
  """w (Cout, Cin, 1, 1) as (Cout / PANEL, Cin, PANEL), contiguous."""
  cout, cin = w.shape[:2]
  return np.ascontiguousarray(w.reshape(cout // PANEL, PANEL, cin).transpose(0, 2, 1))

def pointwise_conv(x: "Tensor", wp: "Tensor", stride: Sequence[int] = (1, 1)) -> "Tensor":
  """x (N, Cin, H, W) convolved with the 1x1 weight whose panel layout is wp (Cout / PANEL, Cin, PANEL), with
  `stride`: (N, Cout, H', W')."""
  from tilecraft.frontend.nn import compact_strided_pixels
  if tuple(stride) != (1, 1): x = compact_strided_pixels(x, tuple(stride))
  n, cin, oh, ow = x.shape
  panels, _, width = wp.shape
  out = (x.reshape(n, 1, 1, cin, oh * ow) * wp.permute(0, 2, 1).reshape(1, panels, width, cin, 1)).sum(3)
  return out.reshape(n, panels * width, oh, ow)
