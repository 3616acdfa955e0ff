#!/usr/bin/python3
"""An event-heavy load against `laissez serve --watch-ring N`, for the ring's cost
(docs/PERFORMANCE_LOG.md, "The watch ring's cost"). A fresh server on loopback with
scenarios/clusters/small.yaml; 8 tenants, each placing an order on its own free
node (allocated, price changes) and releasing it (released, price changes) over
and over for --seconds through the Python SDK. Prints calls/s, the server's CPU
per call and how many events its ring holds at the end. A benchmark, not a test.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/watch_ring_load.py \
           --laissez build/laissez --ring 65536 --seconds 10
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

import laissez

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--laissez", required=True)
    ap.add_argument("--ring", default="65536")
    ap.add_argument("--seconds", type=float, default=10)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="laissez-ring-")
    db = os.path.join(work, "m.db")
    admin = db + ".admin-token"
    log = open(os.path.join(work, "serve.log"), "w+")
    srv = subprocess.Popen([a.laissez, "serve", "--db", db, "--listen", "127.0.0.1:0", "--rate-limit", "0",
                            "--watch-ring", a.ring, "--cluster", os.path.join(ROOT, "scenarios/clusters/small.yaml")],
                           stderr=log)
    try:
        port = None
        while port is None:
            log.seek(0)
            m = re.search(r"gRPC port (\d+)", log.read())
            port = m and m.group(1)
            time.sleep(0.05)
        addr = "127.0.0.1:" + port
        while not os.path.exists(admin):
            time.sleep(0.05)
        cli = [a.laissez]
        tail = ["--server", addr, "--token-file", admin]
        r = subprocess.run(cli + ["nodes", "list", "--json"] + tail, capture_output=True, text=True, check=True)
        nodes = [n["node"] for n in json.loads(r.stdout)["nodes"]][:8]
        clients = []
        for i, n in enumerate(nodes):
            tf = os.path.join(work, "t%d.token" % i)
            subprocess.run(cli + ["tenant", "create", "t%d" % i, "--balance", "1000000", "--token-out", tf] + tail,
                           check=True, capture_output=True)
            clients.append((laissez.Client(addr, token_file=tf), n))

        def cpu():
            f = open("/proc/%d/stat" % srv.pid).read().split(")")[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

        counts = [0] * len(clients)
        stop = time.monotonic() + a.seconds

        def run(i):
            c, n = clients[i]
            while time.monotonic() < stop:
                c.place_order(n, laissez.units(5))
                c.relinquish(n)
                counts[i] += 2

        c0, t0 = cpu(), time.monotonic()
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t1, c1 = time.monotonic(), cpu()
        calls = sum(counts)
        events = subprocess.run(["timeout", "3"] + cli + ["watch", "--operator", "--after", "0.0", "--json"] + tail,
                                capture_output=True, text=True).stdout.count('"type"')
        print(json.dumps({"watch_ring": int(a.ring), "calls": calls, "calls_per_sec": round(calls / (t1 - t0)),
                          "server_cpu_ms_per_call": round(1000 * (c1 - c0) / calls, 3), "events_in_ring": events}))
    finally:
        srv.terminate()
        srv.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
