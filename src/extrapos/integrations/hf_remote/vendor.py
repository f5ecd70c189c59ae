"""The library's own code, copied into an exported folder so that transformers loads it with torch and
transformers alone (``extrapos export --format remote-code``; no package named extrapos need be installed).

Hugging Face's convention for a custom architecture is a folder whose Python files hold the model
(``trust_remote_code=True``). transformers copies the file an ``auto_map`` names into its module cache
together with every file of the same folder it imports relatively (``from .x import y``, followed from
file to file), and checks that each package the files import is installed. So the folder holds flat
copies of the extrapos modules the model runs: ``modeling.py`` and ``configuration.py`` of this package
as ``modeling_extrapos.py`` and ``configuration_extrapos.py``, and every extrapos module they import, at
module level or inside a function, as ``extrapos_<dotted path>.py`` (``extrapos_positions_rotary.py``),
each with its imports of extrapos rewritten to relative ones and nothing else changed. Subfolders are
not used: transformers does not copy them reliably.

Three things differ from the library, each named here:

- the positions registry imports the modules of ``extrapos.positions`` by listing its folder and loads
  plug-ins; in the folder it imports the modules of the encodings this model builds, an encoding built
  inside another (DAPE's base) included (``Closure._registry_function``);
- ``save_pretrained`` of a model built from the folder writes the folder's own files again
  (``copy_code.py``) instead of generating them;
- ``from extrapos import __version__`` reads ``extrapos_provenance.py``, which records the extrapos
  version and commit that wrote the folder and the library file each copy came from.

Anything else a copied module imports must be the standard library, torch or transformers; anything else
fails the export (``VendorError``, naming the file and line), so a folder never needs more to load than
it says; a plug-in's encoding module is copied the same way, as ``plugin_<its dotted path>.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from extrapos.errors import UserError
from extrapos.integrations.hf_remote.copy_code import CONFIG_FILE, MODELING_FILE

ROOT = "extrapos"
PROVENANCE = "extrapos_provenance"
#: library modules that keep the file names transformers' convention gives them
ENTRIES = {
    "extrapos.integrations.hf_remote.configuration": CONFIG_FILE.removesuffix(".py"),
    "extrapos.integrations.hf_remote.modeling": MODELING_FILE.removesuffix(".py"),
}
#: in the folder, the module that writes a saved model's code copies the folder's own files
REPLACED = {"extrapos.integrations.hf_remote.files": "extrapos.integrations.hf_remote.copy_code"}
REGISTRY = "extrapos.positions.registry"
#: what a copied module may import besides the copies: what loading the folder needs anyway
ALLOWED = frozenset(sys.stdlib_module_names) | {"torch", "transformers"}


class VendorError(UserError):
    """A module the folder's code needs cannot be copied (it imports something outside the copies, the
    standard library, torch and transformers, or imports an extrapos module as an object): a plug-in's
    encoding module, or a library module, to change."""


@dataclass
class Copy:
    module: str  # the library's dotted name
    flat: str  # the folder's module name (file name without .py)
    path: Path  # the library file it is copied from
    source: str = ""
    edits: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end) byte offsets -> text
    needs: list[str] = field(default_factory=list)  # library modules it imports


def flat_name(module: str) -> str:
    """``extrapos.positions.rotary`` -> ``extrapos_positions_rotary``; a plug-in's module (another
    package) -> ``plugin_<its dotted name>``."""
    if module in ENTRIES:
        return ENTRIES[module]
    parts = module.split(".")
    return "_".join(parts) if parts[0] == ROOT else "plugin_" + "_".join(parts)


def module_file(module: str) -> Path | None:
    """The .py file of an importable module, or None (not a module: a name defined in its parent)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def source_commit() -> str | None:
    """The git commit of the extrapos source this process runs, ``+modified`` if its files differ from
    it; or the commit pip recorded for a VCS install (direct_url.json); None when neither is known."""
    here = Path(__file__).resolve().parents[2]  # the extrapos package folder
    try:
        # only a checkout that tracks this package: an installed copy may sit inside another repository
        tracked = subprocess.run(
            ["git", "-C", str(here), "ls-files", "--error-unmatch", "__init__.py"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if tracked.returncode == 0 and head.returncode == 0:
            status = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--", "."],
                capture_output=True,
                text=True,
                timeout=10,
            )
            dirty = status.returncode != 0 or bool(status.stdout.strip())
            return head.stdout.strip() + ("+modified" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib import metadata

    try:
        direct = metadata.distribution(ROOT).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if direct:
        commit = json.loads(direct).get("vcs_info", {}).get("commit_id")
        return str(commit) if commit else None
    return None


def _offsets(source: bytes) -> list[int]:
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _span(node: ast.stmt, starts: list[int]) -> tuple[int, int]:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    start = starts[first - 1] if first != node.lineno else starts[node.lineno - 1] + node.col_offset
    end_line, end_col = node.end_lineno, node.end_col_offset
    assert end_line is not None and end_col is not None
    return start, starts[end_line - 1] + end_col


class Closure:
    """The modules to copy, found from the entries by following every import of a vendorable package."""

    def __init__(self, roots: set[str], load: list[tuple[str, str]]) -> None:
        self.roots = roots
        self.load = load  # (module, class) of each encoding the registry imports in the folder
        self.copies: dict[str, Copy] = {}

    def add(self, module: str) -> None:
        module = REPLACED.get(module, module)
        if module in self.copies:
            return
        path = module_file(module)
        if path is None:
            raise VendorError(f"cannot find the source file of {module}")
        copy = Copy(module, flat_name(module), path, path.read_text(encoding="utf-8"))
        self.copies[module] = copy
        self._rewrite(copy)
        for needed in copy.needs:
            self.add(needed)

    def _package(self, copy: Copy) -> str:
        return copy.module if copy.path.name == "__init__.py" else copy.module.rpartition(".")[0]

    def _rewrite(self, copy: Copy) -> None:
        raw = copy.source.encode("utf-8")
        starts = _offsets(raw)
        tree = ast.parse(raw, filename=str(copy.path))
        skipped: list[tuple[int, int]] = []
        if copy.module == REGISTRY:  # the folder lists its encodings instead of its package's files
            for stmt in tree.body:
                if isinstance(stmt, ast.FunctionDef) and stmt.name in ("encoding_modules", "_load"):
                    start, _ = _span(stmt, starts)  # to the end of its last line, comments included
                    span = (start, starts[stmt.end_lineno or 0] - 1)
                    skipped.append(span)
                    copy.edits.append((*span, self._registry_function(stmt.name)))
            for module, _ in self.load:
                copy.needs.append(module)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            span = _span(node, starts)
            if any(a <= span[0] and span[1] <= b for a, b in skipped):
                continue
            text = self._import(copy, node)
            if text is not None:
                copy.edits.append((*span, text))

    def _where(self, copy: Copy, node: ast.AST) -> str:
        return f"{copy.path}:{getattr(node, 'lineno', '?')}"

    def _import(self, copy: Copy, node: ast.Import | ast.ImportFrom) -> str | None:
        """The relative import that replaces ``node``, or None where it stays (stdlib, torch, ...)."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in self.roots:
                    raise VendorError(
                        f"{self._where(copy, node)} imports the module {alias.name}; the folder's code "
                        "imports names from extrapos modules (from extrapos.x import y), which "
                        "transformers follows, never a module object."
                    )
                self._check_allowed(copy, node, top)
            return None
        if node.level:
            base = self._package(copy).split(".")
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        top = module.split(".")[0]
        if top not in self.roots:
            self._check_allowed(copy, node, top)
            return None
        if module == ROOT:
            imported = {a.name for a in node.names}
            if imported != {"__version__"}:
                raise VendorError(
                    f"{self._where(copy, node)} imports {', '.join(sorted(imported))} from extrapos itself; "
                    "the folder's code may read only its __version__ there."
                )
            return f"from .{PROVENANCE} import __version__"
        for alias in node.names:
            if module_file(f"{module}.{alias.name}") is not None:
                raise VendorError(
                    f"{self._where(copy, node)} imports the module {module}.{alias.name}; the folder's code "
                    "imports names from extrapos modules (from extrapos.x import y), which transformers "
                    "follows, never a module object."
                )
        target = REPLACED.get(module, module)
        copy.needs.append(target)
        names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
        return f"from .{flat_name(target)} import {names}"

    def _check_allowed(self, copy: Copy, node: ast.AST, top: str) -> None:
        if top and top not in ALLOWED:
            raise VendorError(
                f"{self._where(copy, node)} imports {top}, which the exported folder cannot require (it "
                "loads with the standard library, torch and transformers); move what needs it out of the "
                "modules the model runs (a folder copies every import of a module, inside functions too)."
            )

    def _registry_function(self, name: str) -> str:
        modules = sorted({flat_name(module) for module, _ in self.load})
        if name == "encoding_modules":
            return (
                "def encoding_modules() -> list[str]:\n"
                '    """The modules of this folder that register the encodings the model uses."""\n'
                f"    return {modules!r}"
            )
        lines = [
            "def _load() -> None:",
            "    # the encodings this model uses, copied into the folder by extrapos export (the library",
            "    # imports every module of extrapos.positions and its plug-ins here)",
            "    global _loaded",
            "    if not _loaded:",
            "        _loaded = True",
        ]
        for module, cls in sorted(set(self.load)):
            lines.append(f"        from .{flat_name(module)} import {cls}  # noqa: F401")
        return "\n".join(lines)


def _apply(copy: Copy) -> str:
    raw = copy.source.encode("utf-8")
    out, last = [], 0
    for start, end, text in sorted(copy.edits):
        if start < last:
            raise VendorError(f"overlapping rewrites in {copy.path}")
        out += [raw[last:start], text.encode("utf-8")]
        last = end
    out.append(raw[last:])
    return b"".join(out).decode("utf-8")


def folder_code(encodings: list[type]) -> dict[str, str]:
    """File name -> text of every Python file of a folder whose model uses the encoding classes
    ``encodings`` (their modules are what the folder's positions registry imports)."""
    from extrapos import __version__

    roots = {ROOT} | {cls.__module__.split(".")[0] for cls in encodings}
    closure = Closure(roots, [(cls.__module__, cls.__name__) for cls in encodings])
    for entry in ENTRIES:
        closure.add(entry)
    by_flat: dict[str, Copy] = {}
    for copy in closure.copies.values():
        if copy.flat in by_flat or copy.flat == PROVENANCE:
            raise VendorError(f"{copy.module} and {by_flat[copy.flat].module} are both {copy.flat}.py")
        by_flat[copy.flat] = copy
    commit = source_commit()
    made_by = f"extrapos {__version__}" + (f", commit {commit}" if commit else "")
    sources = {f"{c.flat}.py": _library_path(c) for c in sorted(by_flat.values(), key=lambda c: c.flat)}
    files = {
        name: (
            f"# {sources[name]}, copied into this model folder by extrapos export --format remote-code\n"
            f"# ({made_by}).\n"
            "# The library's own code, its imports of extrapos made relative to this folder so that\n"
            "# loading it needs no extrapos installed. Export again to change it.\n" + _apply(copy)
        )
        for name, copy in ((f"{c.flat}.py", c) for c in by_flat.values())
    }
    files[f"{PROVENANCE}.py"] = (
        f'"""Which extrapos wrote this folder\'s code (extrapos export --format remote-code), and the\n'
        'library file each of its Python files is a copy of."""\n\n'
        f"__version__ = {__version__!r}\n"
        f"COMMIT = {commit!r}\n"
        f"SOURCES = {json.dumps(sources, indent=4)}\n"
    )
    return dict(sorted(files.items()))


def _library_path(copy: Copy) -> str:
    """``extrapos/positions/rotary.py``: the file's path inside its package (no machine's folders)."""
    parts = copy.module.split(".")
    return "/".join([*parts, "__init__.py"]) if copy.path.name == "__init__.py" else "/".join(parts) + ".py"


def write_folder_code(directory: str | Path, encodings: list[type]) -> list[str]:
    """Write the folder's Python files (``folder_code``) into ``directory``; returns their names. Checks
    with transformers' own reader that it will copy every one of them with the two entry files."""
    from transformers.dynamic_module_utils import get_relative_import_files

    directory = Path(directory)
    files = folder_code(encodings)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    reached = {CONFIG_FILE, MODELING_FILE}
    for entry in (CONFIG_FILE, MODELING_FILE):
        reached |= {Path(f).name for f in get_relative_import_files(directory / entry)}
    missed = sorted(set(files) - reached)
    if missed:
        raise VendorError(f"transformers would not copy {', '.join(missed)} with the model's code")
    return list(files)
