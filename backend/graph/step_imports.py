"""Each Python step in its own import namespace, as Triton gives each Python model a process.

Triton users ship helper modules beside `model.py` (`utils.py`, `preprocess/`) and import them
by their bare names, because Triton puts the model's version folder on `sys.path` of the
model's own stub process. Fused into one process, two steps that each ship a `utils.py` would
share whichever was imported first. Here a step's folder becomes the path of a package of
its own (`_latte_step_<n>`), and the step's code (its `model.py` and every module loaded
from its folder) imports through an `__import__` that turns a bare name the folder holds
into that package's module. Everything else imports as usual.

Code that imports by name around the `import` statement (`importlib.import_module`, pickle)
finds a step's helpers on `sys.path` only while the step loads; such a module stays in
`sys.modules` under its bare name, and a second step that ships another file of the same
name and imports it that way is refused at load, both files named.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import sys
import threading
import types
from pathlib import Path
from typing import Dict, Optional, Set

from latte.backend.errors import ConfigError

_PREFIX = "_latte_step_"
_numbers = itertools.count(1)
_lock = threading.Lock()
# Bare module name -> the file that owns it in sys.modules (imported around a step's __import__).
_global_owners: Dict[str, str] = {}


def local_modules(folder: Path) -> Set[str]:
    """The top-level module names a folder holds: `name.py` files and packages."""
    names = set()
    for entry in folder.iterdir():
        if entry.is_file() and entry.suffix == ".py":
            names.add(entry.stem)
        elif entry.is_file() and entry.suffix in (".so", ".pyd"):
            names.add(entry.name.split(".", 1)[0])
        elif entry.is_dir() and entry.name.isidentifier() and (entry / "__init__.py").is_file():
            names.add(entry.name)
    return names


class _NamespacedLoader(importlib.abc.Loader):
    """Runs a module of a step's folder with the step's own `__import__`."""

    def __init__(self, loader, namespace_builtins: dict) -> None:
        self._loader = loader
        self._builtins = namespace_builtins

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__dict__["__builtins__"] = self._builtins
        self._loader.exec_module(module)


class _StepFinder(importlib.abc.MetaPathFinder):
    """Finds `_latte_step_<n>.<name>` in step n's folder, loaded with its namespace's builtins."""

    def __init__(self) -> None:
        self.namespaces: Dict[str, "StepNamespace"] = {}

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(_PREFIX):
            return None
        namespace = self.namespaces.get(fullname.partition(".")[0])
        if namespace is None or "." not in fullname:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _NamespacedLoader(spec.loader, namespace.builtins)
        return spec


_finder = _StepFinder()


def _install_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


class StepNamespace:
    """The import namespace of one Python step's folder."""

    def __init__(self, folder: Path, step: str) -> None:
        self.folder = folder
        self.step = step
        self.local = local_modules(folder)
        with _lock:
            self.package = f"{_PREFIX}{next(_numbers)}"
            _install_finder()
            _finder.namespaces[self.package] = self
        package = types.ModuleType(self.package)
        package.__path__ = [str(folder)]
        package.__package__ = self.package
        sys.modules[self.package] = package
        self.builtins = dict(builtins.__dict__)
        self.builtins["__import__"] = self._import

    def _import(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.partition(".")[0] in self.local:
            module = _real_import(f"{self.package}.{name}", globals, locals, fromlist, 0)
            if fromlist:
                return module
            return sys.modules[f"{self.package}.{name.partition('.')[0]}"]
        return _real_import(name, globals, locals, fromlist, level)

    def load(self, path: Path) -> types.ModuleType:
        """The step's file as a module of this namespace (its code runs now)."""
        spec = importlib.util.spec_from_file_location(f"{self.package}.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        module.__dict__["__builtins__"] = self.builtins
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(spec.name, None)
            raise
        return module

    def loading(self) -> "_Loading":
        """A context for the step's load (import and initialize): its folder on sys.path."""
        return _Loading(self)

    def close(self) -> None:
        with _lock:
            _finder.namespaces.pop(self.package, None)
        for name in [n for n in sys.modules if n == self.package or n.startswith(self.package + ".")]:
            del sys.modules[name]


class _Loading:
    """While a step loads its folder is on sys.path; a helper imported by its bare name around
    the step's `__import__` stays in sys.modules, owned by that step's file."""

    def __init__(self, namespace: StepNamespace) -> None:
        self.namespace = namespace
        self._before: Dict[str, Optional[types.ModuleType]] = {}

    def __enter__(self) -> "_Loading":
        folder = str(self.namespace.folder)
        self._before = {name: sys.modules.get(name) for name in self.namespace.local}
        # Another step's helper of the same name must not answer this step's lookups by name.
        for name, module in self._before.items():
            if module is not None and _owned_elsewhere(name, self.namespace.folder):
                del sys.modules[name]
        sys.path.insert(0, folder)
        return self

    def __exit__(self, *exc_info) -> None:
        folder = str(self.namespace.folder)
        if folder in sys.path:
            sys.path.remove(folder)
        clash = None
        for name, before in self._before.items():
            module = sys.modules.get(name)
            if module is None or module is before:
                if before is not None and sys.modules.get(name) is None:
                    sys.modules[name] = before
                continue
            mine = str(_module_file(module) or "")
            owner = _global_owners.get(name)
            if owner is not None and owner != mine and clash is None:
                clash = (name, owner, mine)
                sys.modules[name] = before
                continue
            _global_owners[name] = mine
        if clash is not None and exc_info[0] is None:
            name, owner, mine = clash
            raise ConfigError(f"step {self.namespace.step!r}: its module {name!r} ({mine}) is imported by name "
                              f"outside its own import statements (importlib, pickle), and another step's "
                              f"{name!r} ({owner}) already holds that name in this process; rename one of them")


def _module_file(module) -> Optional[str]:
    return getattr(module, "__file__", None)


def _owned_elsewhere(name: str, folder: Path) -> bool:
    owner = _global_owners.get(name)
    return owner is not None and Path(owner).parent != folder and Path(owner).parent.parent != folder


_real_import = builtins.__import__
