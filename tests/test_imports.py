"""The package's shape: imports point one way, no cycles, no hidden imports, configs installed.

The layers, bottom to top (README's layout block shows the same order). A module may import
modules of its own layer and of the layers below it, never above:

  chinchax.errors, chinchax.console      used by every layer
  chinchax.storage                       local and gs:// paths, disk-full
  chinchax.config                        knobs, variants, validation
  chinchax.runtime                       platforms, jax settings, multi-host, signals
  chinchax.laws                          parametric and repetition laws, units, recipes
  chinchax.cost                          counts, FLOPs, bytes, memory, step time, hardware
  chinchax.model                         transformer, attention, sharding rules
  chinchax.tracking                      TensorBoard, W&B
  chinchax.checkpoint, chinchax.data     orbax checkpoints; token stores and pipelines
  ---- the core ends here; analysis/ may import only the core ----
  chinchax.export → sample → train → bench → planning → ladder → aot     the verbs
  analysis: base (errors, runs, io, blas, recipe, validation, profile) → isoflop → repeat
            → reports (report, plots, pipeline, tuning) → isotime
  chinchax.cli                           the command line (the only importer of analysis)

Imports of chinchax / analysis modules sit at module top level (a function-level import would
hide a cycle). A package's ``__init__`` hands names on and holds no logic.
"""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys
import tomllib
import zipfile

REPO = pathlib.Path(__file__).resolve().parent.parent
OURS = ("chinchax", "analysis")
CORE_LAYERS = (
    ("chinchax.errors", "chinchax.console"),
    ("chinchax.storage",),
    ("chinchax.config",),
    ("chinchax.runtime",),
    ("chinchax.laws",),
    ("chinchax.cost",),
    ("chinchax.model",),
    ("chinchax.tracking",),
    ("chinchax.checkpoint", "chinchax.data"),
)
VERB_LAYERS = (("chinchax.export",), ("chinchax.sample",), ("chinchax.train",), ("chinchax.bench",),
               ("chinchax.planning",), ("chinchax.ladder",), ("chinchax.aot",))
ANALYSIS_LAYERS = (
    ("analysis.errors", "analysis.runs", "analysis.io", "analysis.blas", "analysis.recipe",
     "analysis.validation", "analysis.profile"),
    ("analysis.isoflop",),
    ("analysis.repeat",),
    ("analysis.report", "analysis.figures", "analysis.plots", "analysis.pipeline",
     "analysis.tuning"),
    ("analysis.isotime",),
)
CORE = tuple(p for layer in CORE_LAYERS for p in layer)
VERBS = tuple(p for layer in VERB_LAYERS for p in layer)
# The one function-level import of our modules, and why.
DEFERRED = {
    ("chinchax/cli/plan.py", "chinchax.planning.measure"):
        "only plan --calibrate needs the train stack; a plain plan starts in < 1 s",
    ("chinchax/cli/plan.py", "chinchax.aot.plancheck"):
        "only plan --aot compiles (JAX, libtpu); a plain plan starts in < 1 s",
    ("chinchax/cli/sample.py", "chinchax.sample.run"):
        "chinchax sample --help imports no JAX",
    ("chinchax/cli/export.py", "chinchax.export.writer"):
        "chinchax export --help imports no JAX",
    ("chinchax/cli/export.py", "chinchax.export.convert"):
        "chinchax export --help imports no JAX",
    **{("chinchax/cli/compile.py", f"chinchax.aot.{m}"): "chinchax compile --help imports no JAX"
       for m in ("ladder_run", "report", "search", "topology")},
}
VERBS = ("chinchax.train", "chinchax.ladder", "chinchax.planning", "chinchax.bench",
         "chinchax.export", "chinchax.aot", "chinchax.sample")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for top in OURS:
    for path in sorted((REPO / top).rglob("*.py")):
      out[_module_name(path)] = path
  return out


def _in(name: str, prefixes) -> bool:
  return any(name == p or name.startswith(p + ".") for p in prefixes)


def _imports(path: pathlib.Path, known: set[str]):
  """(imported module, line, at top level?) for every import of one of our modules."""
  tree = ast.parse(path.read_text())
  top = {id(n) for n in tree.body}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      # `from pkg import sub` imports the submodule pkg.sub when there is one.
      names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
               for a in node.names]
    else:
      continue
    for name in names:
      if name.split(".")[0] in OURS:
        yield name, node.lineno, id(node) in top


def _graph():
  modules = _modules()
  known = set(modules)
  graph, hidden = {}, []
  for name, path in modules.items():
    graph[name] = set()
    for dep, line, at_top in _imports(path, known):
      if dep != name:
        graph[name].add(dep)
      if not at_top and (str(path.relative_to(REPO)), dep) not in DEFERRED:
        hidden.append(f"{path.relative_to(REPO)}:{line} imports {dep} inside a function")
  return graph, hidden


def _cycle(graph) -> list[str] | None:
  """One import cycle of ``graph`` as a list of modules, or None (iterative DFS)."""
  state = {}
  for start in graph:
    if start in state:
      continue
    stack = [(start, iter(sorted(graph[start])))]
    path = [start]
    state[start] = "open"
    while stack:
      node, deps = stack[-1]
      dep = next(deps, None)
      if dep is None:
        state[node] = "done"
        stack.pop()
        path.pop()
        continue
      if dep not in graph or state.get(dep) == "done":
        continue
      if state.get(dep) == "open":
        return path[path.index(dep):] + [dep]
      state[dep] = "open"
      stack.append((dep, iter(sorted(graph[dep]))))
      path.append(dep)
  return None


def test_cycle_finder_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles():
  graph, _ = _graph()
  # A package's __init__ re-exporting its submodules is not a cycle of the code.
  edges = {m: {d for d in deps if not (m + ".").startswith(d + ".") and not d.startswith(m + ".")}
           for m, deps in graph.items()}
  assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def test_no_function_level_imports_of_our_modules():
  _, hidden = _graph()
  assert not hidden, "\n".join(hidden)


def _rank(name: str) -> tuple[str, int] | None:
  """(stack, layer index) of one of our modules: stack "chinchax" (core, then verbs, then the
  command line) or "analysis"; None for the package roots."""
  for i, layer in enumerate(CORE_LAYERS + VERB_LAYERS + (("chinchax.cli",),)):
    if _in(name, layer):
      return "chinchax", i
  for i, layer in enumerate(ANALYSIS_LAYERS):
    if _in(name, layer):
      return "analysis", i
  return None


def test_layer_ranks():
  assert _rank("chinchax.storage.paths") < _rank("chinchax.model.transformer")
  assert _rank("chinchax.train.loop") < _rank("chinchax.cli.train")
  assert _rank("analysis.isoflop.approach3") < _rank("analysis.pipeline")
  assert _rank("chinchax") is None


def test_layers_point_one_way():
  graph, _ = _graph()
  bad = []
  for m, deps in graph.items():
    rank = _rank(m)
    for d in deps:
      drank = _rank(d)
      if m == "chinchax":  # the package root chooses JAX's platforms before JAX starts
        if d != "chinchax.runtime.platforms":
          bad.append(f"chinchax/__init__ imports {d}")
        continue
      if drank is None:
        continue  # a package root (``from chinchax import errors`` names its module)
      if rank is None:  # analysis/__init__ hands on the core's laws
        rank = ("analysis", 0)
      if rank[0] == "analysis":
        if drank[0] == "chinchax" and not _in(d, CORE):
          bad.append(f"analysis module {m} imports {d} (analysis may import only the core)")
        elif drank[0] == "analysis" and drank[1] > rank[1]:
          bad.append(f"{m} imports {d}, a layer above it")
      elif drank[0] == "analysis":
        if not _in(m, ("chinchax.cli",)):
          bad.append(f"{m} imports {d} (only chinchax.cli may)")
      elif drank[1] > rank[1]:
        bad.append(f"{m} imports {d}, a layer above it")
  assert not bad, "\n".join(sorted(bad))


def test_every_module_is_in_a_layer():
  unplaced = [m for m in _modules() if m not in ("chinchax", "analysis") and _rank(m) is None]
  assert not unplaced, unplaced


def test_a_package_face_holds_no_logic():
  """Every ``__init__.py``: a docstring, imports and ``__all__`` only (the package root also
  chooses JAX's platforms, which must happen on ``import chinchax``)."""
  bad = []
  for top in OURS:
    for path in sorted((REPO / top).rglob("__init__.py")):
      body = ast.parse(path.read_text()).body
      for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
          continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is body[0]:
          continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["__all__"]:
          continue
        if path == REPO / "chinchax" / "__init__.py" and ast.unparse(node) == "_platforms.choose()":
          continue
        bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:60]}")
  assert not bad, "\n".join(bad)


def test_the_top_level_holds_only_what_every_layer_uses():
  top = sorted(p.name for p in (REPO / "chinchax").glob("*.py"))
  assert top == ["__init__.py", "console.py", "errors.py"], top


def test_every_package_directory_is_installed():
  listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
  found = {_module_name(p.parent) for top in OURS for p in (REPO / top).rglob("__init__.py")}
  found.add("chinchax.configs")
  assert found == listed


def test_wheel_carries_the_configs(tmp_path):
  """A non-editable install has configs/*.py as chinchax/configs/ (the CLI's defaults)."""
  src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
  src.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(REPO / name, src / name)
  for top in OURS + ("configs",):
    shutil.copytree(REPO / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                  str(src)], check=True, capture_output=True)
  (wheel,) = tmp_path.glob("chinchax-*.whl")
  names = set(zipfile.ZipFile(wheel).namelist())
  for f in ("train.py", "ladder.py", "bench.py"):
    assert f"chinchax/configs/{f}" in names
