#!/usr/bin/python3
"""The Python SDK (package `laissez`) against a live server on loopback: the client for
every tenant RPC, the one C++ EconAdapter driven by a Python `price(spec, book)`
callback, the ready strategies, bad input, the example strategy, and an offline
`pip install` of the package.

Usage: PYTHONPATH=build/python /usr/bin/python3 tests/tenant/test_sdk.py \
           --laissez build/laissez --build build
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import laissez
from laissez import units

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "scenarios", "clusters", "tenant_demo.yaml")
ARGS = None
UNIT = laissez.MICRO_UNITS


def wait_for(cond, seconds=30.0, step=0.05):
    """Polls `cond` until true; a bounded guard, not a speed assertion."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


class Recorder(laissez.PricingStrategy):
    """Bids `want` for missing nodes and answers `keep` for held ones; records the calls."""

    def __init__(self, want, keep):
        super().__init__()
        self.want, self.keep = want, keep
        self.calls = []

    def price(self, spec, book):
        self.calls.append((spec.node_type, spec.held, spec.count, book.quote, book.request_count))
        return self.keep if spec.held is not None else self.want


class Listener:
    def __init__(self):
        self.gained, self.lost = [], []

    def on_node_gained(self, request, node, limit):
        self.gained.append((node, limit))

    def on_node_lost(self, request, node, reasons):
        self.lost.append((node, reasons))


class SdkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.market = laissez.LocalMarket(ARGS.laissez, CLUSTER)

    @classmethod
    def tearDownClass(cls):
        cls.market.close()

    def token(self, name, balance="500"):
        path = self.market.create_tenant(name, balance)
        with open(path) as f:
            return path, f.read().strip()

    def test_units(self):
        self.assertEqual(units(12.5), 12_500_000)
        self.assertEqual(units("0.000001"), 1)
        self.assertEqual(laissez.format_money(12_500_000), "12.5")
        for bad in (float("nan"), float("inf"), -1, "0.0000001", "abc", 10**10):
            with self.assertRaises(ValueError) as cm:
                units(bad)
            self.assertTrue(str(cm.exception).startswith("price:"), str(cm.exception))

    def test_client_every_tenant_rpc(self):
        path, token = self.token("rpc")
        c = laissez.Client(self.market.address, token_file=path)
        topo = c.topology()
        self.assertEqual(sorted(n.name for n in topo.nodes), ["gpu-a", "gpu-b"])
        q = c.quote("h100x8", depth=True)
        self.assertEqual(q.total, 2)
        w = c.watch(["h100x8"])
        events = []
        reader = threading.Thread(target=lambda: events.extend(w))
        reader.start()
        order = c.place_order("gpu-a", units(3))
        self.assertGreaterEqual(order, 0)
        self.assertTrue(wait_for(lambda: any(e.type == "allocated" for e in events)))
        self.assertEqual([n.node for n in c.list_nodes()], ["gpu-a"])
        c.set_limit("gpu-a", units(4))
        self.assertEqual(c.eviction_quote("gpu-a").limit, units(4))
        c.place_order("gpu-b", units(3))
        self.assertTrue(wait_for(lambda: len(c.list_nodes()) == 2))
        # Both nodes are ours, so this order rests: update it singly and over the stream.
        rest = c.place_order("h100x8", units(1))
        c.update_order(rest, units(2))
        acks = c.stream_updates([(rest, units(3)), (rest, units(4))])
        self.assertEqual([a.code for a in acks], [0, 0])
        self.assertEqual([o.price for o in c.list_orders() if o.id == rest], [units(4)])
        c.cancel_order(rest)
        self.assertEqual([o.id for o in c.list_orders() if o.id == rest], [])
        c.relinquish("gpu-b")
        with self.assertRaises(laissez.LaissezError) as cm:
            c.place_order("h100x8", -1)
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        self.assertTrue(cm.exception.message.startswith("price:"))
        with self.assertRaises(ValueError):
            c.place_order("h100x8", units(1), locality="nearby")
        c.relinquish("gpu-a")
        self.assertEqual(list(c.list_nodes()), [])
        bal = c.balance()
        self.assertEqual(bal.tenant, "rpc")
        self.assertEqual(bal.balance, 500 * UNIT - sum(e.amount for e in c.ledger()))
        w.close()
        reader.join(10)
        self.assertFalse(reader.is_alive())
        c.close()

    def test_failover_keys_and_watch_resume_across_a_restart(self):
        # The leader a follower's refusal names, else the next address.
        eps = laissez.Endpoints("a:1, b:2")
        eps.next("not the leader: this replica follows; the leader is c:3 (leader=c:3)")
        self.assertEqual(eps.address(), "c:3")
        eps.next("failed to connect to all addresses")
        self.assertEqual(eps.address(), "a:1")
        eps.next("not the leader: ... (leader=b:2)")
        self.assertEqual(eps.address(), "b:2")
        with self.assertRaises(ValueError):
            laissez.Endpoints(" , ")
        self.assertFalse(laissez.client.retryable("UNAVAILABLE", "Socket closed", False))
        self.assertTrue(laissez.client.retryable("UNAVAILABLE", "Socket closed", True))
        self.assertFalse(laissez.client.retryable("NOT_FOUND", "order: no order 3", True))

        market = laissez.LocalMarket(ARGS.laissez, CLUSTER)  # Its own: this test restarts it.
        try:
            path = market.create_tenant("fo", "500")
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            dead = "127.0.0.1:%d" % s.getsockname()[1]
            s.close()  # Nobody listens there.
            c = laissez.Client(",".join([dead, market.address]), token_file=path, timeout=10)
            self.assertEqual(c.balance().tenant, "fo")
            self.assertEqual(c.address, market.address, "the client moved past the dead address")
            w = c.watch(["h100x8"])
            start = w.position
            self.assertIsNotNone(start)
            events = []
            reader = threading.Thread(target=lambda: events.extend(w))
            reader.start()
            c.place_order("gpu-a", units(3))
            self.assertTrue(wait_for(lambda: any(e.type == "allocated" for e in events)))
            market.restart()
            # The first call after the restart may meet the old connection (UNAVAILABLE): it
            # is sent again with the same key, so it places one order.
            c.place_order("gpu-b", units(3))
            self.assertTrue(wait_for(lambda: sum(e.type == "allocated" for e in events) == 2))
            key = laissez.new_idempotency_key()
            rest = c.place_order("h100x8", units(1), idempotency_key=key)
            self.assertEqual(c.place_order("h100x8", units(1), idempotency_key=key), rest)
            self.assertEqual([o.id for o in c.list_orders()], [rest], "a repeat placed a second order")
            with self.assertRaises(laissez.LaissezError) as cm:
                c.place_order("h100x8", units(2), idempotency_key=key)
            self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
            self.assertTrue(cm.exception.message.startswith("idempotency_key:"), cm.exception.message)
            ckey = laissez.new_idempotency_key()
            c.cancel_order(rest, idempotency_key=ckey)
            c.cancel_order(rest, idempotency_key=ckey)  # The original answer (OK), not NOT_FOUND.
            # Streamed updates, first sent to the dead address: sent again on the market.
            rest2 = c.place_order("h100x8", units(1))
            c2 = laissez.Client([dead, market.address], token_file=path, timeout=10)
            acks = c2.stream_updates([(rest2, units(2)), (rest2, units(3))])
            self.assertEqual([(a.tag, a.code) for a in acks], [(0, 0), (1, 0)])
            self.assertEqual([o.price for o in c.list_orders() if o.id == rest2], [units(3)])
            self.assertEqual(c2.address, market.address)
            c2.close()
            c.cancel_order(rest2)  # Both nodes are held, so it rested.
            rkey = laissez.new_idempotency_key()
            c.relinquish("gpu-b", idempotency_key=rkey)
            c.relinquish("gpu-b", idempotency_key=rkey)
            self.assertEqual([n.node for n in c.list_nodes()], ["gpu-a"])
            self.assertTrue(wait_for(lambda: any(e.type == "released" for e in events)))
            time.sleep(0.5)
            # The same stream, resumed across the restart, against one read after the fact
            # from where it started: the same events at the same positions.
            whole = c.watch(["h100x8"], after=start)
            replay = []
            r2 = threading.Thread(target=lambda: replay.extend(whole))
            r2.start()
            self.assertTrue(wait_for(lambda: len(replay) >= len(events)))
            time.sleep(0.3)
            w.close()
            whole.close()
            reader.join(10)
            r2.join(10)
            self.assertGreaterEqual(w.reconnects, 1)
            key_of = lambda e: (e.seq, e.index, e.type, e.node)  # noqa: E731
            self.assertEqual([key_of(e) for e in events], [key_of(e) for e in replay],
                             "the resumed watch lost or repeated events")
            c.close()
        finally:
            market.close()

    def test_adapter_with_python_callback(self):
        path, token = self.token("pyadapter")
        conn = laissez.Connection(self.market.address, token, watch=["h100x8"])
        self.assertEqual(conn.tenant, "pyadapter")
        strat = Recorder(want=units(12), keep=units(15))
        listener = Listener()
        adapter = laissez.EconAdapter(conn, strat, listener)
        req = adapter.add([laissez.NodeSpec("h100x8")], count=1)
        laissez.run_adapter(adapter, 60, until=lambda: adapter.held_count == 1 and not adapter.dirty)
        self.assertEqual(adapter.held_count, 1)
        laissez.run_adapter(adapter, 60, until=lambda: adapter.held(req)[0]["limit"] == units(15))
        held = adapter.held(req)
        self.assertEqual(len(listener.gained), 1)
        self.assertEqual(listener.gained[0][0], held[0]["node"])
        # Price() was asked to bid for the missing node, then for the held node's limit.
        wanted = [c for c in strat.calls if c[1] is None]
        kept = [c for c in strat.calls if c[1] is not None]
        self.assertTrue(wanted and kept)
        self.assertEqual(wanted[0][0], "h100x8")
        self.assertEqual(kept[0][1], held[0]["node"])
        c = laissez.Client(self.market.address, token)
        self.assertEqual([(n.node, n.limit) for n in c.list_nodes()], [(held[0]["name"], units(15))])
        self.assertGreaterEqual(adapter.stats["limits_set"], 1)
        adapter.remove(req)
        self.assertTrue(wait_for(lambda: len(c.list_nodes()) == 0))
        self.assertEqual(listener.lost[-1][0], held[0]["node"])

    def test_ready_strategies_compose_with_python(self):
        path, token = self.token("ready")
        conn = laissez.Connection(self.market.address, token, watch=["h100x8"])
        # A C++ decorator around a Python strategy: the cap applies to the Python answer.
        inner = Recorder(want=units(50), keep=units(50))
        capped = laissez.BudgetCapped(inner, units(9))
        del inner  # The decorator keeps the Python object alive.
        adapter = laissez.EconAdapter(conn, capped)
        req = adapter.add([laissez.NodeSpec("h100x8", location="eu")], count=1)
        laissez.run_adapter(adapter, 60, until=lambda: adapter.held_count == 1 and not adapter.dirty)
        self.assertEqual(adapter.held(req)[0]["limit"], units(9))
        adapter.remove(req)
        # Ready strategies answer as in C++.
        self.assertEqual(laissez.ThroughputValue(units(10), {"h100x8": 1_000_000, "a100x8": 500_000})
                         .value_of("a100x8"), units(5))
        self.assertIsNone(laissez.ThroughputValue(units(10), {"h100x8": 1_000_000}).value_of("tpu"))
        mig = laissez.MigrationAware(laissez.FixedValue(units(10)), overhead=30 * 60 * laissez.MICROS_PER_SECOND)
        self.assertEqual(mig.premium(units(10)), units(5))
        urg = laissez.DeadlineUrgency(laissez.FixedValue(units(10)), deadline=10 * laissez.MICROS_PER_HOUR,
                                      remaining=lambda: laissez.MICROS_PER_HOUR)
        self.assertEqual(urg.factor_at(0), 500_000)
        self.assertEqual(urg.factor_at(9 * laissez.MICROS_PER_HOUR), 3_000_000)
        cod = laissez.CostOfDelay(value=units(100), speed_ppm={"h100x8": 1_000_000}, ideal=laissez.MICROS_PER_HOUR)
        self.assertGreater(cod.delay_cost_per_hour(0, 1_000_000, False), 0)
        with self.assertRaises(ValueError) as cm:
            laissez.CostOfDelay(kind="interactive")
        self.assertIn("kind:", str(cm.exception))
        for name in ("fixed", "on-demand", "spot", "locality", "migration", laissez.DEFAULT_STRATEGY):
            self.assertIsInstance(laissez.make_strategy(name, value=units(3)), laissez.PricingStrategy)
        laissez.LocalityAware(laissez.on_demand_like(units(30)), 100_000)
        laissez.GangAware(laissez.spot_like(units(1)))

    def test_bad_input_names_the_field(self):
        with self.assertRaises(ValueError) as cm:
            laissez.make_strategy("psychic")
        self.assertIn("strategy:", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            laissez.make_strategy("budget", value=units(1), cap=0)
        self.assertIn("cap:", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            laissez.NodeSpec("h100x8", locality="nearby")
        self.assertIn("locality", str(cm.exception))
        with self.assertRaises(TypeError):
            laissez.BudgetCapped("not a strategy", units(1))
        path, token = self.token("bad")
        conn = laissez.Connection(self.market.address, token)
        adapter = laissez.EconAdapter(conn, laissez.FixedValue(units(1)))
        with self.assertRaises(ValueError) as cm:
            adapter.add([laissez.NodeSpec("tpu-v9")])
        self.assertIn("node_type", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            adapter.add([laissez.NodeSpec("h100x8")], count=0)
        self.assertIn("count", str(cm.exception))
        with self.assertRaises(laissez.MarketError) as cm:
            laissez.Connection(self.market.address, "lz_" + "0" * 64)
        self.assertIn("UNAUTHENTICATED", str(cm.exception))

    def test_example_strategy_runs(self):
        path, token = self.token("example")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "python", "examples", "quote_follower.py"),
                            "--server", self.market.address, "--token-file", path, "--seconds", "60",
                            "--until-held"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("held 1 node(s)", r.stdout)

    def test_type_stub_matches_the_native_module(self):
        import ast
        from laissez import _native
        with open(os.path.join(ROOT, "python", "laissez", "_native.pyi")) as f:
            tree = ast.parse(f.read())
        stubbed = set()
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                stubbed.add(node.name)
            elif isinstance(node, ast.AnnAssign):
                stubbed.add(node.target.id)
        public = {n for n in dir(_native) if not n.startswith("_")}
        self.assertEqual(stubbed, public)

    def test_pip_install_offline(self):
        work = tempfile.mkdtemp(prefix="laissez-pip-")
        target = os.path.join(work, "site")
        # A copy of python/, so the build leaves nothing in the source tree.
        src = os.path.join(work, "src")
        shutil.copytree(os.path.join(ROOT, "python"), src, ignore=shutil.ignore_patterns("__pycache__"))
        env = dict(os.environ, LAISSEZ_BUILD_DIR=os.path.abspath(ARGS.build), PIP_NO_INDEX="1")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                            "--no-deps", "--target", target, src],
                           capture_output=True, text=True, timeout=240, env=env, cwd=work)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LAISSEZ_BUILD_DIR")}
        clean["PYTHONPATH"] = target
        r = subprocess.run([sys.executable, "-c", "import laissez, os; print(os.path.dirname(laissez.__file__)); "
                            "print(laissez.FixedValue(1).__class__.__name__)"],
                           capture_output=True, text=True, timeout=60, env=clean, cwd=work)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(target), r.stdout)
        self.assertIn("FixedValue", r.stdout)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--laissez", required=True)
    ap.add_argument("--build", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
