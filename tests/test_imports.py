"""The package's shape: imports point one way, no cycles, no hidden imports, configs installed.

Layers (outer may import inner, never the reverse):
  chinchax.cli  →  verbs (train, ladder, planning, bench, export)  →  core
  analysis      →  core
Only chinchax.cli imports analysis. Imports of chinchax / analysis modules sit at
module top level (a function-level import would hide a cycle).
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
# Modules of the core: no import of a verb, the CLI or analysis.
CORE = ("chinchax.errors", "chinchax.console", "chinchax.runtime", "chinchax.config",
        "chinchax.config_defaults", "chinchax.config_base", "chinchax.config_checks", "chinchax.config_ladders",
        "chinchax.laws", "chinchax.laws_repeat", "chinchax.budget", "chinchax.model", "chinchax.attention",
        "chinchax.sharding", "chinchax.distributed", "chinchax.checkpoint", "chinchax.tblog",
        "chinchax.hardware", "chinchax.work", "chinchax.step_time", "chinchax.data",
        "chinchax.paths", "chinchax.hparams", "chinchax.platforms", "chinchax.interrupts",
        "chinchax.recipe", "chinchax.law_units", "chinchax.gcs", "chinchax.diskfull",
        "chinchax.wandblog")
# The one function-level import of our modules, and why.
DEFERRED = {
    ("chinchax/cli/plan.py", "chinchax.planning.measure"):
        "only plan --calibrate needs the train stack; a plain plan starts in < 1 s",
    ("chinchax/cli/plan.py", "chinchax.aot.plancheck"):
        "only plan --aot compiles (JAX, libtpu); a plain plan starts in < 1 s",
    ("chinchax/cli/sample.py", "chinchax.sample.run"):
        "chinchax sample --help imports no JAX",
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


def test_layers_point_one_way():
  graph, _ = _graph()
  bad = []
  for m, deps in graph.items():
    for d in deps:
      if _in(m, CORE) and not _in(d, CORE):
        bad.append(f"core module {m} imports {d}")
      if _in(m, ("analysis",)) and not _in(d, CORE + ("analysis",)):
        bad.append(f"analysis module {m} imports {d}")
      if _in(d, ("analysis",)) and not _in(m, ("analysis", "chinchax.cli")):
        bad.append(f"{m} imports {d} (only chinchax.cli may)")
      if _in(d, ("chinchax.cli",)) and not _in(m, ("chinchax.cli",)):
        bad.append(f"{m} imports the command line {d}")
  assert not bad, "\n".join(sorted(bad))


def test_every_module_is_in_a_layer():
  unplaced = [m for m in _modules() if m.startswith("chinchax.")
              and not _in(m, CORE + VERBS + ("chinchax.cli",))]
  assert not unplaced, unplaced


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
