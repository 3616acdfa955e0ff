#!/usr/bin/python3
"""Load for crash_recovery.sh: concurrent tenants mutate the market over gRPC
and record exactly which mutations the server acknowledged.

Each tenant owns one order that rests behind a floor; its k-th update sets the
price to BASE + k, so the order's price after a restart tells how many of the
tenant's updates survived. Deposits by the admin count the same way.

Modes:
  setup  --tenants K   create tenants, a floor-guarded node, one order each;
                       writes STATE (JSON).
  load   --seconds S   run until S seconds pass; update STATE with the acked
                       counters (written when the run ends, also when the
                       server is gone).
  check                compare the server against STATE; print
                       "acked=A lost=L conserved=yes|no" and exit 0 if L == 0
                       and money is conserved.
"""
import argparse
import json
import os
import sys
import threading
import time

import grpc

BASE = 1_000_000          # 1 unit per hour, in micro-units.
FLOOR = 10**12            # 1e6 units per hour: no bid reaches it.


def stubs(gen_dir):
    sys.path.insert(0, gen_dir)
    from laissez.v1 import market_pb2, market_pb2_grpc  # noqa: E402
    return market_pb2, market_pb2_grpc


def md(token):
    return (("authorization", "Bearer " + token),)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["setup", "load", "check"])
    ap.add_argument("--server", required=True)
    ap.add_argument("--gen", required=True, help="directory of generated Python stubs")
    ap.add_argument("--state", required=True)
    ap.add_argument("--admin-token-file")
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    pb, pbg = stubs(args.gen)
    channel = grpc.insecure_channel(args.server)
    tenant_stub = pbg.TenantServiceStub(channel)
    op_stub = pbg.OperatorServiceStub(channel)
    admin_stub = pbg.AdminServiceStub(channel)

    if args.mode == "setup":
        admin = open(args.admin_token_file).read().strip()
        op_stub.AddNodes(pb.AddNodesRequest(nodes=[pb.NodeSpec(
            name="crash-n0", type="crashgpu", region="x", zone="z", row="r", rack="k")]), metadata=md(admin))
        op_stub.SetFloor(pb.SetFloorRequest(node="crash-n0", price=FLOOR), metadata=md(admin))
        # Holders in "eu" pay at least this floor, so money moves.
        op_stub.SetFloor(pb.SetFloorRequest(location="eu", price=5 * BASE), metadata=md(admin))
        state = {"admin": admin, "tenants": [], "deposits_acked": 0, "deposits_sent": 0}
        for i in range(args.tenants):
            r = admin_stub.CreateTenant(pb.CreateTenantRequest(name="crash%d" % i, balance=10**15),
                                        metadata=md(admin))
            o = tenant_stub.PlaceOrder(pb.PlaceOrderRequest(scope="crashgpu", price=BASE), metadata=md(r.token))
            # Every other tenant also holds a real node, so money moves.
            held = None
            if i % 2 == 0:
                try:
                    tenant_stub.PlaceOrder(pb.PlaceOrderRequest(scope="h100x8", price=50 * BASE),
                                           metadata=md(r.token))
                    held = True
                except grpc.RpcError:
                    held = False
            # Odd tenants send their updates four to a StreamUpdates message.
            state["tenants"].append({"token": r.token, "order": o.order, "acked": 0, "sent": 0, "held": held,
                                     "stream": i % 2 == 1})
        json.dump(state, open(args.state, "w"))
        return 0

    state = json.load(open(args.state))

    if args.mode == "load":
        deadline = time.time() + args.seconds
        lock = threading.Lock()
        ready = [False]  # The script times its kill from our first acknowledged update.

        def churn(t):
            # Give the held node back and bid again: settles the holding's charges.
            nodes = tenant_stub.ListNodes(pb.ListNodesRequest(), metadata=md(t["token"]), timeout=2).nodes
            for n in nodes:
                tenant_stub.Relinquish(pb.RelinquishRequest(node=n.node), metadata=md(t["token"]), timeout=2)
            tenant_stub.PlaceOrder(pb.PlaceOrderRequest(scope="h100x8", price=50 * BASE), metadata=md(t["token"]),
                                   timeout=2)

        def tenant_loop(t):
            while time.time() < deadline:
                if t["held"] and t["sent"] % 25 == 0:
                    try:
                        churn(t)
                    except grpc.RpcError:
                        pass
                k = t["sent"] + 1
                try:
                    if t.get("stream"):
                        ks = list(range(k, k + 4))
                        t["sent"] = ks[-1]
                        msg = pb.UpdateOrderRequest(
                            updates=[pb.UpdateOrderRequest(order=t["order"], price=BASE + j, tag=j) for j in ks])
                        resp = list(tenant_stub.StreamUpdates(iter([msg]), metadata=md(t["token"]), timeout=2))
                        acks = [a for r in resp for a in r.acks]
                        if [a.tag for a in acks] != ks or any(a.code != 0 for a in acks):
                            # Counted as a loss by check: acks come one per update, in order.
                            t["bad_acks"] = "%s" % [(a.tag, a.code, a.message) for a in acks]
                            break
                        k = ks[-1]
                    else:
                        t["sent"] = k
                        tenant_stub.UpdateOrder(pb.UpdateOrderRequest(order=t["order"], price=BASE + k),
                                                metadata=md(t["token"]), timeout=2)
                    t["acked"] = k
                    if not ready[0]:
                        ready[0] = True
                        open(args.state + ".running", "w").close()
                except grpc.RpcError:
                    time.sleep(0.05)  # The server is gone (or restarting).

        def deposit_loop():
            while time.time() < deadline:
                with lock:
                    state["deposits_sent"] += 1
                try:
                    admin_stub.Deposit(pb.DepositRequest(tenant="crash0", amount=1), metadata=md(state["admin"]),
                                       timeout=2)
                    state["deposits_acked"] += 1  # Each acknowledged deposit adds exactly 1.
                except grpc.RpcError as e:
                    if os.environ.get("CRASH_DEBUG"):
                        print("deposit: %s %s" % (e.code(), e.details()), file=sys.stderr)
                    time.sleep(0.05)

        threads = [threading.Thread(target=tenant_loop, args=(t,)) for t in state["tenants"]]
        threads.append(threading.Thread(target=deposit_loop))
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        json.dump(state, open(args.state, "w"))
        return 0

    # check
    acked = lost = 0
    for t in state["tenants"]:
        if t.get("bad_acks"):
            print("tenant order %d: bad stream acks %s" % (t["order"], t["bad_acks"]), file=sys.stderr)
            lost += 1
        orders = tenant_stub.ListOrders(pb.ListOrdersRequest(), metadata=md(t["token"]), timeout=10).orders
        mine = [o for o in orders if o.id == t["order"]]
        if not mine:
            print("order %d of a tenant is missing" % t["order"], file=sys.stderr)
            lost += t["acked"] + 1
            continue
        have = mine[0].effective_price - BASE   # Updates that survived.
        acked += t["acked"]
        if have < t["acked"]:
            print("tenant order %d: %d updates acknowledged, %d present" % (t["order"], t["acked"], have),
                  file=sys.stderr)
            lost += t["acked"] - have
        if have > t["sent"]:
            print("tenant order %d: price beyond anything sent" % t["order"], file=sys.stderr)
            lost += 1
    led = op_stub.GetLedger(pb.OperatorLedgerRequest(limit=1), metadata=md(state["admin"]), timeout=10)
    initial = 10**15 * len(state["tenants"])
    deposits_present = led.deposited - initial
    acked += state["deposits_acked"]
    if deposits_present > state["deposits_sent"]:
        print("deposits: %d present but only %d sent" % (deposits_present, state["deposits_sent"]), file=sys.stderr)
        lost += 1
    if deposits_present < state["deposits_acked"]:
        print("deposits: %d acknowledged, %d present" % (state["deposits_acked"], deposits_present), file=sys.stderr)
        lost += state["deposits_acked"] - deposits_present
    conserved = led.deposited == led.tenant_balances + led.operator_revenue
    if not conserved:
        print("money not conserved: deposited %d != balances %d + revenue %d" %
              (led.deposited, led.tenant_balances, led.operator_revenue), file=sys.stderr)
    print("acked=%d lost=%d conserved=%s revenue=%d" % (acked, lost, "yes" if conserved else "no",
                                                        led.operator_revenue))
    return 0 if lost == 0 and conserved else 1


if __name__ == "__main__":
    sys.exit(main())
