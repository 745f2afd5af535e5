"""The machine's peak FLOPS and memory bandwidth, measured (not assumed) and cached.

Peak FLOPS is the best of:
  - `fma`: elementwise kernels compiled by tilecraft itself on the device, each lane running
    independent chains of `y = y*c + d` (the C compiler contracts them into FMAs), so
    the FLOPs are real and nothing is memory-bound;
  - `matmul`: a 512^3 matmul compiled by tilecraft (hand-coded opts) on the device;
  - `sgemm` (CPU device only): numpy's float32 matmul (BLAS) as a stand-in.
Peak bandwidth is the best of:
  - `copy`: a tilecraft copy kernel (read + write) and, on the CPU, numpy's copyto;
  - `read`: a tilecraft sum over a big array (read only).
The buffers are several times the last-level cache. Results are cached in
`cache_dir()/calibration.json`, keyed by device, CPU, core count, compiler and OMP_NUM_THREADS;
`--recalibrate` (or `tilecraft calibrate`) measures again. A quick calibration (small sizes, for
tests) is cached separately and never stands in for a full one.
"""
from __future__ import annotations
import argparse, datetime, hashlib, json, os, platform, tempfile, time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional
import numpy as np

CALIBRATION_VERSION = 1

@dataclass
class Peaks:
  """Measured peaks of one device on this machine."""
  device: str
  gflops: float
  gbs: float
  flops_source: str
  bw_source: str
  probes: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> {"gflops"|"gbs": value, "seconds": t}
  measured_at: str = ""
  quick: bool = False
  load: Optional[float] = None  # 1-minute load average when measured (busy machines measure low peaks)
  cores: Optional[int] = None
  cached: bool = False
  def to_json(self) -> dict[str, Any]:
    """The record stored in the cache and in bench JSON."""
    d = asdict(self)
    d.pop("cached")
    return d

def load_average() -> Optional[float]:
  """The 1-minute load average, or None where unknown."""
  try: return os.getloadavg()[0]
  except (OSError, AttributeError): return None

def busy(load: Optional[float], cores: Optional[int] = None) -> bool:
  """More than half the cores were busy with other work."""
  cores = cores or os.cpu_count() or 1
  return load is not None and load > max(1.0, cores / 2)

def cpu_model() -> str:
  """The CPU model name."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"): return line.split(":", 1)[1].strip()
  except OSError: pass
  return platform.processor() or platform.machine()

def last_level_cache_bytes() -> int:
  """Size of the largest CPU cache (sysfs), or 32 MiB when unknown."""
  best = 0
  base = "/sys/devices/system/cpu/cpu0/cache"
  try: entries = os.listdir(base)
  except OSError: entries = []
  for e in entries:
    try:
      with open(os.path.join(base, e, "size")) as f: s = f.read().strip().upper()
    except OSError: continue
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    try: best = max(best, int(s.rstrip("KMG")) * mult)
    except ValueError: continue
  return best or 32 << 20

def total_memory_bytes() -> int:
  """Physical memory in bytes."""
  try: return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError): return 8 << 30

def machine_key(device: str, quick: bool) -> str:
  """What a calibration is valid for."""
  from tilecraft.device import Device
  comp = Device[device].compiler
  parts = [CALIBRATION_VERSION, device, platform.machine(), cpu_model(), os.cpu_count(), os.environ.get("OMP_NUM_THREADS", ""),
           getattr(comp, "cachekey", "") or "", " ".join(getattr(comp, "flags", ())), "quick" if quick else "full"]
  return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]

def _path() -> str:
  from tilecraft.helpers import cache_dir
  return os.path.join(cache_dir(), "calibration.json")

def _load_all() -> dict[str, Any]:
  try:
    with open(_path()) as f: data = json.load(f)
    return data if isinstance(data, dict) else {}
  except (OSError, ValueError): return {}

def _save(key: str, peaks: Peaks) -> None:
  data = _load_all()
  data[key] = peaks.to_json()
  path = _path()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".calibration-")
  try:
    with os.fdopen(fd, "w") as f: json.dump(data, f, indent=1)
    os.replace(tmp, path)
  except BaseException:
    try: os.unlink(tmp)
    except OSError: pass
    raise

def best_times(fns: list[Callable[[], Any]], runs: int, warmup: int = 1, min_time: float = 0.3, max_runs: int = 200) -> tuple[list[float], int]:
  """([minimum seconds of each fn], rounds made), timing `fns` interleaved so drift in machine load hits
  all alike: each round runs every fn once; `runs` rounds after `warmup`, more (up to max_runs) while
  under `min_time` per fn. A fn returns its own seconds (a float), or anything else to be wall-timed."""
  for _ in range(warmup):
    for fn in fns: fn()
  best, n, start = [float("inf")] * len(fns), 0, time.perf_counter()
  while n < runs or (n < max_runs and time.perf_counter() - start < min_time * len(fns)):
    for i, fn in enumerate(fns):
      t0 = time.perf_counter()
      r = fn()
      best[i] = min(best[i], r if isinstance(r, float) else time.perf_counter() - t0)
    n += 1
  return best, n

def _tilecraft_probe(out: Any, runs: int) -> tuple[float, float, float]:
  """(seconds, flops, bytes) of the best run of the kernels that compute Tensor `out`."""
  from tilecraft.engine.realize import get_runner
  from tilecraft.ops import MetaOps
  from tilecraft.shape.symbolic import sym_eval
  sched = [si for si in out.schedule() if si.ast.op is MetaOps.KERNEL]
  out.realize()
  runners = [get_runner(si.ast, si.bufs[0].device, list(si.bufs)) for si in sched]
  def once() -> float: return sum(r(list(si.bufs), si.var_vals, wait=True) or 0.0 for r, si in zip(runners, sched))
  t = best_times([once], runs)[0][0]
  flops = sum(float(sym_eval(r.p.op_estimate, si.var_vals)) for r, si in zip(runners, sched))
  nbytes = sum(float(sym_eval(r.p.mem_estimate, si.var_vals)) for r, si in zip(runners, sched))
  return t, flops, nbytes

def _fma_tensor(x: Any, chains: int, depth: int) -> Any:
  """`chains` independent FMA chains of `depth` steps per element, summed at the end."""
  out = None
  for c in range(chains):
    y = x + 0.01 * (c + 1)
    for _ in range(depth): y = y * 0.999 + 0.0001
    out = y if out is None else out + y
  return out

def measure(device: str, quick: bool = False, progress: Optional[Callable[[str], None]] = None) -> Peaks:
  """Run the probes on `device` now (hand-coded opts, whatever NOOPT/BEAM say)."""
  from tilecraft import Context, Tensor
  note = progress or (lambda s: None)
  load = load_average()
  rng = np.random.default_rng(0)
  probes: dict[str, dict[str, float]] = {}
  runs = 3 if quick else 5
  with Context(NOOPT=0, BEAM=0):
    # -- compute --
    n = (1 << 16) if quick else (1 << 20)
    x = Tensor(rng.random(n, dtype=np.float32), device=device)
    for chains, depth in ((4, 32),) if quick else ((4, 32), (12, 32)):
      note(f"calibrating: FMA chains x{chains} (tilecraft, {device})")
      t, flops, _ = _tilecraft_probe(_fma_tensor(x, chains, depth), runs)
      probes[f"fma x{chains} (tilecraft)"] = {"gflops": flops / t / 1e9, "seconds": t}
    m = 128 if quick else 512
    note(f"calibrating: matmul {m} (tilecraft, {device})")
    a, b = (Tensor(rng.random((m, m), dtype=np.float32), device=device) for _ in range(2))
    t, flops, _ = _tilecraft_probe(a @ b, runs)
    probes[f"matmul {m} (tilecraft)"] = {"gflops": flops / t / 1e9, "seconds": t}
    del a, b
    if device == "CPU":
      m = 512 if quick else 2048
      note(f"calibrating: numpy sgemm {m}")
      a, b = rng.random((m, m), dtype=np.float32), rng.random((m, m), dtype=np.float32)
      t = best_times([lambda: (a @ b, None)[1]], runs)[0][0]
      probes[f"sgemm {m} (numpy)"] = {"gflops": 2 * m ** 3 / t / 1e9, "seconds": t}
      del a, b
    # -- memory --
    llc = last_level_cache_bytes()
    nbytes = (16 << 20) if quick else int(min(max(4 * llc, 256 << 20), 1 << 30, total_memory_bytes() // 8))
    n = nbytes // 4
    src = rng.random(n, dtype=np.float32)
    note(f"calibrating: copy {nbytes >> 20} MiB (tilecraft, {device})")
    xs = Tensor(src, device=device)
    t, _, moved = _tilecraft_probe(xs * 1.0, runs)
    probes["copy (tilecraft)"] = {"gbs": moved / t / 1e9, "seconds": t}
    note(f"calibrating: read {nbytes >> 20} MiB (tilecraft sum, {device})")
    t, _, moved = _tilecraft_probe(xs.sum(), runs)
    probes["read (tilecraft sum)"] = {"gbs": moved / t / 1e9, "seconds": t}
    del xs
    if device == "CPU":
      note(f"calibrating: copy {nbytes >> 20} MiB (numpy)")
      dst = np.empty_like(src)
      t = best_times([lambda: np.copyto(dst, src)], runs)[0][0]
      probes["copy (numpy)"] = {"gbs": 2 * src.nbytes / t / 1e9, "seconds": t}
      del dst
  fsrc = max((k for k in probes if "gflops" in probes[k]), key=lambda k: probes[k]["gflops"])
  bsrc = max((k for k in probes if "gbs" in probes[k]), key=lambda k: probes[k]["gbs"])
  return Peaks(device, probes[fsrc]["gflops"], probes[bsrc]["gbs"], fsrc, bsrc, probes,
               datetime.datetime.now().isoformat(timespec="seconds"), quick, load, os.cpu_count())

def get_peaks(device: str, quick: bool = False, recalibrate: bool = False, progress: Optional[Callable[[str], None]] = None) -> Peaks:
  """Cached peaks for `device` on this machine, measured when missing (or when `recalibrate`).
  A quick request is served by a cached full calibration when there is one."""
  data = _load_all()
  if not recalibrate:
    for q in ((False, True) if quick else (False,)):
      rec = data.get(machine_key(device, q))
      if isinstance(rec, dict):
        try: return Peaks(**{**rec, "cached": True})
        except TypeError: pass  # an old layout: measure again
  peaks = measure(device, quick, progress)
  try: _save(machine_key(device, quick), peaks)
  except OSError: pass  # a read-only cache dir: still usable, just not cached
  return peaks

def describe(p: Peaks) -> str:
  """One line for a table header."""
  when = f"measured {p.measured_at}" + (", cached; --recalibrate to measure again" if p.cached else " (now)")
  warn = (f"\nwarning: the peaks were measured while the machine was busy (load {p.load:.1f} on {p.cores} cores) and may be low: "
          f"rerun with --recalibrate when it is idle") if busy(p.load, p.cores) else ""
  return (f"peak (measured): {p.gflops:.1f} GFLOPS [{p.flops_source}], {p.gbs:.1f} GB/s [{p.bw_source}]"
          f"{' (quick calibration)' if p.quick else ''}; {when}{warn}")

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft calibrate`."""
  ap.add_argument("--device", default=None, help="device to calibrate (default: Device.DEFAULT, i.e. $DEVICE or CPU)")
  ap.add_argument("--quick", action="store_true", help="small sizes (seconds; less accurate)")
  ap.add_argument("--show", action="store_true", help="print the cached calibration without measuring (measures if none)")
  ap.add_argument("--json", metavar="PATH", help="also write the peaks as JSON ('-' for stdout)")

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft calibrate`: measure (or show) and print the peaks."""
  from tilecraft.cli import CLIError, Progress, check_output_path, compile_error_line, format_table, open_device, write_text
  from tilecraft.device import CompileError
  dev = open_device(args.device)
  if args.json: check_output_path(args.json, "--json")  # before measuring, not after
  prog = Progress(enabled=True)
  try: p = get_peaks(dev, args.quick, recalibrate=not args.show, progress=prog.note)
  except CompileError as e: raise CLIError(f"calibrating {dev} failed: a probe kernel did not compile: {compile_error_line(e)}", code=1) from None
  finally: prog.clear()
  if args.json:
    txt = json.dumps(p.to_json(), indent=1)
    if args.json == "-":
      print(txt)
      return 0
    write_text(args.json, txt + "\n", "--json")
  print(f"device {dev}: {cpu_model()}, {os.cpu_count()} cores")
  print(describe(p))
  rows = [[name, f"{v['gflops']:.1f} GFLOPS" if "gflops" in v else f"{v['gbs']:.1f} GB/s", f"{v['seconds']*1e3:.2f} ms"] for name, v in p.probes.items()]
  print(format_table(["probe", "result", "best time"], rows))
  return 0
