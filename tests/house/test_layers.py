"""The house rules, read from the code itself: imports run one way (collect -> gnn -> serve -> experiments) with
no circle anywhere, folders and files stay small, and every function-local import says why it is lazy."""

import ast
from pathlib import Path

import pytest

from collect import REPO
from gnn.dataset.sources import PACKAGES, imports_of, module_file

LAYERS = ("collect", "gnn", "serve", "experiments")  # each may import only those before it
MAX_MODULES_PER_FOLDER = 8  # not counting __init__ and __main__
MAX_LINES = 300


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append(".".join(parts))
    return found


MODULES = _modules()


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere():
    graph = {m: [d for d in imports_of(m) if d in MODULES] for m in MODULES}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_imports_run_one_way():
    upward = [
        f"{m} -> {d}"
        for m in MODULES
        for d in imports_of(m)
        if LAYERS.index(d.split(".")[0]) > LAYERS.index(m.split(".")[0])
    ]
    assert upward == []


def _rooms(package: str) -> dict[str, list[str]]:
    """The import graph between the rooms of one package (its subpackages and top-level modules)."""
    room = {m: m.split(".")[1] for m in MODULES if m.split(".")[0] == package and "." in m}
    graph: dict[str, set[str]] = {r: set() for r in room.values()}
    for m, r in room.items():
        graph[r] |= {room[d] for d in imports_of(m) if d in room and room[d] != r}
    return {r: sorted(ds) for r, ds in graph.items()}


@pytest.mark.parametrize("package", LAYERS)
def test_imports_run_one_way_inside_each_package(package):
    """Inside a package too, the rooms stand in floors: no two import each other, however indirectly."""
    rooms = _rooms(package)
    assert any(rooms.values()) and _cycles(rooms) == []


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    (tmp_path / "gnn").mkdir()
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "__init__.py").write_text("")
    (tmp_path / "gnn" / "__init__.py").write_text("")
    (tmp_path / "gnn" / "x.py").write_text("def f():\n    from serve import y\n")
    (tmp_path / "serve" / "y.py").write_text("")
    assert module_file("gnn.x", tmp_path) is not None
    assert "serve.y" in imports_of("gnn.x", tmp_path)


@pytest.mark.parametrize("package", PACKAGES + ("tests",))
def test_folders_stay_small(package):
    crowded = {}
    for folder in [REPO / package, *(p for p in (REPO / package).rglob("*") if p.is_dir())]:
        modules = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "conftest.py")]
        if len(modules) > MAX_MODULES_PER_FOLDER:
            crowded[str(folder.relative_to(REPO))] = len(modules)
    assert crowded == {}


@pytest.mark.parametrize("package", PACKAGES + ("tests",))
def test_files_stay_short(package):
    long = {str(p.relative_to(REPO)): n for p in (REPO / package).rglob("*.py") if (n := _lines(p)) > MAX_LINES}
    assert long == {}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _unexplained_local_imports(path: Path) -> list[str]:
    """Imports inside functions without a ``lazy:`` reason on their line or on a comment just above their block."""
    lines = path.read_text().splitlines()
    found = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not _says_lazy(lines, node.lineno - 1):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def _says_lazy(lines: list[str], i: int) -> bool:
    if "lazy:" in lines[i]:
        return True
    while i > 0:  # up through the import block to the comment that heads it
        i -= 1
        line = lines[i].strip()
        if line.startswith("#"):
            if "lazy:" in line:
                return True
        elif line and not line.startswith(("import ", "from ")):
            return False
    return False


@pytest.mark.parametrize("package", PACKAGES)
def test_function_local_imports_say_why(package):
    assert [f for p in sorted((REPO / package).rglob("*.py")) for f in _unexplained_local_imports(p)] == []


def test_the_lazy_rule_reads_the_comment_above_a_block():
    lines = ["def f():", "    # lazy: start-up", "    import a", "", "    import b", "    x = 1", "    import c"]
    assert [_says_lazy(lines, i) for i in (2, 4, 6)] == [True, True, False]
