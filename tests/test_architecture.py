"""The house rules that code review forgets: imports flow down the layers, and the CLI stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "extrapos"

# Units (a top-level module or a package of extrapos) by layer, bottom first; docs/architecture.md
# draws the same picture. A unit may import units of its own layer or below, never above.
LAYERS = [
    ("foundation", {"extrapos", "errors", "schema", "presets", "files"}),
    ("data", {"data"}),
    ("positions", {"positions"}),
    ("attention", {"attention"}),
    ("model", {"model", "losses"}),
    (
        "run helpers",
        {
            "config",
            "checkpoint",
            "parallelize",
            "perf",
            "metrics",
            "runtime",
            "runs",
            "report",
            "stats",
            "memory",
            "lock",
            "task_tables",
        },
    ),
    (
        "commands",
        {
            "catalog",
            "train",
            "evaluate",
            "evaluate_mlm",
            "embeddings",
            "generate",
            "diagnostics",
            "bench",
            "extend",
            "compare",
            "compare_tasks",
            "tasks",
            "integrations",
        },
    ),
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
                if node.module == "extrapos":  # from extrapos import checkpoint
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


def test_the_checker_sees_an_upward_import(tmp_path):
    """The checker itself: a lazy import of the trainer from model.py would be reported."""
    fake = tmp_path / "model.py"
    fake.write_text("def f():\n    from extrapos.train import train\n")
    assert "extrapos.train" in imported_modules(fake)
    assert RANK[unit_of("extrapos.train")] > RANK[unit_of("extrapos.model")]


def test_help_never_imports_torch():
    """`extrapos --help` and `extrapos <command> --help` print from argparse alone (fast, no torch)."""
    code = (
        "import sys\n"
        "from extrapos.cli import build_parser, COMMAND_MODULES\n"
        "parser = build_parser()\n"
        "for cmd in ['train', 'eval', 'extend', 'compare', 'report', 'generate', 'bench', 'data', "
        "'encodings',\n"
        "            'passkey', 'synthetic-eval', 'lm-eval', 'import', 'export']:\n"
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
