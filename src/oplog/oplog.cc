#include "oplog/oplog.h"

#include "common/check.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <limits>
#include <vector>

namespace laissez::oplog {

using market::Event;
using market::EventType;
using market::Operation;

namespace {

// ---------------------------------------------------------------------------
// Keys. One table for operations and events, so a key means the same thing
// everywhere and a presence set fits in one 64-bit mask.

enum Key : uint8_t {
  kV, kT, kOp, kEvent, kId, kNode, kTenant, kOther, kOrder, kPolicy, kVertex, kScope, kPrice, kCount,
  kLocality, kRelTo, kLimit, kAmount, kWaived, kBalance, kMaxRate, kDeadline, kReasons, kCancelReason,
  kName, kType, kRegion, kZone, kRow, kRack, kGpus, kMemoryGb, kPowerW, kGrace, kHysteresisPpm, kTick,
  kClipAlphaPpm, kClipInterval, kDecayBeta, kMinHold, kKind, kLocation, kCapW, kSteps, kPricePerTonne,
  kSeries, kStart, kEnd, kMarginPpm, kBandPpm, kInterval, kRisePpm, kRiseMin, kRiseMax, kFallStep, kMinFloor,
  kMaxFloor, kCap, kBudgetGPerH, kMinPrice, kMaxPrice, kKey, kNumKeys
};
static_assert(kNumKeys <= 64);

constexpr std::string_view kKeyNames[kNumKeys] = {
    "v", "t", "op", "event", "id", "node", "tenant", "other", "order", "policy", "vertex", "scope", "price",
    "count", "locality", "rel_to", "limit", "amount", "waived", "balance", "max_rate", "deadline", "reasons",
    "cancel_reason", "name", "type", "region", "zone", "row", "rack", "gpus", "memory_gb", "power_w", "grace",
    "hysteresis_ppm", "tick", "clip_alpha_ppm", "clip_interval", "decay_beta", "min_hold", "kind", "location",
    "cap_w", "steps", "price_per_tonne", "series", "start", "end", "margin_ppm", "band_ppm", "interval", "rise_ppm",
    "rise_min", "rise_max", "fall_step", "min_floor", "max_floor", "cap", "budget_g_per_h", "min_price", "max_price",
    "key"};

// Keys whose value is text rather than a number.
constexpr uint64_t Bit(Key k) { return uint64_t{1} << k; }
constexpr uint64_t kStringKeys = Bit(kOp) | Bit(kEvent) | Bit(kLocality) | Bit(kReasons) | Bit(kCancelReason) |
                                 Bit(kName) | Bit(kType) | Bit(kRegion) | Bit(kZone) | Bit(kRow) | Bit(kRack) |
                                 Bit(kKind) | Bit(kKey);
constexpr uint64_t kPairKeys = Bit(kSteps) | Bit(kSeries);
// The controller parameters of an adaptive power cap (besides location and
// cap_w) and of an adaptive carbon budget (besides location, budget and series).
constexpr uint64_t kControlKeys = Bit(kMarginPpm) | Bit(kBandPpm) | Bit(kInterval) | Bit(kRisePpm) | Bit(kRiseMin) |
                                  Bit(kRiseMax) | Bit(kFallStep);
constexpr uint64_t kAdaptiveKeys = kControlKeys | Bit(kMinFloor) | Bit(kMaxFloor);
constexpr uint64_t kCarbonBudgetKeys = kControlKeys | Bit(kMinPrice) | Bit(kMaxPrice);

// A hash of a key's length and first, second and last letters: distinct for
// today's keys (issue 12: a scan of the names was a fifth of the parse); a
// key added later that shares one fails the build (kKeyByHash).
constexpr uint8_t KeyHash(std::string_view key) {
  unsigned second = key.size() > 1 ? static_cast<unsigned char>(key[1]) : 0;
  return static_cast<uint8_t>(key.size() * 10 + static_cast<unsigned char>(key[0]) * 26 + second * 6 +
                              static_cast<unsigned char>(key.back()));
}

// Per hash: the key with it, or -1.
constexpr std::array<int8_t, 256> kKeyByHash = [] {
  std::array<int8_t, 256> t{};
  t.fill(-1);
  for (int i = 0; i < kNumKeys; ++i) {
    int8_t& e = t[KeyHash(kKeyNames[i])];
    if (e != -1) throw "two keys share a KeyHash: change the hash";  // Fails the build.
    e = static_cast<int8_t>(i);
  }
  return t;
}();

int LookupKey(std::string_view key) {
  if (key.empty()) return -1;
  int i = kKeyByHash[KeyHash(key)];
  return i >= 0 && kKeyNames[i] == key ? i : -1;
}

// Each key of at most 8 letters as the word its bytes make in memory (little-endian), zeros
// after it; for the compact lines' keys (LookupKeyPadded).
static_assert(std::endian::native == std::endian::little);
constexpr std::array<uint64_t, kNumKeys> kKeyWord = [] {
  std::array<uint64_t, kNumKeys> t{};
  for (int i = 0; i < kNumKeys; ++i) {
    if (kKeyNames[i].size() > 8) continue;
    for (size_t j = 0; j < kKeyNames[i].size(); ++j) {
      t[i] |= uint64_t{static_cast<unsigned char>(kKeyNames[i][j])} << (8 * j);
    }
  }
  return t;
}();

// LookupKey of the n bytes at `key`, which are followed by at least 8 readable bytes (a
// padded line): a key of at most 8 letters is compared as one word (issue 12: the name's
// comparison was most of a lookup).
int LookupKeyPadded(const char* key, size_t n) {
  if (n == 0 || n > 8) return LookupKey(std::string_view(key, n));
  uint64_t w;
  std::memcpy(&w, key, 8);
  w &= ~uint64_t{0} >> (64 - 8 * n);
  const int i = kKeyByHash[KeyHash(std::string_view(key, n))];
  return i >= 0 && kKeyWord[i] == w && kKeyNames[i].size() == n ? i : -1;
}

std::string Quoted(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string r(s.substr(0, kMax));
  if (s.size() > kMax) r += "...";
  return r;
}

Status Bad(Key k, std::string_view why) { return InvalidArgument(std::string(kKeyNames[k]) + ": " + std::string(why)); }

// ---------------------------------------------------------------------------
// Encoding.

void AppendEscaped(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out->append("\\u00");
          out->push_back(kHex[(c >> 4) & 0xf]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

class Writer {
 public:
  explicit Writer(std::string* out) : o_(out) {}
  void K(Key k) {
    o_->push_back(',');
    o_->push_back('"');
    o_->append(kKeyNames[k]);
    o_->append("\":");
  }
  void Int(int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    o_->append(buf, r.ptr);
  }
  void UInt(uint64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    o_->append(buf, r.ptr);
  }
  void Int(Key k, int64_t v) { K(k); Int(v); }
  void Price(Key k, int64_t v) {
    K(k);
    if (v == kInfPrice) o_->append("\"inf\"");
    else Int(v);
  }
  void Time(Key k, int64_t v) {
    K(k);
    if (v == kNever) o_->append("\"never\"");
    else Int(v);
  }
  template <typename IdT>
  void Id(Key k, IdT id) { K(k); UInt(id.value); }
  template <typename IdT>
  void IdIfValid(Key k, IdT id) {
    if (id.valid()) Id(k, id);
  }
  void Str(Key k, std::string_view s) { K(k); AppendEscaped(s, o_); }
  void Raw(std::string_view s) { o_->append(s); }

 private:
  std::string* o_;
};

void AppendTarget(Writer& w, const market::FloorTarget& t) {
  w.IdIfValid(kLocation, t.location);
  w.IdIfValid(kNode, t.node);
}

struct OpEncoder {
  Writer& w;
  void operator()(const market::OpAdvance&) {}
  void operator()(const market::OpAddNode& o) {
    w.Str(kName, o.info.name);
    w.Str(kType, o.info.type);
    w.Str(kRegion, o.info.region);
    w.Str(kZone, o.info.zone);
    w.Str(kRow, o.info.row);
    w.Str(kRack, o.info.rack);
    w.Int(kGpus, o.info.meta.gpus);
    w.Int(kMemoryGb, o.info.meta.memory_gb);
    w.Int(kPowerW, o.info.meta.power_w);
  }
  void operator()(const market::OpRemoveNode& o) { w.Id(kNode, o.node); }
  void operator()(const market::OpSetParams& o) {
    const auto& p = o.params;
    w.Int(kGrace, p.grace);
    w.Int(kHysteresisPpm, p.hysteresis_ppm);
    w.Int(kTick, p.tick);
    w.Int(kClipAlphaPpm, p.clip_alpha_ppm);
    w.Int(kClipInterval, p.clip_interval);
    w.Int(kDecayBeta, p.decay_beta);
    w.Int(kMinHold, p.min_hold);
  }
  void operator()(const market::OpAddPolicy& o) {
    w.K(kKind);
    w.Raw("\"");
    w.Raw(PolicyKindName(o.spec));
    w.Raw("\"");
    std::visit(*this, o.spec);
  }
  void operator()(const market::StaticFloorSpec& s) {
    AppendTarget(w, s.target);
    w.Price(kPrice, s.price);
  }
  // [[a, b], ...]; b is written "inf" when it is kInfPrice and `inf` allows it.
  void Pairs(Key k, const std::vector<std::pair<int64_t, int64_t>>& pairs, bool inf) {
    w.K(k);
    w.Raw("[");
    bool first = true;
    for (auto [a, b] : pairs) {
      w.Raw(first ? "[" : ",[");
      first = false;
      w.Int(a);
      w.Raw(",");
      if (inf && b == kInfPrice) w.Raw("\"inf\"");
      else w.Int(b);
      w.Raw("]");
    }
    w.Raw("]");
  }
  void operator()(const market::PowerCapSpec& s) {
    w.Id(kLocation, s.row);
    w.Int(kCapW, s.cap_w);
    Pairs(kSteps, s.steps, true);
  }
  void Series(const std::vector<std::pair<Micros, int64_t>>& series) { Pairs(kSeries, series, false); }
  // The controller's fields, in the order of AdaptiveControl.
  void Control(const market::AdaptiveControl& c) {
    w.Int(kMarginPpm, c.margin_ppm);
    w.Int(kBandPpm, c.band_ppm);
    w.Int(kInterval, c.interval);
    w.Int(kRisePpm, c.rise_ppm);
    w.Int(kRiseMin, c.rise_min);
    w.Int(kRiseMax, c.rise_max);
    w.Int(kFallStep, c.fall_step);
  }
  void operator()(const market::AdaptiveCarbonBudgetSpec& s) {
    w.Id(kLocation, s.region);
    w.Int(kBudgetGPerH, s.budget_g_per_h);
    Series(s.series);
    Control(market::ControlOf(s));
    w.Int(kMinPrice, s.min_price);
    w.Price(kMaxPrice, s.max_price);
  }
  void operator()(const market::CarbonSpec& s) {
    w.Id(kLocation, s.location);
    w.Int(kPricePerTonne, s.price_per_tonne);
    Series(s.series);
  }
  void operator()(const market::MaintenanceSpec& s) {
    AppendTarget(w, s.target);
    w.Int(kStart, s.start);
    w.Time(kEnd, s.end);
  }
  void operator()(const market::AdaptivePowerCapSpec& s) {
    w.Id(kLocation, s.row);
    w.Int(kCapW, s.cap_w);
    Control(market::ControlOf(s));
    w.Int(kMinFloor, s.min_floor);
    w.Price(kMaxFloor, s.max_floor);
  }
  void operator()(const market::OpRemovePolicy& o) { w.Id(kPolicy, o.policy); }
  void operator()(const market::OpCreateTenant& o) {
    w.Str(kName, o.name);
    w.Int(kBalance, o.balance);
    w.Price(kMaxRate, o.max_rate);
  }
  void operator()(const market::OpDeposit& o) {
    w.Id(kTenant, o.tenant);
    w.Int(kAmount, o.amount);
  }
  void operator()(const market::OpSetMaxRate& o) {
    w.Id(kTenant, o.tenant);
    w.Price(kMaxRate, o.max_rate);
  }
  void operator()(const market::OpPlaceOrder& o) {
    w.Id(kTenant, o.tenant);
    w.Id(kScope, o.spec.scope);
    w.Price(kPrice, o.spec.price);
    w.Int(kCount, o.spec.count);
    if (o.spec.locality != market::Locality::kAny) {
      w.K(kLocality);
      w.Raw("\"");
      w.Raw(market::LocalityName(o.spec.locality));
      w.Raw("\"");
    }
    w.IdIfValid(kRelTo, o.spec.rel_to);
  }
  void operator()(const market::OpUpdateOrder& o) {
    w.Id(kTenant, o.tenant);
    w.Id(kOrder, o.order);
    w.Price(kPrice, o.price);
  }
  void operator()(const market::OpCancelOrder& o) {
    w.Id(kTenant, o.tenant);
    w.Id(kOrder, o.order);
  }
  void operator()(const market::OpSetLimit& o) {
    w.Id(kTenant, o.tenant);
    w.Id(kNode, o.node);
    w.Price(kLimit, o.limit);
  }
  void operator()(const market::OpRelinquish& o) {
    w.Id(kTenant, o.tenant);
    w.Id(kNode, o.node);
  }
  void operator()(const market::OpSetAdaptiveCap& o) {
    w.Id(kPolicy, o.policy);
    w.Int(kCap, o.cap);
  }
};

// The fields each event type always carries (others are written when set).
uint64_t EventFields(EventType t) {
  switch (t) {
    case EventType::kAllocated: return Bit(kNode) | Bit(kTenant) | Bit(kOrder) | Bit(kPrice);
    case EventType::kReserved: return Bit(kNode) | Bit(kTenant) | Bit(kOrder);
    case EventType::kNotice: return Bit(kNode) | Bit(kTenant) | Bit(kPrice) | Bit(kDeadline) | Bit(kReasons);
    case EventType::kContestEnded: return Bit(kNode) | Bit(kTenant);
    case EventType::kTransferred: return Bit(kNode) | Bit(kTenant) | Bit(kOther) | Bit(kOrder) | Bit(kPrice);
    case EventType::kReleased: return Bit(kNode) | Bit(kTenant) | Bit(kReasons);
    case EventType::kCharged: return Bit(kNode) | Bit(kTenant) | Bit(kPrice) | Bit(kAmount) | Bit(kWaived);
    case EventType::kOrderCancelled: return Bit(kOrder) | Bit(kTenant) | Bit(kCancelReason);
    case EventType::kOrderFilled: return Bit(kOrder) | Bit(kTenant);
    case EventType::kGangDropped: return Bit(kOrder) | Bit(kTenant) | Bit(kDeadline);
    case EventType::kExhausted: return Bit(kTenant);
    case EventType::kPriceChanged: return Bit(kVertex) | Bit(kPrice);
    case EventType::kNodeAdded: return Bit(kNode);
    case EventType::kNodeRemoved: return Bit(kNode);
  }
  return 0;
}

// The event types are numbered 0..kNodeRemoved (market/types.h); a new type is a
// new case in EventFields above (-Wswitch), and must move this bound if it comes last.
constexpr int kNumEventTypes = static_cast<int>(EventType::kNodeRemoved) + 1;
constexpr int kNumCancelReasons = static_cast<int>(market::CancelReason::kScopeGone) + 1;  // Likewise.

// ---------------------------------------------------------------------------
// Decoding: one pass over the object's fields fills slots; then the operation
// or event is built from the slots, checking each field's range.

struct Slot {
  enum Kind : uint8_t { kNumber, kString } kind = kNumber;
  uint64_t num = 0;
  std::string_view text;  // The string's value, or the number's raw token.
};

struct Fields {
  uint64_t present = 0;
  Slot slot[kNumKeys];
  // Pairs of steps (price may be infinite) and series.
  std::vector<std::pair<Ppm, Price>> steps;
  std::vector<std::pair<Micros, int64_t>> series;

  bool has(Key k) const { return present & Bit(k); }
};

// Parses a non-negative integer token; the reason otherwise.
Status ParseUnsigned(Key k, std::string_view tok, uint64_t* out) {
  while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\t' || tok.back() == '\r' || tok.back() == '\n')) {
    tok.remove_suffix(1);
  }
  if (tok.empty()) return Bad(k, "is empty");
  if (tok[0] == '-') return Bad(k, "must not be negative (got " + Quoted(tok) + ")");
  if (tok[0] < '0' || tok[0] > '9') {
    if (tok == "true" || tok == "false" || tok == "null" || tok[0] == '{' || tok[0] == '[') {
      return Bad(k, "must be a non-negative integer (got " + Quoted(tok) + ")");
    }
    return Bad(k, "is not a number (got " + Quoted(tok) + ")");
  }
  auto r = std::from_chars(tok.data(), tok.data() + tok.size(), *out);
  if (r.ec == std::errc::result_out_of_range) return Bad(k, "overflows int64 (got " + Quoted(tok) + ")");
  if (r.ptr != tok.data() + tok.size()) {
    char c = *r.ptr;
    if (c == '.' || c == 'e' || c == 'E') {
      return Bad(k, "must be a whole number of micro-units or microseconds, no fraction or exponent (got " +
                        Quoted(tok) + ")");
    }
    return Bad(k, "is not a number (got " + Quoted(tok) + ")");
  }
  if (tok.size() > 1 && tok[0] == '0') return Bad(k, "has a leading zero (got " + Quoted(tok) + ")");
  return Status::Ok();
}

std::string JsonError(simdjson::error_code err) {
  return std::string("line: not valid JSON (") + simdjson::error_message(err) + ")";
}

Status ParsePairs(Key k, simdjson::ondemand::value& val, Fields* f) {
  simdjson::ondemand::array arr;
  if (val.get_array().get(arr)) return Bad(k, "must be an array of [number, number] pairs");
  size_t index = 0;
  for (auto elem_result : arr) {
    if (auto err = elem_result.error()) return InvalidArgument(JsonError(err));
    simdjson::ondemand::value& elem = elem_result.value_unsafe();
    simdjson::ondemand::array pair;
    std::string where = std::string(kKeyNames[k]) + "[" + std::to_string(index) + "]";
    if (elem.get_array().get(pair)) return InvalidArgument(where + ": must be a [number, number] pair");
    int64_t parts[2] = {0, 0};
    int n = 0;
    for (auto part_result : pair) {
      if (auto err = part_result.error()) return InvalidArgument(JsonError(err));
      simdjson::ondemand::value& part = part_result.value_unsafe();
      if (n >= 2) return InvalidArgument(where + ": has more than 2 elements");
      std::string_view tok = part.raw_json_token();
      if (k == kSteps && n == 1 && !tok.empty() && tok[0] == '"') {
        std::string_view s;
        if (part.get_string().get(s) || s != "inf") {
          return InvalidArgument(where + ": the price must be an integer or \"inf\"");
        }
        parts[n++] = kInfPrice;
        continue;
      }
      uint64_t u;
      Status st = ParseUnsigned(k, tok, &u);
      if (!st.ok()) return InvalidArgument(where + st.message().substr(kKeyNames[k].size()));
      if (u >= static_cast<uint64_t>(kInfPrice)) {
        return InvalidArgument(where + ": overflows int64 (got " + Quoted(tok) + ")");
      }
      parts[n++] = static_cast<int64_t>(u);
    }
    if (n != 2) return InvalidArgument(where + ": must have exactly 2 elements");
    if (k == kSteps) f->steps.emplace_back(parts[0], parts[1]);
    else f->series.emplace_back(parts[0], parts[1]);
    ++index;
  }
  return Status::Ok();
}

// The reading side of `Fields`: typed accessors that name the field on error.
class Reader {
 public:
  Reader(const Fields& f, const DecodeOptions& options) : f_(f), options_(options) {}

  bool has(Key k) const { return f_.has(k); }

  Status Missing(Key k) const { return Bad(k, "is required"); }

  // A finite non-negative int64.
  Status Int(Key k, int64_t* out, bool required = true) const {
    if (!has(k)) return required ? Missing(k) : Status::Ok();
    const Slot& s = f_.slot[k];
    if (s.kind != Slot::kNumber) return Bad(k, "must be a non-negative integer (got \"" + Quoted(s.text) + "\")");
    if (s.num > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(k, "overflows int64 (got " + Quoted(s.text) + ")");
    }
    *out = static_cast<int64_t>(s.num);
    return Status::Ok();
  }
  template <typename T>
  Status Narrow(Key k, T* out, bool required = true) const {
    int64_t v = static_cast<int64_t>(*out);
    LZ_RETURN_IF_ERROR(Int(k, &v, required));
    if (v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return Bad(k, "must be at most " + std::to_string(std::numeric_limits<T>::max()) + " (got " +
                        Quoted(f_.slot[k].text) + ")");
    }
    *out = static_cast<T>(v);
    return Status::Ok();
  }
  // Micro-units (per hour for prices); "inf" for the infinite sentinel when allowed.
  Status Price(Key k, int64_t* out, bool allow_inf, bool required = true) const {
    if (!has(k)) return required ? Missing(k) : Status::Ok();
    const Slot& s = f_.slot[k];
    if (s.kind == Slot::kString) {
      if (s.text == "inf" && allow_inf) {
        *out = kInfPrice;
        return Status::Ok();
      }
      if (s.text == "inf" || s.text == "Infinity") return Bad(k, "must be finite");
      return Bad(k, std::string("must be an integer count of micro-units") + (allow_inf ? " or \"inf\"" : "") +
                        " (got \"" + Quoted(s.text) + "\")");
    }
    if (s.num >= static_cast<uint64_t>(kInfPrice)) {
      return Bad(k, "overflows int64 micro-units (got " + Quoted(s.text) + ")" +
                        (allow_inf ? "; write \"inf\" for no limit" : ""));
    }
    *out = static_cast<int64_t>(s.num);
    return Status::Ok();
  }
  // Microseconds; "never" for the open end when allowed.
  Status Time(Key k, int64_t* out, bool allow_never, bool required = true) const {
    if (!has(k)) return required ? Missing(k) : Status::Ok();
    const Slot& s = f_.slot[k];
    if (s.kind == Slot::kString) {
      if (s.text == "never" && allow_never) {
        *out = kNever;
        return Status::Ok();
      }
      return Bad(k, std::string("must be an integer count of microseconds") + (allow_never ? " or \"never\"" : "") +
                        " (got \"" + Quoted(s.text) + "\")");
    }
    if (s.num >= static_cast<uint64_t>(kNever)) {
      return Bad(k, "overflows int64 microseconds (got " + Quoted(s.text) + ")");
    }
    *out = static_cast<int64_t>(s.num);
    return Status::Ok();
  }
  template <typename IdT>
  Status Id(Key k, IdT* out, bool required = true) const {
    if (!has(k)) return required ? Missing(k) : Status::Ok();
    const Slot& s = f_.slot[k];
    if (s.kind == Slot::kString) {
      return Bad(k, "must be a numeric id (got \"" + Quoted(s.text) + "\")");
    }
    if (s.num > static_cast<uint64_t>(std::numeric_limits<typename IdT::rep>::max())) {
      return Bad(k, "is not a valid id (got " + Quoted(s.text) + ")");
    }
    out->value = static_cast<typename IdT::rep>(s.num);
    return Status::Ok();
  }
  // A node id, or a node name when a topology is given.
  Status Node(Key k, NodeId* out, bool required = true) const {
    if (has(k) && f_.slot[k].kind == Slot::kString) {
      if (options_.topology == nullptr) return Bad(k, "names need a topology; write the numeric node id");
      auto r = options_.topology->FindNode(f_.slot[k].text);
      if (!r.ok()) return Bad(k, "no node named \"" + Quoted(f_.slot[k].text) + "\"");
      *out = *r;
      return Status::Ok();
    }
    return Id(k, out, required);
  }
  Status Vertex(Key k, VertexId* out, bool required = true) const {
    if (has(k) && f_.slot[k].kind == Slot::kString) {
      if (options_.topology == nullptr) return Bad(k, "names need a topology; write the numeric vertex id");
      auto r = options_.topology->FindVertex(f_.slot[k].text);
      if (!r.ok()) return Bad(k, "no vertex named \"" + Quoted(f_.slot[k].text) + "\"");
      *out = *r;
      return Status::Ok();
    }
    return Id(k, out, required);
  }
  Status Location(Key k, LocationId* out, bool required = true) const {
    if (has(k) && f_.slot[k].kind == Slot::kString) {
      if (options_.topology == nullptr) return Bad(k, "names need a topology; write the numeric location id");
      auto r = options_.topology->FindLocation(f_.slot[k].text);
      if (!r.ok()) return Bad(k, "no location with path \"" + Quoted(f_.slot[k].text) + "\"");
      *out = *r;
      return Status::Ok();
    }
    return Id(k, out, required);
  }
  Status Str(Key k, std::string* out, bool required = true) const {
    if (!has(k)) return required ? Missing(k) : Status::Ok();
    out->assign(f_.slot[k].text);
    return Status::Ok();
  }
  Status Target(market::FloorTarget* t) const {
    LZ_RETURN_IF_ERROR(Location(kLocation, &t->location, false));
    // Neither is the engine's to reject (as it did live): the log stays lossless.
    return Node(kNode, &t->node, false);
  }

  const Fields& fields() const { return f_; }

 private:
  const Fields& f_;
  const DecodeOptions& options_;
};

constexpr uint64_t kCommonOp = Bit(kV) | Bit(kT) | Bit(kOp) | Bit(kKey);

struct OpKind {
  std::string_view name;
  uint64_t allowed;  // Besides v, t, op.
};

constexpr uint64_t kTargetKeys = Bit(kLocation) | Bit(kNode);
constexpr OpKind kOpKinds[] = {
    {"advance", 0},
    {"add_node", Bit(kId) | Bit(kName) | Bit(kType) | Bit(kRegion) | Bit(kZone) | Bit(kRow) | Bit(kRack) |
                     Bit(kGpus) | Bit(kMemoryGb) | Bit(kPowerW)},
    {"remove_node", Bit(kNode)},
    {"set_params", Bit(kGrace) | Bit(kHysteresisPpm) | Bit(kTick) | Bit(kClipAlphaPpm) | Bit(kClipInterval) |
                       Bit(kDecayBeta) | Bit(kMinHold)},
    {"add_policy", Bit(kId) | Bit(kKind) | kTargetKeys | Bit(kPrice) | Bit(kCapW) | Bit(kSteps) |
                       Bit(kPricePerTonne) | Bit(kSeries) | Bit(kStart) | Bit(kEnd) | kAdaptiveKeys |
                       Bit(kBudgetGPerH) | kCarbonBudgetKeys},
    {"remove_policy", Bit(kPolicy)},
    {"create_tenant", Bit(kId) | Bit(kName) | Bit(kBalance) | Bit(kMaxRate)},
    {"deposit", Bit(kTenant) | Bit(kAmount)},
    {"set_max_rate", Bit(kTenant) | Bit(kMaxRate)},
    {"place_order", Bit(kId) | Bit(kTenant) | Bit(kScope) | Bit(kPrice) | Bit(kCount) | Bit(kLocality) |
                        Bit(kRelTo)},
    {"update_order", Bit(kTenant) | Bit(kOrder) | Bit(kPrice)},
    {"cancel_order", Bit(kTenant) | Bit(kOrder)},
    {"set_limit", Bit(kTenant) | Bit(kNode) | Bit(kLimit)},
    {"relinquish", Bit(kTenant) | Bit(kNode)},
    {"set_adaptive_cap", Bit(kPolicy) | Bit(kCap)},
};
static_assert(std::size(kOpKinds) == std::variant_size_v<market::OpBody>);

Status CheckAllowed(uint64_t present, uint64_t allowed, std::string_view what) {
  uint64_t extra = present & ~allowed;
  if (extra == 0) return Status::Ok();
  int k = __builtin_ctzll(extra);
  return InvalidArgument(std::string(kKeyNames[k]) + ": is not a field of " + std::string(what));
}

// The controller's fields shared by the adaptive kinds; all required.
Status ReadControl(const Reader& r, Ppm* margin_ppm, Ppm* band_ppm, Micros* interval, Ppm* rise_ppm, Price* rise_min,
                   Price* rise_max, Price* fall_step) {
  LZ_RETURN_IF_ERROR(r.Int(kMarginPpm, margin_ppm));
  LZ_RETURN_IF_ERROR(r.Int(kBandPpm, band_ppm));
  LZ_RETURN_IF_ERROR(r.Time(kInterval, interval, false));
  LZ_RETURN_IF_ERROR(r.Int(kRisePpm, rise_ppm));
  LZ_RETURN_IF_ERROR(r.Price(kRiseMin, rise_min, false));
  LZ_RETURN_IF_ERROR(r.Price(kRiseMax, rise_max, false));
  return r.Price(kFallStep, fall_step, false);
}

Status BuildPolicy(const Reader& r, market::PolicySpec* out) {
  std::string kind;
  LZ_RETURN_IF_ERROR(r.Str(kKind, &kind));
  uint64_t p = r.fields().present;
  if (kind == "static_floor") {
    LZ_RETURN_IF_ERROR(CheckAllowed(p, kCommonOp | Bit(kId) | Bit(kKind) | kTargetKeys | Bit(kPrice),
                                    "add_policy static_floor"));
    market::StaticFloorSpec s;
    LZ_RETURN_IF_ERROR(r.Target(&s.target));
    LZ_RETURN_IF_ERROR(r.Price(kPrice, &s.price, true));
    *out = s;
  } else if (kind == "power_cap") {
    LZ_RETURN_IF_ERROR(CheckAllowed(p, kCommonOp | Bit(kId) | Bit(kKind) | Bit(kLocation) | Bit(kCapW) | Bit(kSteps),
                                    "add_policy power_cap"));
    market::PowerCapSpec s;
    LZ_RETURN_IF_ERROR(r.Location(kLocation, &s.row));
    LZ_RETURN_IF_ERROR(r.Int(kCapW, &s.cap_w));
    if (!r.has(kSteps)) return r.Missing(kSteps);
    s.steps = r.fields().steps;
    *out = std::move(s);
  } else if (kind == "adaptive_power_cap") {
    LZ_RETURN_IF_ERROR(CheckAllowed(p, kCommonOp | Bit(kId) | Bit(kKind) | Bit(kLocation) | Bit(kCapW) | kAdaptiveKeys,
                                    "add_policy adaptive_power_cap"));
    // Every field is required: a log states the whole controller, so a later
    // change of a default cannot change what an old log replays to.
    market::AdaptivePowerCapSpec s;
    LZ_RETURN_IF_ERROR(r.Location(kLocation, &s.row));
    LZ_RETURN_IF_ERROR(r.Int(kCapW, &s.cap_w));
    LZ_RETURN_IF_ERROR(ReadControl(r, &s.margin_ppm, &s.band_ppm, &s.interval, &s.rise_ppm, &s.rise_min, &s.rise_max,
                                   &s.fall_step));
    LZ_RETURN_IF_ERROR(r.Price(kMinFloor, &s.min_floor, false));
    LZ_RETURN_IF_ERROR(r.Price(kMaxFloor, &s.max_floor, true));
    *out = s;
  } else if (kind == "adaptive_carbon_budget") {
    LZ_RETURN_IF_ERROR(CheckAllowed(p, kCommonOp | Bit(kId) | Bit(kKind) | Bit(kLocation) | Bit(kBudgetGPerH) |
                                           Bit(kSeries) | kCarbonBudgetKeys,
                                    "add_policy adaptive_carbon_budget"));
    // Every field is required, as for adaptive_power_cap.
    market::AdaptiveCarbonBudgetSpec s;
    LZ_RETURN_IF_ERROR(r.Location(kLocation, &s.region));
    LZ_RETURN_IF_ERROR(r.Int(kBudgetGPerH, &s.budget_g_per_h));
    if (!r.has(kSeries)) return r.Missing(kSeries);
    s.series = r.fields().series;
    LZ_RETURN_IF_ERROR(ReadControl(r, &s.margin_ppm, &s.band_ppm, &s.interval, &s.rise_ppm, &s.rise_min, &s.rise_max,
                                   &s.fall_step));
    LZ_RETURN_IF_ERROR(r.Price(kMinPrice, &s.min_price, false));
    LZ_RETURN_IF_ERROR(r.Price(kMaxPrice, &s.max_price, true));
    *out = std::move(s);
  } else if (kind == "carbon") {
    LZ_RETURN_IF_ERROR(CheckAllowed(
        p, kCommonOp | Bit(kId) | Bit(kKind) | Bit(kLocation) | Bit(kPricePerTonne) | Bit(kSeries), "add_policy carbon"));
    market::CarbonSpec s;
    LZ_RETURN_IF_ERROR(r.Location(kLocation, &s.location));
    LZ_RETURN_IF_ERROR(r.Price(kPricePerTonne, &s.price_per_tonne, false));
    if (!r.has(kSeries)) return r.Missing(kSeries);
    s.series = r.fields().series;
    *out = std::move(s);
  } else if (kind == "maintenance") {
    LZ_RETURN_IF_ERROR(CheckAllowed(p, kCommonOp | Bit(kId) | Bit(kKind) | kTargetKeys | Bit(kStart) | Bit(kEnd),
                                    "add_policy maintenance"));
    market::MaintenanceSpec s;
    LZ_RETURN_IF_ERROR(r.Target(&s.target));
    LZ_RETURN_IF_ERROR(r.Time(kStart, &s.start, false));
    LZ_RETURN_IF_ERROR(r.Time(kEnd, &s.end, true));
    *out = s;
  } else {
    return Bad(kKind, "'" + Quoted(kind) + "' is not a policy kind (static_floor, power_cap, carbon, maintenance, "
                     "adaptive_power_cap, adaptive_carbon_budget)");
  }
  return Status::Ok();
}

Status BuildOperation(const Reader& r, LogRecord* rec) {
  const Fields& f = r.fields();
  if (!r.has(kOp)) {
    if (r.has(kEvent)) return Bad(kOp, "is required (this line is an event, not an operation)");
    return r.Missing(kOp);
  }
  if (f.slot[kOp].kind != Slot::kString) return Bad(kOp, "must be a string");
  std::string_view name = f.slot[kOp].text;
  int index = -1;
  for (int i = 0; i < static_cast<int>(std::size(kOpKinds)); ++i) {
    if (kOpKinds[i].name == name) index = i;
  }
  if (index < 0) return Bad(kOp, "'" + Quoted(name) + "' is not an operation");
  if (name != "add_policy") LZ_RETURN_IF_ERROR(CheckAllowed(f.present, kCommonOp | kOpKinds[index].allowed, name));

  Operation& op = rec->op;
  LZ_RETURN_IF_ERROR(r.Time(kT, &op.time, false));
  if (r.has(kId)) {
    if (f.slot[kId].kind != Slot::kNumber) return Bad(kId, "must be a numeric id");
    rec->created_id = f.slot[kId].num;
  }
  if (r.has(kKey)) {
    if (f.slot[kV].num < 2) return Bad(kKey, "needs format version 2 (the line says \"v\":1)");
    LZ_RETURN_IF_ERROR(CheckIdempotencyKey(f.slot[kKey].text, "key"));
    rec->idempotency_key = std::string(f.slot[kKey].text);
  }
  switch (index) {
    case 0: op.body = market::OpAdvance{}; break;
    case 1: {
      market::OpAddNode o;
      LZ_RETURN_IF_ERROR(r.Str(kName, &o.info.name));
      LZ_RETURN_IF_ERROR(r.Str(kType, &o.info.type));
      LZ_RETURN_IF_ERROR(r.Str(kRegion, &o.info.region));
      LZ_RETURN_IF_ERROR(r.Str(kZone, &o.info.zone));
      LZ_RETURN_IF_ERROR(r.Str(kRow, &o.info.row));
      LZ_RETURN_IF_ERROR(r.Str(kRack, &o.info.rack));
      LZ_RETURN_IF_ERROR(r.Narrow(kGpus, &o.info.meta.gpus, false));
      LZ_RETURN_IF_ERROR(r.Narrow(kMemoryGb, &o.info.meta.memory_gb, false));
      LZ_RETURN_IF_ERROR(r.Narrow(kPowerW, &o.info.meta.power_w, false));
      op.body = std::move(o);
      break;
    }
    case 2: {
      market::OpRemoveNode o;
      LZ_RETURN_IF_ERROR(r.Node(kNode, &o.node));
      op.body = o;
      break;
    }
    case 3: {
      // Every parameter is required: set_params replaces all of them, and an
      // omitted field silently falling back to a default would be a trap.
      market::OpSetParams o;
      auto& p = o.params;
      LZ_RETURN_IF_ERROR(r.Int(kGrace, &p.grace));
      LZ_RETURN_IF_ERROR(r.Int(kHysteresisPpm, &p.hysteresis_ppm));
      LZ_RETURN_IF_ERROR(r.Int(kTick, &p.tick));
      LZ_RETURN_IF_ERROR(r.Int(kClipAlphaPpm, &p.clip_alpha_ppm));
      LZ_RETURN_IF_ERROR(r.Int(kClipInterval, &p.clip_interval));
      LZ_RETURN_IF_ERROR(r.Int(kDecayBeta, &p.decay_beta));
      LZ_RETURN_IF_ERROR(r.Int(kMinHold, &p.min_hold));
      op.body = o;
      break;
    }
    case 4: {
      market::OpAddPolicy o;
      LZ_RETURN_IF_ERROR(BuildPolicy(r, &o.spec));
      op.body = std::move(o);
      break;
    }
    case 5: {
      market::OpRemovePolicy o;
      LZ_RETURN_IF_ERROR(r.Id(kPolicy, &o.policy));
      op.body = o;
      break;
    }
    case 6: {
      market::OpCreateTenant o;
      LZ_RETURN_IF_ERROR(r.Str(kName, &o.name));
      LZ_RETURN_IF_ERROR(r.Price(kBalance, &o.balance, false));
      LZ_RETURN_IF_ERROR(r.Price(kMaxRate, &o.max_rate, true, false));
      op.body = std::move(o);
      break;
    }
    case 7: {
      market::OpDeposit o;
      LZ_RETURN_IF_ERROR(r.Id(kTenant, &o.tenant));
      LZ_RETURN_IF_ERROR(r.Price(kAmount, &o.amount, false));
      op.body = o;
      break;
    }
    case 8: {
      market::OpSetMaxRate o;
      LZ_RETURN_IF_ERROR(r.Id(kTenant, &o.tenant));
      LZ_RETURN_IF_ERROR(r.Price(kMaxRate, &o.max_rate, true));
      op.body = o;
      break;
    }
    case 9: {
      market::OpPlaceOrder o;
      LZ_RETURN_IF_ERROR(r.Id(kTenant, &o.tenant));
      LZ_RETURN_IF_ERROR(r.Vertex(kScope, &o.spec.scope));
      LZ_RETURN_IF_ERROR(r.Price(kPrice, &o.spec.price, true));
      LZ_RETURN_IF_ERROR(r.Narrow(kCount, &o.spec.count, false));
      if (r.has(kLocality)) {
        LZ_ASSIGN_OR_RETURN(o.spec.locality, market::ParseLocality(f.slot[kLocality].text, "locality"));
      }
      LZ_RETURN_IF_ERROR(r.Node(kRelTo, &o.spec.rel_to, false));
      op.body = o;
      break;
    }
    case 10: {
      market::OpUpdateOrder o;
      LZ_RETURN_IF_ERROR(r.Id(kTenant, &o.tenant));
      LZ_RETURN_IF_ERROR(r.Id(kOrder, &o.order));
      LZ_RETURN_IF_ERROR(r.Price(kPrice, &o.price, true));
      op.body = o;
      break;
    }
    case 11: {
      market::OpCancelOrder o;
      LZ_RETURN_IF_ERROR(r.Id(kTenant, &o.tenant));
      LZ_RETURN_IF_ERROR(r.Id(kOrder, &o.order));
      op.body = o;
      break;
    }
    case 12: {
      market::OpSetLimit o;
      LZ_RETURN_IF_ERROR(r.Id(kTenant, &o.tenant));
      LZ_RETURN_IF_ERROR(r.Node(kNode, &o.node));
      LZ_RETURN_IF_ERROR(r.Price(kLimit, &o.limit, true));
      op.body = o;
      break;
    }
    case 13: {
      market::OpRelinquish o;
      LZ_RETURN_IF_ERROR(r.Id(kTenant, &o.tenant));
      LZ_RETURN_IF_ERROR(r.Node(kNode, &o.node));
      op.body = o;
      break;
    }
    case 14: {
      market::OpSetAdaptiveCap o;
      LZ_RETURN_IF_ERROR(r.Id(kPolicy, &o.policy));
      LZ_RETURN_IF_ERROR(r.Int(kCap, &o.cap));
      op.body = o;
      break;
    }
  }
  return Status::Ok();
}

Result<uint8_t> ParseReasons(std::string_view text) {
  uint8_t bits = 0;
  if (text == "none") return bits;
  static constexpr std::pair<uint8_t, std::string_view> kNames[] = {
      {market::kReasonOutbid, "outbid"}, {market::kReasonFloor, "floor"},
      {market::kReasonMaintenance, "maintenance"}, {market::kReasonExhaustion, "exhaustion"},
      {market::kReasonRelinquish, "relinquish"}};
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view part = text.substr(0, comma);
    bool found = false;
    for (auto [bit, name] : kNames) {
      if (part == name) {
        bits |= bit;
        found = true;
      }
    }
    if (!found) {
      return InvalidArgument("reasons: '" + Quoted(part) +
                             "' is not a reason (outbid, floor, maintenance, exhaustion, relinquish)");
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return bits;
}

constexpr uint64_t kEventKeys = Bit(kV) | Bit(kT) | Bit(kEvent) | Bit(kNode) | Bit(kTenant) | Bit(kOther) |
                                Bit(kOrder) | Bit(kVertex) | Bit(kPrice) | Bit(kAmount) | Bit(kWaived) |
                                Bit(kDeadline) | Bit(kReasons) | Bit(kCancelReason);

Status BuildEvent(const Reader& r, Event* e) {
  const Fields& f = r.fields();
  if (!r.has(kEvent)) {
    if (r.has(kOp)) return Bad(kEvent, "is required (this line is an operation, not an event)");
    return r.Missing(kEvent);
  }
  if (f.slot[kEvent].kind != Slot::kString) return Bad(kEvent, "must be a string");
  std::string_view name = f.slot[kEvent].text;
  int type = -1;
  for (int i = 0; i < kNumEventTypes; ++i) {
    if (market::EventTypeName(static_cast<EventType>(i)) == name) type = i;
  }
  if (type < 0) return Bad(kEvent, "'" + Quoted(name) + "' is not an event type");
  LZ_RETURN_IF_ERROR(CheckAllowed(f.present, kEventKeys, "an event"));
  e->type = static_cast<EventType>(type);
  LZ_RETURN_IF_ERROR(r.Time(kT, &e->time, false));
  LZ_RETURN_IF_ERROR(r.Id(kNode, &e->node, false));
  LZ_RETURN_IF_ERROR(r.Id(kTenant, &e->tenant, false));
  LZ_RETURN_IF_ERROR(r.Id(kOther, &e->other, false));
  LZ_RETURN_IF_ERROR(r.Id(kOrder, &e->order, false));
  LZ_RETURN_IF_ERROR(r.Id(kVertex, &e->vertex, false));
  LZ_RETURN_IF_ERROR(r.Price(kPrice, &e->price, true, false));
  LZ_RETURN_IF_ERROR(r.Price(kAmount, &e->amount, false, false));
  LZ_RETURN_IF_ERROR(r.Price(kWaived, &e->waived, false, false));
  LZ_RETURN_IF_ERROR(r.Time(kDeadline, &e->deadline, true, false));
  if (r.has(kReasons)) {
    if (f.slot[kReasons].kind != Slot::kString) return Bad(kReasons, "must be a string such as \"outbid,floor\"");
    LZ_ASSIGN_OR_RETURN(e->reasons, ParseReasons(f.slot[kReasons].text));
  }
  if (r.has(kCancelReason)) {
    std::string_view cr = f.slot[kCancelReason].text;
    int found = -1;
    for (int i = 0; i < kNumCancelReasons; ++i) {
      if (f.slot[kCancelReason].kind == Slot::kString && market::CancelReasonName(static_cast<market::CancelReason>(i)) == cr) {
        found = i;
      }
    }
    if (found < 0) return Bad(kCancelReason, "'" + Quoted(cr) + "' is not a cancel reason");
    e->cancel_reason = static_cast<market::CancelReason>(found);
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------

std::string_view PolicyKindName(const market::PolicySpec& spec) {
  switch (spec.index()) {
    case 0: return "static_floor";
    case 1: return "power_cap";
    case 2: return "carbon";
    case 3: return "maintenance";
    case 4: return "adaptive_power_cap";
    case 5: return "adaptive_carbon_budget";
  }
  return "?";
}

void AppendOperation(const Operation& op, uint64_t created_id, std::string* out) {
  AppendOperation(op, created_id, {}, out);
}

void AppendOperation(const Operation& op, uint64_t created_id, std::string_view key, std::string* out) {
  Writer w(out);
  // Version 1 unless the line carries a key (docs/OPLOG.md, "Version").
  out->append(key.empty() ? "{\"v\":1,\"t\":" : "{\"v\":2,\"t\":");
  w.Int(op.time);
  out->append(",\"op\":\"");
  out->append(market::OpName(op.body));
  out->push_back('"');
  if (created_id != kNoId) {
    w.K(kId);
    w.UInt(created_id);
  }
  if (!key.empty()) {
    // A valid key (CheckIdempotencyKey) needs no escaping.
    out->append(",\"key\":\"");
    out->append(key);
    out->push_back('"');
  }
  std::visit(OpEncoder{w}, op.body);
  out->push_back('}');
}

std::string EncodeOperation(const Operation& op) { return EncodeOperation(op, kNoId); }

Status CheckIdempotencyKey(std::string_view key, std::string_view field) {
  if (key.empty()) return InvalidArgument(std::string(field) + ": must not be empty");
  if (key.size() > kMaxIdempotencyKey) {
    return InvalidArgument(std::string(field) + ": at most " + std::to_string(kMaxIdempotencyKey) +
                           " characters (got " + std::to_string(key.size()) + ")");
  }
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.' || c == ':';
    if (!ok) {
      return InvalidArgument(std::string(field) + ": only letters, digits and - _ . : are allowed (got \"" +
                             Quoted(key) + "\")");
    }
  }
  return Status::Ok();
}

std::string EncodeOperation(const Operation& op, uint64_t created_id) {
  std::string s;
  s.reserve(128);
  AppendOperation(op, created_id, &s);
  return s;
}

namespace {

// Decimal digits, two at a time.
constexpr char kDigitPairs[201] =
    "0001020304050607080910111213141516171819"
    "2021222324252627282930313233343536373839"
    "4041424344454647484950515253545556575859"
    "6061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

void PutPair(char* p, uint32_t v) { std::memcpy(p, kDigitPairs + 2 * v, 2); }

// The number of decimal digits of v (1 for 0).
unsigned DecimalLength(uint64_t v) {
  static constexpr uint64_t kPow10[20] = {1ULL,
                                          10ULL,
                                          100ULL,
                                          1000ULL,
                                          10000ULL,
                                          100000ULL,
                                          1000000ULL,
                                          10000000ULL,
                                          100000000ULL,
                                          1000000000ULL,
                                          10000000000ULL,
                                          100000000000ULL,
                                          1000000000000ULL,
                                          10000000000000ULL,
                                          100000000000000ULL,
                                          1000000000000000ULL,
                                          10000000000000000ULL,
                                          100000000000000000ULL,
                                          1000000000000000000ULL,
                                          10000000000000000000ULL};
  // floor(log10(2^bits)) by 1233/4096 ~ log10(2), then one comparison. v | 1
  // has v's digit count (a power of ten is even) and is never 0.
  uint64_t x = v | 1;
  unsigned t = (static_cast<unsigned>(std::bit_width(x)) * 1233) >> 12;
  return t + 1 - (x < kPow10[t]);
}

// Digits by fixed-point multiplication (issue 12): for n < 10^(k+2),
// n * ceil(2^57 / 10^k) holds n / 10^k (one or two digits) above bit 57 and
// n's last k digits, as a fraction, below it; each multiplication of the
// fraction by 100 brings the next two digits above bit 57. Rounding the scale
// up errs upwards by less than n < 10^(k+2), and the j-th multiplication makes
// that 10^(2j) times more; the true value there is a multiple of
// 2^57 / 10^(k-2j), so the pair read is exact while 10^(2k+2) < 2^57, which
// holds for every k used here (0-6; it would for 7). The encoder's tests
// compare every number below 10^6 and pseudo-random ones of every length with
// std::to_chars. About five instructions a pair, where a division by 100 and
// a remainder cost more.
constexpr int kPairShift = 57;
constexpr uint64_t kPairFraction = (uint64_t{1} << kPairShift) - 1;
constexpr uint64_t PairScale(uint64_t pow10) { return ((uint64_t{1} << kPairShift) + pow10 - 1) / pow10; }
constexpr uint64_t kPairScale[4] = {PairScale(1), PairScale(100), PairScale(10000), PairScale(1000000)};

// n (< 10^8) in `digits` digits (1-8, at least n's own) at p; returns the
// end. Straight-line code for each length: a loop over the pairs cost more
// than the divisions it replaced.
template <unsigned kPairs, bool kOddHead>
[[gnu::always_inline]] inline char* WritePairs(char* p, uint32_t n) {
  uint64_t x = uint64_t{n} * kPairScale[kPairs];
  const auto head = static_cast<uint32_t>(x >> kPairShift);
  if constexpr (kOddHead) {
    *p++ = static_cast<char>('0' + head);
  } else {
    PutPair(p, head);
    p += 2;
  }
  for (unsigned i = 0; i < kPairs; ++i) {  // Unrolled: kPairs is a constant.
    x = (x & kPairFraction) * 100;
    PutPair(p + 2 * i, static_cast<uint32_t>(x >> kPairShift));
  }
  return p + 2 * kPairs;
}
[[gnu::always_inline]] inline char* WriteUnder1e8(char* p, uint32_t n, unsigned digits) {
  switch (digits) {
    case 1: return WritePairs<0, true>(p, n);
    case 2: return WritePairs<0, false>(p, n);
    case 3: return WritePairs<1, true>(p, n);
    case 4: return WritePairs<1, false>(p, n);
    case 5: return WritePairs<2, true>(p, n);
    case 6: return WritePairs<2, false>(p, n);
    case 7: return WritePairs<3, true>(p, n);
    default: return WritePairs<3, false>(p, n);
  }
}

// Writes v in decimal at p (the bytes std::to_chars writes) and returns the
// end. The event lines' numbers are mostly micro-unit prices of 5 to 8
// digits and ids.
char* WriteDecimal(char* p, uint64_t v) {
  // Ids and zeros: most of the other numbers, and short.
  if (v < 10) {
    *p = static_cast<char>('0' + v);
    return p + 1;
  }
  if (v < 100) {
    PutPair(p, static_cast<uint32_t>(v));
    return p + 2;
  }
  if (v < 100000000) {
    const auto n = static_cast<uint32_t>(v);
    return WriteUnder1e8(p, n, DecimalLength(n));
  }
  // Eight digits at a time below the head, each block with its zeros.
  constexpr uint64_t k1e8 = 100000000;
  if (v < k1e8 * k1e8) {
    const auto head = static_cast<uint32_t>(v / k1e8);
    p = WriteUnder1e8(p, head, DecimalLength(head));
    return WriteUnder1e8(p, static_cast<uint32_t>(v - head * k1e8), 8);
  }
  const uint64_t top = v / (k1e8 * k1e8);  // At most 1844.
  const uint64_t rest = v - top * (k1e8 * k1e8);
  const auto mid = static_cast<uint32_t>(rest / k1e8);
  p = WriteUnder1e8(p, static_cast<uint32_t>(top), DecimalLength(top));
  p = WriteUnder1e8(p, mid, 8);
  return WriteUnder1e8(p, static_cast<uint32_t>(rest - mid * k1e8), 8);
}

char* WriteDecimal(char* p, int64_t v) {
  if (v >= 0) return WriteDecimal(p, static_cast<uint64_t>(v));
  *p++ = '-';
  return WriteDecimal(p, uint64_t{0} - static_cast<uint64_t>(v));
}

// A short piece of text copied with one fixed-size move: `size` bytes count,
// the rest of `text` is slack that the next write overwrites.
template <size_t N>
struct FixedText {
  char text[N] = {};
  size_t size = 0;
};

// Every event type's name with its closing quote, for EventLine::TypeName.
using TypeNameText = FixedText<32>;
const std::array<TypeNameText, kNumEventTypes>& TypeNameTexts() {
  static const std::array<TypeNameText, kNumEventTypes> table = [] {
    std::array<TypeNameText, kNumEventTypes> t;
    for (int i = 0; i < kNumEventTypes; ++i) {
      std::string_view name = market::EventTypeName(static_cast<EventType>(i));
      LZ_CHECK(name.size() + 1 <= sizeof t[i].text);
      std::memcpy(t[i].text, name.data(), name.size());
      t[i].text[name.size()] = '"';
      t[i].size = name.size() + 1;
    }
    return t;
  }();
  return table;
}

// Every key as its event-line text ,"key": for EventLine::K.
using KeyText = FixedText<24>;
constexpr std::array<KeyText, kNumKeys> kKeyTexts = [] {
  std::array<KeyText, kNumKeys> t{};
  for (int i = 0; i < kNumKeys; ++i) {
    std::string_view name = kKeyNames[i];
    if (name.size() + 4 > sizeof t[i].text) throw "a key too long for KeyText";  // Fails the build.
    size_t n = 0;
    t[i].text[n++] = ',';
    t[i].text[n++] = '"';
    for (char c : name) t[i].text[n++] = c;
    t[i].text[n++] = '"';
    t[i].text[n++] = ':';
    t[i].size = n;
  }
  return t;
}();

// An event line's fixed-size part, formatted in place at a pointer the caller
// gives: a stack buffer, or the sink's own buffer (WriteEvent). An append per
// field (a capacity check and a call each) cost more than the formatting itself
// on the replay path. Its largest possible content (the prefix, the longest type
// name, five ids and four 64-bit numbers with their keys) is under 400 bytes;
// the fixed-size copies of Fixed write at most 64 bytes past it.
class EventLine {
 public:
  explicit EventLine(char* p) : start_(p), p_(p) {}
  void Lit(std::string_view s) {
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  // All N bytes are copied (a constant-size move, no call); `size` count.
  template <size_t N>
  void Fixed(const FixedText<N>& t) {
    std::memcpy(p_, t.text, N);
    p_ += t.size;
  }
  void Int(int64_t v) { p_ = WriteDecimal(p_, v); }
  void K(Key k) { Fixed(kKeyTexts[k]); }
  template <typename IdT>
  void IdIfValid(Key k, IdT id) {
    if (!id.valid()) return;
    K(k);
    p_ = WriteDecimal(p_, static_cast<uint64_t>(id.value));
  }
  void Special(Key k, int64_t v, int64_t special, std::string_view name) {
    K(k);
    if (v == special) Lit(name);
    else Int(v);
  }
  std::string_view view() const { return {start_, static_cast<size_t>(p_ - start_)}; }
  char* end() const { return p_; }

 private:
  char* start_;
  char* p_;
};

// Scratch for a line's start up to its type name (at most 43 bytes, then WriteDecimal's slack).
constexpr size_t kEventPrefixRoom = 512;
}  // namespace

char* WriteEvent(const Event& e, char* out) {
  // Consecutive events mostly share their time (one instant's events, and a
  // replay's price changes come in bursts): the line's start up to the type
  // name, with the time's digits, the longest number of most lines, is
  // formatted once per time instead of once per line (issue 12).
  struct TimePrefix {
    int64_t time = 0;
    FixedText<64> prefix;  // {"v":1,"t":TIME,"event":" (at most 43 bytes)
  };
  thread_local TimePrefix last;
  if (last.prefix.size == 0 || last.time != e.time) {
    char buf[kEventPrefixRoom];
    EventLine p(buf);
    p.Lit("{\"v\":1,\"t\":");
    p.Int(e.time);
    p.Lit(",\"event\":\"");
    std::string_view v = p.view();
    std::memcpy(last.prefix.text, v.data(), v.size());
    last.prefix.size = v.size();
    last.time = e.time;
  }
  EventLine w(out);
  w.Fixed(last.prefix);
  // Four in five lines of a replay are price changes with their vertex and
  // price only: the fields below, without the others' tests (issue 12).
  if (e.type == EventType::kPriceChanged && e.vertex.valid() &&
      !(e.node.valid() | e.tenant.valid() | e.other.valid() | e.order.valid()) &&
      (e.amount | e.waived | e.deadline) == 0 && e.reasons == 0 &&
      e.cancel_reason == market::CancelReason::kNone) {
    static const TypeNameText& kName = TypeNameTexts()[static_cast<size_t>(EventType::kPriceChanged)];
    w.Fixed(kName);
    w.K(kVertex);
    w.Int(e.vertex.value);
    w.Special(kPrice, e.price, kInfPrice, "\"inf\"");
    w.Lit("}");
    return w.end();
  }
  // An Event's type is one of the enum's values (the engine makes them, and the
  // decoder refuses any other name), so the table has it.
  LZ_CHECK(static_cast<size_t>(e.type) < kNumEventTypes);
  w.Fixed(TypeNameTexts()[static_cast<size_t>(e.type)]);
  uint64_t m = EventFields(e.type);
  w.IdIfValid(kNode, e.node);
  w.IdIfValid(kTenant, e.tenant);
  w.IdIfValid(kOther, e.other);
  w.IdIfValid(kOrder, e.order);
  w.IdIfValid(kVertex, e.vertex);
  if ((m & Bit(kPrice)) || e.price != 0) w.Special(kPrice, e.price, kInfPrice, "\"inf\"");
  if ((m & Bit(kAmount)) || e.amount != 0) {
    w.K(kAmount);
    w.Int(e.amount);
  }
  if ((m & Bit(kWaived)) || e.waived != 0) {
    w.K(kWaived);
    w.Int(e.waived);
  }
  if ((m & Bit(kDeadline)) || e.deadline != 0) w.Special(kDeadline, e.deadline, kNever, "\"never\"");
  const bool reasons = (m & Bit(kReasons)) || e.reasons != 0;
  const bool cancel_reason = (m & Bit(kCancelReason)) || e.cancel_reason != market::CancelReason::kNone;
  if (!reasons && !cancel_reason) {  // Most lines: closed in place.
    w.Lit("}");
    LZ_CHECK(static_cast<size_t>(w.end() - out) < kEventRoom);  // A tripwire for a new field.
    return w.end();
  }
  // The rare lines with reasons. Their names are the engine's own words
  // (letters and commas: ReasonNames, CancelReasonName), which JSON takes
  // unescaped; the line with them must fit the caller's room.
  const std::string names = reasons ? market::ReasonNames(e.reasons) : std::string();
  const std::string_view cancel = cancel_reason ? market::CancelReasonName(e.cancel_reason) : std::string_view();
  constexpr size_t kKeyRoom = sizeof(KeyText::text);  // What K copies.
  LZ_CHECK(static_cast<size_t>(w.end() - out) + 2 * kKeyRoom + names.size() + cancel.size() + 5 <= kEventRoom);
  auto quoted = [&w](std::string_view name) {
    LZ_CHECK(std::all_of(name.begin(), name.end(), [](char c) { return c > 0x20 && c != '"' && c != '\\'; }));
    w.Lit("\"");
    w.Lit(name);
    w.Lit("\"");
  };
  if (reasons) {
    w.K(kReasons);
    quoted(names);
  }
  if (cancel_reason) {
    w.K(kCancelReason);
    quoted(cancel);
  }
  w.Lit("}");
  return w.end();
}

void AppendEvent(const Event& e, std::string* out) {
  char buf[kEventRoom];
  out->append(buf, WriteEvent(e, buf));
}

std::string EncodeEvent(const Event& e) {
  std::string s;
  s.reserve(128);
  AppendEvent(e, &s);
  return s;
}

// ---------------------------------------------------------------------------

const size_t Decoder::kPadding = simdjson::SIMDJSON_PADDING;

struct Decoder::Impl {
  simdjson::ondemand::parser parser;
  std::string buffer;  // A padded copy of the line for unpadded input.
  Fields fields;

  // Fills `fields` from one JSON object. `data` has `capacity` readable bytes.
  Status Parse(const char* data, size_t len, size_t capacity) {
    while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r')) --len;
    // ParseCompact reads up to 8 bytes from a key's start (the padding).
    if (capacity >= len + 8 && ParseCompact(data, len)) return CheckVersionAndTime();
    fields.present = 0;
    fields.steps.clear();
    fields.series.clear();
    simdjson::ondemand::document doc;
    if (auto err = parser.iterate(data, len, capacity).get(doc)) return InvalidArgument(JsonError(err));
    simdjson::ondemand::object obj;
    if (doc.get_object().get(obj)) return InvalidArgument("line: not valid JSON (expected an object {...})");
    for (auto field_result : obj) {
      if (auto err = field_result.error()) return InvalidArgument(JsonError(err));
      simdjson::ondemand::field& field = field_result.value_unsafe();
      std::string_view key;
      if (auto err = field.unescaped_key().get(key)) return InvalidArgument(JsonError(err));
      int k = LookupKey(key);
      if (k < 0) return InvalidArgument(Quoted(key) + ": unknown field");
      Key kk = static_cast<Key>(k);
      if (fields.present & Bit(kk)) return Bad(kk, "appears twice");
      fields.present |= Bit(kk);
      simdjson::ondemand::value& val = field.value();
      Slot& slot = fields.slot[k];
      if (Bit(kk) & kPairKeys) {
        LZ_RETURN_IF_ERROR(ParsePairs(kk, val, &fields));
        continue;
      }
      std::string_view tok = val.raw_json_token();
      if (!tok.empty() && tok[0] == '"') {
        slot.kind = Slot::kString;
        if (auto err = val.get_string().get(slot.text)) return Bad(kk, std::string("bad string: ") + simdjson::error_message(err));
        continue;
      }
      if (Bit(kk) & kStringKeys) return Bad(kk, "must be a string (got " + Quoted(tok) + ")");
      slot.kind = Slot::kNumber;
      slot.text = tok;
      LZ_RETURN_IF_ERROR(ParseUnsigned(kk, tok, &slot.num));
    }
    if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) return InvalidArgument("line: unexpected text after the JSON object");
    return CheckVersionAndTime();
  }

  // The fields every line needs, checked after either parse below.
  Status CheckVersionAndTime() const {
    if (!(fields.present & Bit(kV))) return Bad(kV, "is required (the format version, 1)");
    const Slot& v = fields.slot[kV];
    if (v.kind != Slot::kNumber || v.num < 1 || v.num > static_cast<uint64_t>(kFormatVersion)) {
      return Bad(kV, "unsupported format version " + Quoted(v.text) + " (this build reads 1 and 2)");
    }
    if (!(fields.present & Bit(kT))) return Bad(kT, "is required (engine time in microseconds)");
    return Status::Ok();
  }

  // The lines this codec writes, read without simdjson (issue 12: its
  // per-document set-up and the field loop were most of the parse's cost): a
  // compact object of known keys, each once, whose values are numbers of 1
  // to 19 digits without a leading zero or strings of printable ASCII without
  // escapes, with nothing around it. Such a line is valid JSON that the
  // general parse below reads into the same slots (a number's text is its
  // token, a string's its content). Anything else, including every line with
  // an error, returns false with `fields` unspecified, and the general parse
  // reads the line again and gives the reason. At least 8 bytes after the line
  // must be readable (its padding).
  bool ParseCompact(const char* p, size_t len) {
    const char* end = p + len;
    if (len < 2 || *p != '{' || end[-1] != '}') return false;
    ++p;
    uint64_t present = 0;
    for (;;) {
      if (*p != '"') return false;
      // A key with an escape or any byte outside a key's letters is no key of
      // the table: LookupKey refuses it below.
      const char* key = ++p;
      while (p < end && *p != '"') ++p;
      if (end - p < 3 || p[1] != ':') return false;
      int k = LookupKeyPadded(key, static_cast<size_t>(p - key));
      if (k < 0 || (present & Bit(static_cast<Key>(k))) || (Bit(static_cast<Key>(k)) & kPairKeys)) return false;
      present |= Bit(static_cast<Key>(k));
      Slot& slot = fields.slot[k];
      p += 2;
      if (*p == '"') {
        const char* text = ++p;
        while (p < end && *p != '"') {
          if (*p == '\\' || static_cast<unsigned char>(*p) < 0x20 || static_cast<unsigned char>(*p) >= 0x80) return false;
          ++p;
        }
        if (p == end) return false;
        slot.kind = Slot::kString;
        slot.text = std::string_view(text, static_cast<size_t>(p - text));
        ++p;
      } else {
        if (Bit(static_cast<Key>(k)) & kStringKeys) return false;
        const char* digits = p;
        uint64_t v = 0;
        while (p < end && *p >= '0' && *p <= '9') v = v * 10 + static_cast<uint64_t>(*p++ - '0');
        size_t n = static_cast<size_t>(p - digits);
        if (n == 0 || n > 19 || (n > 1 && *digits == '0')) return false;
        slot.kind = Slot::kNumber;
        slot.num = v;
        slot.text = std::string_view(digits, n);
      }
      if (p == end) return false;
      if (*p == '}') {
        if (p + 1 != end) return false;
        break;
      }
      if (*p++ != ',') return false;
    }
    fields.present = present;
    fields.steps.clear();
    fields.series.clear();
    return true;
  }

  Status ParseCopy(std::string_view line) {
    if (buffer.size() < line.size() + simdjson::SIMDJSON_PADDING) buffer.resize(line.size() + simdjson::SIMDJSON_PADDING);
    std::memcpy(buffer.data(), line.data(), line.size());
    return Parse(buffer.data(), line.size(), buffer.size());
  }
};

Decoder::Decoder() : impl_(std::make_unique<Impl>()) {}
Decoder::~Decoder() = default;

Result<LogRecord> Decoder::DecodeRecord(std::string_view line, const DecodeOptions& options) {
  LZ_RETURN_IF_ERROR(impl_->ParseCopy(line));
  LogRecord rec;
  LZ_RETURN_IF_ERROR(BuildOperation(Reader(impl_->fields, options), &rec));
  return rec;
}

Result<LogRecord> Decoder::DecodeRecordPadded(std::string_view line, const DecodeOptions& options) {
  LZ_RETURN_IF_ERROR(impl_->Parse(line.data(), line.size(), line.size() + kPadding));
  LogRecord rec;
  LZ_RETURN_IF_ERROR(BuildOperation(Reader(impl_->fields, options), &rec));
  return rec;
}

Result<Event> Decoder::DecodeEvent(std::string_view line) {
  LZ_RETURN_IF_ERROR(impl_->ParseCopy(line));
  Event e;
  DecodeOptions none;
  LZ_RETURN_IF_ERROR(BuildEvent(Reader(impl_->fields, none), &e));
  return e;
}

namespace {
Decoder& ThreadDecoder() {
  thread_local Decoder decoder;
  return decoder;
}
}  // namespace

Result<Operation> DecodeOperation(std::string_view line, const DecodeOptions& options) {
  auto r = ThreadDecoder().DecodeRecord(line, options);
  if (!r.ok()) return r.status();
  return std::move(r->op);
}

Result<LogRecord> DecodeRecord(std::string_view line, const DecodeOptions& options) {
  return ThreadDecoder().DecodeRecord(line, options);
}

Result<Event> DecodeEvent(std::string_view line) { return ThreadDecoder().DecodeEvent(line); }

}  // namespace laissez::oplog
