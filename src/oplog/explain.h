// Explain: replays an operation log and tells, in plain words, the history of
// one node (who held it when, each contest with the winning price, the
// holder's limit, the grace deadline and the outcome, and what the holder paid
// per interval) or one tenant's evictions. The operator's view names every
// tenant; a tenant's view (`as`) shows only what that tenant may see: its own
// events, with rivals anonymous and their limits, orders and payments hidden.
//
// Output is deterministic (no clock), as JSON and as text built from it.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "common/types.h"

namespace laissez::oplog {

struct ExplainQuery {
  std::string node;    // Node id or name; empty for a tenant query.
  std::string tenant;  // Tenant id or name; empty for a node query.
  std::string as;      // Tenant id or name whose view to show; empty: operator.
  Micros at = kNever;  // Account up to this engine time (the log's end if kNever).
};

struct ExplainOutput {
  std::string json;  // One JSON document (docs/OPLOG.md, "Explain").
  std::string text;  // The same account in plain words.
};

// `log` is the operation log; if `padded`, followed by Decoder::kPadding bytes.
Result<ExplainOutput> Explain(std::string_view log, bool padded, const ExplainQuery& query);

// Engine microseconds ("1500000") or an ISO-8601 UTC time
// ("2026-11-30T05:00:00Z", "2026-11-30T05:00:00.25+01:00"), read as
// microseconds since the Unix epoch. `field` names the input in errors.
Result<Micros> ParseTimeArg(std::string_view text, std::string_view field);

// Engine time for people: ISO-8601 UTC for times after 2000-01-01 (wall-clock
// logs), otherwise seconds from the start ("T+180s").
std::string FormatTime(Micros t);

}  // namespace laissez::oplog
