#include "common/time_format.h"

#include <cstdio>
#include <ctime>

namespace laissez {

std::string FormatIsoTime(Micros us) {
  if (us <= 0 || us == kNever) return us == kNever ? "never" : "-";
  std::time_t s = static_cast<std::time_t>(us / kMicrosPerSecond);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>((us / 1000) % 1000));
  return out;
}

}  // namespace laissez
