"""Op families. Importing this package registers every supported operator.

Each module declares its ops (OpSpec) next to their runtime implementation. Torch-free.
"""
import importlib
import pkgutil

for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")
