"""The EconAdapter and the ready strategies: the C++ SDK (``src/sdk``) bound with pybind11.

Write a strategy by subclassing :class:`PricingStrategy`::

    class MyStrategy(laissez.PricingStrategy):
        def price(self, spec: laissez.NodeSpec, book: laissez.OrderBookView) -> Optional[int]:
            if spec.held is not None:        # A node I hold: answer my retention limit.
                return laissez.units(20)
            return min(book.quote, laissez.units(15)) if book.quote != laissez.INF_PRICE else None

``price`` answers micro-units per node per hour; None withdraws the bid (or relinquishes
the held node). The adapter calls it for every node wanted and held whenever something
changed, at most once per :meth:`EconAdapter.reprice`. Ready strategies compose as in C++:
``BudgetCapped(DeadlineUrgency(FixedValue(units(10)), ...), units(30))``.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

try:
    from . import _native
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "laissez: the compiled SDK (laissez/_native) is missing. Build it (`make build`, or "
        "`cmake --build build --target laissez_python`) and use PYTHONPATH=build/python, "
        "or set LAISSEZ_BUILD_DIR to your build folder") from e

MarketError = _native.MarketError
NodeSpec = _native.NodeSpec
OrderBookView = _native.OrderBookView
PricingStrategy = _native.PricingStrategy
FixedValue = _native.FixedValue
ThroughputValue = _native.ThroughputValue
BudgetCapped = _native.BudgetCapped
DeadlineUrgency = _native.DeadlineUrgency
LocalityAware = _native.LocalityAware
GangAware = _native.GangAware
MigrationAware = _native.MigrationAware
CostOfDelay = _native.CostOfDelay
on_demand_like = _native.on_demand_like
spot_like = _native.spot_like
make_strategy = _native.make_strategy
Connection = _native.Connection
EconAdapter = _native.EconAdapter
DEFAULT_STRATEGY: str = _native.DEFAULT_STRATEGY


def run_adapter(adapter: "EconAdapter", seconds: float, *, reprice_interval: float = 0.2,
                refresh_interval: float = 5.0, until: Optional[Callable[[], bool]] = None) -> None:
    """Drives ``adapter`` as ``laissez agent`` does: hands it the watch stream's events,
    re-prices when it is dirty (at most every ``reprice_interval`` seconds) and at least
    every ``refresh_interval`` seconds, for ``seconds`` or until ``until()`` is true."""
    start = time.monotonic()
    last_reprice = -1e9
    last_refresh = start
    while time.monotonic() - start < seconds:
        if until is not None and until():
            return
        now = time.monotonic()
        if adapter.dirty and now - last_reprice >= reprice_interval:
            adapter.reprice()
            last_reprice = now
        if now - last_refresh >= refresh_interval:
            adapter.mark_dirty()
            last_refresh = now
        adapter.poll(50)
