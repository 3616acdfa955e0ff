// The market dashboard (issue 6): routes on the server's `--http` listener.
//
//   /dash/                 the page (operator and tenant views), built assets embedded
//   /api/v1/me             who the bearer token is
//   /api/v1/operator/overview   heatmap per hardware type, row power, totals (operator/admin)
//   /api/v1/tenant/overview     the caller's nodes, orders, balance, ledger, watched quotes
//   /api/v1/history?vertex=V    price history at a vertex since the server started
//   /api/v1/events              Server-Sent Events from the market's event stream
//   /api/v1/operator/floor, /api/v1/operator/drain   controls (POST)
//
// Auth: the same bearer tokens as gRPC, sent as `Authorization: Bearer lz_...`.
// Reads run as closures on the market's writer thread (MarketCore::Execute),
// so they see one consistent state. Controls call the gRPC OperatorService on
// loopback with the caller's token, so they go through exactly the validation,
// authorization, rate limits and audit log the CLI goes through.
// A tenant's reads and events are built only from that tenant's own nodes,
// orders and ledger entries plus aggregated quotes; the event stream uses the
// core's tenant-view Subscription, which strips other tenants' names and ids.
#pragma once

#include <memory>

namespace laissez::server {
class Server;
namespace dashboard {

// Registers the dashboard's routes on `server.http()`; call before the HTTP
// listener starts (ServerOptions::http_routes). No-op without --http.
void Install(Server& server);

}  // namespace dashboard
}  // namespace laissez::server
