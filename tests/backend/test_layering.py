"""The package's layering, checked on the import statements themselves.

Op families (vkdelegate/backend/ops/*.py) share code through vkdelegate/kernels/, never
by importing each other, so that adding a family touches only its own files.
"""
import ast
import pathlib

import vkdelegate

ROOT = pathlib.Path(vkdelegate.__file__).parent
OPS = ROOT / "backend" / "ops"


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
            if parts[:3] == ["vkdelegate", "backend", "ops"] and len(parts) > 3 \
                    and parts[3] in families and parts[3] != path.stem:
                offenders.append(f"{path.name} imports {name}")
    assert offenders == []


def test_kernels_import_no_op_family():
    offenders = [f"{p.name} imports {name}" for p in sorted((ROOT / "kernels").glob("*.py"))
                 for name in _imported_modules(p)
                 if name.startswith("vkdelegate.backend.ops")]
    assert offenders == []
