"""The investigations, one module each (see docs/DESIGN.md). Each registers one
:class:`~perfkit.investigations.registry.Investigation` when imported; importing this package imports
every module in it (:func:`discover`), so a new investigation is one new module here.
"""

import importlib
import pkgutil


def discover() -> list[str]:
    """Import every module of this package (each investigation registers itself); returns
    their names. A module that fails to import raises here, naming itself."""
    found = []
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        importlib.import_module(info.name)
        found.append(info.name)
    return found


discover()
