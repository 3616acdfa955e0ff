#!/usr/bin/python3
"""`laissez run` end to end (issue 13): a live server on loopback with two nodes, a
rival tenant that outbids the job on its node, and the toy job
python/examples/count_job.py, which counts to N and checkpoints its counter.

- A job that follows the contract is noticed, checkpoints, moves to the other node,
  resumes from its checkpoint and finishes with the right count; the ledger shows what
  it paid on each node, and the runner's summary agrees with it to the micro-unit.
- A job that ignores the signal (and SIGTERM) is killed at the deadline and restarted
  from its last periodic checkpoint.
- Refusals: a budget that cannot cover a grace window; bad options name the field.

No timed assertions: the sizes below only keep the job running longer than a notice
takes; waits are bounded guards.

Usage: /usr/bin/python3 tests/tenant/test_run.py --laissez build/laissez
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def _load_local_market():
    # laissez/local.py alone: this test needs no compiled part of the package.
    import importlib.util
    spec = importlib.util.spec_from_file_location("laissez_local", os.path.join(ROOT, "python", "laissez", "local.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.LocalMarket


LocalMarket = _load_local_market()

JOB = os.path.join(ROOT, "python", "examples", "count_job.py")
CLUSTER = os.path.join(ROOT, "scenarios", "clusters", "tenant_demo.yaml")
ARGS = None
GUARD_SECONDS = 180  # Kills a hung run; never an assertion about speed.


def wait_for(cond, seconds=60.0):
    """Polls `cond` until true; a bounded guard, not a speed assertion."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def read_text(path):
    with open(path) as f:
        return f.read()


def read_log(state):
    with open(os.path.join(state, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


class RunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="laissez-run-test-")
        cls.market = LocalMarket(ARGS.laissez, CLUSTER, workdir=os.path.join(cls.work, "market"))
        cls.market.set_grace("3s")
        # A floor, so holding a node costs something even without a rival.
        cls.market.cli("floor", "set", "--location", "eu", "--price", "2")

    @classmethod
    def tearDownClass(cls):
        cls.market.close()
        shutil.rmtree(cls.work, ignore_errors=True)

    def run_job(self, name, n, job_args, run_args=()):
        """Runs the toy job under `laissez run --json`; the rival outbids it on the node it
        starts on. Returns (exit code, events, job state folder, tenant token file)."""
        token = self.market.create_tenant(name, "1000")
        rival = self.market.create_tenant(name + "-rival", "1000")
        state = os.path.join(self.work, name)
        cmd = [ARGS.laissez, "run", "--server", self.market.address, "--token-file", token, "--json",
               "--type", "h100x8", "--value", "10", "--kill-grace", "1", "--status-interval", "0",
               "--state-dir", os.path.join(state, "run"), *run_args,
               "--", "/usr/bin/python3", JOB, "--n", str(n), "--step", "0.05", "--state", state, *job_args]
        err = open(os.path.join(self.work, name + ".stderr"), "w+")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        guard = threading.Timer(GUARD_SECONDS, p.kill)
        guard.start()
        events = []
        outbid = False
        for line in p.stdout:
            e = json.loads(line)
            events.append(e)
            if e["event"] == "started" and not outbid:
                outbid = True
                node = e["nodes"][0]["node"]
                # Outbid once the job is up (it has installed its signal handler when it logs
                # its start), so the test sees the contract rather than a start-up race.
                log = os.path.join(state, "log.jsonl")
                self.assertTrue(wait_for(lambda: os.path.exists(log) and "start" in read_text(log)))
                self.market.cli("bid", "--scope", node, "--price", "50", token_file=rival)
        rc = p.wait()
        p.stdout.close()
        guard.cancel()
        # The rival leaves, so the next test starts with both nodes free.
        held = json.loads(self.market.cli("holdings", "--json", token_file=rival).stdout).get("nodes", [])
        for h in held:
            self.market.cli("release", h["node"], token_file=rival)
        err.seek(0)
        self.stderr = err.read()
        err.close()
        return rc, events, state, token

    def ledger_by_node(self, token):
        r = self.market.cli("ledger", "--json", "--limit", "1000", token_file=token)
        paid = {}
        for e in json.loads(r.stdout)["entries"]:
            paid[e["node"]] = paid.get(e["node"], 0) + e["amount"]
        return paid

    def check_moved_and_paid(self, events, token):
        started = [e for e in events if e["event"] == "started"]
        self.assertEqual(len(started), 2, self.stderr)
        first, second = started[0]["nodes"][0]["node"], started[1]["nodes"][0]["node"]
        self.assertNotEqual(first, second, "the job moved to the other node")
        self.assertFalse(started[0]["resume"])
        self.assertTrue(started[1]["resume"])
        summary = events[-1]
        self.assertEqual(summary["event"], "summary")
        self.assertEqual(summary["job_exit_code"], 0)
        self.assertEqual(summary["attempts"], 2)
        # The ledger shows what the job paid on each node, and the runner counted the same.
        paid = self.ledger_by_node(token)
        self.assertEqual(set(paid), {first, second}, paid)
        for node in (first, second):
            self.assertGreater(paid[node], 0, node)
        self.assertEqual(summary["paid_by_node"], paid)
        self.assertEqual(summary["paid"], sum(paid.values()))
        return first, second

    def test_checkpoint_move_resume(self):
        n = 100
        # A long grace: the job checkpoints and leaves long before it, however busy the
        # machine, and leaving early moves the node at once.
        self.market.set_grace("60s")
        try:
            rc, events, state, token = self.run_job("coop", n, [], ["--metadata-listen", "127.0.0.1:0"])
        finally:
            self.market.set_grace("3s")
        self.assertEqual(rc, 0, self.stderr)
        kinds = [e["event"] for e in events]
        for k in ("bidding", "allocated", "started", "notice", "signalled", "exited", "relinquished", "summary"):
            self.assertIn(k, kinds, self.stderr)
        self.assertEqual([e["outcome"] for e in events if e["event"] == "exited"], ["checkpointed", "finished"])
        notice = next(e for e in events if e["event"] == "notice")
        self.assertEqual(notice["reasons"], "outbid")
        self.assertEqual(notice["price"], 50 * 1_000_000)
        first, second = self.check_moved_and_paid(events, token)

        log = read_log(state)
        starts = [e for e in log if e["event"] == "start"]
        self.assertEqual([s["node"] for s in starts], [first, second])
        moving = [e for e in log if e["event"] == "moving"]
        self.assertEqual(len(moving), 1)
        # The notice file and the metadata endpoint told the job the same deadline.
        self.assertEqual(moving[0]["deadline"], notice["deadline"])
        self.assertEqual(moving[0]["metadata_deadline"], notice["deadline"])
        # No work lost: it resumed exactly where it checkpointed on the notice.
        self.assertEqual(starts[1]["count"], moving[0]["count"])
        self.assertGreater(starts[1]["count"], 0)
        done = [e for e in log if e["event"] == "done"]
        self.assertEqual(len(done), 1)
        self.assertEqual(done[0]["count"], n)
        self.assertEqual(done[0]["node"], second)
        with open(os.path.join(state, "result")) as f:
            self.assertEqual(int(f.read()), n)
        # Each step counted exactly once across both attempts.
        steps = [e["count"] for e in log if e["event"] == "step"]
        self.assertEqual(steps, list(range(1, n + 1)))
        self.assertFalse(os.path.exists(os.path.join(state, "run", "notice.json")))

    def test_ignored_signal_stopped_at_deadline(self):
        n, every = 200, 5
        rc, events, state, token = self.run_job("deaf", n, ["--ignore-signal", "--every", str(every)])
        self.assertEqual(rc, 0, self.stderr)
        kinds = [e["event"] for e in events]
        self.assertIn("signalled", kinds)
        self.assertIn("terminating", kinds)
        self.assertIn("killed", kinds, "SIGTERM was ignored, so SIGKILL followed")
        self.assertEqual([e["outcome"] for e in events if e["event"] == "exited"], ["stopped", "finished"])
        self.assertEqual(events[-1]["deadline_stops"], 1)
        first, second = self.check_moved_and_paid(events, token)

        log = read_log(state)
        starts = [e for e in log if e["event"] == "start"]
        self.assertEqual([s["node"] for s in starts], [first, second])
        first_attempt = log[:log.index(starts[1])]
        last_ckpt = max(e["count"] for e in first_attempt if e["event"] == "checkpoint")
        # Restarted from its last checkpoint; what it did after that was lost (at most `every` steps).
        self.assertEqual(starts[1]["count"], last_ckpt)
        last_step = max(e["count"] for e in first_attempt if e["event"] == "step")
        self.assertLess(last_step - last_ckpt, every)
        self.assertNotIn("moving", [e["event"] for e in log])
        with open(os.path.join(state, "result")) as f:
            self.assertEqual(int(f.read()), n)

    def start_run(self, name, n, job_args=()):
        token = self.market.create_tenant(name, "1000")
        state = os.path.join(self.work, name)
        p = subprocess.Popen(
            [ARGS.laissez, "run", "--server", self.market.address, "--token-file", token, "--json",
             "--type", "h100x8", "--value", "10", "--kill-grace", "1", "--status-interval", "0",
             "--state-dir", os.path.join(state, "run"),
             "--", "/usr/bin/python3", JOB, "--n", str(n), "--step", "0.05", "--state", state, *job_args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        guard = threading.Timer(GUARD_SECONDS, p.kill)
        guard.start()
        return p, guard, token, state

    def test_ctrl_c_cancels_stops_and_relinquishes(self):
        p, guard, token, state = self.start_run("quitter", 10_000)
        events = []
        for line in p.stdout:
            e = json.loads(line)
            events.append(e)
            if e["event"] == "started":
                log = os.path.join(state, "log.jsonl")
                self.assertTrue(wait_for(lambda: os.path.exists(log) and "start" in read_text(log)))
                p.send_signal(signal.SIGINT)
        rc = p.wait()
        p.stdout.close()
        guard.cancel()
        self.assertEqual(rc, 130)
        kinds = [e["event"] for e in events]
        self.assertIn("interrupted", kinds)
        self.assertIn("released", kinds)
        self.assertTrue(events[-1]["interrupted"])
        pid = next(e["pid"] for e in events if e["event"] == "started")
        with self.assertRaises(ProcessLookupError):
            os.kill(pid, 0)  # The job is gone (reaped by the runner).
        self.assertEqual(json.loads(self.market.cli("holdings", "--json", token_file=token).stdout).get("nodes", []), [])
        self.assertEqual(json.loads(self.market.cli("orders", "--json", token_file=token).stdout).get("orders", []), [])
        self.assertNotIn("done", [e["event"] for e in read_log(state)])

    def test_contest_ends_job_keeps_running(self):
        # A long grace, so the rival's withdrawal surely comes before the deadline.
        self.market.set_grace("60s")
        try:
            rival = self.market.create_tenant("fickle-rival", "1000")
            p, guard, token, state = self.start_run("stayer", 100, ["--ignore-signal"])
            events = []
            order = None
            for line in p.stdout:
                e = json.loads(line)
                events.append(e)
                if e["event"] == "started" and order is None:
                    log = os.path.join(state, "log.jsonl")
                    self.assertTrue(wait_for(lambda: os.path.exists(log) and "start" in read_text(log)))
                    r = self.market.cli("bid", "--json", "--scope", e["nodes"][0]["node"], "--price", "50",
                                        token_file=rival)
                    order = json.loads(r.stdout)["order"]
                if e["event"] == "notice":
                    self.assertTrue(os.path.exists(os.path.join(state, "run", "notice.json")))
                    self.market.cli("cancel", str(order), token_file=rival)
            rc = p.wait()
            p.stdout.close()
            guard.cancel()
        finally:
            self.market.set_grace("3s")
        self.assertEqual(rc, 0)
        kinds = [e["event"] for e in events]
        self.assertIn("signalled", kinds)
        self.assertIn("contest_ended", kinds)
        self.assertEqual([e["event"] for e in events if e["event"] == "started"], ["started"])
        self.assertEqual(events[-1]["attempts"], 1)
        self.assertEqual(events[-1]["notices"], 1)
        with open(os.path.join(state, "result")) as f:
            self.assertEqual(int(f.read()), 100)

    def test_budget_cannot_cover_grace_window(self):
        token = self.market.create_tenant("poor", "0.000001")
        r = subprocess.run([ARGS.laissez, "run", "--server", self.market.address, "--token-file", token,
                            "--type", "h100x8", "--value", "10", "--", "/bin/true"],
                           capture_output=True, text=True, timeout=GUARD_SECONDS)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("budget:", r.stderr)
        self.assertIn("grace window", r.stderr)
        self.assertNotIn("started", r.stderr)
        broke = self.market.create_tenant("broke", "0")
        r = subprocess.run([ARGS.laissez, "run", "--server", self.market.address, "--token-file", broke,
                            "--json", "--", "/bin/true"], capture_output=True, text=True, timeout=GUARD_SECONDS)
        self.assertEqual(r.returncode, 1, r.stderr)
        last = json.loads(r.stdout.splitlines()[-1])
        self.assertEqual(last["event"], "error")
        self.assertEqual(last["code"], "RESOURCE_EXHAUSTED")
        self.assertTrue(last["message"].startswith("budget:"))

    def test_bad_options_name_the_field(self):
        token = self.market.create_tenant("picky", "100")
        base = [ARGS.laissez, "run", "--server", self.market.address, "--token-file", token]
        cases = [
            (["--signal", "NOPE", "--", "/bin/true"], "signal:"),
            (["--value", "nan", "--", "/bin/true"], "value:"),
            (["--value", "-1", "--", "/bin/true"], "value:"),
            (["--checkpoint-exit-code", "0", "--", "/bin/true"], "checkpoint-exit-code:"),
            (["--launcher", "ssh {node}", "--", "/bin/true"], "launcher:"),
            (["--strategy", "psychic", "--", "/bin/true"], "strategy:"),
            ([], "command:"),
        ]
        for args, field in cases:
            r = subprocess.run(base + args, capture_output=True, text=True, timeout=GUARD_SECONDS)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(field, r.stderr, args)
        h = subprocess.run([ARGS.laissez, "run", "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(h.returncode, 0)
        self.assertIn("JSON Lines", h.stdout)
        self.assertIn("LAISSEZ_NOTICE_FILE", h.stdout)

    def test_launcher_and_plain_finish(self):
        # A job that finishes at once, through a launcher template: released, exit 0,
        # and the job saw its environment.
        token = self.market.create_tenant("quick", "100")
        out = os.path.join(self.work, "quick.env")
        r = subprocess.run([ARGS.laissez, "run", "--server", self.market.address, "--token-file", token,
                            "--json", "--launcher", "env {env} {command} > " + out,
                            "--", "/bin/sh", "-c", "env | grep ^LAISSEZ_ | sort"],
                           capture_output=True, text=True, timeout=GUARD_SECONDS)
        self.assertEqual(r.returncode, 0, r.stderr)
        env = dict(line.split("=", 1) for line in read_text(out).splitlines())
        self.assertEqual(env["LAISSEZ_TENANT"], "quick")
        self.assertEqual(env["LAISSEZ_RESUME"], "0")
        self.assertEqual(env["LAISSEZ_CHECKPOINT_EXIT_CODE"], "75")
        self.assertEqual(env["LAISSEZ_NOTICE_SIGNAL"], "USR1")
        self.assertIn(env["LAISSEZ_NODE"], ("gpu-a", "gpu-b"))
        events = [json.loads(line) for line in r.stdout.splitlines()]
        self.assertEqual(events[-1]["event"], "summary")
        self.assertIn("released", [e["event"] for e in events])
        # The runner made its own state folder (no --state-dir), so it removed it.
        notice_file = next(e["notice_file"] for e in events if e["event"] == "bidding")
        self.assertFalse(os.path.exists(os.path.dirname(notice_file)))
        held = self.market.cli("holdings", "--json", token_file=token)
        self.assertEqual(json.loads(held.stdout).get("nodes", []), [])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--laissez", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
