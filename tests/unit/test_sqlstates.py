"""The SQLSTATEs the load tells apart are named once, in ``airflow_pg_bulk.errors``: no other
module writes one as a literal, nor compares an error's ``sqlstate`` with a literal."""

import ast
import re
from pathlib import Path

import airflow_pg_bulk
from airflow_pg_bulk import errors

ROOT = Path(airflow_pg_bulk.__file__).parent
NAMED = {
    name: value
    for name, value in vars(errors).items()
    if name.isupper() and isinstance(value, str) and re.fullmatch(r"[0-9A-Z]{5}", value)
}


def test_each_code_has_one_name():
    assert len(NAMED) >= 15
    assert len(set(NAMED.values())) == len(NAMED), "a SQLSTATE named twice"
    assert errors.LOCK_NOT_AVAILABLE == "55P03" and errors.QUERY_CANCELED == "57014"
    assert set(NAMED.values()) >= errors.TRANSIENT_SQLSTATES


def _mentions_sqlstate(node: ast.expr) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr == "sqlstate")
        or (isinstance(n, ast.Name) and n.id == "sqlstate")
        for n in ast.walk(node)
    )


def _strings(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def test_no_module_but_errors_writes_a_sqlstate():
    """A named code written as a literal elsewhere (``sqlstate="55P03"``, a private copy of the
    constant), or an error's ``sqlstate`` compared with a literal: use (or add) the name in
    errors.py. (A code's class, ``sqlstate[:2]``, is not a code: is_data_sqlstate keeps it.)"""
    codes = set(NAMED.values())
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            said: list[str] = []
            if isinstance(node, ast.Constant) and node.value in codes:
                said = [node.value]
            elif isinstance(node, ast.Compare):
                sides = (node.left, *node.comparators)
                if any(_mentions_sqlstate(s) for s in sides):
                    # (a named code is found as a Constant above)
                    said = [v for s in sides for v in _strings(s) if len(v) == 5 and v not in codes]
            if said:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {', '.join(said)}")
    assert not found, "SQLSTATE written as a literal (use errors.py's name):\n" + "\n".join(found)
