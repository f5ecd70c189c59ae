"""The house rules that code review forgets: imports flow down the layers, and the CLI stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "extrapos"

# Units (a top-level module or a folder of extrapos) by layer, bottom first; docs/architecture.md
# draws the same picture. A unit may import units of its own layer or below, never above.
LAYERS = [
    (
        "foundation",
        {
            "extrapos",
            "errors",
            "schema",
            "presets",
            "files",
            "auto_registration",
            "bounds",
            "owned",
            "plugins",
            "console",
            "locks",
        },
    ),
    ("data", {"data"}),
    ("positions", {"positions"}),
    ("attention", {"attention"}),  # a folder: the dispatcher, the mask and one file per kernel family
    ("model", {"model", "losses"}),
    ("run", {"run"}),
    ("report", {"report"}),
    # the commands, three floors: the engines that train, score, sample and inspect (none imports another),
    # the tasks and the bench built on evaluate's slot and evaluators (and bench on inference's decoding),
    # then the integrations, which wrap tasks (lm-eval) and inference (sentence-transformers) for others
    ("commands", {"training", "evaluate", "inference", "tools"}),
    ("tasks", {"tasks", "bench"}),
    ("integrations", {"integrations"}),
    ("sweeps", {"compare"}),
    ("cli", {"cli", "__main__"}),
]
RANK = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "extrapos"


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every extrapos module a file imports, at the top or inside functions (lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "extrapos"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "extrapos":
                found.add(node.module)
                if node.module == "extrapos":  # from extrapos import schema
                    found |= {f"extrapos.{a.name}" for a in node.names}
    return found


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> where, for imports between different units."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        source = unit_of(module_name(path))
        for target_module in imported_modules(path):
            target = unit_of(target_module)
            if target != source:
                edges.setdefault((source, target), []).append(f"{path.relative_to(SRC)} -> {target_module}")
    return edges


def test_every_unit_has_a_layer():
    units = {unit_of(module_name(p)) for p in SRC.rglob("*.py")}
    missing = sorted(units - set(RANK))
    assert not missing, f"place these modules in a layer of LAYERS (and docs/architecture.md): {missing}"


def test_imports_flow_down_the_layers():
    upward = [
        f"{where} ({LAYERS[RANK[s]][0]} imports {LAYERS[RANK[t]][0]})"
        for (s, t), wheres in import_edges().items()
        if RANK.get(t, 0) > RANK.get(s, 0)
        for where in wheres
    ]
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def test_units_do_not_import_each_other_in_a_cycle():
    graph: dict[str, set[str]] = {}
    for s, t in import_edges():
        graph.setdefault(s, set()).add(t)
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack, node, nxt]))
            if nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for node in list(graph):
        if node not in state:
            visit(node, [])


def file_edges() -> dict[str, set[str]]:
    """Module -> the extrapos modules it imports (files, not units; a package is its ``__init__``).

    ``from extrapos.data import prepare`` names the module ``extrapos.data.prepare`` when that file
    exists, else the package ``extrapos.data``. Imports of a module's own enclosing package are left
    out (below)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module in modules and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
                targets |= subs if subs else {node.module}
        # a registry that imports its own package to walk it (``positions/registry.py``) is the package's
        # facade looking back at it, not a second file, and so is reading ``extrapos.__version__``; any
        # other submodule that imports its own package is a cycle (evaluate/stream.py once was one)
        graph[name] = {t for t in targets if not _walks_own_package(name, t)} - {name}
    return graph


#: the registries that import their own package to walk its modules
PACKAGE_WALKERS = {"extrapos.positions.registry": "extrapos.positions"}


def _walks_own_package(module: str, target: str) -> bool:
    return target == "extrapos" or PACKAGE_WALKERS.get(module) == target


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt] if nxt in stack else [*stack, nxt]
            if nxt not in state:
                found = visit(nxt, [*stack, nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_a_submodule_that_imports_its_package_is_a_cycle():
    """Only the package walkers are exempt: a module of evaluate/ that imports ``extrapos.evaluate`` while
    the package imports it back is reported."""
    graph = {
        "extrapos.evaluate": {"extrapos.evaluate.stream"},
        "extrapos.evaluate.stream": {"extrapos.evaluate"},
    }
    kept = {m: {t for t in targets if not _walks_own_package(m, t)} - {m} for m, targets in graph.items()}
    assert find_cycle(kept) == ["extrapos.evaluate", "extrapos.evaluate.stream", "extrapos.evaluate"]
    assert not _walks_own_package("extrapos.evaluate.stream", "extrapos.evaluate")
    assert _walks_own_package("extrapos.positions.registry", "extrapos.positions")


def test_files_do_not_import_each_other_in_a_cycle():
    """Inside a unit too (data/prepare.py and data/synthetic.py once imported each other): a circle
    between files means neither can be read, tested or moved without the other."""
    cycle = find_cycle(file_edges())
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle or [])


def test_only_the_attention_mask_reads_document_numbers():
    """One document-mask implementation (issue 38): inside attention/, only mask.py indexes document
    numbers (every kernel asks its AttentionMask which keys a query sees); reference.py writes the rule
    out on its own, as the tests' ground truth should."""
    readers = set()
    for path in sorted((SRC / "attention").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript):
                held = node.value
                name = held.id if isinstance(held, ast.Name) else getattr(held, "attr", None)
                if name == "documents":
                    readers.add(path.name)
    assert readers == {"mask.py", "reference.py"}, f"document numbers read outside mask.py: {sorted(readers)}"


def test_the_cycle_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_checker_sees_an_upward_import(tmp_path):
    """The checker itself: a lazy import of the trainer from model.py would be reported."""
    fake = tmp_path / "model.py"
    fake.write_text("def f():\n    from extrapos.training.trainer import train\n")
    assert "extrapos.training.trainer" in imported_modules(fake)
    assert RANK[unit_of("extrapos.training.trainer")] > RANK[unit_of("extrapos.model")]


def test_help_never_imports_torch():
    """`extrapos --help` and `extrapos <command> --help` print from argparse alone (fast, no torch)."""
    code = (
        "import sys\n"
        "from extrapos.cli import build_parser, COMMAND_MODULES\n"
        "parser = build_parser()\n"
        "commands = next(a for a in parser._actions if a.dest == 'command').choices\n"
        "assert len(commands) >= 15, sorted(commands)\n"
        "for cmd in commands:\n"
        "    try:\n"
        "        parser.parse_args([cmd, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('torch', 'numpy', 'tokenizers', 'safetensors') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: extrapos train" in out and "usage: extrapos eval" in out
    assert out.strip().splitlines()[-1] == "HEAVY=", f"--help imported {out.strip().splitlines()[-1]}"


def private(name: str) -> bool:
    """``_x`` is private to its file; a dunder (``__version__``) is the package's public face."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_file_imports_a_private_name_of_another():
    """A private name imported across files is a seam left by a split (stream.py once imported evaluate's
    ``_bucketed``; compare/run.py the ``_facts`` of facts.py; bench/gpu.py the ``_spread`` of measure.py):
    the name is either part of the module's API (no underscore, a docstring) or stays in its file. Every
    file of src/ is read, imports inside functions included, and ``import extrapos.a._b`` counts too."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "extrapos":
                where = f"{path.relative_to(SRC)}: from {node.module} import"
                found += [f"{where} {a.name}" for a in node.names if private(a.name)]
                found += [f"{where} ..." for part in node.module.split(".") if private(part)]
            elif isinstance(node, ast.Import):
                found += [
                    f"{path.relative_to(SRC)}: import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == "extrapos" and any(private(p) for p in a.name.split("."))
                ]
    assert not found, "private names imported across files:\n" + "\n".join(found)


#: test folders that are not a source folder: the hostile battery across commands, and model.py / losses.py
#: (files at the top of src/extrapos, one folder of tests for the model floor)
TEST_FOLDERS_BEYOND_SOURCE = {"robustness", "model"}
#: test files about the whole project rather than one folder
TOP_LEVEL_TESTS = {
    "test_architecture.py",
    "test_published_results.py",
    "test_plugins.py",
    "test_console.py",
    "test_locks.py",
}  # plugins.py, console.py and locks.py are top-level modules


def test_tests_mirror_the_source_folders():
    """A test lives in the folder of the source it tests (tests/evaluate/ for src/extrapos/evaluate/), so the
    tests of a module are found where the module is."""
    tests = Path(__file__).resolve().parent
    source_folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - source_folders <= TEST_FOLDERS_BEYOND_SOURCE, folders - source_folders
    assert {p.name for p in tests.glob("test_*.py")} <= TOP_LEVEL_TESTS


#: where ``print`` may be used: the commands, and the console that writes what the library logs
PRINTS_ALLOWED = {"cli", "console.py"}
#: files that still print, to be moved to their module's logger (issue 45, item 4) and then taken off this
#: list: the test fails on a listed file that no longer prints, so the list only shrinks
PRINTS_NOT_YET_LOGGED: set[str] = set()


def printing_lines(source: str) -> list[int]:
    """The lines of ``source`` that use ``print``: a call, or the function passed on (``say=print``)."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Name) and node.id == "print" and isinstance(node.ctx, ast.Load)
    )


def test_the_library_logs_and_only_the_commands_print():
    """A program embedding extrapos silences or routes its output through ``logging``; a ``print`` in the
    library would reach its stdout whatever it configured (console.py: the commands' console)."""
    printing = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.split("/")[0] in PRINTS_ALLOWED:
            continue
        lines = printing_lines(path.read_text())
        if lines:
            printing[rel] = lines
    fresh = {rel: lines for rel, lines in printing.items() if rel not in PRINTS_NOT_YET_LOGGED}
    assert not fresh, f"use the module's logger (logging.getLogger(__name__)) instead of print: {fresh}"
    done = sorted(PRINTS_NOT_YET_LOGGED - set(printing))
    assert not done, f"these files log now: take them off PRINTS_NOT_YET_LOGGED: {done}"


def test_the_print_checker_sees_a_call_and_a_passed_print():
    assert printing_lines("def f(say=print):\n    say(1)\n\nprint('x')\n") == [1, 4]
    assert printing_lines("text = 'print(1)'\nprint = None\n") == []
