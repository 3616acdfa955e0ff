#!/usr/bin/python3
"""The tenant path in one command (`make demo-run`): a local market with two nodes, the
toy job count_job.py under `laissez run`, and a rival that outbids it on its node. You
see the notice, the checkpoint, the move to the other node, the resume, and what the job
paid on each node.

    /usr/bin/python3 python/examples/run_demo.py --laissez build/laissez
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python", "laissez"))
from local import LocalMarket  # noqa: E402  (laissez/local.py alone: no compiled parts needed)


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--laissez", default=os.path.join(ROOT, "build", "laissez"))
    ap.add_argument("--n", type=int, default=60, help="the toy job counts to this")
    ap.add_argument("--step", type=float, default=0.1, help="seconds per count")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="laissez-demo-run-")
    say("starting a local market (two h100x8 nodes, grace 5 s, floor 2/h)")
    with LocalMarket(a.laissez, os.path.join(ROOT, "scenarios", "clusters", "tenant_demo.yaml"),
                     workdir=os.path.join(work, "market")) as m:
        m.set_grace("5s")
        m.cli("floor", "set", "--location", "eu", "--price", "2")
        me = m.create_tenant("trainer", "1000")
        rival = m.create_tenant("rival", "1000")
        state = os.path.join(work, "job")
        cmd = [a.laissez, "run", "--server", m.address, "--token-file", me, "--json", "--type", "h100x8",
               "--value", "10", "--status-interval", "2",
               "--", sys.executable, os.path.join(HERE, "count_job.py"), "--n", str(a.n), "--step", str(a.step),
               "--state", state]
        say("$ " + " ".join(cmd[:2] + ["--token-file", "trainer.token", "--type", "h100x8", "--value", "10", "--",
                                       "count_job.py", "--n", str(a.n)]))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # Progress lines go to our stderr.
        guard = threading.Timer(300, p.kill)
        guard.start()
        outbid = False
        summary = {}
        for line in p.stdout:
            e = json.loads(line)
            if e["event"] == "started" and not outbid:
                outbid = True
                node = e["nodes"][0]["node"]
                log = os.path.join(state, "log.jsonl")
                end = time.monotonic() + 60
                while time.monotonic() < end and not (os.path.exists(log) and "start" in open(log).read()):
                    time.sleep(0.02)  # Until the job is up and handles the signal.
                say(f"the rival bids 50/h for {node}, the node the job runs on")
                m.cli("bid", "--scope", node, "--price", "50", token_file=rival)
            if e["event"] == "summary":
                summary = e
        rc = p.wait()
        guard.cancel()
        with open(os.path.join(state, "log.jsonl")) as f:
            log = [json.loads(x) for x in f]
        starts = [x for x in log if x["event"] == "start"]
        say("the job's own log: " + "; ".join(f"attempt {s['attempt']} on {s['node']} from {s['count']}"
                                              for s in starts))
        ledger = json.loads(m.cli("ledger", "--json", token_file=me).stdout)["entries"]
        per_node = {}
        for x in ledger:
            per_node[x["node"]] = per_node.get(x["node"], 0) + x["amount"]
        say("the ledger: " + ", ".join(f"{n}: {v / 1e6:.6f}" for n, v in sorted(per_node.items())))
        ok = rc == 0 and summary.get("attempts") == 2 and len(starts) == 2 and starts[0]["node"] != starts[1]["node"]
        say("done: noticed, checkpointed, moved, resumed and finished" if ok else f"unexpected end (exit {rc})")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
