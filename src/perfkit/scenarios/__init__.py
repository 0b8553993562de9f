"""The investigations. Each module registers one :class:`~perfkit.scenarios.registry.Scenario`
when imported; importing this package imports every module in it (:func:`discover`), so a new
investigation is one new module here and nothing else. Run order (``Scenario.order``):

- :mod:`.cold_warm`: cold request vs warm requests in one session, leak checks (seed 000).
- :mod:`.warmup_shapes`: does the startup warmup cover the request shapes (seed 003).
- :mod:`.memory_budget`: fit and cost under memory caps, minimum device budget (seed 000).
- :mod:`.offload_modes`: cost and savings of each offload mode (none, model, group-block/leaf).
- :mod:`.load`: serving under load: queueing, throughput, p99, SLO, memory, trace coverage
  (disabled by default).
- :mod:`.overhead`: what perfkit's own instrumentation costs (disabled by default).

The rest is shared: :mod:`.registry` (Scenario and its defaults), :mod:`.parts` (notebook cells,
figures, measure options, ``perfkit figures`` block kinds), :mod:`.cells` (cell texts several
investigations show), :mod:`.common`, :mod:`.runner`. An investigation's measuring function is
its module's (``from perfkit.scenarios.cold_warm import cold_vs_warm``); the package imports no
module by name.
"""

import importlib
import pkgutil

from perfkit.scenarios.registry import all_scenarios, get, names  # noqa: F401 (re-exported)


def discover() -> list[str]:
    """Import every module of this package (each investigation registers itself); returns
    their names. A module that fails to import raises here, naming itself."""
    found = []
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        importlib.import_module(info.name)
        found.append(info.name)
    return found


discover()
