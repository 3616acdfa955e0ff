"""A throwaway market on loopback: ``laissez serve`` with a cluster file, for trying the
SDK and ``laissez run`` (and for tests). Not for production."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import List, Optional


class LocalMarket:
    """Starts ``laissez serve`` on ``127.0.0.1`` (a free port) with a fresh journal.

    :param laissez: path of the ``laissez`` binary.
    :param cluster: cluster YAML loaded into the new market.
    :param workdir: where the journal and token files go (default: a new temporary folder,
        removed by :meth:`close`).
    """

    def __init__(self, laissez: str, cluster: str, workdir: Optional[str] = None,
                 start_timeout: float = 30.0) -> None:
        self.laissez = laissez
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="laissez-market-")
        os.makedirs(self.workdir, exist_ok=True)
        self._cluster = cluster
        self._start_timeout = start_timeout
        db = os.path.join(self.workdir, "market.db")
        self._log = open(os.path.join(self.workdir, "server.log"), "w+")
        self._start("127.0.0.1:0")
        self.admin_token_file = db + ".admin-token"
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(self.admin_token_file) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _start(self, listen: str) -> None:
        db = os.path.join(self.workdir, "market.db")
        self._log.seek(0, os.SEEK_END)
        skip = self._log.tell()  # Read only what this start writes.
        self._server = subprocess.Popen(
            [self.laissez, "serve", "--db", db, "--listen", listen, "--cluster", self._cluster, "--tick-ms", "100"],
            stderr=self._log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self._start_timeout
        port = None
        while time.monotonic() < deadline and port is None:
            if self._server.poll() is not None:
                break
            self._log.seek(skip)
            m = re.search(r"gRPC port (\d+)", self._log.read())
            if m:
                port = m.group(1)
            else:
                time.sleep(0.05)
        if port is None:
            self._log.seek(0)
            log = self._log.read()
            self.close()
            raise RuntimeError("laissez serve did not start:\n" + log)
        self.address = "127.0.0.1:" + port

    def stop(self) -> None:
        """Stops the server (SIGTERM: it drains, commits and ends its streams with UNAVAILABLE)."""
        if self._server.poll() is None:
            self._server.terminate()
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()

    def restart(self) -> None:
        """Stops the server and starts it again on the same port and journal (as after a
        crash or an upgrade): clients see UNAVAILABLE in between and carry on."""
        self.stop()
        self._start(self.address)

    def cli(self, *args: str, token_file: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
        """Runs ``laissez ARGS --server ADDRESS --token-file FILE`` (admin by default)."""
        cmd: List[str] = [self.laissez, *args, "--server", self.address,
                          "--token-file", token_file or self.admin_token_file]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r

    def create_tenant(self, name: str, balance: str = "1000") -> str:
        """Creates a tenant with ``balance`` units; returns its token file."""
        path = os.path.join(self.workdir, name + ".token")
        self.cli("tenant", "create", name, "--balance", balance, "--token-out", path)
        return path

    def set_grace(self, duration: str) -> None:
        """Sets the notice-to-transfer window (e.g. ``"3s"``)."""
        self.cli("volatility", "set", "--grace", duration)

    def server_log(self) -> str:
        """What the server wrote so far."""
        self._log.seek(0)
        return self._log.read()

    def close(self) -> None:
        """Stops the server and removes a temporary work folder."""
        self.stop()
        self._log.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "LocalMarket":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
