"""Images for conv/matmul weights (the IMAGE setting, for GPUs with fast texture reads, as mobile GPUs
have): a tensor is copied into an OpenCL image of (height, width, 4) texels in the layout each op
reads fastest, and the op reads it back through an ordinary view of that image.

IMAGE=1 puts conv2d and matmul weights into images, IMAGE=2 also their inputs. An operand becomes an
image only where it is suitable, else the op runs as usual on plain buffers:
- the device has images (OPENCL with image support) and the operand is float32 or float16
  (imagef / imageh);
- the texel axis (the weight's output channels, a matmul's N or K) is a multiple of 4: a texel
  holds 4 consecutive elements of it;
- the image fits the device's limit: width (texels) and height at most `image_max`
  (16384 x 16384 on PoCL, 8192 x 8192 at least on any OpenCL 1.2 device with images);
- conv2d: groups == 1. Layouts: weights (kh*kw*cin, cout/4, 4) from (kh, kw, cin, cout); inputs
  (n*h, w*cin/4, 4) from NHWC (IMAGE=2, cin a multiple of 4). matmul: the 2-D weight (K, N) as
  (K, N/4, 4), the 2-D input (M, K) as (M, K/4, 4) (IMAGE=2).
Each forward call copies the operand into a fresh image (one small copy kernel). Images pay off
where texture units read them (mobile GPUs); PoCL on a CPU emulates image reads in software, so
there IMAGE is a correctness path and slower (a 32->64 channel 3x3 conv on 28x28: 1.4x the time
with IMAGE=1, 17x with IMAGE=2, in one run side by side)."""
from __future__ import annotations
from typing import TYPE_CHECKING, Optional
from tilecraft.device import Device
from tilecraft.dtype import dtypes
from tilecraft.helpers import IMAGE
if TYPE_CHECKING: from tilecraft.tensor import Tensor

def image_level(t: "Tensor") -> int:
  """The IMAGE setting where t's device has images (else 0)."""
  if not int(IMAGE): return 0
  try: ren = Device[t.device].renderer
  except Exception: return 0  # noqa: BLE001 - a device that can't open here has no images either
  return int(IMAGE) if getattr(ren, "supports_images", False) else 0

def as_image(t: "Tensor", hw: tuple[int, int]) -> Optional["Tensor"]:
  """t's elements (in order) held in an image of hw = (height, width) texels, as a tensor of t's
  shape; None where t can't be one (dtype, size, the device's limit)."""
  h, w = hw
  if t.dtype not in (dtypes.float32, dtypes.float16) or not all(isinstance(s, int) for s in t.shape) or h * w * 4 != t.numel() or h < 1 or w < 1: return None
  wmax, hmax = getattr(Device[t.device].renderer, "image_max", (0, 0))
  if w > wmax or h > hmax: return None
  img = (dtypes.imagef if t.dtype == dtypes.float32 else dtypes.imageh)((h, w, 4))
  return type(t)(t.lazydata.to_image(img))
