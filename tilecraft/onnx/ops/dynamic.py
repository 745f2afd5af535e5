"""ONNX ops whose output shape depends on input values: NonZero, Compress, Unique and NonMaxSuppression.

A kernel's shape is fixed when it is built, so these read the values they depend on at graph-build time
(`Node.static`: a computed input is realized first) and compute on the host with numpy: exact, and the graph
is rebuilt on every call (graph.py marks it data-dependent). Compress keeps its data input lazy: only the
condition is read, and the kept slices are views of the data (common.take_static). Contract:
- NonZero: numpy.nonzero as (rank, count) int64; a 0-d input gives (0, count) as the spec says.
- Compress: numpy.compress along `axis` (the flattened input without it); a condition shorter than the axis
  keeps nothing past its end, one longer is an error naming the node (numpy refuses it too).
- Unique: numpy.unique with all four outputs (Y, first-occurrence indices, inverse indices, counts), over the
  flattened input or whole slices along `axis`; sorted=0 keeps the order of first occurrence. Floats compare as
  numpy does (nan equal to nan, -0.0 equal to 0.0, which keeps the first seen).
- NonMaxSuppression: per batch and class, boxes with score > score_threshold in order of falling score (equal
  scores: the lower index first), each kept unless its IoU with a box already kept exceeds iou_threshold, up to
  max_output_boxes_per_class; boxes as corners in any order (center_point_box=0) or centre and size (1).
  Output (selected, 3) int64 rows of (batch, class, box)."""
from __future__ import annotations
import numpy as np
from tilecraft.onnx.ops.common import norm_axis, static_scalar, take_static
from tilecraft.onnx.registry import Node, op, unsupported
from tilecraft.tensor import Tensor

@op("NonZero")
def _nonzero(n: Node, i: list) -> np.ndarray:
  x = n.static(0)
  if x.ndim == 0: return np.zeros((0, int(x != 0)), np.int64)
  return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)

@op("Compress")
def _compress(n: Node, i: list) -> Tensor:
  x = i[0]
  cond = np.asarray(n.static(1)).reshape(-1).astype(bool)
  a = n.attr("axis", None)
  if a is None: x, a = x.reshape(-1), 0
  else: a = norm_axis(a, x.ndim)
  if cond.size > x.shape[a]: raise unsupported(n, f"a condition of {cond.size} elements for an axis of {x.shape[a]} (at most as long)")
  return take_static(x, [int(j) for j in np.nonzero(cond)[0]], a)

@op("Unique")
def _unique(n: Node, i: list) -> list:
  x = np.asarray(n.static(0))
  a = n.attr("axis", None)
  if a is None: x, a = x.reshape(-1), 0
  else: a = norm_axis(a, x.ndim)
  # numpy's unique along an axis (its rows: each slice flattened), then reordered by first occurrence for sorted=0
  y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=a, equal_nan=True)
  inverse = np.asarray(inverse).reshape(-1)
  if not n.attr("sorted", 1):
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    y, first, counts, inverse = np.take(y, order, axis=a), first[order], counts[order], rank[inverse]
  return [np.ascontiguousarray(y), first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]

def _iou(a: np.ndarray, b: np.ndarray) -> float:
  """Intersection over union of two (y1, x1, y2, x2) boxes with ordered corners; 0 where either has no area."""
  ih, iw = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
  if ih <= 0 or iw <= 0: return 0.0
  inter = ih * iw
  area_a, area_b = (a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1])
  union = area_a + area_b - inter
  return 0.0 if area_a <= 0 or area_b <= 0 or union <= 0 else float(inter / union)

@op("NonMaxSuppression")
def _nms(n: Node, i: list) -> np.ndarray:
  boxes, scores = np.asarray(n.static(0), np.float64), np.asarray(n.static(1), np.float64)
  if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
    raise unsupported(n, f"boxes of shape {boxes.shape} with scores of shape {scores.shape} (batch, boxes, 4) and (batch, classes, boxes)")
  max_out = int(static_scalar(n, 2, "max_output_boxes_per_class", 0))
  iou_t, score_t = float(static_scalar(n, 3, "iou_threshold", 0.0)), static_scalar(n, 4, "score_threshold", None)
  center = int(n.attr("center_point_box", 0))
  if center not in (0, 1): raise unsupported(n, f"center_point_box {center} (0 or 1)")
  if center:  # (x centre, y centre, width, height) -> corners
    xc, yc, w, h = np.moveaxis(boxes, -1, 0)
    boxes = np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], -1)
  else:  # corners in either order along each axis
    boxes = np.concatenate([np.minimum(boxes[..., :2], boxes[..., 2:]), np.maximum(boxes[..., :2], boxes[..., 2:])], -1)
  rows = []
  for b in range(boxes.shape[0]):
    for c in range(scores.shape[1]):
      s = scores[b, c]
      cand = [j for j in range(s.size) if score_t is None or s[j] > score_t]
      cand.sort(key=lambda j: (-s[j], j))
      kept: list[int] = []
      for j in cand:
        if len(kept) >= max_out: break
        if all(_iou(boxes[b, j], boxes[b, k]) <= iou_t for k in kept): kept.append(j)
      rows += [(b, c, j) for j in kept]
  return np.array(rows, np.int64).reshape(-1, 3)
