#include "market/types.h"

#include <algorithm>
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

Status ValidateAdaptivePowerCap(const AdaptivePowerCapSpec& s) {
  if (s.cap_w <= 0) return InvalidArgument("cap_w: must be positive");
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
    return InvalidArgument("rise_min: must be finite and at least 1 (a floor at 0 must be able to rise)");
  }
  if (s.rise_max < s.rise_min || s.rise_max == kInfPrice) return InvalidArgument("rise_max: must be finite and at least rise_min");
  if (s.fall_step < 0 || s.fall_step == kInfPrice) return InvalidArgument("fall_step: must be finite and not negative");
  if (s.min_floor < 0 || s.min_floor == kInfPrice) return InvalidArgument("min_floor: must be finite and not negative");
  if (s.max_floor < s.min_floor) return InvalidArgument("max_floor: must be at least min_floor");
  return Status::Ok();
}

Price AdaptiveStep(const AdaptivePowerCapSpec& s, Price floor, int64_t staying_w, bool reclaim_pending) {
  // Thresholds in watts, rounded down: the row must be strictly above the
  // target to rise, so rounding down errs on the side of holding the cap.
  const __int128 cap = s.cap_w;
  const __int128 target = cap * (kPpm - s.margin_ppm) / kPpm;
  const __int128 low = cap * (kPpm - s.margin_ppm - s.band_ppm) / kPpm;
  if (staying_w > target) {
    Price rise = std::clamp(MulPpmCeil(floor, s.rise_ppm), s.rise_min, s.rise_max);
    return std::min(s.max_floor, SatAdd(floor, rise));
  }
  if (reclaim_pending || staying_w >= low) return floor;
  if (floor == kInfPrice) return floor;  // Only a saturated rise gets here; stay put rather than jump.
  return std::max(s.min_floor, floor - std::min(floor, s.fall_step));
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
