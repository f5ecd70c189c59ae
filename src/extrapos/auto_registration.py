"""``import extrapos`` teaches transformers' Auto classes the ``extrapos`` model type, without importing
transformers itself (slow, and optional).

transformers keeps no plugin list: a model type is known once ``AutoConfig.register`` and
``AutoModel*.register`` have been called in the process. ``install()`` (run by ``extrapos/__init__.py``)
therefore waits for transformers' own auto modules: if they are loaded already it registers at once,
otherwise a finder on ``sys.meta_path`` wraps the loading of each of the two modules and registers
right after it runs (the config when ``configuration_auto`` has loaded, the models when
``modeling_auto`` has), so ``AutoModelForCausalLM.from_pretrained(DIR)`` of an exported folder works
without ``trust_remote_code`` in any process that imported extrapos, whichever was imported first.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing itself, or importlib.abc, would cost more than the rest of `import extrapos`
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

# transformers module -> the function that registers extrapos' classes once it has loaded, named as a
# string: this module belongs to the bottom layer (it runs at ``import extrapos``) and the registrations
# to the integrations layer, which it must not import until transformers is there
# (tests/test_architecture.py; the encodings registry finds its modules by name the same way)
HOW = "extrapos.integrations.hf_remote.registration"
REGISTRATIONS = {
    "transformers.models.auto.configuration_auto": f"{HOW}:register_config",
    "transformers.models.auto.modeling_auto": f"{HOW}:register_models",
}


def resolve(target: str) -> Callable[[], None]:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def run_safely(register: str | Callable[[], None]) -> None:
    """Run a registration (a function, or its ``module:name``); one that fails (a transformers release
    that changed its Auto classes) must not fail the user's own import of transformers: it warns, and
    exported folders still load with trust_remote_code=True."""
    try:
        (resolve(register) if isinstance(register, str) else register)()
    except Exception as e:  # any failure here is reported, never raised into an import
        import warnings

        warnings.warn(
            f"extrapos could not register its model classes with transformers ({type(e).__name__}: {e}); "
            "load exported extrapos folders with trust_remote_code=True.",
            stacklevel=2,
        )


class _RunAfter:
    """The module's own loader, then ``after()`` (an importlib Loader by its methods)."""

    def __init__(self, loader: Any, after: str) -> None:
        self.loader, self.after = loader, after

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        run_safely(self.after)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... as the wrapped loader
        return getattr(self.loader, name)


class AfterImportFinder:
    """An importlib MetaPathFinder that finds nothing itself: for the modules in ``pending`` it asks
    the finders after it and wraps the loader of the spec they return, once."""

    def __init__(self, pending: dict[str, str]) -> None:
        self.pending = pending

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        after = self.pending.pop(fullname, None)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RunAfter(spec.loader, after)  # type: ignore[assignment]  # a Loader by its methods
                return spec
        return None


def install() -> None:
    """Register now for what transformers has loaded, and after it loads the rest (module docstring)."""
    pending = {}
    for module, register in REGISTRATIONS.items():
        if module in sys.modules:
            run_safely(register)
        else:
            pending[module] = register
    if pending and not any(isinstance(f, AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImportFinder(pending))
