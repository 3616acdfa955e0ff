#include "sdk/strategies.h"

#include <algorithm>
#include <cmath>

namespace laissez::sdk {
namespace {

// a x b / d (d > 0), truncated, as __int128. When a x b fits in 64 bits (the
// usual case: prices times ppm or microseconds) the 64-bit division gives the
// same result without the library's 128-bit divide.
__int128 MulDiv(int64_t a, int64_t b, int64_t d) {
  int64_t product;
  if (!__builtin_mul_overflow(a, b, &product)) return product / d;
  return static_cast<__int128>(a) * b / d;
}

// value x ppm / 1e6, rounded down, saturating.
laissez::Price Scale(laissez::Price value, Ppm ppm) {
  if (value == kInfPrice) return kInfPrice;
  __int128 r = MulDiv(value, ppm, kPpm);
  if (r >= kInfPrice) return kInfPrice;
  if (r < 0) return 0;
  return static_cast<laissez::Price>(r);
}

// The urgency factor (ppm) for `left` time to a deadline and `remaining`
// work: `relaxed` at slack >= relaxed_slack, `urgent` at slack <=
// urgent_slack, linear between.
Ppm UrgencyFactor(Micros left, Micros remaining, Ppm relaxed, Ppm urgent, Ppm relaxed_slack, Ppm urgent_slack) {
  if (remaining <= 0) return relaxed;
  if (left <= 0) return urgent;
  __int128 slack = static_cast<__int128>(left) * kPpm / remaining;  // ppm.
  if (slack <= urgent_slack) return urgent;
  if (slack >= relaxed_slack) return relaxed;
  __int128 span = static_cast<__int128>(relaxed_slack) - urgent_slack;
  if (span <= 0) return relaxed;
  __int128 f = urgent + (static_cast<__int128>(relaxed) - urgent) * (slack - urgent_slack) / span;
  return static_cast<Ppm>(f);
}

// A non-negative double price, saturating at kInfPrice.
laissez::Price ToPrice(double v) {
  if (!(v > 0)) return 0;
  if (v >= static_cast<double>(kInfPrice)) return kInfPrice;
  return static_cast<laissez::Price>(std::llround(v));
}

}  // namespace

std::unique_ptr<PricingStrategy> OnDemandLike(laissez::Price high) { return std::make_unique<FixedValue>(high); }
std::unique_ptr<PricingStrategy> SpotLike(laissez::Price low) { return std::make_unique<FixedValue>(low); }

ThroughputValue::ThroughputValue(laissez::Price value_per_hour, std::unordered_map<std::string, Ppm> speed_ppm)
    : value_per_hour_(value_per_hour), speed_ppm_(speed_ppm.begin(), speed_ppm.end()) {}

namespace {
// a == b for type names of a few bytes, compared in place: std::string's ==
// calls the library's memcmp for every entry of equal length, and a tenant's
// every Price() call compares one to three entries (issue 12).
bool SameName(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}
}  // namespace

std::optional<laissez::Price> ThroughputValue::ValueOf(const std::string& type) const {
  for (const auto& [name, ppm] : speed_ppm_)
    if (SameName(name, type)) return ppm > 0 ? std::optional<laissez::Price>(Scale(value_per_hour_, ppm)) : std::nullopt;
  return std::nullopt;
}

std::optional<laissez::Price> ThroughputValue::Price(const NodeSpec& spec, const OrderBookView&) {
  return ValueOf(spec.node_type);
}

BudgetCapped::BudgetCapped(std::unique_ptr<PricingStrategy> inner, laissez::Price max_per_node, Micros horizon)
    : inner_(std::move(inner)), max_per_node_(max_per_node), horizon_(horizon) {}

std::optional<laissez::Price> BudgetCapped::Price(const NodeSpec& spec, const OrderBookView& book) {
  std::optional<laissez::Price> p = inner_->Price(spec, book);
  if (!p) return p;
  laissez::Price cap = max_per_node_;
  if (horizon_ > 0) {
    // What the balance sustains per node per hour over the horizon.
    uint32_t nodes = std::max<uint32_t>(1, book.request_count());
    __int128 sustain = static_cast<__int128>(std::max<Money>(0, book.balance())) * kMicrosPerHour /
                       (static_cast<__int128>(horizon_) * nodes);
    if (sustain < cap) cap = static_cast<laissez::Price>(sustain);
  }
  return std::min(*p, cap);
}

DeadlineUrgency::DeadlineUrgency(std::unique_ptr<PricingStrategy> inner, Params params)
    : inner_(std::move(inner)), p_(std::move(params)) {}

Ppm DeadlineUrgency::FactorAt(Micros now) const {
  if (p_.deadline == kNever) return p_.relaxed_ppm;
  Micros remaining = p_.remaining ? p_.remaining() : 0;
  if (remaining <= 0) return p_.relaxed_ppm;
  return UrgencyFactor(p_.deadline - now, remaining, p_.relaxed_ppm, p_.urgent_ppm, p_.relaxed_slack_ppm,
                       p_.urgent_slack_ppm);
}

std::optional<laissez::Price> DeadlineUrgency::Price(const NodeSpec& spec, const OrderBookView& book) {
  std::optional<laissez::Price> p = inner_->Price(spec, book);
  if (!p) return p;
  return Scale(*p, FactorAt(book.now()));
}

Micros DeadlineUrgency::NextChange(const NodeSpec& spec, Micros now) const {
  if (p_.deadline == kNever) return inner_->NextChange(spec, now);
  return now + 1;
}

LocalityAware::LocalityAware(std::unique_ptr<PricingStrategy> inner, Ppm bonus_ppm)
    : inner_(std::move(inner)), bonus_ppm_(bonus_ppm) {}

std::optional<laissez::Price> LocalityAware::Price(const NodeSpec& spec, const OrderBookView& book) {
  std::optional<laissez::Price> p = inner_->Price(spec, book);
  if (!p || spec.held.valid()) return p;
  if (spec.locality == market::Locality::kAny || !spec.rel_to.valid()) return p;
  return Scale(*p, kPpm + bonus_ppm_);
}

std::optional<laissez::Price> GangAware::Price(const NodeSpec& spec, const OrderBookView& book) {
  std::optional<laissez::Price> p = inner_->Price(spec, book);
  if (!p || !spec.held.valid() || book.request_count() <= 1) return p;
  __int128 v = static_cast<__int128>(*p) * book.request_count();
  return v >= kInfPrice ? kInfPrice : static_cast<laissez::Price>(v);
}

MigrationAware::MigrationAware(std::unique_ptr<PricingStrategy> inner, Params params)
    : inner_(std::move(inner)), p_(std::move(params)) {}

laissez::Price MigrationAware::Premium(laissez::Price value) const {
  if (value == kInfPrice || p_.amortization <= 0) return 0;
  Micros cost_time = p_.overhead + (p_.uncommitted ? std::max<Micros>(0, p_.uncommitted()) : 0);
  __int128 premium = MulDiv(value, cost_time, p_.amortization);
  if (premium >= kInfPrice) return kInfPrice;
  return static_cast<laissez::Price>(premium);
}

std::optional<laissez::Price> MigrationAware::Price(const NodeSpec& spec, const OrderBookView& book) {
  std::optional<laissez::Price> p = inner_->Price(spec, book);
  if (!p || !spec.held.valid()) return p;
  return SatAdd(*p, Premium(*p));
}

Micros MigrationAware::NextChange(const NodeSpec& spec, Micros now) const {
  if (spec.held.valid() && p_.uncommitted) return now + 1;
  return inner_->NextChange(spec, now);
}

CostOfDelay::CostOfDelay(Params params) : p_(std::move(params)) {}

double CostOfDelay::DelayCostPerHour(Micros now, Ppm speed_ppm, bool held) const {
  constexpr double kH = static_cast<double>(kMicrosPerHour);
  if (speed_ppm <= 0 || p_.ideal <= 0) return 0;
  const double speed = static_cast<double>(speed_ppm) / kPpm;
  const double remaining = static_cast<double>(p_.remaining ? std::max<Micros>(0, p_.remaining()) : p_.ideal) / kH;
  const double elapsed = static_cast<double>(std::max<Micros>(0, now - p_.arrival)) / kH;
  double t = elapsed + remaining / speed;
  if (!held) t += static_cast<double>(p_.overhead) / kH;
  const double d = static_cast<double>(p_.ideal) / kH;
  t = std::max(t, d);  // Retention never exceeds 1.
  return static_cast<double>(p_.value) * d / (t * t);
}

Micros CostOfDelay::NextChange(const NodeSpec&, Micros now) const {
  return p_.kind == Kind::kServing ? kNever : now + 1;
}

std::optional<laissez::Price> CostOfDelay::Price(const NodeSpec& spec, const OrderBookView& book) {
  auto it = p_.speed_ppm.find(spec.node_type);
  if (it == p_.speed_ppm.end() || it->second <= 0) return std::nullopt;
  const double speed = static_cast<double>(it->second) / kPpm;
  const bool held = spec.held.valid();
  const double amort = static_cast<double>(std::max<Micros>(1, p_.amortization));
  if (p_.kind == Kind::kServing) {
    double bid = static_cast<double>(p_.value) * speed;
    if (held) bid += bid * static_cast<double>(p_.overhead) / amort;
    return ToPrice(bid);
  }
  const double rate = DelayCostPerHour(book.now(), it->second, held);
  double price = rate * speed / std::max<uint32_t>(1, p_.nodes);
  if (held) {
    Micros at_risk = p_.overhead + (p_.uncommitted ? std::max<Micros>(0, p_.uncommitted()) : 0);
    price += rate * static_cast<double>(at_risk) / amort;
  }
  if (p_.deadline != kNever) {
    Micros remaining = p_.remaining ? std::max<Micros>(0, p_.remaining()) : p_.ideal;
    Ppm f = UrgencyFactor(p_.deadline - book.now(), remaining, kPpm, p_.urgent_ppm, p_.relaxed_slack_ppm,
                          p_.urgent_slack_ppm);
    price = price * static_cast<double>(f) / kPpm;
  }
  return ToPrice(price);
}

}  // namespace laissez::sdk
