"""HIP compile checks: clang compiles HIP source for AMD gfx1100 to assembly, header-free and without
the device libraries (`-nogpulib -nogpuinc`, `-S` needs no linker). There is no HIP runtime here."""
from __future__ import annotations
import functools, os, shutil, subprocess, tempfile
from typing import Optional
from tilecraft.device import CompileError, Compiled, Compiler, DeviceUnavailable, render_only_device, run_compiler

@functools.cache
def find_hip_clang() -> Optional[str]:
  """$HIP_CLANG, else clang-15, else clang (when it knows the amdgcn target)."""
  for cand in (os.environ.get("HIP_CLANG"), "clang-15", "clang"):
    if cand and (path := shutil.which(cand)):
      try: targets = subprocess.run([path, "-print-targets"], capture_output=True, text=True, timeout=60).stdout
      except (OSError, subprocess.SubprocessError): continue
      if "amdgcn" in targets: return path
  return None

class HIPCompiler(Compiler):
  """HIP source -> gfx1100 assembly text (the compile check; a runtime would link a code object)."""
  batch_wrap = "namespace tc_batch{i} {{\n{src}\n}}"
  def __init__(self, arch: str = "gfx1100"):
    self.arch, self.clang = arch, find_hip_clang()
    self.flags = ("-x", "hip", f"--offload-arch={arch}", "-nogpulib", "-nogpuinc", "--cuda-device-only", "-O3", "-S")
    version = "missing"
    if self.clang:
      try: version = subprocess.run([self.clang, "--version"], capture_output=True, text=True, timeout=60).stdout.splitlines()[0]
      except (OSError, subprocess.SubprocessError, IndexError): version = "unknown"
    super().__init__(f"hip|{version}|{arch}")
  def compile(self, src: str) -> bytes:
    if self.clang is None: raise DeviceUnavailable("no clang with the amdgcn target for HIP (install clang-15 or set HIP_CLANG)")
    with tempfile.TemporaryDirectory(prefix="tilecraft-hip-") as d:
      out = os.path.join(d, "kernel.s")
      try: res = run_compiler([self.clang, *self.flags, "-o", out, "-"], input=src, timeout=600)
      except subprocess.TimeoutExpired as e: raise CompileError(f"clang timed out ({self.arch})", src, str(e)) from e
      if res.returncode != 0: raise CompileError(f"clang failed to compile HIP for {self.arch}", src, res.stderr + res.stdout)
      with open(out, "rb") as f: return f.read()

def open_device() -> Compiled:
  """HIP here: render + compile-check only (device.py's registry calls this)."""
  from tilecraft.renderer.hip import HIPRenderer
  return render_only_device("HIP", HIPRenderer, HIPCompiler(), "no HIP runtime is implemented; HIP source is compile-checked for gfx1100")
