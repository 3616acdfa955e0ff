#include "market/types.h"

#include <algorithm>
#include <limits>
#include <string>

namespace laissez::market {

Status ValidateParams(const MarketParams& p) {
  // Durations are bounded so that engine time plus any of them never
  // overflows (min_hold = INT64_MAX used to wrap and turn the hold off).
  auto duration = [&](Micros v, const char* field) -> Status {
    if (v < 0) return InvalidArgument(std::string(field) + ": must not be negative");
    if (v > kMaxDuration) {
      return InvalidArgument(std::string(field) + ": must be at most " + std::to_string(kMaxDuration) +
                             " microseconds (100 years) (got " + std::to_string(v) + ")");
    }
    return Status::Ok();
  };
  LZ_RETURN_IF_ERROR(duration(p.grace, "grace"));
  if (p.hysteresis_ppm < 0 || p.hysteresis_ppm > 100 * kPpm) return InvalidArgument("hysteresis_ppm: must be in [0, 100000000]");
  if (p.tick < 1) return InvalidArgument("tick: must be at least 1 micro-unit");
  if (p.clip_alpha_ppm < 0 || p.clip_alpha_ppm > 100 * kPpm) return InvalidArgument("clip_alpha_ppm: must be in [0, 100000000]");
  LZ_RETURN_IF_ERROR(duration(p.clip_interval, "clip_interval"));
  if (p.decay_beta < 0 || p.decay_beta == kInfPrice) return InvalidArgument("decay_beta: must be finite and not negative");
  LZ_RETURN_IF_ERROR(duration(p.min_hold, "min_hold"));
  return Status::Ok();
}

Status ValidateAdaptiveControl(const AdaptiveControl& s, const AdaptiveFieldNames& names) {
  const std::string cap = names.cap, min_value = names.min_value, max_value = names.max_value;
  if (s.cap <= 0) return InvalidArgument(cap + ": must be positive");
  if (s.margin_ppm < 0 || s.margin_ppm >= kPpm) return InvalidArgument("margin_ppm: must be in [0, 1000000)");
  if (s.band_ppm < 0 || s.band_ppm > kPpm - s.margin_ppm) {
    return InvalidArgument("band_ppm: must not be negative, and margin_ppm + band_ppm at most 1000000");
  }
  // A controller stepping every microsecond would make one Advance loop a
  // million times per second of engine time.
  if (s.interval < kMicrosPerSecond || s.interval > kMaxDuration) {
    return InvalidArgument("interval: must be at least 1 second (1000000) and at most " + std::to_string(kMaxDuration) +
                           " microseconds (100 years)");
  }
  if (s.rise_ppm < 0 || s.rise_ppm > 100 * kPpm) return InvalidArgument("rise_ppm: must be in [0, 100000000]");
  if (s.rise_min < 1 || s.rise_min == kInfPrice) {
    return InvalidArgument("rise_min: must be finite and at least 1 (a value at 0 must be able to rise)");
  }
  if (s.rise_max < s.rise_min || s.rise_max == kInfPrice) return InvalidArgument("rise_max: must be finite and at least rise_min");
  if (s.fall_step < 0 || s.fall_step == kInfPrice) return InvalidArgument("fall_step: must be finite and not negative");
  if (s.min_value < 0 || s.min_value == kInfPrice) return InvalidArgument(min_value + ": must be finite and not negative");
  if (s.max_value < s.min_value) return InvalidArgument(max_value + ": must be at least " + min_value);
  return Status::Ok();
}

AdaptiveThresholds AdaptiveThresholdsOf(const AdaptiveControl& s) {
  // Rounded down: the measurement must be strictly above the target to rise,
  // so rounding down errs on the side of holding the cap.
  const __int128 cap = s.cap;
  return {static_cast<int64_t>(cap * (kPpm - s.margin_ppm) / kPpm),
          static_cast<int64_t>(cap * (kPpm - s.margin_ppm - s.band_ppm) / kPpm)};
}

Price AdaptiveStep(const AdaptiveControl& s, Price value, int64_t measured, bool reclaim_pending) {
  const auto [target, low] = AdaptiveThresholdsOf(s);
  if (measured > target) {
    Price rise = std::clamp(MulPpmCeil(value, s.rise_ppm), s.rise_min, s.rise_max);
    return std::min(s.max_value, SatAdd(value, rise));
  }
  if (reclaim_pending || measured >= low) return value;
  if (value == kInfPrice) return value;  // Only a saturated rise gets here; stay put rather than jump.
  return std::max(s.min_value, value - std::min(value, s.fall_step));
}

AdaptiveControl ControlOf(const AdaptivePowerCapSpec& s) {
  return {s.cap_w, s.margin_ppm, s.band_ppm, s.interval, s.rise_ppm, s.rise_min, s.rise_max, s.fall_step,
          s.min_floor, s.max_floor};
}

Status ValidateAdaptivePowerCap(const AdaptivePowerCapSpec& s) {
  return ValidateAdaptiveControl(ControlOf(s), {"cap_w", "min_floor", "max_floor"});
}

AdaptiveControl ControlOf(const AdaptiveCarbonBudgetSpec& s) {
  return {s.budget_g_per_h, s.margin_ppm, s.band_ppm, s.interval, s.rise_ppm, s.rise_min, s.rise_max, s.fall_step,
          s.min_price, s.max_price};
}

Status ValidateAdaptiveCarbonBudget(const AdaptiveCarbonBudgetSpec& s) {
  return ValidateAdaptiveControl(ControlOf(s), {"budget_g_per_h", "min_price", "max_price"});
}

Price CarbonFloor(int64_t g_per_kwh, int64_t power_w, Price per_tonne) {
  if (g_per_kwh <= 0 || power_w <= 0 || per_tonne <= 0) return 0;
  // g/kWh x W = mg/h; x price per tonne / 10^9 = price per hour. Rounded up.
  const __int128 mg_per_h = static_cast<__int128>(g_per_kwh) * power_w;
  const __int128 limit = static_cast<__int128>(kInfPrice) * 1'000'000'000;
  if (per_tonne == kInfPrice) return kInfPrice;
  // A 128-bit division is a library call (issue 12: a power-cap step
  // re-floors a row, two divisions a node). When mg/h fits in 64 bits the
  // product fits in 127 and `per_tonne > limit / mg_per_h` is `product > limit`;
  // a rounded product that fits in 64 bits is divided in 64.
  __int128 product;
  if (mg_per_h <= std::numeric_limits<int64_t>::max()) {
    product = mg_per_h * per_tonne;
    if (product > limit) return kInfPrice;
  } else {
    if (static_cast<__int128>(per_tonne) > limit / mg_per_h) return kInfPrice;
    product = mg_per_h * per_tonne;
  }
  const __int128 rounded = product + 999'999'999;
  const __int128 f = rounded <= std::numeric_limits<int64_t>::max()
                         ? static_cast<int64_t>(rounded) / 1'000'000'000
                         : rounded / 1'000'000'000;
  return f >= kInfPrice ? kInfPrice : static_cast<Price>(f);
}

int64_t IntensityAt(const std::vector<std::pair<Micros, int64_t>>& series, Micros t) {
  int64_t intensity = 0;
  for (auto [from, v] : series) {
    if (from > t) break;
    intensity = v;
  }
  return intensity;
}

std::string_view LocalityName(Locality l) {
  switch (l) {
    case Locality::kAny: return "any";
    case Locality::kSameRegion: return "same_region";
    case Locality::kSameZone: return "same_zone";
    case Locality::kSameRow: return "same_row";
    case Locality::kSameRack: return "same_rack";
  }
  return "?";
}

Result<Locality> ParseLocality(std::string_view text, std::string_view field) {
  for (int i = 0; i <= 4; ++i) {
    if (LocalityName(static_cast<Locality>(i)) == text) return static_cast<Locality>(i);
  }
  return InvalidArgument(std::string(field) + ": '" + std::string(text) +
                         "' is not a locality (any, same_region, same_zone, same_row, same_rack)");
}

std::string_view OrderStateName(OrderState s) {
  switch (s) {
    case OrderState::kResting: return "resting";
    case OrderState::kPending: return "pending";
    case OrderState::kFilled: return "filled";
    case OrderState::kCancelled: return "cancelled";
  }
  return "?";
}

std::string_view NodeStatusName(NodeStatus s) {
  switch (s) {
    case NodeStatus::kFree: return "free";
    case NodeStatus::kHeld: return "held";
    case NodeStatus::kContested: return "contested";
    case NodeStatus::kReserved: return "reserved";
    case NodeStatus::kRemoved: return "removed";
  }
  return "?";
}

std::string ReasonNames(uint8_t r) {
  static constexpr std::pair<uint8_t, const char*> kNames[] = {
      {kReasonOutbid, "outbid"}, {kReasonFloor, "floor"}, {kReasonMaintenance, "maintenance"},
      {kReasonExhaustion, "exhaustion"}, {kReasonRelinquish, "relinquish"}};
  std::string s;
  for (auto [bit, name] : kNames) {
    if (r & bit) {
      if (!s.empty()) s += ",";
      s += name;
    }
  }
  return s.empty() ? "none" : s;
}

std::string_view CancelReasonName(CancelReason r) {
  switch (r) {
    case CancelReason::kNone: return "none";
    case CancelReason::kByTenant: return "by_tenant";
    case CancelReason::kOutOfMoney: return "out_of_money";
    case CancelReason::kExhausted: return "exhausted";
    case CancelReason::kRelToLost: return "rel_to_lost";
    case CancelReason::kScopeGone: return "scope_gone";
  }
  return "?";
}

std::string_view EventTypeName(EventType t) {
  switch (t) {
    case EventType::kAllocated: return "allocated";
    case EventType::kReserved: return "reserved";
    case EventType::kNotice: return "notice";
    case EventType::kContestEnded: return "contest_ended";
    case EventType::kTransferred: return "transferred";
    case EventType::kReleased: return "released";
    case EventType::kCharged: return "charged";
    case EventType::kOrderCancelled: return "order_cancelled";
    case EventType::kOrderFilled: return "order_filled";
    case EventType::kGangDropped: return "gang_dropped";
    case EventType::kExhausted: return "exhausted";
    case EventType::kPriceChanged: return "price_changed";
    case EventType::kNodeAdded: return "node_added";
    case EventType::kNodeRemoved: return "node_removed";
  }
  return "?";
}

}  // namespace laissez::market
