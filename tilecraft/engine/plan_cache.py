"""The plan cache: what a graph's shape maps to on its way to running kernels, in one place.

A user's loop builds the same graph on every call (new LazyBuffers, the same ops over the same views of
inputs of the same kinds), so everything between the lazy graph and the launches is memoized here, in
one chain of tables with explicit keys:

  GraphKey --templates--> Template --Template.plans[RunnerSettings]--> plan (runnable: loaded runners)

- `templates`: a graph's structure (`GraphKey`, engine/schedule.py's `_walk`) -> its schedule
  `Template`: per kernel its AST (the very object) and where its buffers come from, so a repeated
  graph skips fusion, AST building and verification (engine/schedule.py: create_schedule).
- `Template.plans`: the runner settings of the moment (`RunnerSettings`) -> the template bound to its
  loaded runners (engine/realize.py: `_Plan`), made once the template ran under them; realizing a
  replayed graph again is then allocate, launch, mark (engine/realize.py: realize_lazy).
- A graph a frontend recipe replayed (frontend/recipes.py) remembers its walk and template on the
  recipe (`ReplayedWalk`, `remember_walk`/`replayed_walk`): the step "graph -> GraphKey -> template"
  then costs no walk and no key.

Beneath the plans, the loaded runners a plan is bound to (engine/realize.py: get_runner):
- `runners`: `RunnerKey` (the AST's content key and the settings) -> CompiledRunner;
- `loaded_runners(settings)`: the same runners by AST object (hash and structural ==; dict lookups
  try identity first), one table per settings: run_schedule finds each kernel's runner without
  computing its content key (a sha256 of its text);
- `built_ahead`: RunnerKey -> what compile_ahead built for a schedule's new kernels, until get_runner
  loads it;
- `verified`: the kernel ASTs verify_ast accepted.

One size policy for every table (`Table`): a table that is full when an entry is added is emptied
first (a user's loop refills it with what it uses; nothing to keep up per lookup). `clear()` empties
every table and makes the walks remembered on recipes stale: the next realize of any graph is cold
(it walks, schedules, loads its runners from the disk cache or compiles them, and binds a new plan;
the recipes themselves, which record graph construction, and helpers.settings_memo stay).
`counts` says how often each step hit (counted where a hit skips work, never per kernel launch).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional
from tilecraft.ops import LazyOp

# ---- keys ----------------------------------------------------------------------------------------

class GraphKey(NamedTuple):
  """A graph's structure, as engine/schedule.py's _walk sees it: everything the scheduler reads."""
  nodes: tuple        # per node in walk order: (op, argument, dtype, device, view, forced realize, sources, image)
                      # for an unrealized base, (None, dtype, device, view, buffer dtype) for a realized input
  outputs: tuple      # each output's base as its position in the walk's order
  fused: bool         # FUSE_REDUCES (engine/schedule.py: fuse_reduces) when it was walked

class OptsMode(NamedTuple):
  """The settings that choose a kernel's opts (engine/realize.py: optimize)."""
  noopt: int
  beam: int
  tc: int
  tc_opt: int
  nolocals: int
  gpu_fill: int  # GPU_FILL: grouped memory-bound reduces on GPUs (codegen/heuristic.py)

class RunnerSettings(NamedTuple):
  """What besides the AST picks a device's runner (engine/realize.py: _settings)."""
  device: str
  renderer: Any             # the Renderer (the PYTHON device's follows EMULATE)
  mode: OptsMode
  compiler_flags: tuple     # the compiler's flags (CPU_ARCH's -march changes them)
  renderer_settings: tuple  # Renderer.settings_key()

class RunnerKey(NamedTuple):
  """A loaded runner's identity: its kernel's content (LazyOp.key) under the settings it was built with."""
  ast_key: str
  settings: RunnerSettings

# ---- the size policy -----------------------------------------------------------------------------

class Table(dict):
  """A memo table: a dict of at most `cap` entries; `put` into a full table empties it first."""
  __slots__ = ("name", "cap")
  def __init__(self, name: str, cap: int):
    super().__init__()
    self.name, self.cap = name, cap
  def put(self, key: Any, value: Any) -> Any:
    if len(self) >= self.cap: self.clear()
    self[key] = value
    return value

# ---- the values ----------------------------------------------------------------------------------

PLANS_PER_TEMPLATE = 8

@dataclass(frozen=True)
class Template:
  """A schedule up to its buffers (made by engine/schedule.py: _template_of, used by its instantiate)."""
  # per item: its AST, where its buffers come from (>= 0: that node of the walk's order; < 0: leaf ~p), its output nodes
  items: tuple[tuple[LazyOp, tuple[int, ...], tuple[int, ...]], ...]
  fused: bool  # FUSE_REDUCES when it was built
  # RunnerSettings -> the template bound to its loaded runners (engine/realize.py: _Plan), once it ran under them
  plans: Table = field(default_factory=lambda: Table("plans", PLANS_PER_TEMPLATE), compare=False, repr=False)

class ReplayedWalk(NamedTuple):
  """A replayed graph's walk (recipe.walk), by node index of the recipe."""
  order: tuple[int, ...]    # the walk's order (its last node is the output's base)
  leaves: tuple[int, ...]   # the walk's leaves
  forced: tuple[bool, ...]  # each node's forced realize when walked
  template: Template
  generation: int           # clear() makes walks of earlier generations stale

class Counts:
  """How often each step of the chain hit (its work skipped) or missed: graph_* in templates (a walk's
  key), walk_hits where create_schedule found a recipe's remembered walk (no walk, no key), plan_* in
  Template.plans (realize_lazy; a plan hit found the remembered walk first, uncounted), runner_* in
  runners (get_runner, after a miss by AST object), built_ahead_loaded where that miss loaded what
  compile_ahead built."""
  __slots__ = ("walk_hits", "graph_hits", "graph_misses", "plan_hits", "plan_misses", "runner_hits", "runner_misses", "built_ahead_loaded")
  def __init__(self) -> None:
    for name in self.__slots__: setattr(self, name, 0)
  def as_dict(self) -> dict[str, int]: return {name: getattr(self, name) for name in self.__slots__}

# ---- the tables ----------------------------------------------------------------------------------

templates: Table = Table("templates", 1024)       # GraphKey -> Template
runners: Table = Table("runners", 1 << 14)        # RunnerKey -> CompiledRunner
by_ast: Table = Table("by_ast", 64)               # RunnerSettings -> Table(LazyOp -> CompiledRunner)
built_ahead: Table = Table("built_ahead", 1 << 14)  # RunnerKey -> (Kernel, Program, binary, symbol in it)
verified: Table = Table("verified", 4096)         # LazyOp -> None
counts = Counts()
generation = 0

def loaded_runners(settings: RunnerSettings) -> Table:
  """The runners loaded under settings, by AST object."""
  if (t := by_ast.get(settings)) is None: t = by_ast.put(settings, Table("loaded", 4096))
  return t

def clear() -> None:
  """Start cold: empty every table, forget the walks remembered on recipes, zero the counts."""
  global generation
  for t in (templates, runners, by_ast, built_ahead, verified): t.clear()
  generation += 1
  counts.__init__()

def stats() -> dict[str, int]:
  """The counts and each table's size."""
  return {**counts.as_dict(), **{t.name: len(t) for t in (templates, runners, built_ahead, verified)},
          "loaded": sum(len(t) for t in by_ast.values())}

# ---- replayed graphs: the walk remembered on the recipe ------------------------------------------
# A graph a frontend recipe replayed has the recorded structure, so realizing its output alone walks it
# the same way every time: the walk's order and leaves are remembered as node indices of the recipe,
# with the template they found, and later replays skip the walk and the key. Valid while every node is
# as it was walked: unrealized, with the same forced realizes (the only things that change a node after
# it is made). The replayed nodes leave out the output's base (and its view), the walk's last node.

def remember_walk(rp: tuple, base: Any, order: list, leaves: list, t: Template) -> None:
  """Remember on base's recipe (rp = base.replayed) the walk (order, leaves) that found template t."""
  recipe, made = rp
  where = {n: i for i, n in enumerate(made) if n is not None}
  where[base] = recipe.base
  if order and order[-1] is base and all(b in where for b in order) and all(b in where for b in leaves):
    recipe.walk = ReplayedWalk(tuple([where[b] for b in order]), tuple([where[b] for b in leaves]), tuple([b.forced_realize for b in order]),
                               t, generation)

def replayed_walk(base: Any, fused: bool) -> Optional[tuple[Template, list, list]]:
  """For the unrealized base of a replayed graph whose walk is remembered and still valid (under
  FUSE_REDUCES `fused`, since the last clear()): its template, the walk's order and its leaves."""
  if (rp := base.replayed) is None: return None
  recipe, made = rp
  if (w := recipe.walk) is None: return None
  order_idx, leaf_idx, forced, t, gen = w
  if t.fused is not fused or gen != generation: return None
  order = [made[i] for i in order_idx[:-1]]
  order.append(base)
  for b, f in zip(order, forced):
    if b.op is None or b.forced_realize is not f: return None
  leaves = [made[i] for i in leaf_idx]
  for b in leaves:
    if b.op is not None or b.buffer is None: return None
  return t, order, leaves
