"""The package's layering, checked on the import statements themselves.

Op families (vkdelegate/ops/families/*.py) share code through vkdelegate/kernels/, never
by importing each other, so that adding a family touches only its own files.
"""
import ast
import pathlib

import vkdelegate

ROOT = pathlib.Path(vkdelegate.__file__).parent
OPS = ROOT / "ops" / "families"


def _imported_modules(path: pathlib.Path) -> set:
    """Absolute module names ``path`` imports (``from a.b import c`` gives a.b and
    a.b.c, since c may be a submodule)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_op_families_import_no_other_family():
    families = {p.stem for p in OPS.glob("*.py") if p.stem != "__init__"}
    assert len(families) > 10  # the glob found the op families
    offenders = []
    for path in sorted(OPS.glob("*.py")):
        for name in _imported_modules(path):
            parts = name.split(".")
            if parts[:3] == ["vkdelegate", "ops", "families"] and len(parts) > 3 \
                    and parts[3] in families and parts[3] != path.stem:
                offenders.append(f"{path.name} imports {name}")
    assert offenders == []


def test_kernels_import_no_op_family():
    offenders = [f"{p.name} imports {name}" for p in sorted((ROOT / "kernels").glob("*.py"))
                 for name in _imported_modules(p)
                 if name.startswith("vkdelegate.ops.families")]
    assert offenders == []


def _offenders(folder: pathlib.Path, forbidden: tuple) -> list:
    """``file imports module`` for each import under ``folder`` of a forbidden prefix."""
    return [f"{p.relative_to(ROOT)} imports {name}" for p in sorted(folder.rglob("*.py"))
            for name in sorted(_imported_modules(p))  # sorted: a set's order varies by run
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


def test_ops_import_neither_torch_nor_the_backend():
    # The registry and the families sit between the partitioner and the runtime.
    assert _offenders(ROOT / "ops", ("torch", "vkdelegate.backend")) == []


def test_runtime_knows_nothing_of_torch_ops_or_backend():
    # runtime/op_table.py imports the default table lazily, inside a function, only when
    # no table is injected; that one import is the documented exception.
    found = _offenders(ROOT / "runtime", ("torch", "vkdelegate.backend", "vkdelegate.ops"))
    # sorted: _imported_modules' order within a file follows string hashing.
    assert sorted(found) == ["runtime/op_table.py imports vkdelegate.ops.default_table",
                     "runtime/op_table.py imports vkdelegate.ops.default_table.default_op_table"]


def test_kernels_and_shaders_import_neither_torch_nor_backend():
    for folder in ("kernels", "shaders"):
        assert _offenders(ROOT / folder, ("torch", "vkdelegate.backend")) == []
