#!/usr/bin/python3
"""Failure tests of the replicated market (docs/HA.md, issue 14).

Each scenario starts its own etcd members and `laissez serve --etcd` replicas
on free loopback ports, drives them over gRPC and stops them all (SIGKILL at
the end, whatever happened). Every wait is bounded in time.

Scenarios:
  kill     three members, three replicas; kill -9 the leader --kills times at
           random points under client load (tenants re-pricing, the admin
           depositing, holders being charged), restarting the killed replica
           each time. Checks: 0 acknowledged mutations lost, money conserved,
           a new leader each time, every replica at the same state digest.
           Prints failover times (kill -> first acknowledged mutation) p50/p99.
  fence    SIGSTOP the leader past its lease TTL; another replica takes over
           and accepts writes; a deposit sent to the paused leader is pending
           in its socket; SIGCONT: the old leader must not append it (nor
           anything) and must step down to follower.
  members  three members: lose one, the market works; lose two, mutations
           fail with UNAVAILABLE and nothing acknowledged is lost; a member
           returns, service resumes.
  join     under load, several snapshot rounds keep the journal keys and
           etcd's database in use bounded; a replica started late (after
           snapshots truncated the journal and etcd history was compacted)
           restores the newest snapshot, replays only the tail and has the
           same digest.
  lag      (a measurement, not a check) how long after an acknowledged
           mutation a follower has applied it.

Usage: ha_test.py --build DIR [--kills N] [--seed S] [--join-seconds N] SCENARIO...
Exit status 0 only if every scenario passed; one line "ha-SCENARIO: ..." each.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import grpc

BASE = 1_000_000          # 1 unit per hour, in micro-units.
FLOOR = 10**12            # No bid reaches it: orders behind it rest.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_given = set()


def free_port():
    # Never the same port twice in one run: a port is free when picked, not
    # reserved, so two picks could otherwise collide.
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p not in _given:
            _given.add(p)
            return p


def wait_until(fn, seconds, what):
    end = time.time() + seconds
    while time.time() < end:
        try:
            v = fn()
            if v:
                return v
        except Exception:  # noqa: BLE001 - a process not up yet
            pass
        time.sleep(0.05)
    raise RuntimeError("timed out after %.0f s waiting for %s" % (seconds, what))


def http_json(url, timeout=1.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class Procs:
    """Every process a scenario starts; all are killed at the end."""

    def __init__(self, work):
        self.work = work
        self.all = []

    def start(self, name, argv):
        log = open(os.path.join(self.work, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.all.append(p)
        return p

    def stop_all(self):
        for p in self.all:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except OSError:
                    pass
        for p in self.all:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


class Etcd:
    def __init__(self, procs, n):
        self.procs = procs
        self.n = n
        self.client = [free_port() for _ in range(n)]
        self.peer = [free_port() for _ in range(n)]
        self.p = [None] * n
        self.cluster = ",".join("m%d=http://127.0.0.1:%d" % (i, self.peer[i]) for i in range(n))

    def start(self, i):
        d = os.path.join(self.procs.work, "etcd%d" % i)
        self.p[i] = self.procs.start("etcd%d" % i, [
            "etcd", "--name", "m%d" % i, "--data-dir", d,
            "--listen-client-urls", "http://127.0.0.1:%d" % self.client[i],
            "--advertise-client-urls", "http://127.0.0.1:%d" % self.client[i],
            "--listen-peer-urls", "http://127.0.0.1:%d" % self.peer[i],
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % self.peer[i],
            "--initial-cluster", self.cluster, "--initial-cluster-token", "laissez-ha-test",
            # Short heartbeats let a lease be as short as 1 s (etcd's minimum TTL follows them).
            "--heartbeat-interval", "50", "--election-timeout", "500"])

    def start_all(self):
        for i in range(self.n):
            self.start(i)
        for i in range(self.n):
            wait_until(lambda i=i: http_json("http://127.0.0.1:%d/health" % self.client[i])["health"] == "true",
                       30, "etcd member %d" % i)

    def kill(self, i):
        self.p[i].kill()
        self.p[i].wait()

    def endpoints(self):
        return ",".join("127.0.0.1:%d" % c for c in self.client)


class Replicas:
    def __init__(self, procs, etcd, laissez, n, snapshot_ms=1000):
        self.procs = procs
        self.etcd = etcd
        self.laissez = laissez
        self.grpc = [free_port() for _ in range(n)]
        self.http = [free_port() for _ in range(n)]
        self.p = [None] * n
        self.snapshot_ms = snapshot_ms
        self.admin_file = os.path.join(procs.work, "admin-token")

    def add(self):
        self.grpc.append(free_port())
        self.http.append(free_port())
        self.p.append(None)
        return len(self.p) - 1

    def start(self, i):
        self.p[i] = self.procs.start("replica%d" % i, [
            self.laissez, "serve", "--etcd", self.etcd.endpoints(), "--listen", "127.0.0.1:%d" % self.grpc[i],
            "--http", "127.0.0.1:%d" % self.http[i], "--admin-token-file", self.admin_file,
            "--cluster", os.path.join(ROOT, "scenarios/clusters/small.yaml"), "--lease-ttl", "1",
            "--snapshot-ms", str(self.snapshot_ms), "--rate-limit", "0", "--tick-ms", "200"])

    def health(self, i):
        try:
            return http_json("http://127.0.0.1:%d/healthz" % self.http[i], timeout=0.5)
        except Exception:  # noqa: BLE001 - down or paused
            return None

    def leader(self, among=None):
        for i in (among if among is not None else range(len(self.p))):
            h = self.health(i)
            if h and h.get("role") == "leader":
                return i
        return None

    def wait_leader(self, what, among=None, seconds=30):
        return wait_until(lambda: (self.leader(among),) if self.leader(among) is not None else None, seconds, what)[0]

    def wait_up(self, i, seconds=20):
        wait_until(lambda: self.health(i), seconds, "replica %d" % i)

    def addresses(self):
        return ["127.0.0.1:%d" % g for g in self.grpc]


def md(token):
    return (("authorization", "Bearer " + token),)


class Market:
    """A client over all replicas that fails over like the CLI (grpc_client.h):
    any UNAVAILABLE for idempotent calls, only proven-not-applied ones otherwise."""

    NOT_APPLIED = ("not the leader", "failed to connect", "Connection refused", "server: not running",
                   "the store failed; restart the server")

    def __init__(self, pb, pbg, addresses):
        self.pb, self.pbg = pb, pbg
        self.addresses = list(addresses)
        self.cur = 0
        self.lock = threading.Lock()
        self.channels = {}
        self.ambiguous_keyed = 0

    def stub(self, kind, addr):
        if addr not in self.channels:
            self.channels[addr] = grpc.insecure_channel(addr)
        ch = self.channels[addr]
        return {"tenant": self.pbg.TenantServiceStub, "op": self.pbg.OperatorServiceStub,
                "admin": self.pbg.AdminServiceStub}[kind](ch)

    def call(self, kind, method, req, token, idempotent, budget=15.0, timeout=3.0):
        """`idempotent`: a read, an absolute set, or a call with an idempotency
        key, which is retried with the same key on any UNAVAILABLE (and on a
        timeout, as ambiguous as a dead leader) and so applies once."""
        end = time.time() + budget
        with self.lock:
            cur = self.cur
        while True:
            addr = self.addresses[cur % len(self.addresses)]
            try:
                r = getattr(self.stub(kind, addr), method)(req, metadata=md(token), timeout=timeout)
                with self.lock:
                    self.cur = cur
                return r
            except grpc.RpcError as e:
                d = e.details() or ""
                keyed = bool(getattr(req, "idempotency_key", ""))
                retry = (e.code() == grpc.StatusCode.UNAVAILABLE and (
                    idempotent or any(s in d for s in self.NOT_APPLIED))) or (
                    keyed and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retry or time.time() >= end:
                    raise
                if keyed and not any(s in d for s in self.NOT_APPLIED):
                    with self.lock:
                        self.ambiguous_keyed += 1  # May have been applied: the key makes the retry safe.
                if "leader=" in d:
                    named = d.split("leader=")[1].split(")")[0]
                    cur = self.addresses.index(named) if named in self.addresses else cur + 1
                else:
                    cur += 1
                time.sleep(0.03)


class Load:
    """Tenants re-price their orders (the k-th update sets BASE + k), the admin
    deposits 1 micro-unit at a time, holders churn so money moves. Records what
    was acknowledged, and when."""

    def __init__(self, m, admin, tenants):
        self.m, self.admin, self.tenants = m, admin, tenants
        self.stop = threading.Event()
        self.deposits_sent = 0
        self.deposits_acked = 0
        self.unresolved = []  # Keys of deposits that failed; resolved before counting.
        self.resolved = 0
        self.other_deposits = 0  # Money deposited outside `deposit` (fence: the CLI's, the paused leader's).
        self.ack_times = []
        self.lock = threading.Lock()
        self.threads = []

    def acked(self):
        with self.lock:
            self.ack_times.append(time.time())

    def tenant_loop(self, t):
        pb = self.m.pb
        while not self.stop.is_set():
            if t["held"] and t["sent"] % 25 == 0:
                try:
                    nodes = self.m.call("tenant", "ListNodes", pb.ListNodesRequest(), t["token"], True).nodes
                    for n in nodes:
                        self.m.call("tenant", "Relinquish", pb.RelinquishRequest(node=n.node), t["token"], False)
                    self.m.call("tenant", "PlaceOrder", pb.PlaceOrderRequest(scope="h100x8", price=50 * BASE),
                                t["token"], False)
                except grpc.RpcError:
                    pass
            k = t["sent"] + 1
            t["sent"] = k
            try:
                self.m.call("tenant", "UpdateOrder", pb.UpdateOrderRequest(order=t["order"], price=BASE + k),
                            t["token"], True)
                t["acked"] = k
                self.acked()
            except grpc.RpcError:
                time.sleep(0.05)

    def deposit(self, budget=15.0):
        """One deposit of 1 micro-unit with its own idempotency key, retried
        with that key through failovers. A deposit still failing after
        `budget` is kept to be resolved (resolve) and re-raised."""
        key = "dep-" + uuid.uuid4().hex
        self.deposits_sent += 1
        try:
            self.m.call("admin", "Deposit", self.m.pb.DepositRequest(tenant="ha0", amount=1, idempotency_key=key),
                        self.admin, True, budget=budget)
        except grpc.RpcError:
            self.unresolved.append(key)
            raise
        self.deposits_acked += 1
        self.acked()

    def resolve(self):
        """Sends every unresolved deposit again with its key: applied once
        whether or not the first attempt was."""
        for key in self.unresolved:
            self.m.call("admin", "Deposit", self.m.pb.DepositRequest(tenant="ha0", amount=1, idempotency_key=key),
                        self.admin, True, budget=30)
            self.deposits_acked += 1
            self.resolved += 1
        self.unresolved = []

    def deposit_loop(self):
        while not self.stop.is_set():
            try:
                self.deposit()
            except grpc.RpcError:
                time.sleep(0.05)

    def start(self):
        self.threads = [threading.Thread(target=self.tenant_loop, args=(t,)) for t in self.tenants]
        self.threads.append(threading.Thread(target=self.deposit_loop))
        for th in self.threads:
            th.start()

    def finish(self):
        self.stop.set()
        for th in self.threads:
            th.join(timeout=60)

    def first_ack_after(self, t):
        with self.lock:
            later = [a for a in self.ack_times if a > t]
        return min(later) if later else None


class ResumingWatch:
    """An operator watch that fails over like `laissez watch`: when its replica
    goes (UNAVAILABLE), it re-opens on the next endpoint, resuming after the
    last event it saw. Records every event's (seq, index, type)."""

    def __init__(self, m, admin, order, start=None):
        self.m, self.admin, self.order = m, admin, list(order)
        self.events = []
        self.start_pos = start  # (seq, index) the stream starts after.
        self.reconnects = 0
        self.error = None
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.call = None
        self.thread = threading.Thread(target=self.run)
        self.thread.start()
        self.ready.wait(30)

    def run(self):
        pb = self.m.pb
        cur = 0
        pos = self.start_pos
        deadline = None
        out_of_range = 0
        while not self.stop.is_set():
            addr = self.order[cur % len(self.order)]
            q = pb.WatchRequest()
            if pos is not None:
                q.resume, q.after_seq, q.after_index = True, pos[0], pos[1]
            try:
                self.call = self.m.stub("op", addr).Watch(q, metadata=md(self.admin))
                for k, v in self.call.initial_metadata():
                    if k != "laissez-position":
                        continue
                    # The stream is live: the failover budget starts again.
                    deadline, out_of_range = None, 0
                    if pos is None:
                        seq, index = v.split(".")
                        pos = self.start_pos = (int(seq), int(index))
                    self.ready.set()
                for e in self.call:
                    pos = (e.seq, e.index)
                    self.events.append((e.seq, e.index, e.type))
                if self.stop.is_set():
                    return
            except grpc.RpcError as e:
                if self.stop.is_set():
                    return
                # A replica whose ring no longer reaches back (OUT_OF_RANGE):
                # another one may still have the events.
                if e.code() == grpc.StatusCode.OUT_OF_RANGE:
                    out_of_range += 1
                if (e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OUT_OF_RANGE) or
                        out_of_range >= len(self.order)):
                    self.error = "%s: %s" % (e.code(), e.details())
                    self.ready.set()
                    return
            deadline = deadline or time.time() + 15
            if time.time() > deadline:
                self.error = "no replica to watch on for 15 s"
                self.ready.set()
                return
            self.reconnects += 1
            cur += 1
            time.sleep(0.05)

    def finish(self, settle=1.0):
        time.sleep(settle)
        self.stop.set()
        if self.call is not None:
            self.call.cancel()
        self.thread.join(30)


def check_watches(watches):
    """Each watch saw each event once, in order, with no gap: positions strictly
    increase, every record's events are numbered 0, 1, 2, ... and all the
    watches, which failed over along different paths, saw the same events.
    Returns (ok, events, reconnects)."""
    ok = True
    for w in watches:
        if w.error:
            print("watch: %s" % w.error, file=sys.stderr)
            ok = False
        pos = [(s, i) for s, i, _ in w.events]
        if any(a >= b for a, b in zip(pos, pos[1:])):
            print("watch: positions do not increase strictly (a duplicate)", file=sys.stderr)
            ok = False
        expect = {}
        for s, i in pos:
            want = expect.get(s, 0 if s != w.start_pos[0] else w.start_pos[1] + 1)
            if i != want:
                print("watch: seq %d: event %d came after %d (a gap)" % (s, i, want - 1), file=sys.stderr)
                ok = False
                break
            expect[s] = i + 1
    first = watches[0].events
    n = min(len(w.events) for w in watches)
    for w in watches[1:]:
        if w.events[:n] != first[:n]:
            diff = next(k for k in range(n) if w.events[k] != first[k])
            print("watch: two watches differ at event %d: %s vs %s" % (diff, first[diff], w.events[diff]),
                  file=sys.stderr)
            ok = False
    if n == 0 or max(len(w.events) for w in watches) - n > 0:
        # Both were given a settle time after the load stopped: they must end equal.
        print("watch: event counts %s" % [len(w.events) for w in watches], file=sys.stderr)
        ok = ok and n > 0 and all(len(w.events) == n for w in watches)
    return ok, n, sum(w.reconnects for w in watches)


def deposit_until(m, admin, load, want, seconds):
    """Deposits 1 micro-unit to ha0 until `want` are acknowledged or `seconds`
    pass (each with an idempotency key; a failed one is resolved later).
    Returns how many were acknowledged."""
    got = 0
    end = time.time() + seconds
    while got < want and time.time() < end:
        try:
            load.deposit()
            got += 1
        except grpc.RpcError:
            time.sleep(0.1)
    return got


def setup_market(m, admin, ntenants):
    pb = m.pb
    m.call("op", "AddNodes", pb.AddNodesRequest(nodes=[pb.NodeSpec(
        name="ha-n0", type="hagpu", region="x", zone="z", row="r", rack="k")]), admin, False)
    m.call("op", "SetFloor", pb.SetFloorRequest(node="ha-n0", price=FLOOR), admin, False)
    m.call("op", "SetFloor", pb.SetFloorRequest(location="eu", price=5 * BASE), admin, False)
    tenants = []
    for i in range(ntenants):
        r = m.call("admin", "CreateTenant", pb.CreateTenantRequest(name="ha%d" % i, balance=10**15), admin, False)
        o = m.call("tenant", "PlaceOrder", pb.PlaceOrderRequest(scope="hagpu", price=BASE), r.token, False)
        held = False
        if i % 2 == 0:
            try:
                m.call("tenant", "PlaceOrder", pb.PlaceOrderRequest(scope="h100x8", price=50 * BASE), r.token, False)
                held = True
            except grpc.RpcError:
                pass
        tenants.append({"token": r.token, "order": o.order, "acked": 0, "sent": 0, "held": held})
    return tenants


def keyed_calls(m, admin, token):
    """One keyed mutation of each kind, made on the current leader:
    (kind, method, request, token, answer); answer None for CreateTenant,
    whose repeat says "already applied" (its token is not kept)."""
    pb = m.pb
    out = []
    for kind, method, req, tok in [
            ("op", "AddNodes", pb.AddNodesRequest(nodes=[pb.NodeSpec(
                name="ha-k1", type="hagpu", region="x", zone="z", row="r", rack="k")], idempotency_key="k-add"),
             admin),
            ("op", "SetFloor", pb.SetFloorRequest(node="ha-k1", price=FLOOR, idempotency_key="k-floor"), admin),
            ("tenant", "PlaceOrder", pb.PlaceOrderRequest(scope="hagpu", price=BASE, idempotency_key="k-order"),
             token)]:
        out.append((kind, method, req, tok, m.call(kind, method, req, tok, True)))
    cancel = pb.CancelOrderRequest(order=out[-1][4].order, idempotency_key="k-cancel")
    out.append(("tenant", "CancelOrder", cancel, token, m.call("tenant", "CancelOrder", cancel, token, True)))
    ct = pb.CreateTenantRequest(name="ha-k", balance=1, idempotency_key="k-tenant")
    m.call("admin", "CreateTenant", ct, admin, True)
    out.append(("admin", "CreateTenant", ct, admin, None))
    return out


def repeat_keyed(m, calls):
    """Sends each keyed call again (to whichever replica leads now): each must
    give its original answer and apply nothing (a second AddNodes, cancel or
    CreateTenant would fail otherwise). Returns what went wrong."""
    bad = []
    for kind, method, req, tok, answer in calls:
        try:
            again = m.call(kind, method, req, tok, True)
            if answer is None or again != answer:
                bad.append("%s: %r, originally %r" % (method, again, answer))
        except grpc.RpcError as e:
            if not (answer is None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                    "already applied" in (e.details() or "")):
                bad.append("%s: %s: %s" % (method, e.code().name, e.details()))
    return bad


def check_acked(m, admin, load):
    """Returns (acked, lost, conserved) as read through the leader."""
    pb = m.pb
    acked = lost = 0
    for t in load.tenants:
        orders = m.call("tenant", "ListOrders", pb.ListOrdersRequest(), t["token"], True).orders
        mine = [o for o in orders if o.id == t["order"]]
        if not mine:
            print("order %d is missing" % t["order"], file=sys.stderr)
            lost += t["acked"] + 1
            continue
        have = mine[0].effective_price - BASE
        acked += t["acked"]
        if have < t["acked"]:
            print("order %d: %d updates acknowledged, %d present" % (t["order"], t["acked"], have), file=sys.stderr)
            lost += t["acked"] - have
        if have > t["sent"]:
            print("order %d: a price beyond anything sent" % t["order"], file=sys.stderr)
            lost += 1
    # Every deposit carries an idempotency key and the failed ones are sent
    # again with theirs: each is then acknowledged and must be there exactly once.
    load.resolve()
    led = m.call("op", "GetLedger", pb.OperatorLedgerRequest(limit=1), admin, True)
    present = led.deposited - 10**15 * len(load.tenants) - load.other_deposits
    acked += load.deposits_acked
    if present != load.deposits_acked:
        print("deposits: %d acknowledged (%d after a failure, resent with their key), %d sent, %d present" %
              (load.deposits_acked, load.resolved, load.deposits_sent, present), file=sys.stderr)
        lost += abs(load.deposits_acked - present)
    conserved = led.deposited == led.tenant_balances + led.operator_revenue
    if not conserved:
        print("money not conserved: deposited %d != balances %d + revenue %d" %
              (led.deposited, led.tenant_balances, led.operator_revenue), file=sys.stderr)
    return acked, lost, conserved


def digest(m, addr, admin, tenants):
    """What a replica serves: the ledger totals, every tenant's orders, holdings and balance."""
    pb = m.pb
    s = m.stub("op", addr)
    led = s.GetLedger(pb.OperatorLedgerRequest(limit=1), metadata=md(admin), timeout=5)
    out = [led.deposited, led.tenant_balances, led.operator_revenue]
    ts = m.stub("tenant", addr)
    for t in tenants:
        orders = ts.ListOrders(pb.ListOrdersRequest(), metadata=md(t["token"]), timeout=5).orders
        out.append(sorted((o.id, o.price, o.state, o.filled) for o in orders))
        nodes = ts.ListNodes(pb.ListNodesRequest(), metadata=md(t["token"]), timeout=5).nodes
        out.append(sorted(n.node for n in nodes))
        b = ts.GetBalance(pb.GetBalanceRequest(), metadata=md(t["token"]), timeout=5)
        out.append((b.balance, b.paid))
    return json.dumps(out)


def same_digest(reps, m, admin, tenants, which):
    """Waits until every replica in `which` has applied the same journal seq, then compares digests.
    Up to about 15 s: on a loaded 2-core machine a follower that has just stepped down may take a
    few seconds to catch up (the digests are compared only at one seq, so waiting hides no mismatch)."""
    for _ in range(150):
        seqs = [(reps.health(i) or {}).get("applied_seq") for i in which]
        if None in seqs or len(set(seqs)) != 1:
            time.sleep(0.1)
            continue
        try:
            ds = [digest(m, reps.addresses()[i], admin, tenants) for i in which]
        except grpc.RpcError:
            time.sleep(0.2)  # A channel still backing off from a restarted replica.
            continue
        after = [(reps.health(i) or {}).get("applied_seq") for i in which]
        if after != seqs:
            continue
        if len(set(ds)) != 1:
            print("same_digest: replicas %s at seq %s serve different state: %s" % (list(which), seqs[0], ds),
                  file=sys.stderr)
        return len(set(ds)) == 1, seqs[0]
    print("same_digest: replicas %s never reached one applied seq: last %s" %
          (list(which), [(reps.health(i) or {}).get("applied_seq") for i in which]), file=sys.stderr)
    return False, None


class Scenario:
    def __init__(self, args, name, members=3, replicas=3, snapshot_ms=1000):
        self.name = name
        self.work = tempfile.mkdtemp(prefix="laissez-ha-%s." % name)
        self.procs = Procs(self.work)
        self.etcd = Etcd(self.procs, members)
        self.reps = Replicas(self.procs, self.etcd, args.laissez, replicas, snapshot_ms)
        self.args = args

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise

    def start(self):
        self.etcd.start_all()
        for i in range(len(self.reps.p)):
            self.reps.start(i)
            if i == 0:
                # The first replica creates the market; the others join it.
                self.reps.wait_leader("the first leader", [0])
        for i in range(len(self.reps.p)):
            self.reps.wait_up(i)
        self.admin = open(self.reps.admin_file).read().strip()
        self.m = Market(self.args.pb, self.args.pbg, self.reps.addresses())
        return self

    def __exit__(self, *exc):
        self.procs.stop_all()
        if exc[0] is not None or os.environ.get("HA_KEEP"):
            print("%s: logs kept in %s" % (self.name, self.work), file=sys.stderr)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        return False


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def run_kill(args):
    with Scenario(args, "kill") as s:
        tenants = setup_market(s.m, s.admin, 4)
        # Two operator watches through every kill, on different replicas and
        # failing over in different orders, starting after the same event.
        li = s.reps.wait_leader("a leader")
        addrs = s.reps.addresses()
        w1 = ResumingWatch(s.m, s.admin, addrs[li:] + addrs[:li])
        w2 = ResumingWatch(s.m, s.admin, list(reversed(addrs[li + 1:] + addrs[:li + 1])), w1.start_pos)
        # And `laissez watch` given every replica, from the same position, until SIGINT.
        cli_out = open(os.path.join(s.work, "watch.json"), "w")
        cli = subprocess.Popen([args.laissez, "watch", "--operator", "--json", "--server", ",".join(addrs),
                                "--token-file", s.reps.admin_file, "--after", "%d.%d" % w1.start_pos],
                               stdout=cli_out, stderr=subprocess.PIPE, text=True)
        load = Load(s.m, s.admin, tenants)
        load.start()
        failovers = []
        ok = True
        try:
            for k in range(args.kills):
                time.sleep(random.uniform(0.3, 1.0))
                li = s.reps.wait_leader("a leader before kill %d" % (k + 1))
                t = time.time()
                s.reps.p[li].kill()
                s.reps.p[li].wait()
                first = wait_until(lambda: load.first_ack_after(t), 30, "an acknowledged mutation after kill %d" % (k + 1))
                failovers.append((first - t) * 1000)
                new = s.reps.wait_leader("a new leader")
                if new == li:
                    ok = False
                s.reps.start(li)  # It rejoins as a follower.
                s.reps.wait_up(li)
        finally:
            load.finish()
            w1.finish()
            w2.finish(0)
            cli.send_signal(signal.SIGINT)
            cli_err = cli.communicate(timeout=30)[1]
            cli_out.close()
        acked, lost, conserved = check_acked(s.m, s.admin, load)
        same, seq = same_digest(s.reps, s.m, s.admin, tenants, range(len(s.reps.p)))
        watched, events, reconnects = check_watches([w1, w2])
        try:
            cli_events = [(e["seq"], e["index"], e["type"]) for e in json.load(open(cli_out.name))]
        except ValueError as e:
            cli_events = None
            print("laissez watch: bad JSON (%s); stderr: %s" % (e, cli_err), file=sys.stderr)
        cli_ok = cli.returncode == 0 and cli_events is not None and cli_events == w1.events[:len(cli_events)] and \
            len(w1.events) - len(cli_events) <= 0
        if not cli_ok:
            print("laissez watch: rc %d, %s events vs %d: %s" % (cli.returncode, None if cli_events is None else
                  len(cli_events), len(w1.events), cli_err), file=sys.stderr)
        watched = watched and cli_ok
        ok = ok and lost == 0 and conserved and same and acked > 0 and watched
        print("ha-kill: kills=%d acked=%d lost=%d conserved=%s digests_equal=%s seq=%s failover_ms p50=%.0f p99=%.0f "
              "max=%.0f deposits=%d (%d retried after an ambiguous error, %d failed and resent at the end, same key) "
              "watch: events=%d reconnects=%d "
              "exactly_once=%s" %
              (args.kills, acked, lost, "yes" if conserved else "no", same, seq, pct(failovers, 0.5),
               pct(failovers, 0.99), max(failovers) if failovers else float("nan"), load.deposits_acked,
               s.m.ambiguous_keyed, load.resolved, events, reconnects, "yes" if watched else "no"))
        return ok


def run_fence(args):
    with Scenario(args, "fence") as s:
        pb = s.m.pb
        tenants = setup_market(s.m, s.admin, 2)
        old = s.reps.wait_leader("a leader")
        keyed = keyed_calls(s.m, s.admin, tenants[0]["token"])
        led0 = s.m.call("op", "GetLedger", pb.OperatorLedgerRequest(limit=1), s.admin, True).deposited
        s.reps.p[old].send_signal(signal.SIGSTOP)
        t0 = time.time()
        # A deposit of 777 sent to the paused leader waits in its socket.
        pending = {}

        def send_to_old():
            try:
                st = s.m.stub("admin", s.reps.addresses()[old])
                st.Deposit(pb.DepositRequest(tenant="ha0", amount=777), metadata=md(s.admin), timeout=30)
                pending["result"] = "acknowledged"
            except grpc.RpcError as e:
                pending["result"] = "%s: %s" % (e.code().name, e.details())
        th = threading.Thread(target=send_to_old)
        th.start()
        others = [i for i in range(len(s.reps.p)) if i != old]
        new = s.reps.wait_leader("a new leader while the old one is paused", others)
        took_over = time.time() - t0
        # The new leader accepts writes. (A client would wait out its deadline
        # on the paused one, an ambiguous failure for a deposit: start at the new one.)
        s.m.cur = new
        load = Load(s.m, s.admin, tenants)
        wrote = deposit_until(s.m, s.admin, load, 5, 30)
        # Keyed calls the old leader committed, repeated on the new one.
        keyed_bad = repeat_keyed(s.m, keyed)
        time.sleep(1.0)
        s.reps.p[old].send_signal(signal.SIGCONT)
        th.join(timeout=40)
        stepped = wait_until(lambda: (s.reps.health(old) or {}).get("role") == "follower", 20,
                             "the old leader to step down")
        led1 = s.m.call("op", "GetLedger", pb.OperatorLedgerRequest(limit=1), s.admin, True).deposited
        # Deposits of 1 since led0: at least the acknowledged ones, at most the
        # ones sent (far fewer than 777), so the 777 is there only if appended.
        appended_777 = not (load.deposits_acked <= led1 - led0 <= load.deposits_sent)
        same, seq = same_digest(s.reps, s.m, s.admin, tenants, range(len(s.reps.p)))
        log = open(os.path.join(s.work, "replica%d.log" % old)).read()
        # The CLI, given the followers first, finds the leader by itself (grpc_client.h).
        leader_now = s.reps.wait_leader("the leader")
        order = [a for i, a in enumerate(s.reps.addresses()) if i != leader_now] + [s.reps.addresses()[leader_now]]
        cli = subprocess.run([args.laissez, "tenant", "deposit", "ha0", "--amount", "0.000003", "--server",
                              ",".join(order), "--token-file", s.reps.admin_file], capture_output=True, text=True,
                             timeout=60)
        led2 = s.m.call("op", "GetLedger", pb.OperatorLedgerRequest(limit=1), s.admin, True).deposited
        cli_ok = cli.returncode == 0 and led2 - led1 == 3
        if not cli_ok:
            print("CLI failover: rc %d, deposited +%d: %s" % (cli.returncode, led2 - led1, cli.stderr), file=sys.stderr)
        ok = (not appended_777) and stepped and pending.get("result") != "acknowledged" and same and new != old
        ok = ok and cli_ok and wrote == 5 and not keyed_bad
        print("ha-fence: new_leader_after=%.1fs deposit_to_paused_leader=%r deposited_delta=%d (%d acknowledged) "
              "old_leader_stepped_down=%s digests_equal=%s cli_failover_ok=%s keyed_repeats_on_new_leader=%s "
              "step_down_log=%r" %
              (took_over, pending.get("result"), led1 - led0, load.deposits_acked, bool(stepped), same, cli_ok,
               "ok (%d calls)" % len(keyed) if not keyed_bad else keyed_bad,
               [l for l in log.splitlines() if "stepping down" in l][:1]))
        return ok


def run_members(args):
    with Scenario(args, "members") as s:
        pb = s.m.pb
        tenants = setup_market(s.m, s.admin, 2)
        load = Load(s.m, s.admin, tenants)
        # Lose one member of three: the market keeps working.
        s.etcd.kill(2)
        one_ok = deposit_until(s.m, s.admin, load, 10, 30) == 10
        # Lose two: mutations fail with UNAVAILABLE.
        s.etcd.kill(1)
        err = None
        seen = []
        t0 = time.time()
        while time.time() - t0 < 30:
            try:
                load.deposit(budget=2)
            except grpc.RpcError as e:
                # The call in flight when quorum goes may time out (ambiguous);
                # after that the replicas refuse with UNAVAILABLE.
                seen.append(e.code().name)
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    err = (e.code().name, e.details())
                    break
        # A member returns: service resumes.
        s.etcd.start(1)
        t1 = time.time()
        resumed = None
        while time.time() - t1 < 40:
            try:
                load.deposit(budget=2)
                resumed = time.time() - t1
                break
            except grpc.RpcError:
                time.sleep(0.2)
        acked, lost, conserved = check_acked(s.m, s.admin, load)
        ok = one_ok and err is not None and err[0] == "UNAVAILABLE" and resumed is not None and lost == 0 and conserved
        print("ha-members: one_lost_ok=%s two_lost_errors=%s two_lost_error=%r resumed_after=%s acked=%d lost=%d "
              "conserved=%s" % (one_ok, seen, err, "%.1fs" % resumed if resumed is not None else None, acked, lost,
               "yes" if conserved else "no"))
        return ok


def etcd_footprint(s):
    """(journal keys, snapshot keys, largest member's dbSizeInUse in bytes, largest dbSize, the
    first seq the journal in etcd still holds) now."""
    env = dict(os.environ, ETCDCTL_API="3")

    def key_list(prefix):
        return subprocess.run(["etcdctl", "--endpoints", s.etcd.endpoints(), "get", "--prefix", prefix,
                               "--keys-only"], capture_output=True, text=True, timeout=10, env=env).stdout.split()

    def keys(prefix):
        return len(key_list(prefix))
    journal = key_list("/laissez/j/")
    first = int(journal[0].rsplit("/", 1)[1]) if journal else 0
    status = subprocess.run(["etcdctl", "--endpoints", s.etcd.endpoints(), "endpoint", "status", "-w", "json"],
                            capture_output=True, text=True, timeout=10, env=env).stdout
    members = json.loads(status or "[]")
    in_use = max((m["Status"].get("dbSizeInUse", 0) for m in members), default=0)
    size = max((m["Status"].get("dbSize", 0) for m in members), default=0)
    return len(journal), keys("/laissez/s/") + keys("/laissez/m/"), in_use, size, first


def run_join(args):
    with Scenario(args, "join", replicas=2, snapshot_ms=500) as s:
        tenants = setup_market(s.m, s.admin, 4)
        load = Load(s.m, s.admin, tenants)
        load.start()
        # Several snapshot rounds under load: the journal keys and etcd's
        # database in use must stay bounded while the journal grows.
        samples = []
        for _ in range(max(3, args.join_seconds)):
            time.sleep(1)
            leader = s.reps.leader()
            seq = (s.reps.health(leader) or {}).get("applied_seq", 0) if leader is not None else 0
            samples.append((seq,) + etcd_footprint(s))
        load.finish()
        late = s.reps.add()
        s.reps.start(late)
        s.reps.wait_up(late)
        same, seq = same_digest(s.reps, s.m, s.admin, tenants, range(len(s.reps.p)))
        log = open(os.path.join(s.work, "replica%d.log" % late)).read()
        jkeys, skeys, in_use, size, first = etcd_footprint(s)
        acked, lost, conserved = check_acked(s.m, s.admin, load)
        note = [l for l in log.splitlines() if "replayed" in l][:1]
        restored = replayed = None
        if note:
            words = note[0].replace(",", "").split()
            if "snapshot" in words:
                restored = int(words[words.index("seq") + 1])
            replayed = int(words[words.index("replayed") + 1])
        # Bounded: the journal keys left are the tail since the last snapshot
        # (at most a few rounds of batches), never the whole history; the
        # database in use does not keep growing with the journal.
        grew = samples[-1][0] - samples[1][0]
        bounded_keys = all(k <= max(100, sq // 4) for sq, k, _, _, _, _ in samples) and jkeys < seq
        bounded_db = samples[-1][3] <= 2 * samples[1][3] + (1 << 20)
        # Truncated: the journal's first record in etcd moves up round by
        # round (folding alone would keep seq 1 there for ever).
        truncated = first > 1 and samples[-1][5] > samples[0][5]
        ok = (same and lost == 0 and conserved and seq is not None and bounded_keys and bounded_db and truncated and
              restored is not None and restored > 0 and replayed < seq and skeys <= 8 and grew > 0)
        print("ha-join: digests_equal=%s seq=%s late_replica: restored snapshot seq=%s, replayed %s of %s records; "
              "journal_keys=%d snapshot_keys=%d acked=%d lost=%d conserved=%s" %
              (same, seq, restored, replayed, seq, jkeys, skeys, acked, lost, "yes" if conserved else "no"))
        print("ha-join: rounds (seq, journal keys, snapshot keys, db in use, db size, first journal seq in etcd): %s" %
              "; ".join("%d %d %d %d %d %d" % x for x in samples + [(seq or 0, jkeys, skeys, in_use, size, first)]))
        return ok


def run_lag(args):
    """How stale a follower is: after each acknowledged deposit on the leader,
    the time until a follower's /healthz reports the leader's applied seq."""
    with Scenario(args, "lag") as s:
        pb = s.m.pb
        setup_market(s.m, s.admin, 1)
        leader = s.reps.wait_leader("a leader")
        follower = [i for i in range(len(s.reps.p)) if i != leader][0]
        lags = []
        for _ in range(100):
            s.m.call("admin", "Deposit", pb.DepositRequest(tenant="ha0", amount=1), s.admin, False)
            t = time.time()
            seq = s.reps.health(leader)["applied_seq"]
            wait_until(lambda: (s.reps.health(follower) or {}).get("applied_seq", 0) >= seq, 10, "the follower")
            lags.append((time.time() - t) * 1000)
        print("ha-lag: deposits=%d follower_lag_ms p50=%.1f p99=%.1f max=%.1f (includes one /healthz poll, ~1 ms)" %
              (len(lags), pct(lags, 0.5), pct(lags, 0.99), max(lags)))
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios", nargs="+", choices=["kill", "fence", "members", "join", "lag"])
    ap.add_argument("--build", default="build")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--join-seconds", type=int, default=5,
                    help="join: seconds of load (one footprint sample a second) before the late replica starts")
    args = ap.parse_args()
    random.seed(args.seed)
    args.laissez = os.path.join(args.build, "laissez")
    if not os.path.isabs(args.laissez) and not os.path.exists(args.laissez):
        args.laissez = os.path.join(ROOT, args.laissez)
    if shutil.which("etcd") is None:
        print("ha_test.py: etcd not found (apt-get install etcd-server; scripts/install-deps.sh does)", file=sys.stderr)
        return 2
    gen = tempfile.mkdtemp(prefix="laissez-ha-gen.")
    try:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I" + os.path.join(ROOT, "proto"),
                        "--python_out=" + gen, "--grpc_python_out=" + gen,
                        os.path.join(ROOT, "proto/laissez/v1/market.proto")], check=True)
        for d in ("laissez", "laissez/v1"):
            open(os.path.join(gen, d, "__init__.py"), "w").close()
        sys.path.insert(0, gen)
        from laissez.v1 import market_pb2, market_pb2_grpc  # noqa: E402
        args.pb, args.pbg = market_pb2, market_pb2_grpc
        print("ha_test.py: seed %d" % args.seed, file=sys.stderr)
        ok = True
        for name in args.scenarios:
            try:
                passed = {"kill": run_kill, "fence": run_fence, "members": run_members, "join": run_join,
                          "lag": run_lag}[name](args)
            except Exception as e:  # noqa: BLE001 - report and go on to the next scenario
                print("ha-%s: error: %s" % (name, e.details() if isinstance(e, grpc.RpcError) else e))
                passed = False
            print("ha-%s: %s" % (name, "PASS" if passed else "FAIL"), flush=True)
            ok = ok and passed
        return 0 if ok else 1
    finally:
        shutil.rmtree(gen, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
