#!/usr/bin/env bash
# The GPU check, in one go on a machine with an NVIDIA GPU (written to finish in under 8 minutes):
#   1. python packages: cuda-python and an NVRTC no newer than the driver (pip, in a venv that sees the
#      system's packages, so an installed torch is used); torch if it is missing and pip can get it
#      (WHEELS=dir: install from wheels there, offline; OFFLINE=1: install nothing, use python3 as it is)
#   2. the CUDA tests: the runtime on the GPU (buffers, launches, the corpus fuzzed on CUDA, tensor cores,
#      half/bf16 matmuls, light ONNX models against onnxruntime), the renderers, and every op check the
#      tests run on OPENCL, on CUDA too (TEST_GPU=CUDA)
#   3. bench/bench_cuda.py: matmul 4096^3 fp32 and fp16, softmax, sums, tilecraft vs torch side by side;
#      SqueezeNet, ShuffleNet and ResNet-50 on CUDA (time per call, first call)
# Figures go to stdout and, as JSON with the test log, to $OUT (default ./gpu_check_out).
# Run: bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
OUT="${OUT:-$PWD/gpu_check_out}"; mkdir -p "$OUT"
VENV="${GPUCHECK_VENV:-/tmp/tilecraft-gpucheck-venv}"
step() { echo; echo "=== [$((SECONDS - START)) s] $*"; }

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(nvidia-smi failed)"
DRV=$(python3 -c "import ctypes; v = ctypes.c_int(); ctypes.CDLL('libcuda.so.1').cuDriverGetVersion(ctypes.byref(v)); print(v.value)" 2>/dev/null || echo 0)
echo "driver CUDA version: $DRV (e.g. 12040 = 12.4)"
[ "$DRV" -gt 0 ] || echo "WARNING: libcuda.so.1 not loadable: CUDA will be render + compile-check only"
MAJOR=$((DRV / 1000)); MINOR=$(((DRV % 1000) / 10))

if [ -n "${OFFLINE:-}" ]; then VENV=""; fi  # (a venv made from python3 there could hide the packages of the venv python3 is)
step "python environment (${VENV:-python3 as it is})"
if [ -n "$VENV" ] && [ ! -x "$VENV/bin/python" ]; then python3 -m venv --system-site-packages "$VENV" || { echo "venv failed; using python3 --user"; VENV=""; }; fi
if [ -n "$VENV" ]; then PY="$VENV/bin/python"; PIP=("$PY" -m pip install -q --disable-pip-version-check)
else PY=python3; PIP=("$PY" -m pip install -q --disable-pip-version-check --user); fi
[ -n "${WHEELS:-}" ] && PIP+=(--no-index --find-links "$WHEELS")
pipi() {
  if [ -n "${OFFLINE:-}" ]; then echo "OFFLINE: not installing $1"; return; fi
  timeout "${2:-180}" "${PIP[@]}" $1 && echo "installed: $1" || echo "could not install $1"
}
"$PY" --version; "$PY" -c "import numpy; print('numpy', numpy.__version__)"
"$PY" -c "import numpy, pytest, hypothesis, xdist" 2>/dev/null || pipi "numpy pytest hypothesis pytest-xdist"
if [ "$MAJOR" -ge 13 ]; then CUDAPY="cuda-python>=13,<14"; NVRTC="nvidia-cuda-nvrtc==$MAJOR.$MINOR.*"
else CUDAPY="cuda-python>=12.6,<13"; NVRTC="nvidia-cuda-nvrtc-cu12<12.$((MINOR + 1))"; fi
if [ "$DRV" -gt 0 ]; then
  "$PY" -c "from cuda.bindings import driver" 2>/dev/null || "$PY" -c "from cuda import cuda" 2>/dev/null || pipi "$CUDAPY"
  # a cubin must come from a compiler no newer than the driver: NVRTC of the driver's version (nvcc only as a fallback)
  PYTHONPATH=$PWD "$PY" -c "import sys; from tilecraft.runtime.cuda import _nvrtc; sys.exit(_nvrtc() is None)" 2>/dev/null || pipi "$NVRTC"
  "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || pipi torch 240
fi
PYTHONPATH=$PWD "$PY" - <<'PYEOF'
from tilecraft.device import Device
d = Device["CUDA"]
print("tilecraft CUDA device:", "RUNS" if d.render_only is None else f"render + compile-check only ({d.render_only})", "| compiler:", d.compiler.cachekey)
try:
  import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
except ImportError as e: print("no torch:", e)
PYEOF

step "CUDA tests (the runtime on the GPU, the renderers, the op checks on CUDA)"
WORKERS=$(( $(nproc) > 8 ? 8 : $(nproc) ))
PYTHONPATH=$PWD TEST_GPU=CUDA timeout "${TEST_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" tests \
  -k "CUDA or test_cuda_runtime or test_gpu_renderers" -rs --durations=15 --junitxml="$OUT/cuda_tests.xml" > "$OUT/cuda_tests.log" 2>&1
echo "tests exit status: $?"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -40

step "bench: tilecraft vs torch on the GPU"
PYTHONPATH=$PWD timeout "${BENCH_TIMEOUT:-240}" "$PY" bench/bench_cuda.py --reduces --json "$OUT/bench_cuda.json" --models "${MODELS-squeezenet,shufflenet,resnet50}" 2>&1 | tail -30
echo "bench exit status: ${PIPESTATUS[0]}"
PYTHONPATH=$PWD DEBUG=4 timeout 60 "$PY" -c "
from tilecraft import Tensor; import numpy as np
a = np.ones((256, 256), np.float32); (Tensor(a, device='CUDA') @ Tensor(a, device='CUDA')).realize()" > "$OUT/matmul_source.txt" 2>&1
step "done; files in $OUT"
ls -la "$OUT"
