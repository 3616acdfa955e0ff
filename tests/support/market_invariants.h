// Brute-force invariant checks of a MarketEngine, written only against its
// public query API (GetNode, GetOrder, OpenOrders, GetTenant, Quote,
// GetEvictionQuote, ledger, ledger_totals, UnsettledCharges, AvailableBalance).
//
// Every check recomputes its expectation from DESIGN.md §3 and §3b from the
// node, order and tenant views, independently of the engine's indexes and
// aggregates, so an engine bug in bookkeeping shows up as a disagreement.
// Used by the property tests after every operation and by the scenario tests.
//
// Thread-safety: none; the functions only read the engine.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "market/market_engine.h"

namespace laissez::testsupport {

struct InvariantContext {
  // The sum of initial balances and successful deposits, as the test applied
  // them; -1 when unknown.
  Money expected_deposited = -1;
  // Ledger entries seen at the previous check; must still be a prefix (the
  // ledger is append-only). Updated by `CheckInvariants`. May be null.
  std::vector<market::LedgerEntry>* ledger_prefix = nullptr;
  // Sum of `kCharged` event amounts delivered so far; -1 to skip the check.
  Money charged_event_total = -1;
  // Each order's requested price as the test last set it (PlaceOrder, then
  // successful UpdateOrders). Used instead of `OrderView::spec.price`, which
  // the engine does not update on UpdateOrder
  // (Regression_OrderViewSpecPriceStaleAfterUpdate). May be null.
  const std::map<uint64_t, Price>* requested = nullptr;
  // Whether AvailableBalance must not go negative. The engine lets it fall
  // below zero when charges outrun a balance that settlement would waive
  // (Regression_AvailableBalanceNegativeWhenChargesOutrunBalance).
  bool check_available_non_negative = true;
  // The latest kNotice delivered per node (RecordingSink::last_notice). When
  // set, every contested node's latest notice must state the deadline, the
  // reasons and the price in force (DESIGN.md §3b). May be null.
  const std::map<uint32_t, market::Event>* last_notice = nullptr;
};

// Returns an empty string when every invariant holds, else one line per
// violation naming the rule.
std::string CheckInvariants(const market::MarketEngine& e, InvariantContext& ctx);

// The obtain price of `n` for a tenant order of `tenant` (an invalid tenant
// means "a tenant holding none of them", as in quotes), from the node views and
// params: f(n) if free; max(f, r x (1 + h), q) + tick if held; infinite while
// reserved, during the minimum hold, or when the floor is infinite.
Price BruteObtain(const market::MarketEngine& e, NodeId n);

// The clipping reference of order `o` (DESIGN.md §3b): the k-th lowest obtain
// price over the nodes it is eligible for and its tenant does not hold, for
// `o` itself (an order never competes with itself: a node it contests is
// priced without its own pending price, a node it reserves at its floor);
// kInfPrice if fewer than k are obtainable.
Price BruteClipReference(const market::MarketEngine& e, const market::OrderView& o);

// Whether `o` is eligible for node `n` by scope, type and locality (not
// looking at who holds n).
bool Eligible(const market::MarketEngine& e, const market::OrderView& o, NodeId n);

// A complete text rendering of the engine's observable state: params, time,
// nodes, orders with ids below `order_id_bound`, tenants, balances, ledger,
// quotes and eviction quotes. Two engines in the same state render the same.
std::string Snapshot(const market::MarketEngine& e, uint64_t order_id_bound);

std::string EventToString(const market::Event& ev);
std::string EventsToString(std::span<const market::Event> events);

// Collects every delivered event, and the call boundaries.
class RecordingSink : public market::EventSink {
 public:
  void OnEvents(std::span<const market::Event> events) override;
  std::vector<market::Event> events;
  size_t batches = 0;
  Money charged_total = 0;
  std::map<uint32_t, market::Event> last_notice;  // The latest kNotice per node.
};

}  // namespace laissez::testsupport
