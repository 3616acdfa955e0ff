#!/usr/bin/python3
"""A toy job for `laissez run`: counts to N, one step every STEP seconds, and
follows the notice contract (docs/TENANTS.md):

- it resumes from its checkpoint when LAISSEZ_RESUME=1;
- on the notice signal (LAISSEZ_NOTICE_SIGNAL, SIGUSR1 by default) it writes its
  counter to the checkpoint and exits with LAISSEZ_CHECKPOINT_EXIT_CODE (75);
- it also checkpoints every --every steps, so a stop at the deadline loses at most
  that much work.

With --ignore-signal it ignores the notice signal and SIGTERM (so the runner has to
stop it with SIGKILL at the deadline). It appends one JSON line per happening to
STATE/log.jsonl and writes the final count to STATE/result.

    laissez run --token-file me.token -- python/examples/count_job.py --n 100 --state /tmp/count
"""
import argparse
import json
import os
import signal
import sys
import time
import urllib.request


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="count to this")
    ap.add_argument("--step", type=float, default=0.1, help="seconds per step")
    ap.add_argument("--every", type=int, default=10, help="checkpoint every this many steps")
    ap.add_argument("--state", required=True, help="folder for the checkpoint, log and result")
    ap.add_argument("--ignore-signal", action="store_true", help="ignore the notice signal and SIGTERM")
    a = ap.parse_args()
    # The handler goes in first: a notice may come at any moment after the start.
    noticed = []
    sig_name = os.environ.get("LAISSEZ_NOTICE_SIGNAL", "USR1")
    sig = int(sig_name) if sig_name.isdigit() else getattr(signal, "SIG" + sig_name)
    if a.ignore_signal:
        signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(sig, lambda *_: noticed.append(True))
    os.makedirs(a.state, exist_ok=True)
    ckpt = os.path.join(a.state, "checkpoint")
    node = os.environ.get("LAISSEZ_NODE", "local")
    exit_code = int(os.environ.get("LAISSEZ_CHECKPOINT_EXIT_CODE", "75"))

    def log(**kv) -> None:
        kv["node"] = node
        with open(os.path.join(a.state, "log.jsonl"), "a") as f:
            f.write(json.dumps(kv) + "\n")

    def checkpoint(count: int) -> None:
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(count))
        os.replace(ckpt + ".tmp", ckpt)
        log(event="checkpoint", count=count)

    count = 0
    if os.environ.get("LAISSEZ_RESUME") == "1" and os.path.exists(ckpt):
        with open(ckpt) as f:
            count = int(f.read())
    log(event="start", count=count, attempt=int(os.environ.get("LAISSEZ_ATTEMPT", "1")),
        resume=os.environ.get("LAISSEZ_RESUME") == "1")
    print(f"count_job: starting on {node} at {count} of {a.n}", flush=True)

    while count < a.n:
        if noticed:
            notice = {}
            path = os.environ.get("LAISSEZ_NOTICE_FILE")
            if path and os.path.exists(path):
                with open(path) as f:
                    notice = json.load(f)
            meta = {}
            url = os.environ.get("LAISSEZ_METADATA_URL")
            if url:  # The same notice, as a spot-aware tool would poll it.
                try:
                    with urllib.request.urlopen(url + "/notice", timeout=5) as r:
                        meta = json.load(r)
                except Exception as e:  # noqa: BLE001 - logged for the reader
                    meta = {"error": str(e)}
            checkpoint(count)
            log(event="moving", count=count, deadline=notice.get("deadline"), metadata_deadline=meta.get("deadline"))
            print(f"count_job: notice ({notice.get('reasons', '?')}); checkpointed at {count}, exiting {exit_code}",
                  flush=True)
            return exit_code
        time.sleep(a.step)
        count += 1
        log(event="step", count=count)
        if count % a.every == 0:
            checkpoint(count)
    with open(os.path.join(a.state, "result"), "w") as f:
        f.write(str(count))
    log(event="done", count=count)
    print(f"count_job: done, counted to {count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
