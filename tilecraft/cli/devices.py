"""`tilecraft devices`: every known device, whether it works here (it is opened and a tiny kernel
is run and checked), only renders and compile-checks (a GPU target without its GPU), or why not,
and what its renderer supports."""
from __future__ import annotations
import argparse, json, time
from typing import Any
import numpy as np
from tilecraft.cli import format_table

def add_arguments(ap: argparse.ArgumentParser) -> None:
  """The options of `tilecraft devices`."""
  ap.add_argument("--no-run", action="store_true", help="only open each device; don't run a test kernel on it")
  ap.add_argument("--json", metavar="PATH", help="write the report as JSON ('-' for stdout instead of the table)")

def _caps(ren: Any) -> dict[str, Any]:
  tcs = [str(tc) for tc in getattr(ren, "tensor_cores", []) or []]
  out: dict[str, Any] = {"renderer": type(ren).__name__}
  for a in ("has_local", "has_shared", "shared_max", "local_max", "global_max", "max_threads", "supports_float4"):
    v = getattr(ren, a, None)
    out[a] = list(v) if isinstance(v, tuple) else v
  try: vw = getattr(ren, "vector_width", None)
  except Exception: vw = None  # noqa: BLE001
  if vw is not None: out["vector_width"] = vw
  out["tensor_cores"] = tcs
  return out

def _compiler(dev: Any) -> str:
  comp = dev.compiler
  if (cc := getattr(comp, "cc", None)): return str(cc)
  key = getattr(comp, "cachekey", "") or type(comp).__name__
  return key if len(key) <= 100 else key[:97] + "..."

def probe(name: str, run_kernel: bool = True) -> dict[str, Any]:
  """{'name', 'usable', 'mode', 'reason', 'default', 'compiler', 'caps', 'test_s'} for one device. `mode` is
  'runs', 'render + compile-check only' or None (doesn't open)."""
  from tilecraft.device import Device, DeviceUnavailable
  rec: dict[str, Any] = {"name": name, "usable": False, "mode": None, "reason": None, "default": name == Device.DEFAULT, "compiler": None,
                         "caps": None, "test_s": None}
  try: dev = Device[name]
  except DeviceUnavailable as e:
    rec["reason"] = str(e)
    return rec
  except Exception as e:  # noqa: BLE001 - a broken driver: report it, don't crash the listing
    rec["reason"] = f"opening it failed: {type(e).__name__}: {e}"
    return rec
  try:
    rec["compiler"] = _compiler(dev)
    rec["caps"] = _caps(dev.renderer)
  except Exception as e:  # noqa: BLE001
    rec["reason"] = f"its renderer failed: {type(e).__name__}: {e}"
    return rec
  if dev.render_only is not None:
    rec["mode"], rec["reason"] = "render + compile-check only", dev.render_only
    return rec
  if run_kernel:
    from tilecraft import Tensor
    t0 = time.perf_counter()
    try:
      x = np.arange(8, dtype=np.float32)
      got = (Tensor(x, device=name) * 2 + 1).sum().numpy()
      if float(got) != float((x * 2 + 1).sum()): raise AssertionError(f"test kernel gave {got}, expected {(x * 2 + 1).sum()}")
    except Exception as e:  # noqa: BLE001
      rec["reason"] = f"opens, but a test kernel failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      return rec
    rec["test_s"] = time.perf_counter() - t0
  rec["usable"], rec["mode"] = True, "runs"
  return rec

def _fmt(v: Any) -> str:
  if v is None: return "-"
  if isinstance(v, bool): return "yes" if v else "no"
  if isinstance(v, list): return "x".join(str(x) for x in v) if v and all(isinstance(x, int) for x in v) else (", ".join(map(str, v)) or "none")
  return str(v)

def host_isa() -> dict[str, Any]:
  """The host CPU's ISA as the C compiler sees -march=native, the CPU_ARCH in force, and which
  CPU_ARCH values this host can execute (CPU and LLVM devices)."""
  from tilecraft.host import cpu_arch, host_target, runnable_archs
  try: t = host_target()
  except (RuntimeError, ValueError) as e: return {"error": str(e)}
  return {"isa": t.isa, "vector_width": t.vector_width, "extensions": sorted(t.features), "cpu_arch": cpu_arch(), "runnable_cpu_archs": runnable_archs()}

def run(args: argparse.Namespace) -> int:
  """Run `tilecraft devices`: the table, then why each device is (not) usable, then the host's ISA."""
  from tilecraft.device import DEVICES
  recs = [probe(d, not args.no_run) for d in DEVICES]
  host = host_isa()
  if args.json:
    txt = json.dumps({"devices": recs, "host": host}, indent=1, default=str)
    if args.json == "-":
      print(txt)
      return 0
    with open(args.json, "w") as f: f.write(txt + "\n")
  rows = []
  for r in recs:
    c = r["caps"] or {}
    rows.append([r["name"] + (" (default)" if r["default"] else ""), "yes" if r["usable"] else "render+check" if r["mode"] else "no", _fmt(c.get("renderer")), _fmt(c.get("has_local")),
                 _fmt(c.get("has_shared")), _fmt(c.get("shared_max")), _fmt(c.get("local_max")), _fmt(c.get("supports_float4")),
                 _fmt(c.get("vector_width")), _fmt(c.get("tensor_cores")) if r["caps"] else "-"])
  print(format_table(["device", "usable", "renderer", "has_local", "has_shared", "shared_max", "local_max", "float4", "vector_width", "tensor cores"],
                     rows, "llllllllll"))
  for r in recs:
    if r["caps"] and r["caps"].get("global_max"):
      print(f"{r['name']:7s} global_max {_fmt(r['caps']['global_max'])}, max_threads {_fmt(r['caps'].get('max_threads'))}")
  print()
  for r in recs:
    if r["usable"]:
      how = f"ran a test kernel ({r['test_s']*1e3:.0f} ms)" if r["test_s"] is not None else "opens (no test kernel run)"
      print(f"{r['name']:7s} usable: {how}; compiler: {r['compiler']}")
    elif r["mode"]: print(f"{r['name']:7s} render + compile-check only: {r['reason']}; compiler: {r['compiler']}")
    else: print(f"{r['name']:7s} not usable: {r['reason']}")
  print()
  if "error" in host: print(f"host ISA: unknown ({host['error']})")
  else:
    print(f"host ISA: {host['isa']} ({host['vector_width']} float lanes); extensions: {' '.join(host['extensions'])}")
    print(f"CPU_ARCH (CPU and LLVM devices): {host['cpu_arch']}; runnable here: {', '.join(host['runnable_cpu_archs'])}")
  return 0
