"""The layer contract, checked over the import graph of every module of airflow_pg_bulk (read
with ast, imports inside functions counted, ``if TYPE_CHECKING:`` blocks skipped): no cycle, no
import of a higher layer, no import inside a function below the Airflow layer, no private name
of one module used in another."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import airflow_pg_bulk

PACKAGE = "airflow_pg_bulk"
ROOT = Path(airflow_pg_bulk.__file__).parent

#: top (may import anything below) to bottom (imports nothing above); a name stands for the
#: module of that name and, for a package, every module in it. Names not present are skipped.
LAYERS: list[list[str]] = [
    # 1. the public surface and the Airflow layer
    [
        PACKAGE,
        f"{PACKAGE}.cli",
        f"{PACKAGE}.task_group",
        f"{PACKAGE}.demo",
        f"{PACKAGE}.get_provider_info",
    ],
    # 2.
    [f"{PACKAGE}.operators", f"{PACKAGE}.hooks", f"{PACKAGE}.lineage"],
    # 3.
    [f"{PACKAGE}.runner"],
    # 4. facade over loading/
    [f"{PACKAGE}.steps"],
    # 5. the four steps on a connection, no Airflow
    [f"{PACKAGE}.loading"],
    # 6. the target table and every way staged rows become its rows
    [f"{PACKAGE}.target"],
    # 7. connection, driver, session
    [f"{PACKAGE}.db"],
    # 8. statement builders
    [f"{PACKAGE}.sql"],
    # 9. find, inspect, cut and read the input; never a database
    [f"{PACKAGE}.source"],
    # 10. plain data and pure planning
    [f"{PACKAGE}.plan"],
    # 11. bottom: import nothing of the package at run time
    [f"{PACKAGE}.naming", f"{PACKAGE}.options", f"{PACKAGE}.option_types", f"{PACKAGE}.errors"],
]

#: layers whose modules may import inside a function (lazily, to keep Airflow's parse time low)
LAZY_IMPORTS_ALLOWED = 2


@dataclass(frozen=True)
class Import:
    """One import of a package module: who, what, where, and whether inside a function."""

    importer: str
    imported: str
    line: int
    in_function: bool


def module_names() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([PACKAGE, *parts])] = path
    return found


MODULES = module_names()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(importer: str, node: ast.ImportFrom) -> str | None:
    """The module a ``from X import ...`` reads from, absolute."""
    if not node.level:
        return node.module
    package = importer if MODULES[importer].name == "__init__.py" else importer.rsplit(".", 1)[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


class _Reader(ast.NodeVisitor):
    """The package imports of one module, and the private names it takes from others."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.imports: list[Import] = []
        self.private: list[tuple[str, int]] = []  # (module._name, line)
        self.aliases: dict[str, str] = {}  # local name -> package module
        self._depth = 0

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, imported: str, line: int) -> None:
        self.imports.append(Import(self.name, imported, line, self._depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self._add(alias.name, node.lineno)
                if alias.asname:
                    self.aliases[alias.asname] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = _resolve(self.name, node)
        if source is None or not (source == PACKAGE or source.startswith(PACKAGE + ".")):
            return
        for alias in node.names:
            full = f"{source}.{alias.name}"
            if full in MODULES:  # a module: from airflow_pg_bulk.target import catalog
                self._add(full, node.lineno)
                self.aliases[alias.asname or alias.name] = full
            else:  # a name of the module ``source``
                self._add(source, node.lineno)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    self.private.append((full, node.lineno))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in self.aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            self.private.append((f"{self.aliases[node.value.id]}.{node.attr}", node.lineno))
        self.generic_visit(node)


def read(name: str) -> _Reader:
    """The imports and private names of one module."""
    reader = _Reader(name)
    reader.visit(ast.parse(MODULES[name].read_text(), str(MODULES[name])))
    return reader


READERS = {name: read(name) for name in MODULES}


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the layer holding ``module`` (the longest name that holds
    it), or None."""
    best: tuple[int, int] | None = None
    for index, names in enumerate(LAYERS):
        for name in names:
            holds = module == name or (name != PACKAGE and module.startswith(name + "."))
            if holds and (best is None or len(name) > best[1]):
                best = (index, len(name))
    return None if best is None else best[0]


def graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (package ``__init__``s reached only as the
    parents of what is imported are left out)."""
    return {
        name: {i.imported for i in reader.imports if i.imported != name}
        for name, reader in READERS.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_shadows_a_public_name():
    """A submodule ``airflow_pg_bulk.x`` becomes the package's attribute ``x`` once imported,
    replacing a public top-level name ``x`` (``airflow_pg_bulk.load``, the in-process runner)."""
    public = set(airflow_pg_bulk.__all__)
    assert [name for name in MODULES if name.rsplit(".", 1)[-1] in public] == []


def test_every_module_is_in_a_layer():
    assert [name for name in MODULES if layer_of(name) is None] == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_no_import_of_a_higher_layer():
    upward = []
    for reader in READERS.values():
        for i in reader.imports:
            mine, theirs = layer_of(i.importer), layer_of(i.imported)
            if mine is not None and theirs is not None and theirs < mine:
                upward.append(f"{i.importer}:{i.line} imports {i.imported} (a higher layer)")
    assert upward == []


def test_no_import_inside_a_function_below_the_airflow_layer():
    lazy = [
        f"{i.importer}:{i.line} imports {i.imported} inside a function"
        for reader in READERS.values()
        for i in reader.imports
        if i.in_function and (layer_of(i.importer) or 0) >= LAZY_IMPORTS_ALLOWED
    ]
    assert lazy == []


def test_no_private_name_of_another_module():
    used = [
        f"{name}:{line} uses {private}"
        for name, reader in READERS.items()
        for private, line in reader.private
        if private.rsplit(".", 1)[0] != name
    ]
    assert used == []
