"""A client for every tenant RPC (``TenantService`` in ``proto/laissez/v1/market.proto``).

Replies are the generated protobuf messages (``laissez.v1.market_pb2``); prices and money
are int micro-units (see :func:`laissez.units`). Failed calls raise :class:`LaissezError`
with the gRPC status code name and the server's message, which names the field and the
reason (``INVALID_ARGUMENT: price: must not be negative``).

Thread-safety: a Client may be shared between threads (gRPC channels are thread-safe).
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable, Iterator, List, Optional, Sequence

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


def read_token_file(path: str) -> str:
    """The first line of a token file, whitespace trimmed (as ``--token-file``)."""
    with open(path) as f:
        token = f.readline().strip()
    if not token:
        raise ValueError(f"token_file: {path} is empty")
    return token


class Client:
    """A tenant's connection to ``laissez serve``.

    :param address: ``HOST:PORT`` of the server.
    :param token: the tenant's bearer token (or use ``token_file``).
    :param tls_ca: PEM file of the CA for a TLS server; None for plaintext.
    :param timeout: seconds per unary call.
    """

    def __init__(self, address: str, token: Optional[str] = None, *, token_file: Optional[str] = None,
                 tls_ca: Optional[str] = None, timeout: float = 30.0) -> None:
        if token is None and token_file is None:
            raise ValueError("token: give token or token_file")
        self.token = token if token is not None else read_token_file(token_file)  # type: ignore[arg-type]
        if tls_ca:
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self._channel = grpc.secure_channel(address, creds)
        else:
            self._channel = grpc.insecure_channel(address)
        self.address = address
        self.timeout = timeout
        self._stub = pbg.TenantServiceStub(self._channel)
        self._md = (("authorization", "Bearer " + self.token),)

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable, request):  # type: ignore[no-untyped-def]
        try:
            return method(request, metadata=self._md, timeout=self.timeout)
        except grpc.RpcError as e:  # pragma: no cover - exercised through the server
            raise LaissezError(e.code().name, e.details() or "") from None

    # ---- Orders ----
    def place_order(self, scope: str, price: int, count: int = 1, locality: str = "any",
                    rel_to: str = "") -> int:
        """Places a bid at ``scope`` (a type, ``TYPE/region/zone/row/rack`` or a node name) for
        ``count`` nodes (> 1: an all-or-nothing gang); returns the order id."""
        if locality not in _LOCALITIES:
            raise ValueError(f"locality: unknown {locality!r} ({', '.join(_LOCALITIES)})")
        r = self._call(self._stub.PlaceOrder, pb.PlaceOrderRequest(
            scope=scope, price=price, count=count, locality=_LOCALITIES[locality], rel_to=rel_to))
        return r.order

    def update_order(self, order: int, price: int) -> None:
        """Changes an open order's price."""
        self._call(self._stub.UpdateOrder, pb.UpdateOrderRequest(order=order, price=price))

    def stream_updates(self, updates: Iterable[tuple]) -> List[pb.UpdateOrderResponse]:
        """Sends ``(order, price)`` updates over one bidirectional stream; returns one ack
        per update, in order (``code`` 0 is OK), each sent once the update is durable."""
        reqs = (pb.UpdateOrderRequest(order=o, price=p, tag=i) for i, (o, p) in enumerate(updates))
        try:
            return list(self._stub.StreamUpdates(reqs, metadata=self._md, timeout=self.timeout))
        except grpc.RpcError as e:
            raise LaissezError(e.code().name, e.details() or "") from None

    def cancel_order(self, order: int) -> None:
        """Withdraws an open order."""
        self._call(self._stub.CancelOrder, pb.CancelOrderRequest(order=order))

    def list_orders(self) -> Sequence[pb.Order]:
        """Your open orders."""
        return self._call(self._stub.ListOrders, pb.ListOrdersRequest()).orders

    # ---- Holdings ----
    def set_limit(self, node: str, limit: int) -> None:
        """Sets the retention limit on a node you hold."""
        self._call(self._stub.SetLimit, pb.SetLimitRequest(node=node, limit=limit))

    def relinquish(self, node: str) -> None:
        """Gives a held node up at once (a contested node moves to its challenger)."""
        self._call(self._stub.Relinquish, pb.RelinquishRequest(node=node))

    def list_nodes(self) -> Sequence[pb.HeldNode]:
        """The nodes you hold, with their limits."""
        return self._call(self._stub.ListNodes, pb.ListNodesRequest()).nodes

    # ---- Reads ----
    def quote(self, vertex: str, depth: bool = False) -> pb.Quote:
        """The price to obtain a node below ``vertex``, with free counts (and depth)."""
        return self._call(self._stub.Quote, pb.QuoteRequest(vertex=vertex, depth=depth)).quote

    def eviction_quote(self, node: str) -> pb.EvictionQuoteResponse:
        """How close the market is to taking a node you hold."""
        return self._call(self._stub.EvictionQuote, pb.EvictionQuoteRequest(node=node))

    def balance(self) -> pb.BalanceResponse:
        """Your balance, rates and totals paid."""
        return self._call(self._stub.GetBalance, pb.GetBalanceRequest())

    def ledger(self, limit: int = 0) -> Sequence[pb.LedgerEntry]:
        """Your settled charges, most recent ``limit`` (0: 100)."""
        return self._call(self._stub.GetLedger, pb.GetLedgerRequest(limit=limit)).entries

    def topology(self) -> pb.TopologyResponse:
        """The public topology: every node and vertex name."""
        return self._call(self._stub.GetTopology, pb.GetTopologyRequest())

    def watch(self, vertices: Sequence[str] = ()) -> "Watch":
        """Streams price changes at ``vertices`` and your own events; iterate the result,
        ``close()`` it to stop. Returns once the server has registered the stream."""
        return Watch(self._stub.Watch(pb.WatchRequest(vertices=list(vertices)), metadata=self._md))


class Watch:
    """An open event stream: iterate for :class:`laissez.v1.market_pb2.Event` messages."""

    def __init__(self, call) -> None:  # type: ignore[no-untyped-def]
        self._call = call
        call.initial_metadata()  # The server sends it once the subscription is live.
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[pb.Event]:
        try:
            for e in self._call:
                yield e
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise LaissezError(e.code().name, e.details() or "") from None

    def close(self) -> None:
        """Ends the stream (iteration stops)."""
        self._call.cancel()
