"""Running a schedule: each kernel AST is optimized (hand-coded opts, BEAM, or NOOPT), compiled
once per (AST, runner settings) and launched on its buffers. The loaded runners, compile_ahead's
binaries and the plans of replayed graphs live in engine/plan_cache.py. A schedule run again and again
on the same buffers (a model built once, called many times) is a BoundSchedule: its launches bound once
per runner settings, a rerun is the launches alone."""
from __future__ import annotations
import atexit, operator, threading, time, warnings
from typing import Any, Iterator, Optional
from tilecraft.codegen.kernel import Kernel, Opt, OptOps
from tilecraft.device import Buffer, CompiledRunner, Device
from tilecraft.dtype import ImageDType, dtypes
from tilecraft.engine import plan_cache
from tilecraft.engine.plan_cache import (OptsMode, RunnerKey, RunnerSettings, Template, built_ahead, counts, loaded_runners, replayed_walk,
                                         runners)
from tilecraft.engine.memory_plan import MemoryPlan, plan_memory
from tilecraft.engine.schedule import _buf_dtype, create_schedule, fuse_reduces, instantiate
from tilecraft.helpers import BEAM, DEBUG, GPU_FILL, MEMORY_PLAN, NOOPT, TC, TC_OPT, getenv, prod, settings_memo, usable_cores
from tilecraft.ops import LazyOp, MetaOps
from tilecraft.shape.symbolic import sym_eval

kernel_count = 0  # kernels launched in this process (for DEBUG=1 and tests)

def optimize(k: Kernel, bufs: Optional[list[Buffer]] = None) -> Kernel:
  """The one place a kernel's opts are chosen: `NOOPT=1` only the required opts; `BEAM=n` a beam search
  of width n (budget: `BEAM_BUDGET` seconds, if set; the search package is imported only then);
  otherwise the hand-coded heuristics. A search that can't run (no worker, a broken device) falls
  back to the hand-coded opts with a warning. `NOLOCALS=1` (on targets with workgroups): no local axes,
  for the heuristics and for the search's start alike. Returns a new Kernel."""
  if NOOPT: return k.copy().required_optimizations()
  if (width := int(BEAM)) >= 1:
    from tilecraft.engine.search import beam_search
    start = k
    if getenv("NOLOCALS", 0) and k.opts.has_local and not k.local_dims and not k.group_for_reduces and not k.dont_use_locals:
      start = k.copy()  # NOLOCALS=1: the search starts from (and so keeps) no local axes, as the hand-coded opts do
      start.apply_opt(Opt(OptOps.NOLOCALS), reason="NOLOCALS=1")
    try: return beam_search(start, bufs, width, budget_s=float(getenv("BEAM_BUDGET", 0.0)) or None)
    except Exception as e:  # noqa: BLE001
      warnings.warn(f"BEAM={width}: search of {k.name} failed ({type(e).__name__}: {e}); using hand-coded opts", RuntimeWarning, stacklevel=2)
  return k.copy().hand_coded_optimizations()

def _settings(device: str) -> RunnerSettings:
  """What besides the AST picks a device's runner: the renderer (the PYTHON device's follows EMULATE),
  the settings that choose the kernel's opts, and the compiler's flags (CPU_ARCH's -march changes them too).
  Computed again only when one of the settings it reads changes (helpers.settings_memo)."""
  return _device_settings(device, Device[device])

@settings_memo
def _device_settings(device: str, dev: Any) -> RunnerSettings:
  return RunnerSettings(device, dev.renderer, OptsMode(int(NOOPT), int(BEAM), int(TC), int(TC_OPT), int(getenv("NOLOCALS", 0)), int(GPU_FILL)),
                        getattr(dev.compiler, "flags", ()), dev.renderer.settings_key())

@settings_memo
def _run_settings(device: str, dev: Any) -> tuple[RunnerSettings, int]:
  """(_settings(device), DEBUG): what realizing a replayed graph reads, in one lookup."""
  return _device_settings(device, dev), int(DEBUG)

def get_runner(ast: LazyOp, device: str, bufs: Optional[list[Buffer]] = None, settings: Optional[RunnerSettings] = None) -> CompiledRunner:
  """The loaded runner of `ast` on `device`, optimized and compiled on first use. `settings` is
  `_settings(device)` when the caller has it already (run_schedule asks once per schedule)."""
  if settings is None: settings = _settings(device)
  loaded = loaded_runners(settings)
  if (r := loaded.get(ast)) is not None: return r
  key = RunnerKey(ast.key, settings)
  if (r := runners.get(key)) is not None: counts.runner_hits += 1
  else:
    counts.runner_misses += 1
    if (ahead := built_ahead.pop(key, None)) is not None:
      counts.built_ahead_loaded += 1
      k, prg, lib, symbol = ahead
      try: r = CompiledRunner(prg, precompiled=lib, symbol=symbol)
      except Exception: r = CompiledRunner(prg)  # noqa: BLE001 -- (a binary that doesn't load: built again, the usual way)
    else:
      k = optimize(Kernel(ast, settings.renderer), bufs)
      r = CompiledRunner(k.to_program())
    runners.put(key, r)
    if DEBUG >= 3:  # as the reference: the name, with RAWAST=1 the AST as scheduled, the optimized AST, the opts
      print(k.name)
      if getenv("RAWAST", 0): print(ast)
      print(k.get_optimized_ast())
      print(f"opts: {k.applied_opts}")
    if DEBUG >= 4: print(r.p.src)
    if DEBUG >= 5:
      for i, u in enumerate(r.p.uops or []): print(f"{i:4d} {u.op.name:12s} {str(u.dtype):20s} {[(r.p.uops or []).index(s) if s in (r.p.uops or []) else '-' for s in u.src]} {u.arg!r}")
  return loaded.put(ast, r)

# ---- compiling a schedule's new kernels at once ---------------------------------------------------
# A model's first call meets tens of new kernels. run_schedule optimizes and renders them one by one and
# builds them together, each batch as soon as its kernels are rendered (so the compiler's runs overlap the
# rendering of the rest: DenseNet-121's cold first call 16.9-17.4 s -> 14.8-15.5 s, ResNet-50's 6.2-6.3 -> 5.4-5.6 s);
# get_runner then loads what was built here. Compilers that can put many kernels
# in one translation unit (Compiler.batch_renames) get them in batches of up to AHEAD_BATCH kernels
# (Compiler.compile_batch: one run of gcc or PoCL for the batch, ~1/3 of the CPU time of a run per
# kernel; the binary is disk-cached under the batch's source: a later schedule that makes another
# batch of some of the same kernels builds them again, while a kernel whose own binary is on disk is
# left out and loaded from there), and where the compiler is a separate
# process (Compiler.parallel_compile: the CPU's C compiler) the batches, at least one per core, compile
# on every core at once. PoCL (Compiler.batch_builds: a build costs the same whatever it holds) builds
# its batches one after the other. Not under BEAM: the search times each kernel on the buffers the
# kernels before it filled, so it runs when its turn comes.
AHEAD_BATCH = 16  # (what it built waits in engine/plan_cache.py: built_ahead, RunnerKey -> (kernel, program, binary, symbol in it))

def compile_ahead(items: list[tuple[LazyOp, str, list[Buffer]]], settings: dict[str, RunnerSettings]) -> int:
  """Build the runners of the (ast, device, bufs) `items` that aren't loaded yet, in batches and in
  parallel (Compiler.build_many; see above); returns how many kernels it built or found on disk. A kernel that fails to compile here (or
  whose batch does) is left to get_runner, which compiles it alone and raises the error where the kernel runs."""
  if int(BEAM) >= 1: return 0
  todo: dict[RunnerKey, tuple[LazyOp, list[Buffer]]] = {}
  for ast, device, bufs in items:
    comp = Device[device].compiler
    key = RunnerKey(ast.key, settings[device])
    if key in runners or key in built_ahead or key in todo: continue
    if comp.batch_builds or (comp.parallel_compile and (comp.batch_renames or usable_cores() >= 2)): todo[key] = (ast, bufs)
  if len(todo) < 2: return 0
  made: dict[RunnerKey, Kernel] = {}
  progs: dict[RunnerKey, Any] = {}
  def rendered(keys: list[RunnerKey]) -> Iterator[tuple[str, str]]:  # (optimized and rendered as build_many asks: see there)
    for key in keys:
      ast, bufs = todo[key]
      made[key] = optimize(Kernel(ast, key.settings.renderer), bufs)
      progs[key] = p = made[key].to_program()
      yield p.src, p.name
  n = 0
  for device in dict.fromkeys(key.settings.device for key in todo):
    comp = Device[device].compiler
    keys = [k for k in todo if k.settings.device == device]
    # (PoCL, whose builds cost the same whatever they hold, builds a lone kernel when its turn comes)
    built = comp.build_many(rendered(keys), AHEAD_BATCH, parallel=True, singles=comp.parallel_compile, count=len(keys))
    for key, b in zip(keys, built):
      if b is None: continue
      built_ahead.put(key, (made[key], progs[key], *b))
      n += 1
  return n

# ---- replayed graphs: a template bound to its runners ---------------------------------------------
# A user's loop realizes the same composite (a frontend recipe's graph) on every call. Once its
# schedule template ran under some runner settings, its runners are loaded and its launches checked:
# a _Plan keeps, per kernel, the runner's launcher and where its memory handles come from, the output
# buffer to make and the sizes of the memory the kernels pass values in. A later realize of the
# replayed graph under the same settings is then: allocate (from the caching allocator), launch, mark
# the output realized, free what was on the way. The template fixes the graph's structure (every op,
# view, dtype, device, forced realize, input kind: engine/schedule.py), so what was checked holds for
# every graph it describes; the settings key (helpers.settings_memo) picks another plan when opts,
# compiler or renderer settings change. DEBUG>=2 (per-kernel timings) takes run_schedule.

WORKSPACE_MAX = 1 << 18  # bytes of values on the way a plan keeps memory for (more: the allocator's, per call)

class _Plan:
  """Only the graph's output gets a Buffer (and is marked realized). The values computed on the way
  (layernorm's statistics, a split reduce's partials) belong to LazyBuffers the replay made and nothing
  else can reach: the kernels pass them in memory of their own, and those LazyBuffers die unrealized
  with the output's sources. Up to WORKSPACE_MAX bytes of it the plan keeps (its workspace: Buffers,
  used by one realize at a time, handed back to the pool with the plan); otherwise, or while another
  thread's realize has the workspace, each call takes it from the caching allocator and gives it back
  once the kernels ran (a queue runs in order: what is queued later may reuse it)."""
  __slots__ = ("device", "leaves", "outs", "scratch", "launches", "work", "work_handles", "lock")
  def __init__(self, device: str, leaves: tuple, outs: tuple, scratch: tuple, launches: tuple):
    self.device = device
    self.leaves = leaves      # which leaves the kernels read (indices into the walk's leaves): handles 0..
    self.outs = outs          # (order position, size, dtype) of each buffer to make: the next handles
    self.scratch = scratch    # byte sizes of the memory for the values on the way: the last handles
    self.launches = launches  # per kernel: its launcher (CompiledRunner.launcher), what takes its arguments from the handles
    self.work: Optional[tuple[Buffer, ...]] = None
    if scratch and sum(scratch) <= WORKSPACE_MAX: self.work = tuple(Buffer(device, n, dtypes.uint8).allocate() for n in scratch)
    self.work_handles = [b._buf for b in self.work] if self.work is not None else []
    self.lock = threading.Lock()  # held by the realize using the workspace

  @staticmethod
  def of(t: Template, settings: RunnerSettings, order: list, leaves: list) -> Optional["_Plan"]:
    """The plan of template t under settings, or None while one of its runners isn't loaded."""
    device, last = order[-1].device, len(order) - 1
    slot: dict[int, int] = {}
    leaf_pos = sorted({p for _, pos, _ in t.items for p in pos if p < 0}, reverse=True)
    for p in leaf_pos: slot[p] = len(slot)
    made = sorted({p for _, pos, _ in t.items for p in pos if p >= 0})
    if last not in made or any(b.device != device for b in order): return None
    outs, scratch = [], []
    for p in made:  # the output and images get Buffers; the rest is scratch memory
      b = order[p]
      if not all(isinstance(x, int) for x in b.shape): return None
      if isinstance(dt := _buf_dtype(b), ImageDType) or p == last:
        slot[p] = len(slot)
        outs.append((p, prod(b.shape), dt))
    for p in made:
      if p not in slot:
        slot[p] = len(slot)
        scratch.append(prod(order[p].shape) * _buf_dtype(order[p]).itemsize)
    launches, loaded = [], loaded_runners(settings)
    for ast, pos, _ in t.items:
      if ast.op is not MetaOps.KERNEL or (r := loaded.get(ast)) is None or r.p.vars: return None
      if r.p.globals and len(pos) != len(r.p.globals): return None
      idx = [slot[p] for p in pos]
      launches.append((r.launcher(), operator.itemgetter(*idx) if len(idx) > 1 else lambda h, i=idx[0]: (h[i],)))  # handles -> its arguments
    return _Plan(device, tuple([~p for p in leaf_pos]), tuple(outs), tuple(scratch), tuple(launches))

  def run(self, order: list, leaves: list) -> None:
    global kernel_count
    handles = []
    for j in self.leaves:
      buf = leaves[j].buffer
      if not hasattr(buf, "_buf"): buf.allocate()
      handles.append(buf._buf)
    for p, size, dtype in self.outs:
      b = order[p]
      if (buf := b.buffer) is None: buf = b.buffer = Buffer(self.device, size, dtype)
      if not hasattr(buf, "_buf"): buf.allocate()
      handles.append(buf._buf)
    done, scratch, own = 0, [], False
    try:
      if self.scratch:
        if self.work is not None and self.lock.acquire(blocking=False):
          own = True
          handles += self.work_handles
        else:
          alloc = Device[self.device].allocator
          for nbytes in self.scratch: scratch.append(alloc.alloc(nbytes))
          handles += scratch
      for prg, take in self.launches:
        prg.launch(*take(handles))
        done += 1
    finally:
      kernel_count += done
      if done == len(self.launches):
        for p, _, _ in self.outs: order[p].mark_realized()
      if own: self.lock.release()
      for h, nbytes in zip(scratch, self.scratch): alloc.free(h, nbytes)

def realize_lazy(outs: list) -> None:
  """Compute the LazyBuffers outs: their schedule, run (what Tensor.realize does). A replayed graph
  whose template ran before under the current settings runs its _Plan (engine/plan_cache.py: the chain
  replayed walk -> Template -> Template.plans[RunnerSettings])."""
  if len(outs) == 1 and (b := outs[0] if outs[0]._base is None else outs[0]._base).replayed is not None and \
      (hit := replayed_walk(b, fuse_reduces())) is not None:
    t, order, leaves = hit
    s, debug = _run_settings(order[-1].device, Device[order[-1].device])
    if debug < 2:
      if (plan := t.plans.get(s)) is not None:
        counts.plan_hits += 1
        return plan.run(order, leaves)
      counts.plan_misses += 1
      run_schedule(instantiate(t, order, leaves))
      if (plan := _Plan.of(t, s, order, leaves)) is not None: t.plans.put(s, plan)
      return
    return run_schedule(instantiate(t, order, leaves))
  run_schedule(create_schedule(outs))

@atexit.register
def _report_count() -> None:
  if DEBUG >= 1 and kernel_count: print(f"tilecraft: {kernel_count} kernels run")

def run_schedule(schedule: list) -> None:
  """Run the items in order. Everything that can be is looked up first (memory, loaded runners, checked
  launch arguments) and outputs are marked realized at the end: a kernel that streamed through memory
  leaves the caches cold, so between launches runs as little Python as possible. A runner that isn't
  loaded yet is optimized and compiled when its turn comes (BEAM times it on buffers earlier items filled)."""
  global kernel_count
  debug, settings, loaded = int(DEBUG), {}, {}
  plan: list[tuple[Any, Optional[CompiledRunner], Any]] = []
  for si in schedule:
    for b in si.bufs:
      if not hasattr(b, "_buf"): b.allocate()  # (Buffer.is_allocated, inlined)
    runner = args = None
    if si.ast.op is not MetaOps.COPY:
      device = si.bufs[0].device
      if (by_ast := loaded.get(device)) is None: by_ast = loaded[device] = loaded_runners(settings.setdefault(device, _settings(device)))
      if (runner := by_ast.get(si.ast)) is not None: args = runner.launch_args(list(si.bufs), si.var_vals)
    plan.append((si, runner, args))
  if sum(runner is None and si.ast.op is not MetaOps.COPY for si, runner, _ in plan) >= 2:
    compile_ahead([(si.ast, si.bufs[0].device, list(si.bufs)) for si, runner, _ in plan if runner is None and si.ast.op is not MetaOps.COPY], settings)
  done = 0
  try:
    for si, runner, args in plan:
      if si.ast.op is MetaOps.COPY:
        dest, src = si.bufs
        dest.copyin(src.numpy())
      else:
        if runner is None:
          device = si.bufs[0].device
          runner = get_runner(si.ast, device, list(si.bufs), settings[device])
          args = runner.launch_args(list(si.bufs), si.var_vals)
        kernel_count += 1
        t = runner.clprg(*args[0], wait=debug >= 2, **args[1])
        if debug >= 2 and t is not None:
          p = runner.p
          ops, mem = sym_eval(p.op_estimate, si.var_vals) if p.op_estimate is not None else 0, sym_eval(p.mem_estimate, si.var_vals)
          print(f"*** {runner.dname:6s} {kernel_count:4d} {p.name:40s} {t*1e6:9.1f} us  {ops/max(t,1e-9)/1e9:8.2f} GFLOPS  {mem/max(t,1e-9)/1e9:7.2f} GB/s  {list(p.applied_opts)}")
      done += 1
  finally:
    for si, _, _ in plan[:done]:
      for lb in si.outputs: lb.mark_realized()

# ---- a schedule rerun on its own buffers -----------------------------------------------------------
# A model built once and called many times (tilecraft/onnx/graph.py: a graph built for one input
# signature) reruns the same schedule on the same Buffers, with new data copied into its inputs.
# run_schedule would look up every kernel's runner and check its arguments again on every call (~10 us of
# Python per kernel); a BoundSchedule does that once: per item the runner's launcher (or a COPY) with its
# memory handles, checked by CompiledRunner.launch_args. A rerun is then one call per item (~1 us of
# Python for a CPU kernel). The binding holds under the runner settings (and DEBUG) it was made under and
# until plan_cache.clear(): a rerun under other settings binds again (compiling what isn't loaded, in
# batches as run_schedule does); DEBUG>=2 (per-kernel timings) takes run_schedule. The Buffers must stay
# allocated as they are (the schedule holds them; nothing frees a Buffer's memory while it lives).

def _copy_item(dest: Buffer, src: Buffer) -> None: dest.copyin(src.numpy())

def _launch_vars(runner: CompiledRunner, bufs: list[Buffer], var_vals: dict) -> None: runner(bufs, var_vals, wait=False)

class BoundSchedule:
  """A schedule whose buffers stay the same, rerun with `run()`; see above. With `keep` (the buffers the
  caller reads or writes between runs) and MEMORY_PLAN=1, the other buffers it writes before reading
  share memory where their lifetimes allow (engine/memory_plan.py); `memory` says what that did."""
  __slots__ = ("schedule", "devices", "key", "steps", "names", "kernels", "memory")
  def __init__(self, schedule: list, keep: Optional[list[Buffer]] = None):
    self.schedule = schedule
    self.memory = plan_memory(schedule, keep) if keep is not None and MEMORY_PLAN else MemoryPlan()
    self.devices = tuple(dict.fromkeys(si.bufs[0].device for si in schedule if si.ast.op is not MetaOps.COPY))
    self.key: Any = None  # (plan_cache.generation, per device (RunnerSettings, DEBUG)) the steps were bound under
    self.steps: tuple = ()
    self.names: tuple[str, ...] = ()  # per step: its kernel's name, or "copy"
    self.kernels = sum(si.ast.op is not MetaOps.COPY for si in schedule)

  def _bind(self, key: Any) -> None:
    settings = {d: s for d, (s, _) in zip(self.devices, key[1])}
    for si in self.schedule:
      for b in si.bufs:
        if not hasattr(b, "_buf"): b.allocate()
    missing = [(si.ast, si.bufs[0].device, list(si.bufs)) for si in self.schedule
               if si.ast.op is not MetaOps.COPY and loaded_runners(settings[si.bufs[0].device]).get(si.ast) is None]
    if len(missing) >= 2: compile_ahead(missing, settings)
    steps: list[tuple[Any, tuple]] = []
    names: list[str] = []
    for si in self.schedule:
      if si.ast.op is MetaOps.COPY:
        steps.append((_copy_item, tuple(si.bufs)))
        names.append("copy")
        continue
      device = si.bufs[0].device
      runner = get_runner(si.ast, device, list(si.bufs), settings[device])
      names.append(runner.p.name)
      handles, _ = runner.launch_args(list(si.bufs), si.var_vals)  # (checks the buffers: count, device, allocated)
      if runner.p.vars: steps.append((_launch_vars, (runner, list(si.bufs), si.var_vals)))
      else: steps.append((runner.launcher().launch, tuple(handles)))
    self.steps, self.names, self.key = tuple(steps), tuple(names), key

  def run(self, timings: Optional[list[float]] = None) -> None:
    """Run the schedule again on its buffers (binding it first when the settings changed). With `timings`,
    each step's wall time in seconds is appended to it, in schedule order (a profile: OnnxModel.profile)."""
    global kernel_count
    key = (plan_cache.generation, tuple([_run_settings(d, Device[d]) for d in self.devices]))
    if key != self.key:
      if any(debug >= 2 for _, debug in key[1]): return run_schedule(self.schedule)
      self._bind(key)
    done = 0
    try:
      if timings is None:
        for fn, args in self.steps:
          fn(*args)
          done += 1
      else:
        for fn, args in self.steps:
          t0 = time.perf_counter()
          fn(*args)
          timings.append(time.perf_counter() - t0)
          done += 1
    finally:
      kernel_count += self.kernels if done == len(self.steps) else sum(fn is not _copy_item for fn, _ in self.steps[:done])
