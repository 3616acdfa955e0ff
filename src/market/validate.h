// ValidateOperation: the one check of an operation's own fields, shared by
// everything that applies operations (the server, before it applies and
// journals a request; replay, for every record it reads; the simulator).
//
// Why one function: the server must never accept what replay refuses, or one
// accepted call makes the journal unreadable and the market cannot restart.
// `market::Apply` runs this before dispatching to the engine, so a live call
// and the replay of its journal record meet the same rules, and the oplog
// decoder's representable ranges (no value equal to the `kInfPrice`/`kNever`
// sentinels where the format writes "inf"/"never") are repeated here.
//
// The checks need no engine state: ranges, ordering within a request, sizes.
// Rules that depend on state (a tenant's balance, a name already taken) stay in
// the engine, which replay runs too.
//
// Errors are INVALID_ARGUMENT naming the field and the reason.
#pragma once

#include "market/operation.h"

namespace laissez::market {

// Highest utilization step of a power cap: 100x the cap.
inline constexpr Ppm kMaxUtilizationPpm = 100 * kPpm;

Status ValidateOperation(const Operation& op);

// One function per operation (op.time is checked by ValidateOperation).
Status Validate(const OpAdvance& o);
Status Validate(const OpAddNode& o);
Status Validate(const OpRemoveNode& o);
Status Validate(const OpSetParams& o);
Status Validate(const OpAddPolicy& o);
Status Validate(const OpRemovePolicy& o);
Status Validate(const OpCreateTenant& o);
Status Validate(const OpDeposit& o);
Status Validate(const OpSetMaxRate& o);
Status Validate(const OpPlaceOrder& o);
Status Validate(const OpUpdateOrder& o);
Status Validate(const OpCancelOrder& o);
Status Validate(const OpSetLimit& o);
Status Validate(const OpRelinquish& o);
Status Validate(const OpSetAdaptiveCap& o);

}  // namespace laissez::market
