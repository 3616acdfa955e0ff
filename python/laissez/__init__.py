"""LaissezCloud's Python SDK.

- :class:`Client`: a client for every tenant RPC of ``proto/laissez/v1/market.proto``
  (Debian's ``python3-grpcio``).
- :class:`EconAdapter` with a ``price(spec, book)`` callback written in Python, and the
  ready strategies: the one C++ adapter (``src/sdk``) bound with pybind11, not a second
  implementation.
- :class:`LocalMarket`: a throwaway ``laissez serve`` on loopback for trying things out.

Prices are int micro-units per node per hour (``units(12.5)`` == 12_500_000), money is
int micro-units, times are engine microseconds. See docs/TENANTS.md.

Import paths: ``PYTHONPATH=build/python`` (the package the build assembles), or
``PYTHONPATH=python`` after a build (this source package then finds the built parts in
``build/python``; ``LAISSEZ_BUILD_DIR`` names another build folder), or
``pip install ./python`` after a build.
"""
from __future__ import annotations

import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))


def _find_built_parts() -> None:
    """Adds the build folder's copy of this package to ``__path__`` when the
    compiled extension is not beside this file (running from the source tree)."""
    if any(n.startswith("_native") for n in _os.listdir(_here)):
        return
    build = _os.environ.get("LAISSEZ_BUILD_DIR") or _os.path.join(_here, "..", "..", "build")
    cand = _os.path.normpath(_os.path.join(build, "python", "laissez"))
    if _os.path.isdir(cand) and cand not in __path__:
        __path__.append(cand)


_find_built_parts()

from .units import MICRO_UNITS, MICROS_PER_SECOND, MICROS_PER_HOUR, INF_PRICE, units, format_money  # noqa: E402
from .client import Client, Endpoints, LaissezError, Watch, new_idempotency_key  # noqa: E402
from .adapter import (  # noqa: E402
    BudgetCapped,
    Connection,
    CostOfDelay,
    DeadlineUrgency,
    DEFAULT_STRATEGY,
    EconAdapter,
    FixedValue,
    GangAware,
    LocalityAware,
    MarketError,
    MigrationAware,
    NodeSpec,
    OrderBookView,
    PricingStrategy,
    ThroughputValue,
    make_strategy,
    on_demand_like,
    run_adapter,
    spot_like,
)
from .local import LocalMarket  # noqa: E402

__all__ = [
    "BudgetCapped", "Client", "Connection", "CostOfDelay", "DEFAULT_STRATEGY", "DeadlineUrgency", "EconAdapter", "FixedValue",
    "GangAware", "INF_PRICE", "LaissezError", "LocalMarket", "LocalityAware", "MICROS_PER_HOUR",
    "MICROS_PER_SECOND", "MICRO_UNITS", "MarketError", "MigrationAware", "NodeSpec", "OrderBookView",
    "PricingStrategy", "ThroughputValue", "format_money", "make_strategy", "on_demand_like", "run_adapter",
    "spot_like", "units",
]
__version__ = "0.1.0"
