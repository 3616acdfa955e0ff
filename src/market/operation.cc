#include "market/operation.h"

#include "market/validate.h"

namespace laissez::market {
namespace {

template <typename IdT>
ApplyResult FromResult(const Result<IdT>& r) {
  if (!r.ok()) return {r.status(), UINT64_MAX};
  return {Status::Ok(), static_cast<uint64_t>(r->value)};
}

struct Applier {
  MarketEngine& e;
  Micros t;
  ApplyResult operator()(const OpAdvance&) { return {e.Advance(t)}; }
  ApplyResult operator()(const OpAddNode& o) { return FromResult(e.AddNode(t, o.info)); }
  ApplyResult operator()(const OpRemoveNode& o) { return {e.RemoveNode(t, o.node)}; }
  ApplyResult operator()(const OpSetParams& o) { return {e.SetParams(t, o.params)}; }
  ApplyResult operator()(const OpAddPolicy& o) { return FromResult(e.AddPolicy(t, o.spec)); }
  ApplyResult operator()(const OpRemovePolicy& o) { return {e.RemovePolicy(t, o.policy)}; }
  ApplyResult operator()(const OpCreateTenant& o) { return FromResult(e.CreateTenant(t, o.name, o.balance, o.max_rate)); }
  ApplyResult operator()(const OpDeposit& o) { return {e.Deposit(t, o.tenant, o.amount)}; }
  ApplyResult operator()(const OpSetMaxRate& o) { return {e.SetMaxRate(t, o.tenant, o.max_rate)}; }
  ApplyResult operator()(const OpPlaceOrder& o) { return FromResult(e.PlaceOrder(t, o.tenant, o.spec)); }
  ApplyResult operator()(const OpUpdateOrder& o) { return {e.UpdateOrder(t, o.tenant, o.order, o.price)}; }
  ApplyResult operator()(const OpCancelOrder& o) { return {e.CancelOrder(t, o.tenant, o.order)}; }
  ApplyResult operator()(const OpSetLimit& o) { return {e.SetLimit(t, o.tenant, o.node, o.limit)}; }
  ApplyResult operator()(const OpRelinquish& o) { return {e.Relinquish(t, o.tenant, o.node)}; }
  ApplyResult operator()(const OpSetAdaptiveCap& o) { return {e.SetAdaptiveCap(t, o.policy, o.cap)}; }
};

struct Namer {
  std::string_view operator()(const OpAdvance&) { return "advance"; }
  std::string_view operator()(const OpAddNode&) { return "add_node"; }
  std::string_view operator()(const OpRemoveNode&) { return "remove_node"; }
  std::string_view operator()(const OpSetParams&) { return "set_params"; }
  std::string_view operator()(const OpAddPolicy&) { return "add_policy"; }
  std::string_view operator()(const OpRemovePolicy&) { return "remove_policy"; }
  std::string_view operator()(const OpCreateTenant&) { return "create_tenant"; }
  std::string_view operator()(const OpDeposit&) { return "deposit"; }
  std::string_view operator()(const OpSetMaxRate&) { return "set_max_rate"; }
  std::string_view operator()(const OpPlaceOrder&) { return "place_order"; }
  std::string_view operator()(const OpUpdateOrder&) { return "update_order"; }
  std::string_view operator()(const OpCancelOrder&) { return "cancel_order"; }
  std::string_view operator()(const OpSetLimit&) { return "set_limit"; }
  std::string_view operator()(const OpRelinquish&) { return "relinquish"; }
  std::string_view operator()(const OpSetAdaptiveCap&) { return "set_adaptive_cap"; }
};

}  // namespace

ApplyResult Apply(MarketEngine& engine, const Operation& op) {
  // The same field checks for a live call and for the replay of its record.
  if (Status st = ValidateOperation(op); !st.ok()) return {std::move(st), UINT64_MAX};
  return std::visit(Applier{engine, op.time}, op.body);
}

std::string_view OpName(const OpBody& body) { return std::visit(Namer{}, body); }

}  // namespace laissez::market
