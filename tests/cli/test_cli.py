"""The `tilecraft` command line, run the way a user runs it: `python -m tilecraft ...` in a subprocess.
Small sizes (`--quick`) keep the whole file fast."""
from __future__ import annotations
import importlib.util, json, os, platform, shutil, subprocess, sys
from pathlib import Path
from typing import Any, Optional
import pytest

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HAS_MPL = importlib.util.find_spec("matplotlib") is not None

def tc(*args: str, env: Optional[dict[str, str]] = None, timeout: float = 300) -> subprocess.CompletedProcess:
  """Run `python -m tilecraft ARGS` from the repository root; stdout/stderr as text."""
  full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
  for k in ("DEBUG", "NOOPT", "BEAM", "DEVICE"): full_env.pop(k, None)
  return subprocess.run([sys.executable, "-m", "tilecraft", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)

# ---- bench ---------------------------------------------------------------------------------------

BENCH_COLUMNS = ["kernel", "time", "e2e", "e2e/time", "GFLOPS", "GB/s", "%peakFLOPS", "%peakBW", "%roof", "numpy", "vs numpy", "check", "opts"]
QUICK_KERNELS = ["matmul_64", "matmul_128", "matvec_256", "conv2d_8x16", "softmax_64x256", "layernorm_64x256", "sum_64K", "elementwise_64K"]

def _check_table(out: str) -> None:
  lines = out.splitlines()
  header = next(l for l in lines if l.startswith("kernel "))
  for col in BENCH_COLUMNS: assert col in header, f"column {col!r} missing from {header!r}"
  assert "peak (measured):" in out and "GFLOPS" in out and "GB/s" in out
  for name in QUICK_KERNELS:
    row = next((l for l in lines if l.startswith(name + " ")), None)
    assert row is not None, f"no table row for {name}:\n{out}"
    assert "  ok  " in row, f"{name} not verified: {row}"
  assert f"all {len(QUICK_KERNELS)} kernels verified against numpy" in out

def _check_json(data: dict[str, Any]) -> None:
  assert data["schema"] == "tilecraft-bench/2"
  assert data["device"] == "CPU" and data["ok"] is True
  for k in ("cpu", "cores", "platform", "python", "numpy", "compiler"): assert k in data["host"]
  assert data["settings"]["quick"] is True and data["settings"]["runs"] >= 1
  peak = data["peak"]
  assert peak["gflops"] > 0 and peak["gbs"] > 0 and peak["flops_source"] in peak["probes"] and peak["bw_source"] in peak["probes"]
  assert [k["name"] for k in data["kernels"]] == QUICK_KERNELS
  for k in data["kernels"]:
    assert k["ok"] and k["verified"] and k["error"] is None, k
    assert k["max_rel_error"] <= k["tol"]
    assert k["runs"] >= data["settings"]["runs"] and k["e2e_runs"] == k["runs"]  # timed interleaved
    assert k["numpy_runs"] >= data["settings"]["runs"]  # timed after them
    for f in ("time_s", "gflops", "gbs", "intensity", "pct_peak_flops", "pct_peak_bw", "pct_roofline", "e2e_time_s", "e2e_overhead",
              "numpy_time_s", "vs_numpy", "vs_numpy_kernels"):
      assert isinstance(k[f], float) and k[f] > 0, (k["name"], f, k[f])
    assert isinstance(k["flops"], int) and isinstance(k["bytes"], int) and k["bytes"] > 0
    assert k["schedule"] and all({"name", "opts", "time_s", "flops", "bytes"} <= set(s) for s in k["schedule"])
    assert sum(s["flops"] for s in k["schedule"]) == k["flops"]
    assert k["vs_numpy"] == pytest.approx(k["numpy_time_s"] / k["e2e_time_s"])  # end to end against end to end
    assert k["vs_numpy_kernels"] == pytest.approx(k["numpy_time_s"] / k["time_s"])
    assert k["e2e_overhead"] == pytest.approx(k["e2e_time_s"] / k["time_s"])

def test_bench_quick_table_json_plot(tmp_path: Path) -> None:
  """One `bench --quick --json --plot` run: every kernel verified, the table's columns, the JSON
  schema, a valid PNG (or, without matplotlib, a clear message), and `roofline` redrawing it."""
  js, png = tmp_path / "bench.json", tmp_path / "roofline.png"
  r = tc("bench", "--quick", "--json", str(js), "--plot", str(png))
  _check_table(r.stdout)
  _check_json(json.loads(js.read_text()))
  if not HAS_MPL:
    assert r.returncode == 2 and "needs matplotlib" in r.stderr
    return
  assert r.returncode == 0, r.stdout + r.stderr
  data = png.read_bytes()
  assert data[:8] == PNG_MAGIC and len(data) > 10000
  again = tmp_path / "again.png"
  r = tc("roofline", str(js), "-o", str(again))
  assert r.returncode == 0, r.stderr
  assert again.read_bytes()[:8] == PNG_MAGIC

def test_bench_json_to_stdout_quiet() -> None:
  r = tc("bench", "--quick", "-k", "sum", "--json", "-", "--quiet", "--runs", "1", "--warmup", "0")
  assert r.returncode == 0, r.stderr
  data = json.loads(r.stdout)
  assert [k["name"] for k in data["kernels"]] == ["sum_64K"] and data["ok"]
  assert "[1/1]" not in r.stderr  # --quiet: no progress

def test_bench_unknown_kernel() -> None:
  r = tc("bench", "--quick", "-k", "no_such_kernel")
  assert r.returncode == 2 and "no benchmark kernel matches" in r.stderr

def test_bench_unavailable_device() -> None:
  r = tc("bench", "--quick", "--device", "METAL")
  assert r.returncode == 2 and "METAL" in r.stderr and "not available" in r.stderr

# ---- show ----------------------------------------------------------------------------------------

def test_show_prints_each_kernel() -> None:
  r = tc("show", "(a@b).relu()", "--shapes", "a=64x64,b=64x64", "-v")
  assert r.returncode == 0, r.stderr
  out = r.stdout
  for part in ("--- AST", "--- shape:", "--- opts", "--- uops", "--- source"): assert part in out
  names = [l.split(": ", 1)[1].split(" on ")[0] for l in out.splitlines() if l.startswith("=== kernel ")]
  assert names and names[0].startswith("r_")
  for n in names: assert f"void {n}(" in out, f"source of {n} not printed"
  assert "SUM" in out and "  -- " in out  # the reduce in the AST, a reason for an opt

def test_show_one_kernel_and_run() -> None:
  r = tc("show", "a.softmax(-1)", "--shapes", "a=4x32", "--kernel", "1", "--run")
  assert r.returncode == 0, r.stderr
  assert r.stdout.count("=== kernel ") == 1 and "result (4, 32)" in r.stdout

@pytest.mark.parametrize("expr", ["a.__class__", "__import__('os')", "open('x')", "a.numpy()", "[x for x in a]", "lambda: 1", "b + 1"])
def test_show_rejects_unsafe_or_unknown(expr: str) -> None:
  r = tc("show", expr, "--shapes", "a=4")
  assert r.returncode == 2, r.stdout
  assert "tilecraft show:" in r.stderr

# ---- devices -------------------------------------------------------------------------------------

def test_devices_lists_cpu_usable() -> None:
  r = tc("devices")
  assert r.returncode == 0, r.stderr
  assert any(l.startswith("CPU") and "usable: ran a test kernel" in l for l in r.stdout.splitlines())
  for name in ("LLVM", "OPENCL", "PYTHON", "CUDA", "METAL", "HIP"): assert name in r.stdout
  r = tc("devices", "--json", "-", "--no-run")
  devs = {d["name"]: d for d in json.loads(r.stdout)["devices"]}
  assert devs["CPU"]["usable"] and devs["CPU"]["caps"]["has_local"] is False
  assert not devs["METAL"]["usable"] and devs["METAL"]["reason"]
  host = json.loads(r.stdout)["host"]
  if platform.machine() in ("x86_64", "AMD64"):  # the host's ISA, and the CPU_ARCH values it can run
    assert host["isa"] in ("AVX-512", "AVX2", "AVX", "SSE") and "sse2" in host["extensions"]
    assert host["runnable_cpu_archs"][-1] == "native" and "x86-64" in host["runnable_cpu_archs"]
    assert ("skylake-avx512" in host["runnable_cpu_archs"]) == ("avx512f" in host["extensions"])
    assert "runnable here: x86-64" in tc("devices", "--no-run").stdout

def test_unrunnable_cpu_arch_is_a_clear_cli_error() -> None:
  """A CPU_ARCH whose ISA the host lacks: exit 2 naming the extensions, not a SIGILL (exit 132)."""
  if platform.machine() not in ("x86_64", "AMD64"): pytest.skip("x86-64 -march names")
  r = tc("show", "a+b", "--shapes", "a=4,b=4", env={"CPU_ARCH": "x86-64-v4"})
  assert r.returncode == 0 and "void E_" in r.stdout, r.stderr  # rendering AVX-512 code for inspection works anywhere
  r = tc("show", "a+b", "--shapes", "a=4,b=4", "--run", env={"CPU_ARCH": "x86-64-v4"})
  if "avx512f" in json.loads(tc("devices", "--json", "-", "--no-run").stdout)["host"]["extensions"]: assert r.returncode == 0, r.stderr
  else: assert r.returncode == 2 and "avx512f" in r.stderr and "SIGILL" in r.stderr, (r.returncode, r.stderr)

# ---- fuzz ----------------------------------------------------------------------------------------

def test_fuzz_small_run() -> None:
  r = tc("fuzz", "--device", "CPU", "--n", "3", "--seed", "0", "-k", "ew_7")
  assert r.returncode == 0, r.stdout + r.stderr
  assert "fuzzed 1 corpus kernels on CPU" in r.stdout and "no unexpected failures" in r.stdout

def test_fuzz_failure_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
  """A code generation bug injected in this process (--no-isolate): programs with an UNROLL add 1 to
  their first output element. `fuzz` exits 1 with the minimal failing opts; the same failure listed
  as a known bug is expected (exit 0) unless --strict."""
  import dataclasses
  from tilecraft.__main__ import main
  from tilecraft.codegen.kernel import Kernel, OptOps
  from tilecraft.testing import corpus, fuzz
  orig = Kernel.to_program
  def to_program(self: Kernel, name_override: Optional[str] = None):
    p = orig(self, name_override)
    if not any(o.op is OptOps.UNROLL for o in self.applied_opts): return p
    body = p.src.rstrip()
    return dataclasses.replace(p, src=body[:-1] + f"  data0[{fuzz.FRONT_GUARD}] += 1.0f;\n}}\n")
  monkeypatch.setattr(Kernel, "to_program", to_program)
  monkeypatch.setattr(fuzz, "_program_cache", type(fuzz._program_cache)())
  args = ["fuzz", "--device", "CPU", "--n", "12", "-k", "matmul_16x16x16", "--quiet", "--no-isolate"]
  assert main(args) == 1
  out = capsys.readouterr().out
  assert "FAIL matmul_16x16x16" in out and "minimal failing opts" in out and "UNROLL" in out
  monkeypatch.setattr(corpus, "KNOWN_BUGS", [corpus.KnownBug("injected for this test", ("CPU",), ("fuzz",), ("matmul_16x16x16",))])
  assert main(args) == 0 and "known-bug" in capsys.readouterr().out
  assert main(args + ["--strict"]) == 1

# ---- tune ----------------------------------------------------------------------------------------

def test_tune_fills_the_search_cache(tmp_path: Path) -> None:
  env = {"CACHEDB": str(tmp_path / "search.db")}
  r = tc("tune", "--quick", "-k", "elementwise", "--beam", "1", "--quiet", env=env)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "elementwise_64K" in r.stdout and (tmp_path / "search.db").exists()
  r = tc("tune", "--quick", "-k", "elementwise", "--beam", "1", "--quiet", env=env)
  assert r.returncode == 0 and "cached" in r.stdout
  assert "replay with: tilecraft bench --beam 1 --quick" in r.stdout and "BEAM_BUDGET" not in r.stdout

def test_tune_with_a_budget_says_to_replay_with_it(tmp_path: Path) -> None:
  """A search cut by its budget is replayed only by a search with no larger budget: the replay line carries it."""
  r = tc("tune", "--quick", "-k", "elementwise", "--beam", "1", "--budget", "2.5", "--quiet", env={"CACHEDB": str(tmp_path / "search.db")})
  assert r.returncode == 0, r.stdout + r.stderr
  assert "replay with: BEAM_BUDGET=2.5 tilecraft bench --beam 1 --quick  (or BEAM_BUDGET=2.5 BEAM=1 in the environment)" in r.stdout, r.stdout

# ---- calibrate and the command itself -------------------------------------------------------------

def test_calibrate_quick_is_cached(tmp_path: Path) -> None:
  env = {"XDG_CACHE_HOME": str(tmp_path)}
  r = tc("calibrate", "--quick", "--json", "-", env=env)
  assert r.returncode == 0, r.stderr
  peaks = json.loads(r.stdout)
  assert peaks["gflops"] > 0 and peaks["gbs"] > 0 and peaks["quick"] is True
  cached = json.loads((tmp_path / "tilecraft" / "calibration.json").read_text())
  assert any(v["gflops"] == peaks["gflops"] for v in cached.values())
  r = tc("calibrate", "--quick", "--show", "--json", "-", env=env)  # --show: the cached one, nothing measured
  assert json.loads(r.stdout)["measured_at"] == peaks["measured_at"]

def test_help_and_no_command() -> None:
  r = tc("--help")
  assert r.returncode == 0
  for cmd in ("bench", "show", "devices", "fuzz", "tune", "calibrate", "roofline"): assert cmd in r.stdout
  assert tc().returncode == 2

@pytest.mark.skipif(shutil.which("tilecraft") is None, reason="the console script is not installed (pip install -e .)")
def test_console_script() -> None:
  r = subprocess.run(["tilecraft", "devices", "--no-run"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and "CPU" in r.stdout

# ---- bad input: one line naming the problem, exit 2 (bad request) or 1 (failed), never a traceback or a hang ----

def tc_here(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
  """`tilecraft ARGS` in this process (for errors raised before anything is compiled): (exit code, stdout, stderr)."""
  from tilecraft.__main__ import main
  try: rc = main(list(args))
  except SystemExit as e: rc = int(e.code or 0)  # argparse's own errors
  out, err = capsys.readouterr()
  return rc, out, err

def tc_bounded(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
  """`tilecraft ARGS` in a subprocess limited to 4 GiB of address space: a regression that allocates
  without bound dies with MemoryError instead of taking the machine's memory."""
  import resource
  def limit() -> None: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
  env = {**os.environ, "NO_COLOR": "1"}
  return subprocess.run([sys.executable, "-m", "tilecraft", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=limit)

def _one_line_error(rc: int, err: str, want_rc: int, *needles: str) -> None:
  assert rc == want_rc, (rc, err)
  assert "Traceback" not in err, err
  last = err.strip().splitlines()[-1]
  for n in needles: assert n in last, (n, last)

@pytest.mark.parametrize("expr, needle", [("a+9**9**9", "9**387420489 is too large"), ("a*(2**100000)", "2**100000 is too large")])
def test_show_refuses_huge_constants(capsys: pytest.CaptureFixture, expr: str, needle: str) -> None:
  rc, _, err = tc_here(capsys, "show", expr, "--shapes", "a=4")  # (9**9**9 took Python minutes)
  _one_line_error(rc, err, 2, "tilecraft show:", needle)

@pytest.mark.parametrize("expr, needle", [("'x'*10**10", "repeating a str of length 1 10000000000 times is too large"), ("[0]*10**9", "too large"),
                                          ("a+(1<<10**10)", "1 << 10000000000 is too large")])
def test_show_refuses_huge_allocations(expr: str, needle: str) -> None:
  r = tc_bounded("show", expr, "--shapes", "a=4")  # ('x'*10**10 took 10 GB)
  _one_line_error(r.returncode, r.stderr, 2, "tilecraft show:", needle)

def test_show_small_constants_still_work(capsys: pytest.CaptureFixture) -> None:
  rc, out, err = tc_here(capsys, "show", "a*2**10+(1<<3)+a**3", "--shapes", "a=4")
  assert rc == 0, err
  assert "1024.0f" in out

@pytest.mark.parametrize("shapes, needle", [("a=4:chr", "unknown dtype 'chr'"), ("a=100000x100000x100000", "is too large"),
                                            ("a=4:void", "unknown dtype 'void'"), ("a=4:float128", "unknown dtype 'float128'")])
def test_show_refuses_bad_shapes(capsys: pytest.CaptureFixture, shapes: str, needle: str) -> None:
  rc, _, err = tc_here(capsys, "show", "a+1", "--shapes", shapes)
  _one_line_error(rc, err, 2, "tilecraft show:", needle)

@pytest.mark.parametrize("dt", ["char", "uchar", "half", "bool", "bfloat16", "int64"])
def test_show_every_dtype_name_runs(capsys: pytest.CaptureFixture, dt: str) -> None:
  rc, out, err = tc_here(capsys, "show", "a+a", "--shapes", f"a=4:{dt}", "--run")
  assert rc == 0, err
  assert "result (4,)" in out

def test_show_seed_must_be_nonnegative(capsys: pytest.CaptureFixture) -> None:
  rc, _, err = tc_here(capsys, "show", "a+1", "--shapes", "a=4", "--seed", "-1")
  _one_line_error(rc, err, 2, "--seed", "must be >= 0")

def test_show_run_of_too_large_result_is_an_error(capsys: pytest.CaptureFixture) -> None:
  rc, _, err = tc_here(capsys, "show", "a.expand(10**6,10**6,4)", "--shapes", "a=4", "--run")
  _one_line_error(rc, err, 1, "--run: running", "MemoryError")

def test_calibrate_json_path_checked_before_measuring(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
  rc, out, err = tc_here(capsys, "calibrate", "--quick", "--json", str(tmp_path))
  _one_line_error(rc, err, 2, "is a directory")
  assert "calibrating" not in err + out
  rc, _, err = tc_here(capsys, "calibrate", "--quick", "--json", str(tmp_path / "missing" / "x.json"))
  _one_line_error(rc, err, 2, "does not exist")

def test_bench_output_paths_checked_first(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
  rc, _, err = tc_here(capsys, "bench", "--quick", "-k", "sum", "--json", str(tmp_path))
  _one_line_error(rc, err, 2, "--json", "is a directory")

def test_roofline_refuses_devices_and_bad_json(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
  r = tc_bounded("roofline", "/dev/zero", timeout=60)  # read forever (into memory) before
  _one_line_error(r.returncode, r.stderr, 2, "/dev/zero is not a regular file")
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)  # opening it would block forever
  rc, _, err = tc_here(capsys, "roofline", str(fifo))
  _one_line_error(rc, err, 2, "not a regular file")
  rc, _, err = tc_here(capsys, "roofline", str(tmp_path / "nope.json"))
  _one_line_error(rc, err, 2, "No such file")
  bad = tmp_path / "bad.json"
  for txt, needle in (('{"peak": null, "kernels": []}', "no measured peaks"), ('[1, 2]', "can't read"), ("{", "can't read"),
                      ('{"peak": {"gflops": 1, "gbs": 0}, "kernels": []}', "no peak")):
    bad.write_text(txt)
    rc, _, err = tc_here(capsys, "roofline", str(bad))
    _one_line_error(rc, err, 2, needle)

def test_bad_env_setting_names_the_variable() -> None:
  env = {**os.environ, "NO_COLOR": "1", "BEAM": "abc"}  # (tc() clears BEAM)
  r = subprocess.run([sys.executable, "-m", "tilecraft", "show", "a+1", "--shapes", "a=4"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  _one_line_error(r.returncode, r.stderr, 2, "BEAM='abc'", "int")

def test_broken_c_compiler_is_a_clear_error(tmp_path: Path) -> None:
  env = {"CC": "/bin/false", "XDG_CACHE_HOME": str(tmp_path)}
  # refused when the device opens (the compiler fails its -march probe: exit 2) or at the first compile (exit 1)
  for args, needle in ((("show", "a+1", "--shapes", "a=4", "--run"), "failed to compile"), (("calibrate", "--quick"), "failed")):
    r = tc(*args, env=env)
    if r.returncode == 2: _one_line_error(r.returncode, r.stderr, 2, "false")
    else: _one_line_error(r.returncode, r.stderr, 1, needle)

def test_bench_with_a_broken_compiler_marks_rows_error(tmp_path: Path) -> None:
  r = tc("bench", "--quick", "-k", "sum", "-k", "elementwise", "--json", str(tmp_path / "r.json"), env={"CC": "/bin/false", "XDG_CACHE_HOME": str(tmp_path)})
  if r.returncode == 2: return _one_line_error(r.returncode, r.stderr, 2, "false")  # the device refuses the compiler up front
  assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
  assert "calibration failed" in r.stderr and "peak: not measured" in r.stdout
  rows = [l for l in r.stdout.splitlines() if l.startswith(("sum_64K ", "elementwise_64K "))]
  assert len(rows) == 2 and all(" ERROR" in l for l in rows), r.stdout
  data = json.loads((tmp_path / "r.json").read_text())
  assert data["peak"] is None and data["ok"] is False
  assert all(k["error"].startswith("CompileError:") and "\n" not in k["error"] for k in data["kernels"])
