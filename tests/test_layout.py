"""The package's shape: imports point one way, no cycle, nothing loads files by path.

The import graph is read from the source with ``ast`` (every ``import`` statement, those inside
functions included), so a lazy import counts as an edge like any other.
"""

import ast
import re
import pathlib

import pytest

from tests.util import REPO

PACKAGE = REPO / "andrea_jax"

# The layers, lowest first: a module may import its own layer and the layers below, never above.
LAYERS = (
    {"checks", "plugins", "sources", "attention", "model", "simplex", "heads", "optim", "repetition",
     "storage", "signals", "xent"},
    {"curriculum", "data", "cliff", "generate", "convert", "sharding", "distributed", "lock",
     "probes", "pretrained", "hf_files", "scoring"},
    {"step"},
    {"runconfig", "config", "checkpoint", "feed", "logs", "plots", "evaluate", "viz", "resume",
     "hooks", "rundir", "trained"},
    {"train", "ablation", "terrain", "sample", "export", "harness"},
    {"main"},
)


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, module: str) -> set[str]:
  """Every ``andrea_jax`` module ``path`` imports (``from a import b`` counts ``a.b`` when that is
  a module, else ``a``)."""
  tree = ast.parse(path.read_text(), str(path))
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      for a in node.names:
        found.add(f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base)
  return {m for m in found if m == "andrea_jax" or m.startswith("andrea_jax.")}


def _is_module(name: str) -> bool:
  path = REPO.joinpath(*name.split("."))
  return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
  graph = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    module = _module_name(path)
    graph[module] = {m for m in _imports(path, module) if m != module}
  return graph


def _top(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int:
  top = _top(module)
  for i, names in enumerate(LAYERS):
    if top in names:
      return i
  raise AssertionError(f"{module} is in no layer of tests/test_layout.py: place it")


def test_the_package_has_no_import_cycle():
  graph = _graph()
  # Package __init__ files import their own modules to re-export them: an edge down, not a cycle.
  edges = {m: {d for d in deps if not (m.endswith(d.rpartition(".")[0]) and d.startswith(m + "."))
               and d != "andrea_jax"}
           for m, deps in graph.items()}
  done, stack = set(), []

  def visit(m):
    if m in stack:
      cycle = stack[stack.index(m):] + [m]
      raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
    if m in done:
      return
    stack.append(m)
    for d in sorted(edges.get(m, ())):
      if d in edges:
        visit(d)
    stack.pop()
    done.add(m)

  for m in sorted(edges):
    visit(m)


def test_imports_point_down_the_layers():
  upward = []
  for module, deps in _graph().items():
    if module == "andrea_jax":
      continue
    for d in deps:
      if d != "andrea_jax" and _layer(d) > _layer(module):
        upward.append(f"{module} imports {d}")
  assert not upward, "\n".join(sorted(upward))


def test_the_curriculum_never_imports_the_trainer():
  trainer = {"andrea_jax.train", "andrea_jax.step", "andrea_jax.runconfig", "andrea_jax.main"}
  bad = [f"{m} imports {d}" for m, deps in _graph().items()
         if m.startswith("andrea_jax.curriculum") for d in deps if d in trainer]
  assert not bad, bad


def test_the_package_never_imports_a_study_benchmark_or_test():
  bad = []
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      bad += [f"{path.relative_to(REPO)}: {n}" for n in names
              if n.split(".")[0] in ("study", "bench", "tests", "experiments")]
  assert not bad, bad


@pytest.mark.parametrize("pattern", ["spec_from_file_location", "sys.path.insert",
                                     "sys.path.append"])
def test_no_file_is_loaded_by_path_outside_the_config_loader(pattern):
  """Files import files with ``import``; the one exception is the config-file loader
  (``andrea_jax.config.load_config_file``: config files are files, as ``--config`` names them)."""
  allowed = {REPO / "andrea_jax" / "config.py", pathlib.Path(__file__)}
  found = [str(p.relative_to(REPO)) for folder in ("andrea_jax", "tests", "bench", "study",
                                                   "experiments")
           for p in (REPO / folder).rglob("*.py") if p not in allowed and pattern in p.read_text()]
  assert not found, found


def test_no_function_of_the_package_is_over_80_lines():
  """Long functions are split into named pieces (comments count; the docstring, the function's
  reference, does not)."""
  long = []
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if ast.get_docstring(node) is not None:
          doc = node.body[0]
          n -= doc.end_lineno - doc.lineno + 1
        if n > 80:
          long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
  assert not long, "\n".join(long)


def test_the_trainer_reads_like_one_loop():
  """``train.py`` keeps to the loop and its set-up (about 300 lines): the resume policy, the
  signals, the run directory and the log records live in modules of their own."""
  lines = len((PACKAGE / "train.py").read_text().splitlines())
  assert lines <= 330, f"andrea_jax/train.py has {lines} lines"
  text = (PACKAGE / "train.py").read_text()
  for moved in ("RESUME_FREE", "def config_changes", "class _Signals", "def cliff_message",
                "def step_record", "def make_workdir"):
    assert moved not in text, moved


# Modules below the command line: they take the typed Run, never the ConfigDict's sections.
_BELOW_THE_COMMAND_LINE = ("train.py", "evaluate.py", "feed.py", "rundir.py", "resume.py",
                           "logs.py", "step.py", "hooks.py", "probes/__init__.py",
                           "probes/interface.py", "probes/target_gain.py")


@pytest.mark.parametrize("name", _BELOW_THE_COMMAND_LINE)
def test_no_raw_config_reads_below_the_command_line(name):
  """``config.<section>.<field>`` is read once, by ``runconfig.build``; below it, ``run.train``,
  ``run.eval``, ``run.data`` and the rest of the typed ``Run``."""
  text = (PACKAGE / name).read_text()
  found = re.findall(r"(?<![\w.-])config\.(?:train|eval|data|optim|model|curriculum|mesh|seed|"
                     r"cliff)\b",
                     text)
  assert not found, f"andrea_jax/{name}: {sorted(set(found))}"


def test_every_temporary_file_write_goes_through_storage():
  """A file written whole or not at all is ``storage.atomic_write`` or ``storage.AtomicFile``:
  no module renames a temporary file into place itself. (The lock's takeover renames the lock
  file aside, the cache renames a finished directory, and a prepared source's finished files move
  from its staging folder: none is a file write.)"""
  allowed = {"storage.py", "lock.py", "cache.py", "commit.py"}
  found = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
           if p.name not in allowed and re.search(r"os\.(replace|rename)\(", p.read_text())]
  assert not found, found


def test_a_data_format_is_one_entry_in_the_registry():
  """Adding a data format touches one module: the built-in formats are listed in
  ``data/formats.py`` and read in their own modules (``data/readers.py``, the Hugging Face
  plug-in); nothing else branches on a format's name, and the pipeline takes the checked spec
  without checking the section again."""
  own = {PACKAGE / "data" / "formats.py", PACKAGE / "data" / "readers.py"}
  found = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
           if p not in own and "hub" not in p.parts
           and re.search(r"\.format\s*(?:==|!=|\bin\b)", p.read_text())]
  assert not found, found
  calls = {node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
           for node in ast.walk(ast.parse((PACKAGE / "data" / "pipeline.py").read_text()))
           if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))}
  assert not calls & {"data_spec", "validate_data_config", "build", "check"}, calls


@pytest.mark.slow
def test_the_trainer_imports_no_hub_code_nor_any_corpus():
  """``import andrea_jax.train`` (and the command line) loads the data pipeline only: the Hugging
  Face plug-in (but its one spec class) and the built-in corpora load when a run asks for them."""
  import subprocess
  import sys
  code = ("import sys, andrea_jax.main, andrea_jax.train\n"
          "print(sorted(m for m in sys.modules if m.startswith(('andrea_jax.data.hub.', "
          "'andrea_jax.data.corpora', 'datasets', 'jinja2', 'transformers'))))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=REPO)
  assert out.stdout.strip() == "['andrea_jax.data.hub.spec']", out.stdout


def test_every_plug_in_is_found_and_read_by_one_module():
  """A name the config gives (a mixer, a reward, a probe, a data format, an optimizer update, a
  hook, a metric) is imported by :func:`andrea_jax.plugins.resolve` and its factory's signature
  read by :func:`andrea_jax.plugins.arguments`: no other module imports by name or reads a
  signature, so every extension point is opened the same way."""
  found = [f"{p.relative_to(REPO)}: {m}" for p in PACKAGE.rglob("*.py") if p.name != "plugins.py"
           for m in ("import_module(", "get_type_hints(", "inspect.signature(")
           if m in p.read_text()]
  assert not found, found


# Modules that may write their own checks, each with the reason.
_OWN_CHECKS_ALLOWED = {
    "andrea_jax/checks.py": "the one module that writes the rule",
}


def _is_isinstance(node: ast.AST) -> bool:
  return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id == "isinstance" and len(node.args) == 2)


def _names_bool(types: ast.AST) -> bool:
  """``bool``, ``np.bool_``, or a tuple holding one."""
  return any((isinstance(t, ast.Name) and t.id == "bool")
             or (isinstance(t, ast.Attribute) and t.attr == "bool_")
             for t in (types.elts if isinstance(types, ast.Tuple) else [types]))


def _own_checks(source: str) -> list[int]:
  """The lines of ``source`` that hand-write what :mod:`andrea_jax.checks` says once.

  What ``grep "isinstance([^)]*bool[^)]*) or not isinstance\\|not isinstance([a-z_.]*, bool)"``
  finds, read from the syntax tree so a line break, a tuple of types or a reordering does not hide
  it: ``isinstance(x, bool)`` in one ``and``/``or`` with another ``isinstance(x, ...)`` of the same
  ``x`` (an integer or a number check: ``checks.integer``, ``checks.number``, or the predicates
  ``checks.is_integer`` and ``checks.is_number``), and ``not isinstance(x, bool)`` (a flag check:
  ``checks.flag``)."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.BoolOp):
      calls = [c for v in node.values for c in ast.walk(v) if _is_isinstance(c)]
      excluded = {ast.dump(c.args[0]) for c in calls if _names_bool(c.args[1])}
      if any(ast.dump(c.args[0]) in excluded for c in calls if not _names_bool(c.args[1])):
        found.add(node.lineno)
    elif (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
          and _is_isinstance(node.operand) and _names_bool(node.operand.args[1])):
      found.add(node.lineno)
  return sorted(found)


def test_own_checks_finds_the_hand_written_forms():
  for source in ("isinstance(v, bool) or not isinstance(v, int) or v < 1",
                 "isinstance(v, int) and not isinstance(v, bool)",
                 "(isinstance(x.y, (bool, np.bool_))\n or not isinstance(x.y, numbers.Real))",
                 "integer = lambda x: (isinstance(x, numbers.Integral)\n"
                 "                     and not isinstance(x, (bool, np.bool_)))",
                 "if not isinstance(cfg.verify, bool):\n  pass"):
    assert _own_checks(source), source
  for source in ("checks.integer('n', v, minimum=1)", "isinstance(v, int) and v > 0",
                 "isinstance(a, bool) or isinstance(b, int)", "checks.is_number(v)"):
    assert not _own_checks(source), source


def test_every_field_check_goes_through_the_checks_module():
  """A field or argument is checked with :mod:`andrea_jax.checks` (``integer``, ``number``,
  ``flag``, ...; ``is_integer``/``is_number`` where values are sorted rather than refused), so a
  bool is never taken for a number and every refusal reads the same; no module writes
  ``isinstance(v, bool) or not isinstance(v, int)`` itself, but those of ``_OWN_CHECKS_ALLOWED``."""
  import fnmatch
  found = []
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(REPO).as_posix()
    if not any(fnmatch.fnmatch(rel, p) for p in _OWN_CHECKS_ALLOWED):
      found += [f"{rel}:{n}" for n in _own_checks(path.read_text())]
  assert not found, "checks written by hand (use andrea_jax.checks): " + ", ".join(found)
