#!/usr/bin/python3
"""An example strategy in Python: follow the quote, never above what a node-hour is
worth to me, and defend a held node up to that worth.

    PYTHONPATH=build/python /usr/bin/python3 python/examples/quote_follower.py \\
        --server 127.0.0.1:50051 --token-file me.token --type h100x8 --worth 12 --seconds 60
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

import laissez
from laissez import INF_PRICE, NodeSpec, OrderBookView, units


class QuoteFollower(laissez.PricingStrategy):
    """Bids the quote plus `step` (capped at `worth`); holds with limit `worth`."""

    def __init__(self, worth: int, step: int) -> None:
        super().__init__()  # Required: the C++ base class must be initialised.
        self.worth = worth
        self.step = step

    def price(self, spec: NodeSpec, book: OrderBookView) -> Optional[int]:
        if spec.held is not None:
            return self.worth  # Keep the node unless someone values it more.
        if book.quote == INF_PRICE:
            return self.worth  # Nothing obtainable now: rest at my worth.
        bid = book.quote + self.step
        return bid if bid <= self.worth else None  # Too dear: do not want it now.


class Printer:
    def on_node_gained(self, request: int, node: int, limit: int) -> None:
        print(f"gained node {node} with limit {laissez.format_money(limit)}/h", flush=True)

    def on_notice(self, request: int, node: int, deadline: int, price: int, reasons: str) -> None:
        print(f"notice on node {node}: {reasons} at {laissez.format_money(price)}/h", flush=True)

    def on_node_lost(self, request: int, node: int, reasons: str) -> None:
        print(f"lost node {node} ({reasons})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description="Follow the quote up to what a node-hour is worth.")
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--type", default="h100x8")
    ap.add_argument("--worth", default="12", help="units per node-hour")
    ap.add_argument("--step", default="0.5", help="units above the quote")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--until-held", action="store_true", help="stop once a node is held")
    a = ap.parse_args()
    worth, step = units(a.worth, "worth"), units(a.step, "step")
    with open(a.token_file) as f:
        token = f.read().strip()
    conn = laissez.Connection(a.server, token, watch=[a.type])
    adapter = laissez.EconAdapter(conn, QuoteFollower(worth, step), Printer())
    req = adapter.add([NodeSpec(a.type)], count=1)
    try:
        laissez.run_adapter(adapter, a.seconds,
                            until=(lambda: adapter.held_count == 1) if a.until_held else None)
        print(f"held {adapter.held_count} node(s): {[h['name'] for h in adapter.held(req)]}", flush=True)
    finally:
        adapter.remove(req)
    return 0


if __name__ == "__main__":
    sys.exit(main())
