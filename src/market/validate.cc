#include "market/validate.h"

#include <string>

namespace laissez::market {
namespace {

std::string Got(int64_t v) { return " (got " + std::to_string(v) + ")"; }

// A finite amount: 0 <= v < kInfPrice (kInfPrice is written "inf" and means
// "no limit", so it is not an amount).
Status Finite(int64_t v, const std::string& field) {
  if (v < 0) return InvalidArgument(field + ": must not be negative" + Got(v));
  if (v >= kInfPrice) return InvalidArgument(field + ": must be finite" + Got(v));
  return Status::Ok();
}
// A limit: finite, or kInfPrice for none.
Status Limit(int64_t v, const std::string& field) {
  if (v < 0) return InvalidArgument(field + ": must not be negative" + Got(v));
  return Status::Ok();
}
Status Name(const std::string& s, const std::string& field) {
  if (s.empty()) return InvalidArgument(field + ": must not be empty");
  return Status::Ok();
}

// A carbon intensity series: (from time, gCO2/kWh), times strictly ascending.
Status Series(const std::vector<std::pair<Micros, int64_t>>& series) {
  Micros last = -1;
  for (size_t i = 0; i < series.size(); ++i) {
    std::string f = "series[" + std::to_string(i) + "]";
    auto [from, intensity] = series[i];
    LZ_RETURN_IF_ERROR(Finite(from, f + ".time"));
    if (from <= last) return InvalidArgument(f + ".time: must increase" + Got(from));
    last = from;
    LZ_RETURN_IF_ERROR(Finite(intensity, f + ".intensity"));
  }
  return Status::Ok();
}

struct PolicyValidator {
  Status operator()(const StaticFloorSpec& s) {
    return Limit(s.price, "price");
  }
  Status operator()(const PowerCapSpec& s) {
    if (!s.row.valid()) return InvalidArgument("row: required");
    if (s.cap_w <= 0) return InvalidArgument("cap_w: must be positive" + Got(s.cap_w));
    if (s.cap_w >= kInfPrice) return InvalidArgument("cap_w: must be finite" + Got(s.cap_w));
    if (s.steps.empty()) return InvalidArgument("steps: must not be empty");
    Ppm last = -1;
    for (size_t i = 0; i < s.steps.size(); ++i) {
      std::string f = "steps[" + std::to_string(i) + "]";
      auto [ppm, floor] = s.steps[i];
      if (ppm < 0) return InvalidArgument(f + ".utilization_ppm: must not be negative" + Got(ppm));
      if (ppm > kMaxUtilizationPpm) {
        return InvalidArgument(f + ".utilization_ppm: must be at most " + std::to_string(kMaxUtilizationPpm) +
                               " (100x the cap)" + Got(ppm));
      }
      if (ppm <= last) return InvalidArgument(f + ".utilization_ppm: must increase" + Got(ppm));
      last = ppm;
      LZ_RETURN_IF_ERROR(Limit(floor, f + ".floor"));
    }
    return Status::Ok();
  }
  Status operator()(const CarbonSpec& s) {
    if (!s.location.valid()) return InvalidArgument("location: required");
    LZ_RETURN_IF_ERROR(Finite(s.price_per_tonne, "price_per_tonne"));
    return Series(s.series);
  }
  Status operator()(const MaintenanceSpec& s) {
    LZ_RETURN_IF_ERROR(Finite(s.start, "start"));
    if (s.end <= s.start) return InvalidArgument("end: must be after start" + Got(s.end));
    return Status::Ok();
  }
  Status operator()(const AdaptivePowerCapSpec& s) {
    if (!s.row.valid()) return InvalidArgument("row: required");
    if (s.cap_w >= kInfPrice) return InvalidArgument("cap_w: must be finite" + Got(s.cap_w));
    // The controller's parameter ranges (types.h), which AddPolicy checks too.
    return ValidateAdaptivePowerCap(s);
  }
  Status operator()(const AdaptiveCarbonBudgetSpec& s) {
    if (!s.region.valid()) return InvalidArgument("region: required");
    if (s.budget_g_per_h >= kInfPrice) return InvalidArgument("budget_g_per_h: must be finite" + Got(s.budget_g_per_h));
    LZ_RETURN_IF_ERROR(Series(s.series));
    return ValidateAdaptiveCarbonBudget(s);
  }
};

struct Dispatch {
  template <typename T>
  Status operator()(const T& o) {
    return Validate(o);
  }
};

}  // namespace

Status ValidateOperation(const Operation& op) {
  LZ_RETURN_IF_ERROR(Finite(op.time, "t"));
  return std::visit(Dispatch{}, op.body);
}

Status Validate(const OpAdvance&) { return Status::Ok(); }

Status Validate(const OpAddNode& o) {
  const auto& i = o.info;
  LZ_RETURN_IF_ERROR(Name(i.name, "name"));
  LZ_RETURN_IF_ERROR(Name(i.type, "type"));
  if (i.meta.gpus < 0) return InvalidArgument("gpus: must not be negative" + Got(i.meta.gpus));
  if (i.meta.memory_gb < 0) return InvalidArgument("memory_gb: must not be negative" + Got(i.meta.memory_gb));
  if (i.meta.power_w < 0) return InvalidArgument("power_w: must not be negative" + Got(i.meta.power_w));
  return Status::Ok();
}

Status Validate(const OpRemoveNode& o) {
  if (!o.node.valid()) return InvalidArgument("node: required");
  return Status::Ok();
}

Status Validate(const OpSetParams& o) { return ValidateParams(o.params); }

Status Validate(const OpAddPolicy& o) { return std::visit(PolicyValidator{}, o.spec); }

Status Validate(const OpRemovePolicy& o) {
  if (!o.policy.valid()) return InvalidArgument("policy: required");
  return Status::Ok();
}

Status Validate(const OpCreateTenant& o) {
  LZ_RETURN_IF_ERROR(Name(o.name, "name"));
  LZ_RETURN_IF_ERROR(Finite(o.balance, "balance"));
  return Limit(o.max_rate, "max_rate");
}

Status Validate(const OpDeposit& o) {
  if (!o.tenant.valid()) return InvalidArgument("tenant: required");
  if (o.amount <= 0) return InvalidArgument("amount: must be positive" + Got(o.amount));
  return Finite(o.amount, "amount");
}

Status Validate(const OpSetMaxRate& o) {
  if (!o.tenant.valid()) return InvalidArgument("tenant: required");
  return Limit(o.max_rate, "max_rate");
}

Status Validate(const OpPlaceOrder& o) {
  if (!o.tenant.valid()) return InvalidArgument("tenant: required");
  if (!o.spec.scope.valid()) return InvalidArgument("scope: required");
  LZ_RETURN_IF_ERROR(Limit(o.spec.price, "price"));
  if (o.spec.count < 1) return InvalidArgument("count: must be at least 1");
  return Status::Ok();
}

Status Validate(const OpUpdateOrder& o) {
  if (!o.tenant.valid()) return InvalidArgument("tenant: required");
  return Limit(o.price, "price");
}

Status Validate(const OpCancelOrder& o) {
  if (!o.tenant.valid()) return InvalidArgument("tenant: required");
  return Status::Ok();
}

Status Validate(const OpSetLimit& o) {
  if (!o.tenant.valid()) return InvalidArgument("tenant: required");
  if (!o.node.valid()) return InvalidArgument("node: required");
  return Limit(o.limit, "limit");
}

Status Validate(const OpRelinquish& o) {
  if (!o.tenant.valid()) return InvalidArgument("tenant: required");
  if (!o.node.valid()) return InvalidArgument("node: required");
  return Status::Ok();
}

Status Validate(const OpSetAdaptiveCap& o) {
  // The cap of either adaptive kind: watts, or grams CO2 per hour.
  if (!o.policy.valid()) return InvalidArgument("policy: required");
  if (o.cap <= 0) return InvalidArgument("cap: must be positive" + Got(o.cap));
  return Finite(o.cap, "cap");
}

}  // namespace laissez::market
