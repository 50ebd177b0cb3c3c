"""The README and the pages of docs/ as a user reads them.

Every command line in their shell code blocks, as a user copies it into a shell at the
repository's root: each `python -m spec_decode...` and `python -m t5x...` command names only
flags its program defines, and every gin file it names exists where that program looks for it
(T5X's: where gin finds it, as `python -m t5x.infer` parses it). Every relative link leads to a
file that exists, and to a heading of it where it names one. The README stays a page a user reads
in minutes: at most README_MOST_LINES lines, the rest in docs/.

Read, not run: the commands need TPUs, checkpoints and data. A `<name>` in a path stands for a
choice among existing files (it must match one); a shell variable or an absolute path (a file an
earlier command writes) is the user's and is not looked up.
"""

import argparse
import glob
import importlib.util
import os
import pathlib
import re
import runpy
import shlex
import sys
import warnings
from unittest import mock

import pytest

from spec_decode import paths

README = paths.ROOT / "README.md"
PAGES = [README, *sorted((paths.ROOT / "docs").rglob("*.md"))]
README_MOST_LINES = 250
# The documented search path for T5X (`--gin_search_paths="$(python -m spec_decode.paths)"`).
PATHS_COMMAND = "$(python -m spec_decode.paths)"
SEPARATORS = {"&&", "||", ";", "|", "do", "then", "(", ")"}


def _commands() -> list[list[str]]:
  """The pages' `python -m` commands of spec_decode or T5X, each as its words."""
  text = "\n".join(page.read_text() for page in PAGES)
  commands = []
  for language, block in re.findall(r"```(\w*)\n(.*?)```", text, re.DOTALL):
    if language not in ("", "bash", "sh", "shell"):
      continue
    for line in block.replace("\\\n", " ").splitlines():
      line = line.replace(PATHS_COMMAND, str(paths.CONFIG_ROOT))
      line = re.sub(r"\$\([^()]*\)", "$SUBSTITUTED", line)  # another command's output
      lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
      lexer.whitespace_split = True
      words: list[str] = []
      for word in [*lexer, ";"]:
        if word not in SEPARATORS:
          words.append(word)
          continue
        if (len(words) > 2 and words[0] in ("python", "python3") and words[1] == "-m"
            and words[2].split(".")[0] in ("spec_decode", "t5x")):
          commands.append(words)
        words = []
  return commands


COMMANDS = _commands()


class _Parsed(Exception):
  """Raised by the captured argparse parser of a program, carrying it."""

  def __init__(self, parser: argparse.ArgumentParser):
    super().__init__(parser.prog)
    self.parser = parser


def _spec_decode_flags(module: str) -> tuple[set[str], bool]:
  """The flags `python -m module` defines, and whether it takes gin's `--gin.NAME=VALUE`: its
  argparse parser, captured where the program parses its command line."""

  def capture(parser, *args, **kwargs):
    del args, kwargs
    raise _Parsed(parser)

  with mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture), \
      mock.patch.object(argparse.ArgumentParser, "parse_args", capture), \
      mock.patch.object(sys, "argv", [module]), warnings.catch_warnings():
    # runpy warns that an imported module runs again as `__main__`: only its parser is kept.
    warnings.simplefilter("ignore", RuntimeWarning)
    try:
      runpy.run_module(module, run_name="__main__")
    except _Parsed as parsed:
      flags = set(parsed.parser._option_string_actions)  # pylint: disable=protected-access
      return flags, "--gin_file" in flags
  raise AssertionError(f"python -m {module} parses no command line with argparse")


def _t5x_flags(module: str) -> tuple[set[str], bool]:
  """The flags T5X's script `module` defines (read from its source: absl defines them when it
  runs as the program), and gin's `--gin.NAME=VALUE`, which T5X rewrites into bindings."""
  spec = importlib.util.find_spec(module)
  assert spec is not None and spec.origin, f"no {module} in this T5X installation"
  with open(spec.origin, encoding="utf-8") as source:
    names = re.findall(r"flags\.DEFINE_\w+\(\s*'(\w+)'", source.read())
  return {f"--{name}" for name in names}, True


def _found_by_gin(gin_file: str, search_paths: list[str]) -> bool:
  """Whether T5X's gin finds `gin_file`: under each prefix ('' first, then the search paths) a
  file there, or a file in the folder of an importable package of that dotted name (gin's own
  lookup, which fails on a folder without `__init__.py`)."""
  for prefix in ["", *search_paths]:
    path = os.path.join(prefix, gin_file)
    if (paths.ROOT / path).is_file():
      return True
    folder, name = os.path.split(path)
    try:
      spec = importlib.util.find_spec(folder.replace("/", "."))
    except (ImportError, ValueError):
      continue
    if spec is not None and spec.origin is None:
      return False  # a namespace package: gin stops with a TypeError there
    if spec is not None and os.path.isfile(os.path.join(os.path.dirname(spec.origin), name)):
      return True
  return False


def _values(words: list[str], flag: str) -> list[str]:
  """The values given to `flag` (`--flag=value` or `--flag value`)."""
  values = []
  for i, word in enumerate(words):
    if word.startswith(f"{flag}="):
      values.append(word.split("=", 1)[1])
    elif word == flag and i + 1 < len(words):
      values.append(words[i + 1])
  return values


def _anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as '-'."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
  return {_anchor(heading) for heading in re.findall(r"(?m)^#+ (.*)$", text)}


def _links(page: pathlib.Path) -> list[str]:
  """The targets of the page's Markdown links, outside its code blocks."""
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
  return re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_readme_is_short():
  lines = len(README.read_text().splitlines())
  assert lines <= README_MOST_LINES, f"README.md has {lines} lines: move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(paths.ROOT)))
def test_every_relative_link_leads_somewhere(page):
  broken = []
  for link in _links(page):
    if re.match(r"[a-z]+:", link):
      continue  # a URL
    target, _, anchor = link.partition("#")
    path = (page.parent / target).resolve() if target else page
    if not path.exists():
      broken.append(f"{link} (no such file)")
    elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
      broken.append(f"{link} (no such heading)")
  assert not broken, f"{page.relative_to(paths.ROOT)}: {broken}"


def test_the_readme_has_commands_to_check():
  programs = {words[2] for words in COMMANDS}
  assert {"spec_decode.infer", "t5x.infer"} <= programs, programs


@pytest.mark.parametrize("words", COMMANDS, ids=lambda words: " ".join(words[2:5])[:80])
def test_a_readme_command_names_existing_flags_and_gin_files(words):
  module, arguments = words[2], words[3:]
  if module.startswith("t5x."):
    pytest.importorskip("t5x", reason="needs t5x, installed from its repository (README: Tests)")
    flags, takes_gin = _t5x_flags(module)
  else:
    flags, takes_gin = _spec_decode_flags(module)
  for word in arguments:
    if not word.startswith("--"):
      continue
    name = word.split("=", 1)[0]
    if name.startswith("--gin."):
      assert takes_gin, f"{module} takes no gin bindings: {word}"
    else:
      assert name in flags, f"python -m {module} has no flag {name}"
  search_paths = [path for value in _values(arguments, "--gin_search_paths")
                  for path in value.split(",")]
  for flag in sorted({word.split("=", 1)[0] for word in arguments
                      if word.startswith("--") and word.split("=", 1)[0].endswith("gin_file")}):
    for gin_file in _values(arguments, flag):
      if "$" in gin_file or os.path.isabs(gin_file):
        continue  # the user's: a shell variable, or a file an earlier command writes
      if "<" in gin_file:  # a choice: `configs/table2/<row>.gin`
        pattern = re.sub(r"<[^>]*>", "*", gin_file)
        assert glob.glob(str(paths.ROOT / pattern)), f"{flag}={gin_file} matches no file"
        continue
      if module.startswith("t5x."):
        assert _found_by_gin(gin_file, search_paths), (
            f"{flag}={gin_file}: T5X's gin does not find it (search paths {search_paths})")
      else:
        assert os.path.isfile(paths.resolve(gin_file)), f"{flag}={gin_file} does not exist"
