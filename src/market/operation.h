// Operation: one engine call as data, with its engine time. The operation log
// (docs/OPLOG.md), the server's journal and the simulator's --oplog all record
// Operations; `Apply` runs one against an engine. Ids inside operations are the
// engine's own (assigned deterministically in call order), so a log replays to
// the same ids.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "market/market_engine.h"

namespace laissez::market {

struct OpAdvance {};
struct OpAddNode { topology::NodeInfo info; };
struct OpRemoveNode { NodeId node; };
struct OpSetParams { MarketParams params; };
struct OpAddPolicy { PolicySpec spec; };
struct OpRemovePolicy { PolicyId policy; };
struct OpCreateTenant { std::string name; Money balance = 0; Price max_rate = kInfPrice; };
struct OpDeposit { TenantId tenant; Money amount = 0; };
struct OpSetMaxRate { TenantId tenant; Price max_rate = kInfPrice; };
struct OpPlaceOrder { TenantId tenant; OrderSpec spec; };
struct OpUpdateOrder { TenantId tenant; OrderId order; Price price = 0; };
struct OpCancelOrder { TenantId tenant; OrderId order; };
struct OpSetLimit { TenantId tenant; NodeId node; Price limit = 0; };
struct OpRelinquish { TenantId tenant; NodeId node; };
// A live adaptive policy's cap changed in place: `cap_w` of an adaptive power
// cap, `budget_g_per_h` of an adaptive carbon budget. The controller keeps its
// value (floor or carbon price) and its step times (docs/MECHANISM.md).
struct OpSetAdaptiveCap { PolicyId policy; int64_t cap = 0; };

using OpBody = std::variant<OpAdvance, OpAddNode, OpRemoveNode, OpSetParams, OpAddPolicy, OpRemovePolicy,
                            OpCreateTenant, OpDeposit, OpSetMaxRate, OpPlaceOrder, OpUpdateOrder,
                            OpCancelOrder, OpSetLimit, OpRelinquish, OpSetAdaptiveCap>;

struct Operation {
  Micros time = 0;
  OpBody body;
};

// The outcome of Apply: the call's Status and, for calls that create something,
// the new id's value (node, policy, tenant or order).
struct ApplyResult {
  Status status;
  uint64_t created_id = UINT64_MAX;
};

ApplyResult Apply(MarketEngine& engine, const Operation& op);

// The operation's name as used in the log ("place_order", ...).
std::string_view OpName(const OpBody& body);

}  // namespace laissez::market
