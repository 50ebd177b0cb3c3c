"""The package's import graph has the layers the README's Layout table describes.

Bottom to top: `engine/` (imports only itself: no gin, no T5, no framework), `paths` and
`checkpoints/storage` (nothing of ours), `t5/`, `checkpoints/`, the T5X-style modules at the top
level and their packages, then the tools (`infer/`, `training/`, `bench/`, `aot`'s command
line) and the T5X hook (`t5x/`), which nothing below them imports. Only the hook imports
`t5x`; only the top level and above import gin. Read from the source (ast), so the test sees
every import, lazy ones too.
"""

import ast
import configparser
import pathlib
import re
import shlex

import pytest

from spec_decode import paths

MODULES = sorted(paths.PACKAGE.rglob("*.py"))
TOOLS = ("spec_decode.infer", "spec_decode.training", "spec_decode.bench", "spec_decode.t5x",
         "spec_decode.aot.cli", "spec_decode.aot.__main__")
# Modules above ~500 lines, with the reason a reader would accept.
LONG_MODULES: dict[str, str] = {}


def _name(path: pathlib.Path) -> str:
  parts = path.relative_to(paths.ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      found.update(f"{node.module}.{alias.name}" for alias in node.names)
  return found


def _allowed(module: str) -> tuple[str, ...]:
  """The spec_decode prefixes `module` may import."""
  if module.startswith("spec_decode.engine"):
    return ("spec_decode.engine",)
  if module in ("spec_decode.paths", "spec_decode.checkpoints.storage"):
    return ()
  if module.startswith("spec_decode.t5."):  # the vocabulary reads gs:// files as checkpoints do
    return ("spec_decode.engine", "spec_decode.t5.", "spec_decode.paths",
            "spec_decode.checkpoints.storage")
  if module.startswith("spec_decode.checkpoints"):
    return ("spec_decode.checkpoints", "spec_decode.engine", "spec_decode.t5.",
            "spec_decode.paths")
  return ("spec_decode",)  # above t5/; the T5X-style layer is kept off the tools below


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(paths.ROOT)))
def test_imports_follow_the_layers(path):
  module = _name(path)
  imports = _imports(path)
  ours = {name for name in imports if name.startswith("spec_decode")}
  allowed = _allowed(module)
  assert all(name.startswith(allowed) for name in ours), sorted(ours)
  if not module.startswith(TOOLS):
    assert not any(name.startswith(TOOLS) for name in ours), sorted(ours)
  third_party = {name.split(".")[0] for name in imports - ours}
  if module.startswith("spec_decode.engine"):
    assert not third_party & {"gin", "seqio", "tensorflow", "t5x"}, third_party
  if not module.startswith("spec_decode.t5x"):
    assert "t5x" not in third_party


def test_no_modules_import_each_other():
  """The package's imports, lazy ones too, form no circle: each module can be read (and
  imported) after what it uses."""
  names = {_name(path): path for path in MODULES}

  def module_of(name: str) -> str:
    while name not in names:  # `from spec_decode.x import name`: the module x
      name = name.rpartition(".")[0]
    return name

  uses = {name: {module_of(imported) for imported in _imports(path)
                 if imported.startswith("spec_decode.")} - {name}
          for name, path in names.items()}
  done: set[str] = set()

  def visit(name: str, chain: tuple[str, ...]) -> None:
    assert name not in chain, " -> ".join(chain[chain.index(name):] + (name,))
    if name not in done:
      for used in sorted(uses[name]):
        visit(used, chain + (name,))
      done.add(name)

  for name in sorted(uses):
    visit(name, ())


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(paths.ROOT)))
def test_modules_stay_readable(path):
  relative = str(path.relative_to(paths.ROOT))
  if relative not in LONG_MODULES:
    assert len(path.read_text().splitlines()) <= 520, f"{relative}: split it or say why"


def test_no_module_registers_with_gin_on_import():
  for path in MODULES:
    source = path.read_text()
    assert "@gin.configurable" not in source and "gin.external_configurable(" not in source, path


# The places that decode: each through the one core, none wiring the engine's loops itself.
RUNNERS = ("spec_decode/models.py", "spec_decode/t5x/speculative.py",
           "spec_decode/runtime/decode_layout.py", "spec_decode/bench/decoders.py",
           "spec_decode/training/greedy.py")


@pytest.mark.parametrize("relative", RUNNERS)
def test_every_runner_decodes_through_the_core(relative):
  path = paths.ROOT / relative
  assert "spec_decode.core" in _imports(path), relative
  # Caches and step functions are the core's business (`core.ModelCalls`; the mesh's layout is
  # one, so it alone wraps the network's step function): no runner wires a loop itself.
  source = path.read_text()
  wired = ("decoding.speculative_sample(", "decoding.temperature_sample(")
  if relative != "spec_decode/runtime/decode_layout.py":
    wired += ("make_tokens_to_logits(", "init_decode_cache(")
  for name in wired:
    assert name not in source, (relative, name)


def test_no_module_uses_gins_private_names():
  for path in MODULES:
    source = path.read_text()
    for private in ("gin_config._", "gin.config._", "._CONFIG", "._REGISTRY"):
      assert private not in source, (path, private)


def test_every_gin_file_lives_under_configs():
  gin_files = {path for path in paths.ROOT.rglob("*.gin")
               if not any(part.startswith((".venv", ".git", "build"))
                          for part in path.relative_to(paths.ROOT).parts)}
  assert gin_files, "no gin file found"
  outside = sorted(str(p.relative_to(paths.ROOT)) for p in gin_files
                   if p.relative_to(paths.ROOT).parts[0] != "configs")
  assert not outside, outside


def test_the_library_names_no_developer_data_folder():
  """`../shared` is the test suite's (tests/shared_data.py), never the package's."""
  for path in MODULES:
    assert not re.search(r"['\"]shared['\"]|\.\./shared", path.read_text()), path


# What a machine-independent file may still name from the root: the operating system's own
# interfaces (the interpreter of a script, devices, /proc), a scratch file in /tmp, JAX's
# monitoring event names, and placeholders a user replaces.
SYSTEM_PATHS = ("/usr/bin/env", "/dev/", "/proc/", "/sys/", "/tmp/", "/jax/", "/path/to",
                "/abs/path")
# A path from the root: at the start of a line or after a separator, an opening quote or `=`,
# not inside a relative path, a URL ("gs://b/x") or after a closing quote ("$work"/dist).
ABSOLUTE_PATH = re.compile(
    r"(?:^|[\s=(\[,>:!]|(?:^|[\s=(\[,])[\"'`])(/[A-Za-z_][\w.-]*(?:/[\w.*-]*)+)", re.MULTILINE)


def _portable_files() -> list[pathlib.Path]:
  """The scripts, configs and package source of the checkout (or of the installed package)."""
  files = [paths.ROOT / "setup.py", paths.ROOT / ".ci" / "run"]
  files += [path for path in (paths.ROOT / "scripts").glob("*") if path.is_file()]
  files += paths.CONFIGS.rglob("*.gin")
  files += [path for path in paths.PACKAGE.rglob("*")
            if path.suffix in (".py", ".cc", ".md", ".gin")]
  return sorted(path for path in files if path.is_file())


def test_no_file_names_a_machines_folder():
  """Scripts, configs and code run on any machine: none names a folder by its absolute path."""
  found = [f"{path.relative_to(paths.ROOT)}: {match}" for path in _portable_files()
           for match in ABSOLUTE_PATH.findall(path.read_text())
           if not match.startswith(SYSTEM_PATHS)]
  assert not found, found


# The network: the module every caller imports, and those it is split into (as T5X's).
NETWORK_MODULES = ("network", "layers", "ops", "decoder_only")


@pytest.mark.parametrize("module", NETWORK_MODULES)
def test_the_network_knows_no_backend(module):
  """The network's modules import no kernel or backend module (only each other) and ask JAX
  for no backend: the code that runs a model injects its products (`network.Ops`, chosen by
  `platforms.Platform`)."""
  path = paths.PACKAGE / "t5" / f"{module}.py"
  imports = _imports(path)
  ours = {name for name in imports if name.startswith("spec_decode")}
  assert all(name.startswith(tuple(f"spec_decode.t5.{other}." for other in NETWORK_MODULES))
             for name in ours), sorted(ours)
  third_party = {name.split(".")[0] for name in imports - ours}
  assert third_party <= {"dataclasses", "functools", "operator", "typing", "jax", "numpy",
                         "flax"}, sorted(third_party)
  assert not {name for name in imports if name.startswith(("jax.extend", "jax.ffi", "jaxlib"))}
  names = {node.attr if isinstance(node, ast.Attribute) else node.id
           for node in ast.walk(ast.parse(path.read_text()))
           if isinstance(node, (ast.Attribute, ast.Name))}
  assert not names & {"default_backend", "devices", "local_devices", "device_count", "ffi",
                      "cpu_kernels"}, sorted(names)


def _calls(path: pathlib.Path) -> set[str]:
  """Dotted names of everything `path` calls or refers to (`jax.distributed.initialize`)."""
  def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
      return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"
  return {dotted(node) for node in ast.walk(ast.parse(path.read_text()))
          if isinstance(node, (ast.Attribute, ast.Name))}


def test_one_place_chooses_the_platforms_products():
  """`platforms.Platform` alone picks a program's products and options from its devices: no
  other module of the package picks CPU ops or asks for the host's backend (the benchmark's
  machine report only records it)."""
  choosers = {str(path.relative_to(paths.ROOT)) for path in MODULES
              if {"cpu_kernels.cpu_ops", "cpu_ops"} & _calls(path)
              and path.name != "cpu_kernels.py"}
  assert choosers == {"spec_decode/runtime/platforms.py"}, choosers
  asking = {str(path.relative_to(paths.ROOT)) for path in MODULES
            if "jax.default_backend" in _calls(path)}
  assert asking <= {"spec_decode/bench/machine.py"}, asking


def test_jax_distributed_starts_at_the_edge_only():
  """Setup happens once, where a program starts: `gin_utils.initialize_distributed`, called by
  the entry points; no library module starts JAX's distributed system."""
  starting = {str(path.relative_to(paths.ROOT)) for path in MODULES
              if any(name.startswith("jax.distributed") for name in _calls(path))}
  assert starting == {"spec_decode/gin_utils.py"}, starting


def _pytest_arguments(script: str) -> list[str]:
  """The arguments of the `-m pytest` command in scripts/`script` that runs the main process's
  tests (not the sharding tests' run, which sets XLA_FLAGS), line continuations joined."""
  text = (paths.ROOT / "scripts" / script).read_text().replace("\\\n", " ")
  commands = [line for line in text.splitlines()
              if "-m pytest" in line and not line.lstrip().startswith("#")
              and "XLA_FLAGS" not in line]
  assert len(commands) == 1, commands
  return shlex.split(commands[0].split("-m pytest", 1)[1])


def test_the_tiers_are_marker_selections():
  """pytest runs with --strict-markers and the markers it declares; the fast and newest tiers
  are marker expressions over the whole tests folder, not lists of files; the full suite selects
  nothing away."""
  ini = configparser.ConfigParser()
  ini.read(paths.ROOT / "pytest.ini")
  assert "--strict-markers" in ini["pytest"]["addopts"].split()
  declared = {line.split(":")[0].strip() for line in ini["pytest"]["markers"].splitlines()
              if line.strip()}
  assert declared == {"slow", "newest"}
  for script, expression in (("test_fast.sh", "not slow"),
                             ("test_newest.sh", "newest")):
    arguments = _pytest_arguments(script)
    assert arguments[arguments.index("-m") + 1] == expression, (script, arguments)
    assert "tests" in arguments, (script, arguments)
    assert not [a for a in arguments if a.startswith("tests/") and a.endswith(".py")], script
  full = _pytest_arguments("test.sh")
  assert "-m" not in full and "-k" not in full and "tests" in full, full


# The top of the package: the central modules a newcomer reads first; the rest in packages
# named by their role.
MOST_TOP_LEVEL_MODULES = 8


def test_the_top_level_holds_few_modules():
  modules = sorted(path.name for path in paths.PACKAGE.glob("*.py"))
  assert len(modules) <= MOST_TOP_LEVEL_MODULES, modules


def test_the_readme_names_every_top_level_module():
  """A newcomer finds the owner of each concern from the README's Layout table: it names every
  module and package at the top of `spec_decode/`, and nothing that is not there."""
  readme = (paths.ROOT / "README.md").read_text()
  table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
  named = set(re.findall(r"`spec_decode/(\w+)(?:\.py|/)`", table))
  present = {path.stem for path in paths.PACKAGE.iterdir()
             if (path.suffix == ".py" and path.stem != "__init__")
             or (path.is_dir() and not path.name.startswith("__"))}
  assert named == present, (sorted(present - named), sorted(named - present))


# Rows of the paper's table, written as the paper prints them.
POSITIONAL_CALLS_ALLOWED = {"spec_decode/bench/paper.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(paths.ROOT)))
def test_no_call_passes_eight_positional_arguments(path):
  """Past a few arguments a call names them: a reader should not count positions."""
  relative = str(path.relative_to(paths.ROOT))
  if relative in POSITIONAL_CALLS_ALLOWED:
    return
  long_calls = [node.lineno for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Call) and len(node.args) >= 8]
  assert not long_calls, f"{relative}: lines {long_calls}"
