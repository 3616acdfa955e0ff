#!/usr/bin/python3
"""A client in another language: Python stubs generated from proto/ with
Debian's grpc_tools drive the tenant flow end to end against `laissez serve`.

Usage: /usr/bin/python3 tests/python/test_client.py --laissez build/laissez
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = 1_000_000
ARGS = None


def md(token):
    return (("authorization", "Bearer " + token),)


class TenantFlow(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="laissez-py-")
        gen = os.path.join(cls.work, "gen")
        os.makedirs(gen)
        from grpc_tools import protoc
        rc = protoc.main(["protoc", "-I" + os.path.join(ROOT, "proto"), "--python_out=" + gen,
                          "--grpc_python_out=" + gen, os.path.join(ROOT, "proto/laissez/v1/market.proto")])
        assert rc == 0, "protoc failed"
        for d in ("laissez", "laissez/v1"):
            open(os.path.join(gen, d, "__init__.py"), "a").close()
        sys.path.insert(0, gen)
        global pb, pbg
        from laissez.v1 import market_pb2 as pb, market_pb2_grpc as pbg  # noqa: F401
        db = os.path.join(cls.work, "market.db")
        cls.log = open(os.path.join(cls.work, "server.log"), "w+")
        cls.server = subprocess.Popen(
            [ARGS.laissez, "serve", "--db", db, "--listen", "127.0.0.1:0",
             "--cluster", os.path.join(ROOT, "scenarios/clusters/small.yaml")],
            stderr=cls.log)
        port = None
        for _ in range(200):
            cls.log.seek(0)
            m = re.search(r"gRPC port (\d+)", cls.log.read())
            if m:
                port = m.group(1)
                break
            time.sleep(0.05)
        assert port, "server did not start"
        cls.log.seek(0)
        log = cls.log.read()
        assert db + ".admin-token" in log, "the log names the admin token file"
        cls.admin = open(db + ".admin-token").read().strip()
        assert oct(os.stat(db + ".admin-token").st_mode & 0o777) == "0o600"
        cls.channel = grpc.insecure_channel("127.0.0.1:" + port)
        cls.tenant = pbg.TenantServiceStub(cls.channel)
        cls.admin_stub = pbg.AdminServiceStub(cls.channel)
        cls.op = pbg.OperatorServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        cls.server.wait(timeout=10)
        cls.log.close()
        shutil.rmtree(cls.work)

    def test_tenant_flow(self):
        r = self.admin_stub.CreateTenant(pb.CreateTenantRequest(name="py", balance=500 * UNIT),
                                         metadata=md(self.admin))
        token = r.token
        self.assertTrue(token.startswith("lz_"))

        # Watch first, so the allocation arrives on the stream.
        events = []
        ready = threading.Event()
        call = self.tenant.Watch(pb.WatchRequest(vertices=["h100x8"]), metadata=md(token))

        def read():
            call.initial_metadata()
            ready.set()
            try:
                for e in call:
                    events.append(e)
            except grpc.RpcError:
                pass
        reader = threading.Thread(target=read)
        reader.start()
        self.assertTrue(ready.wait(10))

        q = self.tenant.Quote(pb.QuoteRequest(vertex="h100x8", depth=True), metadata=md(token))
        self.assertEqual(q.quote.total, 5)  # scenarios/clusters/small.yaml has five h100x8 nodes.
        self.assertEqual(q.quote.free, 5)

        order = self.tenant.PlaceOrder(pb.PlaceOrderRequest(scope="h100x8/eu/eu-1a", price=20 * UNIT),
                                       metadata=md(token)).order
        self.assertGreaterEqual(order, 0)  # Ids start at 0.
        deadline = time.time() + 10
        while time.time() < deadline and not any(e.type == "allocated" for e in events):
            time.sleep(0.05)
        alloc = [e for e in events if e.type == "allocated"]
        self.assertEqual(len(alloc), 1)
        node = alloc[0].node
        self.assertEqual(alloc[0].tenant, "")  # Names of tenants never travel to tenants.

        nodes = self.tenant.ListNodes(pb.ListNodesRequest(), metadata=md(token)).nodes
        self.assertEqual([n.node for n in nodes], [node])
        self.assertEqual(nodes[0].limit, 20 * UNIT)

        self.tenant.SetLimit(pb.SetLimitRequest(node=node, limit=30 * UNIT), metadata=md(token))
        ev = self.tenant.EvictionQuote(pb.EvictionQuoteRequest(node=node), metadata=md(token))
        self.assertEqual(ev.limit, 30 * UNIT)
        self.assertFalse(ev.contested)

        bal = self.tenant.GetBalance(pb.GetBalanceRequest(), metadata=md(token))
        self.assertEqual(bal.tenant, "py")
        self.assertLessEqual(bal.balance, 500 * UNIT)

        # Bad input: the right status and a message naming the field.
        with self.assertRaises(grpc.RpcError) as cm:
            self.tenant.PlaceOrder(pb.PlaceOrderRequest(scope="h100x8", price=-1), metadata=md(token))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(cm.exception.details().startswith("price:"))
        with self.assertRaises(grpc.RpcError) as cm:
            self.tenant.GetBalance(pb.GetBalanceRequest(), metadata=md("lz_" + "0" * 64))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as cm:
            self.op.ListCluster(pb.ListClusterRequest(), metadata=md(token))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.PERMISSION_DENIED)

        self.tenant.Relinquish(pb.RelinquishRequest(node=node), metadata=md(token))
        self.assertEqual(len(self.tenant.ListNodes(pb.ListNodesRequest(), metadata=md(token)).nodes), 0)
        ledger = self.tenant.GetLedger(pb.GetLedgerRequest(), metadata=md(token)).entries
        bal2 = self.tenant.GetBalance(pb.GetBalanceRequest(), metadata=md(token))
        self.assertEqual(bal2.balance, 500 * UNIT - sum(e.amount for e in ledger))
        call.cancel()
        reader.join(10)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--laissez", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
