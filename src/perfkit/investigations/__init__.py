"""The investigations, one module each (docs/DESIGN.md); importing this package imports every
module in it (:func:`discover`), each registering its
:class:`~perfkit.investigations.registry.Investigation`."""

import importlib
import pkgutil


def discover() -> list[str]:
    """Import every module of this package; returns their names."""
    found = []
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        importlib.import_module(info.name)
        found.append(info.name)
    return found


discover()
