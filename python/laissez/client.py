"""A client for every tenant RPC (``TenantService`` in ``proto/laissez/v1/market.proto``).

Replies are the generated protobuf messages (``laissez.v1.market_pb2``); prices and money
are int micro-units (see :func:`laissez.units`). Failed calls raise :class:`LaissezError`
with the gRPC status code name and the server's message, which names the field and the
reason (``INVALID_ARGUMENT: price: must not be negative``).

Replicated markets (docs/HA.md): ``address`` may list several replicas (a list, or
``"HOST:PORT,HOST:PORT"``). Calls go to one; on UNAVAILABLE the client moves to the leader
the refusal names (``leader=HOST:PORT``), else to the next address, and sends the call again
when that is safe: reads, absolute sets (``update_order``, ``set_limit``, ``stream_updates``) and calls with an
idempotency key (``place_order``, ``cancel_order``, ``relinquish`` send a fresh key per call
and every retry with the same key, so each applies once); other calls only when the error
proves they were not applied. It keeps trying for up to 15 s (``failover_budget``).
:meth:`Client.watch` streams resume after the last event seen on another replica (or the
same one restarted): no event lost or repeated.

Thread-safety: a Client may be shared between threads (gRPC channels are thread-safe; the
current address is switched under a lock).
"""
from __future__ import annotations

import re
import secrets
import threading
import time
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from .v1 import market_pb2 as pb
from .v1 import market_pb2_grpc as pbg

_LOCALITIES = {
    "any": pb.LOCALITY_ANY,
    "same_region": pb.LOCALITY_SAME_REGION,
    "same_zone": pb.LOCALITY_SAME_ZONE,
    "same_row": pb.LOCALITY_SAME_ROW,
    "same_rack": pb.LOCALITY_SAME_RACK,
}


class LaissezError(RuntimeError):
    """A call the server refused: ``code`` is the gRPC status name, ``message`` its reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def new_idempotency_key() -> str:
    """A fresh idempotency key for one logical call (``k-`` and 32 hex digits, as the C++
    clients make); send every retry of that call with the same key."""
    return "k-" + secrets.token_hex(16)


# An UNAVAILABLE with one of these proves the call was not applied (grpc_client.h, Retryable).
_NOT_APPLIED = ("not the leader", "failed to connect", "Connection refused", "server: not running",
                "the store failed; restart the server", "connections to all backends failing")


def retryable(code: str, message: str, idempotent: bool) -> bool:
    """Whether a call that failed with (``code``, ``message``) may be sent again to another
    replica: any UNAVAILABLE if it is ``idempotent``, else only one that proves it was not
    applied (a follower refused it, it never reached a server)."""
    if code != "UNAVAILABLE":
        return False
    return idempotent or any(m in message for m in _NOT_APPLIED)


class Endpoints:
    """The replicas of a market; ``next(error)`` moves to the leader an error names
    (``leader=HOST:PORT``), else to the next one."""

    def __init__(self, addresses: Union[str, Sequence[str]]) -> None:
        parts = addresses.split(",") if isinstance(addresses, str) else list(addresses)
        self.addresses = [a.strip() for a in parts if a.strip()]
        if not self.addresses:
            raise ValueError("address: give HOST:PORT, or several (a list or comma-separated)")
        self.current = 0

    def address(self) -> str:
        return self.addresses[self.current]

    def next(self, error: str) -> None:
        m = re.search(r"leader=([^) ,;]+)", error)
        if m:
            leader = m.group(1)
            if leader not in self.addresses:
                self.addresses.append(leader)  # A replica the caller did not list: try it too.
            self.current = self.addresses.index(leader)
            return
        self.current = (self.current + 1) % len(self.addresses)


def read_token_file(path: str) -> str:
    """The first line of a token file, whitespace trimmed (as ``--token-file``)."""
    with open(path) as f:
        token = f.readline().strip()
    if not token:
        raise ValueError(f"token_file: {path} is empty")
    return token


class Client:
    """A tenant's connection to ``laissez serve``.

    :param address: ``HOST:PORT`` of the server, or the replicas of a replicated market (a
        list, or comma-separated).
    :param token: the tenant's bearer token (or use ``token_file``).
    :param tls_ca: PEM file of the CA for a TLS server; None for plaintext.
    :param timeout: seconds per unary call.
    :param failover_budget: seconds to keep moving between replicas after an UNAVAILABLE.
    """

    def __init__(self, address: Union[str, Sequence[str]], token: Optional[str] = None, *,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None, timeout: float = 30.0,
                 failover_budget: float = 15.0) -> None:
        if token is None and token_file is None:
            raise ValueError("token: give token or token_file")
        self.token = token if token is not None else read_token_file(token_file)  # type: ignore[arg-type]
        self._creds = None
        if tls_ca:
            with open(tls_ca, "rb") as f:
                self._creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        self.endpoints = Endpoints(address)
        self.timeout = timeout
        self.failover_budget = failover_budget
        self._lock = threading.Lock()
        self._md = (("authorization", "Bearer " + self.token),)
        self._dial()

    @property
    def address(self) -> str:
        """The replica calls go to now."""
        return self.endpoints.address()

    def _dial(self) -> None:
        a = self.endpoints.address()
        self._channel = grpc.secure_channel(a, self._creds) if self._creds else grpc.insecure_channel(a)
        self._stub = pbg.TenantServiceStub(self._channel)

    def failover(self, error: str, stub: object = None) -> None:
        """After an UNAVAILABLE ``error``: moves to the leader it names, else the next replica.
        ``stub``: the stub the failed call used (no move if another thread already moved)."""
        with self._lock:
            if stub is not None and stub is not self._stub:
                return
            old = self._channel
            self.endpoints.next(error)
            self._dial()
        old.close()

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, request, idempotent: bool = True):  # type: ignore[no-untyped-def]
        """Calls TenantService.``name``, failing over between replicas while ``retryable``."""
        until = time.monotonic() + self.failover_budget
        backoff = 0.05
        while True:
            stub = self._stub
            try:
                return getattr(stub, name)(request, metadata=self._md, timeout=self.timeout)
            except grpc.RpcError as e:
                code, msg = e.code().name, e.details() or ""
                if not retryable(code, msg, idempotent) or time.monotonic() >= until:
                    raise LaissezError(code, msg) from None
                self.failover(msg, stub)
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.5)

    # ---- Orders ----
    def place_order(self, scope: str, price: int, count: int = 1, locality: str = "any",
                    rel_to: str = "", idempotency_key: Optional[str] = None) -> int:
        """Places a bid at ``scope`` (a type, ``TYPE/region/zone/row/rack`` or a node name) for
        ``count`` nodes (> 1: an all-or-nothing gang); returns the order id. Sent (and retried)
        with ``idempotency_key``, a fresh one by default: a repeat returns the original id."""
        if locality not in _LOCALITIES:
            raise ValueError(f"locality: unknown {locality!r} ({', '.join(_LOCALITIES)})")
        r = self._call("PlaceOrder", pb.PlaceOrderRequest(
            scope=scope, price=price, count=count, locality=_LOCALITIES[locality], rel_to=rel_to,
            idempotency_key=idempotency_key or new_idempotency_key()))
        return r.order

    def update_order(self, order: int, price: int) -> None:
        """Changes an open order's price."""
        self._call("UpdateOrder", pb.UpdateOrderRequest(order=order, price=price))

    def stream_updates(self, updates: Iterable[tuple]) -> List[pb.UpdateOrderResponse]:
        """Sends ``(order, price)`` updates over one bidirectional stream; returns one ack
        per update, in order (``code`` 0 is OK), each sent once the update is durable.

        If the stream breaks with UNAVAILABLE, or the server refuses updates with it (a
        follower), the updates from the first one not acknowledged on are sent again, in
        order, on the leader or the next replica: each sets an absolute price, so sending
        one again is harmless."""
        todo = list(updates)
        acks: List[Optional[pb.UpdateOrderResponse]] = [None] * len(todo)
        until = time.monotonic() + self.failover_budget
        start = 0
        while start < len(todo):
            stub = self._stub
            reqs = (pb.UpdateOrderRequest(order=o, price=p, tag=i)
                    for i, (o, p) in enumerate(todo[start:], start))
            error = None
            try:
                for a in stub.StreamUpdates(reqs, metadata=self._md, timeout=self.timeout):
                    acks[a.tag] = a
            except grpc.RpcError as e:
                error = (e.code().name, e.details() or "")
            # Resend from the first update without an ack, or refused as UNAVAILABLE.
            start = next((i for i in range(start, len(todo)) if acks[i] is None or
                          acks[i].code == grpc.StatusCode.UNAVAILABLE.value[0]), len(todo))
            if start == len(todo):
                break
            if error is None:
                error = ("UNAVAILABLE", acks[start].message if acks[start] is not None else "")
            if error[0] != "UNAVAILABLE" or time.monotonic() >= until:
                if acks[start] is not None:
                    break  # The refusal is in the acks.
                raise LaissezError(*error)
            self.failover(error[1], stub)
            time.sleep(0.05)
        return acks  # type: ignore[return-value]

    def cancel_order(self, order: int, idempotency_key: Optional[str] = None) -> None:
        """Withdraws an open order (a repeat of the same key answers OK, cancelling nothing)."""
        self._call("CancelOrder", pb.CancelOrderRequest(
            order=order, idempotency_key=idempotency_key or new_idempotency_key()))

    def list_orders(self) -> Sequence[pb.Order]:
        """Your open orders."""
        return self._call("ListOrders", pb.ListOrdersRequest()).orders

    # ---- Holdings ----
    def set_limit(self, node: str, limit: int) -> None:
        """Sets the retention limit on a node you hold."""
        self._call("SetLimit", pb.SetLimitRequest(node=node, limit=limit))

    def relinquish(self, node: str, idempotency_key: Optional[str] = None) -> None:
        """Gives a held node up at once (a contested node moves to its challenger). A repeat
        of the same key answers OK, releasing nothing."""
        self._call("Relinquish", pb.RelinquishRequest(
            node=node, idempotency_key=idempotency_key or new_idempotency_key()))

    def list_nodes(self) -> Sequence[pb.HeldNode]:
        """The nodes you hold, with their limits."""
        return self._call("ListNodes", pb.ListNodesRequest()).nodes

    # ---- Reads ----
    def quote(self, vertex: str, depth: bool = False) -> pb.Quote:
        """The price to obtain a node below ``vertex``, with free counts (and depth)."""
        return self._call("Quote", pb.QuoteRequest(vertex=vertex, depth=depth)).quote

    def eviction_quote(self, node: str) -> pb.EvictionQuoteResponse:
        """How close the market is to taking a node you hold."""
        return self._call("EvictionQuote", pb.EvictionQuoteRequest(node=node))

    def balance(self) -> pb.BalanceResponse:
        """Your balance, rates and totals paid."""
        return self._call("GetBalance", pb.GetBalanceRequest())

    def ledger(self, limit: int = 0) -> Sequence[pb.LedgerEntry]:
        """Your settled charges, most recent ``limit`` (0: 100)."""
        return self._call("GetLedger", pb.GetLedgerRequest(limit=limit)).entries

    def topology(self) -> pb.TopologyResponse:
        """The public topology: every node and vertex name."""
        return self._call("GetTopology", pb.GetTopologyRequest())

    def watch(self, vertices: Sequence[str] = (), after: Optional[Tuple[int, int]] = None) -> "Watch":
        """Streams price changes at ``vertices`` and your own events; iterate the result,
        ``close()`` it to stop. Returns once the server has registered the stream.

        ``after``: resume after that position ``(seq, index)`` (an old stream's
        ``position``). The stream resumes by itself after an UNAVAILABLE (a replica died or
        stepped down, a server restarted): on the leader or the next replica, after the last
        event it delivered, so none is lost or repeated; :class:`LaissezError` OUT_OF_RANGE
        if the server no longer has them all (re-read state and watch again)."""
        return Watch(self, list(vertices), after)


class Watch:
    """An open event stream: iterate for :class:`laissez.v1.market_pb2.Event` messages.
    ``position`` is ``(seq, index)`` of the last event delivered (or where the stream
    started)."""

    def __init__(self, client: Client, vertices: List[str], after: Optional[Tuple[int, int]]) -> None:
        self._client = client
        self._vertices = vertices
        self._closed = False
        self._lock = threading.Lock()
        self.position: Optional[Tuple[int, int]] = after
        self.reconnects = 0
        self._open(failover_until=time.monotonic() + client.failover_budget)

    def _open(self, failover_until: float) -> None:
        while True:
            stub = self._client._stub
            q = pb.WatchRequest(vertices=self._vertices)
            if self.position is not None:
                q.resume = True
                q.after_seq, q.after_index = self.position
            call = stub.Watch(q, metadata=self._client._md)
            try:
                md = dict(call.initial_metadata() or ())  # Sent once the subscription is live.
            except grpc.RpcError as e:
                md = None
                err = e
            if md is not None and "laissez-position" in md:
                if self.position is None:
                    seq, index = md["laissez-position"].split(".")
                    self.position = (int(seq), int(index))
                with self._lock:
                    self._call = call
                return
            if md is not None:  # Ended before it was live: read why.
                try:
                    for _ in call:
                        pass
                    self._set(call)  # Ended cleanly (the server stopped it): nothing to read.
                    return
                except grpc.RpcError as e:
                    err = e
            code, msg = err.code().name, err.details() or ""
            if not retryable(code, msg, True) or time.monotonic() >= failover_until:
                raise LaissezError(code, msg) from None
            self._client.failover(msg, stub)
            time.sleep(0.1)

    def _set(self, call) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self._call = call

    def __iter__(self) -> Iterator[pb.Event]:
        while True:
            try:
                for e in self._call:
                    self.position = (e.seq, e.index)
                    yield e
                return
            except grpc.RpcError as e:
                if self._closed or e.code() == grpc.StatusCode.CANCELLED:
                    return
                code, msg = e.code().name, e.details() or ""
                if code != "UNAVAILABLE":
                    raise LaissezError(code, msg) from None
                # The replica went away: resume after the last event, elsewhere or there.
                self._client.failover(msg)
                self.reconnects += 1
                self._open(failover_until=time.monotonic() + self._client.failover_budget)
                if self._closed:
                    self._call.cancel()
                    return

    def close(self) -> None:
        """Ends the stream (iteration stops)."""
        self._closed = True
        with self._lock:
            self._call.cancel()
