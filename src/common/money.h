// Parsing and printing of prices and money as decimal text.
//
// Every entry that reads text (CLI, JSON, YAML) goes through `ParsePrice`, so
// `nan`, `inf`, negative values, digits beyond the micro-unit and overflow are
// rejected the same way everywhere.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "common/types.h"

namespace laissez {

// Parses "12", "12.5" or "0.000001" (units of money, at most 6 decimals) into
// micro-units. `field` names the input in the error message.
Result<int64_t> ParseMoney(std::string_view text, std::string_view field);

// Formats micro-units as a decimal with up to 6 decimals ("12.5"); "inf" for the sentinel.
std::string FormatMoney(int64_t micro_units);

// Parses a duration such as "90s", "2m", "1h", "1500ms", "250us" or a bare
// number of seconds into microseconds.
Result<Micros> ParseDuration(std::string_view text, std::string_view field);

}  // namespace laissez
