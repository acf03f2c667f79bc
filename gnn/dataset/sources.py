"""The project's own source files a module depends on, found from the code's import statements.

The graph dataset's cache key hashes them (gnn.dataset.graphs): whatever file the
features are computed by, directly or through anything it imports, a change to it
rebuilds the cache. No hand-kept list to forget a file in. The layering test
(tests/house/test_layers.py) reads the same imports to find circles.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

from collect import REPO

PACKAGES = ("collect", "gnn", "serve", "experiments")


def module_file(module: str, root: Path = REPO) -> Path | None:
    """The file of a project module (a package's __init__.py for a package), or None if it is not ours."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=None)
def imports_of(module: str, root: Path = REPO) -> tuple[str, ...]:
    """Project modules ``module`` imports anywhere in its file (top level or inside functions), with the packages
    on the way to each (importing a.b.c runs a/__init__ and a/b/__init__) but its own: those ran before it did."""
    path = module_file(module, root)
    if path is None:
        return ()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # "from pkg import name": name is a submodule or an attribute of pkg
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    parts = module.split(".")
    own = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return tuple(sorted(m for m in found - own if module_file(m, root) is not None))


def closure(modules: list[str], root: Path = REPO) -> list[str]:
    """``modules`` and every project module they import, transitively."""
    seen, todo = set(), list(modules)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(imports_of(m, root))
    return sorted(seen)


def source_files(modules: list[str], root: Path = REPO) -> list[Path]:
    return [module_file(m, root) for m in closure(modules, root)]


def code_key(modules: list[str], root: Path = REPO) -> str:
    """A hash of the source of ``modules`` and all they import: what a cached result made by that code is keyed on."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in source_files(modules, root))).hexdigest()
