// Printing engine time for people.
#pragma once

#include <string>

#include "common/types.h"

namespace laissez {

// Formats engine microseconds (since the Unix epoch) as ISO-8601 UTC with
// milliseconds ("2026-12-01T08:12:03.512Z"); "never" for kNever, "-" for <= 0.
std::string FormatIsoTime(Micros us);

}  // namespace laissez
