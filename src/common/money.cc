#include "common/money.h"

#include <cctype>
#include <cstdio>
#include <string>

namespace laissez {
namespace {

Status Bad(std::string_view field, std::string_view text, std::string_view why) {
  return InvalidArgument(std::string(field) + ": '" + std::string(text) + "' " + std::string(why));
}

}  // namespace

Result<int64_t> ParseMoney(std::string_view text, std::string_view field) {
  if (text.empty()) return Bad(field, text, "is empty; expected a decimal amount such as 12.5");
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("nan") != std::string::npos) return Bad(field, text, "is not a number");
  if (lower.find("inf") != std::string::npos) return Bad(field, text, "is infinite; prices must be finite");
  size_t i = 0;
  if (text[0] == '-') return Bad(field, text, "is negative; prices and amounts must be >= 0");
  if (text[0] == '+') i = 1;
  __int128 units = 0;
  int64_t frac = 0;
  int frac_digits = 0;
  bool any_digit = false, seen_dot = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c == '.') {
      if (seen_dot) return Bad(field, text, "has two decimal points");
      seen_dot = true;
      continue;
    }
    if (c < '0' || c > '9') return Bad(field, text, "is not a decimal number");
    any_digit = true;
    if (seen_dot) {
      if (++frac_digits > 6) return Bad(field, text, "has more than 6 decimals (the unit is 0.000001)");
      frac = frac * 10 + (c - '0');
    } else {
      units = units * 10 + (c - '0');
      if (units > static_cast<__int128>(kInfPrice / kMicroUnits)) return Bad(field, text, "overflows int64 micro-units");
    }
  }
  if (!any_digit) return Bad(field, text, "has no digits");
  while (frac_digits < 6) {
    frac *= 10;
    ++frac_digits;
  }
  __int128 total = units * kMicroUnits + frac;
  if (total >= static_cast<__int128>(kInfPrice)) return Bad(field, text, "overflows int64 micro-units");
  return static_cast<int64_t>(total);
}

std::string FormatMoney(int64_t v) {
  if (v == kInfPrice) return "inf";
  bool neg = v < 0;
  unsigned long long a = neg ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  unsigned long long whole = a / kMicroUnits, frac = a % kMicroUnits;
  char buf[64];
  if (frac == 0) {
    std::snprintf(buf, sizeof buf, "%s%llu", neg ? "-" : "", whole);
  } else {
    std::snprintf(buf, sizeof buf, "%s%llu.%06llu", neg ? "-" : "", whole, frac);
    std::string s(buf);
    while (s.back() == '0') s.pop_back();
    return s;
  }
  return buf;
}

Result<Micros> ParseDuration(std::string_view text, std::string_view field) {
  size_t i = 0;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
  std::string_view num = text.substr(0, i), unit = text.substr(i);
  if (num.empty()) return Bad(field, text, "is not a duration such as 90s, 2m, 1h or 1500ms");
  LZ_ASSIGN_OR_RETURN(int64_t micro, ParseMoney(num, field));  // Same fixed-point rules, 6 decimals.
  __int128 scale;
  if (unit.empty() || unit == "s") scale = kMicrosPerSecond;
  else if (unit == "ms") scale = 1000;
  else if (unit == "us") scale = 1;
  else if (unit == "m" || unit == "min") scale = 60 * kMicrosPerSecond;
  else if (unit == "h") scale = kMicrosPerHour;
  else if (unit == "d") scale = 24 * kMicrosPerHour;
  else return Bad(field, text, "has an unknown unit; use us, ms, s, m, h or d");
  __int128 r = static_cast<__int128>(micro) * scale / kMicroUnits;
  if (r >= static_cast<__int128>(kNever)) return Bad(field, text, "overflows int64 microseconds");
  return static_cast<Micros>(r);
}

}  // namespace laissez
