"""Each Python step in its own import namespace, as Triton gives each Python model a process.

Triton users ship helper modules beside `model.py` (`utils.py`, `preprocess/`) and import them
by their bare names, because Triton puts the model's version folder on `sys.path` of the
model's own stub process. Fused into one process, two steps that each ship a `utils.py` would
share whichever was imported first. Here a step's folder becomes the path of a package of
its own (`_latte_step_<n>`), and the step's code (its `model.py` and every module loaded
from its folder) imports through an `__import__` that turns a bare name the folder holds
into that package's module. Everything else imports as usual.

Code that imports by name around the `import` statement (`importlib.import_module`, pickle,
`torch.load`) gets the same module object under the bare name: while a step loads, its own;
afterwards, the module of the one step that ships that name, where no installed module has it. A name that a step imports that
way while another step's module already holds it cannot be isolated, and is refused at load
with both files named.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import sys
import threading
import types
from pathlib import Path
from typing import Dict, List, Optional, Set

from latte.backend.errors import ConfigError

_PREFIX = "_latte_step_"
# Names a step's folder may hold that must stay the process's own: the stub's module (users
# ship a stand-in of it for their own tests; in Triton the stub's is imported first).
_NEVER_LOCAL = frozenset({"triton_python_backend_utils"})
_numbers = itertools.count(1)
_lock = threading.RLock()


def local_modules(folder: Path) -> Set[str]:
    """The top-level module names a folder holds: `name.py` files, extension modules and
    folders (packages, with or without `__init__.py`)."""
    names = set()
    for entry in folder.iterdir():
        if entry.is_file() and entry.suffix == ".py":
            names.add(entry.stem)
        elif entry.is_file() and entry.suffix in (".so", ".pyd"):
            names.add(entry.name.split(".", 1)[0])
        elif entry.is_dir() and entry.name.isidentifier() and entry.name != "__pycache__":
            names.add(entry.name)
    return names - _NEVER_LOCAL


class _NamespacedLoader(importlib.machinery.SourceFileLoader):
    """A source module of a step's folder, run with the step's own `__import__`."""

    def __init__(self, fullname: str, path: str, namespace_builtins: dict) -> None:
        super().__init__(fullname, path)
        self._builtins = namespace_builtins

    def exec_module(self, module) -> None:
        module.__dict__["__builtins__"] = self._builtins
        super().exec_module(module)


class _AliasLoader(importlib.abc.Loader):
    """A bare name imported by name: the step's own module, not a second copy of the file."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module

    def create_module(self, spec):
        return self._module

    def exec_module(self, module) -> None:
        pass  # it ran when the step's namespace imported it


class _StepFinder(importlib.abc.MetaPathFinder):
    """Finds `_latte_step_<n>.<name>` in step n's folder, and a bare name a step ships for
    code that imports it by name."""

    def __init__(self) -> None:
        self.namespaces: Dict[str, "StepNamespace"] = {}
        self.loading: Optional["StepNamespace"] = None  # the step whose load is under way

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(_PREFIX):
            namespace = self.namespaces.get(fullname.partition(".")[0])
            if namespace is None or "." not in fullname:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
                spec.loader = _NamespacedLoader(fullname, spec.origin, namespace.builtins)
            return spec
        namespace = self._shipping(fullname.partition(".")[0])
        if namespace is None:
            return None
        module = importlib.import_module(f"{namespace.package}.{fullname}")
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module))

    def _shipping(self, name: str) -> Optional["StepNamespace"]:
        """The namespace a bare name imported by name resolves to: the loading step's, else the
        one step that ships it (None when none does, or several: then no guess is made)."""
        if self.loading is not None and name in self.loading.local:
            return self.loading
        shipping = [n for n in self.namespaces.values() if name in n.local]
        if len(shipping) != 1 or importlib.machinery.PathFinder.find_spec(name) is not None:
            return None  # an installed module of that name is everyone else's answer to it
        return shipping[0]


_finder = _StepFinder()


class StepNamespace:
    """The import namespace of one Python step's folder."""

    def __init__(self, folder: Path, step: str) -> None:
        self.folder = folder
        self.step = step
        self.local = local_modules(folder)
        self.builtins = dict(builtins.__dict__)
        self.builtins["__import__"] = self._import
        self.aliases: List[str] = []  # bare names in sys.modules that hold this step's modules
        with _lock:
            self.package = f"{_PREFIX}{next(_numbers)}"
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            _finder.namespaces[self.package] = self
        package = types.ModuleType(self.package)
        package.__path__ = [str(folder)]
        package.__package__ = self.package
        sys.modules[self.package] = package

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
        """A context for the step's load (import, initialize): names imported by name are its own."""
        return _Loading(self)

    def close(self) -> None:
        with _lock:
            for name in self.aliases:
                if _owner(sys.modules.get(name)) is self:
                    del sys.modules[name]
            self.aliases = []
            _finder.namespaces.pop(self.package, None)
        for name in [n for n in list(sys.modules) if n == self.package or n.startswith(self.package + ".")]:
            sys.modules.pop(name, None)


class _Loading:
    """While a step loads, bare names it ships resolve to its own modules; one that its load
    imported by name stays in sys.modules for it, unless another step's module holds it."""

    def __init__(self, namespace: StepNamespace) -> None:
        self.namespace = namespace
        self._before: Dict[str, Optional[types.ModuleType]] = {}

    def __enter__(self) -> "_Loading":
        _lock.acquire()  # one step loads at a time: the finder has one loading step
        self._before = {name: sys.modules.get(name) for name in self.namespace.local}
        for name, module in self._before.items():
            if _owner(module) not in (None, self.namespace):
                del sys.modules[name]  # another step's: not this step's answer to the name
        _finder.loading = self.namespace
        return self

    def __exit__(self, kind, *_) -> None:
        try:
            _finder.loading = None
            clashes = self._settle()
        finally:
            _lock.release()
        if clashes and kind is None:
            name, theirs, mine = clashes[0]
            raise ConfigError(f"step {self.namespace.step!r}: its module {name!r} ({mine}) is imported by name "
                              f"outside its own import statements (importlib, pickle), and another step's "
                              f"{name!r} ({theirs}) already holds that name in this process; rename one of them")

    def _settle(self) -> list:
        """Every bare name back to the module another step had there; this step's own kept
        where no other step's was. The clashes: (name, their file, this step's file)."""
        clashes = []
        for name, before in self._before.items():
            module = sys.modules.get(name)
            if module is None or module is before:
                if before is not None:
                    sys.modules[name] = before
                continue
            if before is not None and _owner(before) is not self.namespace:
                clashes.append((name, _file(before), _file(module)))
                sys.modules[name] = before
            elif name not in self.namespace.aliases:
                self.namespace.aliases.append(name)
        return clashes


def _owner(module) -> Optional[StepNamespace]:
    """The step namespace a module belongs to (None: not a step's)."""
    name = getattr(module, "__name__", "") or ""
    if not name.startswith(_PREFIX):
        return None
    return _finder.namespaces.get(name.partition(".")[0])


def _file(module) -> str:
    return str(getattr(module, "__file__", None) or getattr(module, "__path__", ["?"])[0])


_real_import = builtins.__import__
