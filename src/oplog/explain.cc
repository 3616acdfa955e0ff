#include "oplog/explain.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "common/money.h"
#include "oplog/replay.h"

namespace laissez::oplog {

using market::Event;
using market::EventType;
using Json = nlohmann::ordered_json;

namespace {

// ---------------------------------------------------------------------------
// Time.

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

void CivilFromDays(int64_t z, int64_t* y, unsigned* m, unsigned* d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  *d = doy - (153 * mp + 2) / 5 + 1;
  *m = mp < 10 ? mp + 3 : mp - 9;
  *y = static_cast<int64_t>(yoe) + era * 400 + (*m <= 2);
}

constexpr Micros kYear2000 = 946'684'800LL * kMicrosPerSecond;

}  // namespace

std::string FormatTime(Micros t) {
  if (t == kNever) return "never";
  char buf[64];
  if (t >= kYear2000) {
    int64_t secs = t / kMicrosPerSecond;
    int64_t frac = t % kMicrosPerSecond;
    int64_t days = secs / 86400, rem = secs % 86400;
    int64_t y;
    unsigned m, d;
    CivilFromDays(days, &y, &m, &d);
    int n = std::snprintf(buf, sizeof buf, "%04lld-%02u-%02uT%02lld:%02lld:%02lld", static_cast<long long>(y), m, d,
                          static_cast<long long>(rem / 3600), static_cast<long long>(rem / 60 % 60),
                          static_cast<long long>(rem % 60));
    std::string s(buf, static_cast<size_t>(n));
    if (frac != 0) {
      std::snprintf(buf, sizeof buf, ".%06lld", static_cast<long long>(frac));
      std::string f(buf);
      while (f.back() == '0') f.pop_back();
      s += f;
    }
    return s + "Z";
  }
  // Seconds from the start, with the micro-units of FormatMoney's decimal rules.
  return "T+" + FormatMoney(t) + "s";
}

Result<Micros> ParseTimeArg(std::string_view text, std::string_view field) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument(std::string(field) + ": '" + std::string(text) + "' " + std::string(why));
  };
  if (text.empty()) return bad("is empty; give engine microseconds or an ISO-8601 time");
  bool digits = std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) {
    int64_t v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size()) return bad("overflows int64 microseconds");
    return v;
  }
  // YYYY-MM-DDTHH:MM[:SS[.ffffff]](Z|+HH:MM|-HH:MM); a space may replace T.
  auto num = [&](size_t pos, size_t len, int* out) {
    if (pos + len > text.size()) return false;
    int v = 0;
    for (size_t i = pos; i < pos + len; ++i) {
      if (text[i] < '0' || text[i] > '9') return false;
      v = v * 10 + (text[i] - '0');
    }
    *out = v;
    return true;
  };
  int y, mo, d, h, mi, s = 0;
  if (!num(0, 4, &y) || text.size() < 16 || text[4] != '-' || !num(5, 2, &mo) || text[7] != '-' || !num(8, 2, &d) ||
      (text[10] != 'T' && text[10] != 't' && text[10] != ' ') || !num(11, 2, &h) || text[13] != ':' ||
      !num(14, 2, &mi)) {
    return bad("is neither engine microseconds nor an ISO-8601 time such as 2026-11-30T05:00:00Z");
  }
  size_t i = 16;
  int64_t frac = 0;
  if (i < text.size() && text[i] == ':') {
    if (!num(i + 1, 2, &s)) return bad("has bad seconds");
    i += 3;
    if (i < text.size() && text[i] == '.') {
      ++i;
      int nd = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        if (++nd > 6) return bad("has more than 6 decimals (the unit is a microsecond)");
        frac = frac * 10 + (text[i] - '0');
        ++i;
      }
      if (nd == 0) return bad("has a '.' without digits");
      while (nd++ < 6) frac *= 10;
    }
  }
  int64_t offset = 0;
  if (i >= text.size()) return bad("needs a time zone: Z or +HH:MM");
  if (text[i] == 'Z' || text[i] == 'z') {
    ++i;
  } else if (text[i] == '+' || text[i] == '-') {
    int oh, om;
    if (!num(i + 1, 2, &oh) || i + 3 >= text.size() || text[i + 3] != ':' || !num(i + 4, 2, &om)) {
      return bad("has a bad time-zone offset (use +HH:MM)");
    }
    offset = (text[i] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
    i += 6;
  } else {
    return bad("needs a time zone: Z or +HH:MM");
  }
  if (i != text.size()) return bad("has extra text after the time");
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) return bad("is not a valid date and time");
  int64_t days = DaysFromCivil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  int64_t y2, dummy_m = 0;
  unsigned m2, d2;
  CivilFromDays(days, &y2, &m2, &d2);
  (void)dummy_m;
  if (static_cast<int>(m2) != mo || static_cast<int>(d2) != d) return bad("is not a valid date");
  int64_t secs = days * 86400 + h * 3600 + mi * 60 + s - offset;
  if (secs < 0) return bad("is before 1970-01-01, engine time 0");
  return secs * kMicrosPerSecond + frac;
}

namespace {

// ---------------------------------------------------------------------------
// Collection: the engine's events and the holders' own calls, in one timeline.

struct Item {
  enum Kind : uint8_t { kEvent, kSetLimit, kRelinquish } kind = kEvent;
  Event e;             // For kEvent.
  Micros time = 0;     // For calls.
  TenantId tenant;
  NodeId node;
  Price limit = 0;
  std::string rejected;  // Non-empty if the engine rejected the call.

  Micros when() const { return kind == kEvent ? e.time : time; }
};

class Collector : public market::EventSink {
 public:
  explicit Collector(std::vector<Item>* items) : items_(items) {}
  void OnEvents(std::span<const Event> events) override {
    for (const Event& e : events) {
      if (e.type == EventType::kPriceChanged) continue;
      Item it;
      it.e = e;
      items_->push_back(std::move(it));
    }
  }

 private:
  std::vector<Item>* items_;
};

std::string PriceText(Price p) { return p == kInfPrice ? "infinite" : FormatMoney(p) + "/h"; }
Json PriceJson(Price p) { return p == kInfPrice ? Json("inf") : Json(p); }
Json TimeJson(Micros t) { return t == kNever ? Json("never") : Json(t); }

std::string ReasonWords(uint8_t r) {
  std::string s;
  auto add = [&](const char* w) {
    if (!s.empty()) s += ", ";
    s += w;
  };
  if (r & market::kReasonOutbid) add("outbid by a challenger");
  if (r & market::kReasonFloor) add("the operator floor rose above the limit");
  if (r & market::kReasonMaintenance) add("scheduled maintenance");
  if (r & market::kReasonExhaustion) add("the holder's budget ran out");
  if (r & market::kReasonRelinquish) add("the holder relinquished it");
  return s.empty() ? "no reason given" : s;
}

struct Holding {
  NodeId node;
  TenantId tenant;
  OrderId order;
  Micros from = 0, to = kNever;
  Price start_limit = 0, last_limit = 0;
  std::string started, ended;
  Money paid = 0, waived = 0;
};

struct Contest {
  NodeId node;
  TenantId holder;
  Micros notice = 0, deadline = 0;
  Price price = 0;  // The latest (highest) challenger price, or the floor.
  uint8_t reasons = 0;
  OrderId challenger_order;
  TenantId challenger;
  int notices = 0;
  Price holder_limit = 0;   // At the first notice.
  Price limit_after = 0;    // The holder's limit when the contest ended.
  bool raised = false;      // The holder raised its limit during the contest.
  std::string outcome = "open";
  Micros ended = kNever;
  TenantId winner;
  Price winner_limit = 0;
};

struct Payment {
  NodeId node;
  TenantId tenant;
  Micros from = 0, to = 0;
  Price rate = 0;
  Money amount = 0, waived = 0;
};

struct HistoryEntry {
  Micros t = 0;
  NodeId node;
  std::string kind;
  std::string text;
  TenantId a, b;  // Tenants involved (for visibility).
};

// Walks the timeline and keeps, per node, who holds it, at what limit, and
// the open contest; emits holdings, contests, payments and history.
class Builder {
 public:
  Builder(const market::MarketEngine& engine, const std::unordered_map<uint64_t, TenantId>& order_tenant,
          TenantId viewer)
      : eng_(engine), order_tenant_(order_tenant), viewer_(viewer) {
    for (uint32_t i = 0; i < engine.tenant_count(); ++i) {
      auto t = engine.GetTenant(TenantId(i));
      names_.push_back(t.ok() ? t->name : "tenant " + std::to_string(i));
    }
  }

  bool operator_view() const { return !viewer_.valid(); }
  bool Sees(TenantId t) const { return operator_view() || t == viewer_; }
  std::string Who(TenantId t) const {
    if (!t.valid()) return "nobody";
    if (!Sees(t)) return "another tenant";
    return t.value < names_.size() ? names_[t.value] : "tenant " + std::to_string(t.value);
  }
  Json WhoJson(TenantId t) const {
    if (!t.valid() || !Sees(t)) return nullptr;
    return Json{{"id", t.value}, {"name", Who(t)}};
  }

  void Process(const Item& it) {
    NodeId n = it.kind == Item::kEvent ? it.e.node : it.node;
    if (!n.valid()) return;
    Track& tr = tracks_[n.value];
    if (it.kind == Item::kSetLimit) return SetLimit(tr, n, it);
    if (it.kind == Item::kRelinquish) {
      if (it.rejected.empty()) {
        History(it.time, n, "relinquish", Who(it.tenant) + " relinquished the node.", it.tenant);
      } else {
        History(it.time, n, "relinquish_rejected",
                Who(it.tenant) + " tried to relinquish the node: rejected (" + it.rejected + ").", it.tenant);
      }
      return;
    }
    const Event& e = it.e;
    switch (e.type) {
      case EventType::kNodeAdded: History(e.time, n, "node_added", "The node joined the market.", {}); break;
      case EventType::kNodeRemoved: History(e.time, n, "node_removed", "The node left the market.", {}); break;
      case EventType::kAllocated: {
        StartHolding(tr, n, e.tenant, e.order, e.time, e.price, "obtained the node while it was free");
        History(e.time, n, "allocated",
                Who(e.tenant) + " obtained the node (it was free)" + OrderText(e.order, e.tenant) + " at limit " +
                    LimitText(e.price, e.tenant) + ".",
                e.tenant);
        break;
      }
      case EventType::kReserved:
        History(e.time, n, "reserved",
                "The node was reserved for a gang order" + OrderText(e.order, e.tenant) + " of " + Who(e.tenant) + ".",
                e.tenant);
        break;
      case EventType::kNotice: Notice(tr, n, e); break;
      case EventType::kContestEnded: {
        std::string why;
        if (tr.contest >= 0) {
          Contest& c = contests_[static_cast<size_t>(tr.contest)];
          c.outcome = "kept";
          c.ended = e.time;
          c.limit_after = tr.limit;
          why = c.raised ? " after raising its limit to " + LimitText(tr.limit, e.tenant)
                         : " (the challenger withdrew, lowered its price or could no longer pay)";
          tr.contest = -1;
        }
        History(e.time, n, "contest_ended", "Outcome: " + Who(e.tenant) + " kept the node" + why + ".", e.tenant);
        break;
      }
      case EventType::kTransferred: {
        std::string early;
        if (tr.contest >= 0) {
          Contest& c = contests_[static_cast<size_t>(tr.contest)];
          c.outcome = "transferred";
          c.ended = e.time;
          c.limit_after = tr.limit;
          c.winner = e.tenant;
          c.winner_limit = e.price;
          if (e.time < c.deadline) early = " before the deadline";
          tr.contest = -1;
        }
        EndHolding(tr, e.time, "lost: " + ReasonWords(e.reasons) + "; the node moved to " + Who(e.tenant));
        StartHolding(tr, n, e.tenant, e.order, e.time, e.price, "took the node over from " + Who(e.other));
        std::string text = "Outcome: the node moved from " + Who(e.other) + " to " + Who(e.tenant) + early;
        if (Sees(e.tenant)) text += OrderText(e.order, e.tenant) + " at limit " + PriceText(e.price);
        text += " (" + ReasonWords(e.reasons) + ").";
        History(e.time, n, "transferred", text, e.tenant, e.other);
        break;
      }
      case EventType::kReleased: {
        if (tr.contest >= 0) {
          Contest& c = contests_[static_cast<size_t>(tr.contest)];
          c.outcome = "released";
          c.ended = e.time;
          c.limit_after = tr.limit;
          tr.contest = -1;
        }
        EndHolding(tr, e.time, "released: " + ReasonWords(e.reasons));
        History(e.time, n, "released",
                Who(e.tenant) + " no longer holds the node (" + ReasonWords(e.reasons) + ").", e.tenant);
        break;
      }
      case EventType::kCharged: {
        payments_.push_back(Payment{n, e.tenant, e.deadline, e.time, e.price, e.amount, e.waived});
        if (tr.holding >= 0 && holdings_[static_cast<size_t>(tr.holding)].tenant == e.tenant) {
          holdings_[static_cast<size_t>(tr.holding)].paid += e.amount;
          holdings_[static_cast<size_t>(tr.holding)].waived += e.waived;
        } else {
          // A charge settled as a holding ended belongs to the last holding of that tenant.
          for (auto it2 = holdings_.rbegin(); it2 != holdings_.rend(); ++it2) {
            if (it2->node == n && it2->tenant == e.tenant) {
              it2->paid += e.amount;
              it2->waived += e.waived;
              break;
            }
          }
        }
        break;
      }
      default: break;
    }
  }

  std::vector<Holding> holdings_;
  std::vector<Contest> contests_;
  std::vector<Payment> payments_;
  std::vector<HistoryEntry> history_;

 private:
  struct Track {
    TenantId holder;
    Price limit = 0;
    int holding = -1;
    int contest = -1;
  };

  std::string LimitText(Price p, TenantId owner) const { return Sees(owner) ? PriceText(p) : "(hidden)"; }
  std::string OrderText(OrderId o, TenantId owner) const {
    if (!o.valid() || !Sees(owner)) return "";
    return " with order " + std::to_string(o.value);
  }

  void History(Micros t, NodeId n, std::string kind, std::string text, TenantId a, TenantId b = TenantId()) {
    history_.push_back(HistoryEntry{t, n, std::move(kind), std::move(text), a, b});
  }

  void StartHolding(Track& tr, NodeId n, TenantId t, OrderId o, Micros at, Price limit, std::string how) {
    tr.holder = t;
    tr.limit = limit;
    holdings_.push_back(Holding{n, t, o, at, kNever, limit, limit, std::move(how), "", 0, 0});
    tr.holding = static_cast<int>(holdings_.size()) - 1;
  }

  void EndHolding(Track& tr, Micros at, std::string how) {
    if (tr.holding >= 0) {
      Holding& h = holdings_[static_cast<size_t>(tr.holding)];
      h.to = at;
      h.ended = std::move(how);
      h.last_limit = tr.limit;
    }
    tr.holding = -1;
    tr.holder = TenantId();
  }

  void SetLimit(Track& tr, NodeId n, const Item& it) {
    if (!it.rejected.empty()) {
      History(it.time, n, "set_limit_rejected",
              Who(it.tenant) + " tried to set its limit to " + LimitText(it.limit, it.tenant) + ": rejected (" +
                  it.rejected + ").",
              it.tenant);
      return;
    }
    if (tr.holder == it.tenant) {
      bool raise = it.limit > tr.limit;
      tr.limit = it.limit;
      if (tr.holding >= 0) holdings_[static_cast<size_t>(tr.holding)].last_limit = it.limit;
      if (raise && tr.contest >= 0) contests_[static_cast<size_t>(tr.contest)].raised = true;
      History(it.time, n, "set_limit",
              Who(it.tenant) + (raise ? " raised" : " lowered") + " its limit to " + LimitText(it.limit, it.tenant) +
                  ".",
              it.tenant);
    }
  }

  void Notice(Track& tr, NodeId n, const Event& e) {
    TenantId challenger;
    if (e.order.valid()) {
      auto f = order_tenant_.find(e.order.value);
      if (f != order_tenant_.end()) challenger = f->second;
    }
    bool again = false;
    if (tr.contest >= 0 && contests_[static_cast<size_t>(tr.contest)].deadline == e.deadline) {
      again = true;
    } else {
      Contest c;
      c.node = n;
      c.holder = e.tenant;
      c.notice = e.time;
      c.holder_limit = tr.limit;
      contests_.push_back(c);
      tr.contest = static_cast<int>(contests_.size()) - 1;
    }
    Contest& c = contests_[static_cast<size_t>(tr.contest)];
    c.deadline = e.deadline;
    c.price = e.price;
    c.reasons |= e.reasons;
    c.challenger_order = e.order;
    c.challenger = challenger;
    ++c.notices;
    std::string by;
    if (e.order.valid()) {
      by = operator_view() ? " by order " + std::to_string(e.order.value) + " of " + Who(challenger)
                           : " by a challenger";
    }
    std::string text = again ? "A higher bid" + by + " replaced the pending challenger: " + PriceText(e.price) +
                                   "; the deadline stays " + FormatTime(e.deadline) + "."
                             : "Contest: " + Who(e.tenant) + " was given notice (" + ReasonWords(e.reasons) +
                                   "). Price to beat " + PriceText(e.price) + by + "; " + Who(e.tenant) +
                                   "'s limit " + LimitText(tr.limit, e.tenant) + "; grace deadline " +
                                   FormatTime(e.deadline) + ".";
    History(e.time, n, again ? "notice_raised" : "notice", text, e.tenant);
  }

  const market::MarketEngine& eng_;
  const std::unordered_map<uint64_t, TenantId>& order_tenant_;
  TenantId viewer_;
  std::vector<std::string> names_;
  std::unordered_map<uint32_t, Track> tracks_;
};

Result<NodeId> ResolveNode(const market::MarketEngine& eng, const std::string& text) {
  const auto& topo = eng.topology();
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    uint64_t v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec == std::errc() && v < topo.node_count()) return NodeId(static_cast<uint32_t>(v));
  }
  auto byname = topo.FindNode(text);
  if (byname.ok()) return *byname;
  return NotFound("--node: no node '" + text + "' in the log (give its id or its name)");
}

Result<TenantId> ResolveTenant(const market::MarketEngine& eng, const std::string& text, std::string_view flag) {
  auto byname = eng.FindTenant(text);
  if (byname.ok()) return *byname;
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    uint64_t v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec == std::errc() && v < eng.tenant_count()) return TenantId(static_cast<uint32_t>(v));
  }
  return NotFound(std::string(flag) + ": no tenant '" + text + "' in the log (give its id or its name)");
}

std::string Pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

}  // namespace

Result<ExplainOutput> Explain(std::string_view log, bool padded, const ExplainQuery& q) {
  if (q.node.empty() == q.tenant.empty()) return InvalidArgument("explain: give exactly one of --node and --tenant");
  std::vector<Item> items;
  Collector collector(&items);
  ReplayOptions ro;
  ro.price_events = false;
  ro.stop_at = q.at;
  Replayer replayer(ro, &collector);
  std::unordered_map<uint64_t, TenantId> order_tenant;
  size_t mark = 0;
  replayer.set_observer([&](uint64_t, const LogRecord& rec, const market::ApplyResult& res) {
    const auto& body = rec.op.body;
    if (const auto* po = std::get_if<market::OpPlaceOrder>(&body)) {
      if (res.status.ok()) order_tenant[res.created_id] = po->tenant;
    }
    Item it;
    it.time = rec.op.time;
    if (const auto* sl = std::get_if<market::OpSetLimit>(&body)) {
      it.kind = Item::kSetLimit;
      it.tenant = sl->tenant;
      it.node = sl->node;
      it.limit = sl->limit;
    } else if (const auto* rl = std::get_if<market::OpRelinquish>(&body)) {
      it.kind = Item::kRelinquish;
      it.tenant = rl->tenant;
      it.node = rl->node;
    } else {
      mark = items.size();
      return;
    }
    if (!res.status.ok()) it.rejected = res.status.ToString();
    // The call's own events follow it; events of the catch-up to its time
    // (earlier deadlines) precede it.
    size_t pos = mark;
    while (pos < items.size() && items[pos].when() < it.time) ++pos;
    items.insert(items.begin() + static_cast<std::ptrdiff_t>(pos), std::move(it));
    mark = items.size();
  });
  LZ_RETURN_IF_ERROR(replayer.ReplayText(log, padded));
  LZ_RETURN_IF_ERROR(replayer.Finish());
  const market::MarketEngine& eng = replayer.engine();

  TenantId viewer;
  if (!q.as.empty()) {
    LZ_ASSIGN_OR_RETURN(viewer, ResolveTenant(eng, q.as, "--as"));
  }
  NodeId node;
  TenantId subject;
  if (!q.node.empty()) {
    LZ_ASSIGN_OR_RETURN(node, ResolveNode(eng, q.node));
  } else {
    LZ_ASSIGN_OR_RETURN(subject, ResolveTenant(eng, q.tenant, "--tenant"));
    if (viewer.valid() && viewer != subject) {
      return PermissionDenied("--as: a tenant may only see its own account, not that of another tenant");
    }
  }

  Builder b(eng, order_tenant, viewer);
  for (const Item& it : items) {
    NodeId n = it.kind == Item::kEvent ? it.e.node : it.node;
    if (node.valid() && n != node) continue;
    b.Process(it);
  }

  // Which records this account shows.
  auto involves = [&](TenantId t) {
    if (subject.valid()) return t == subject;
    return b.Sees(t);
  };

  Json doc;
  doc["v"] = 1;  // This document's format did not change in version 2.
  doc["view"] = viewer.valid() ? Json{{"tenant", viewer.value}, {"name", b.Who(viewer)}} : Json("operator");
  doc["up_to"] = eng.now();
  doc["up_to_text"] = FormatTime(eng.now());
  const auto& topo = eng.topology();
  std::string text;
  if (node.valid()) {
    const auto& nd = topo.node(node);
    std::string where = topo.location(nd.rack).path;
    doc["node"] = Json{{"id", node.value}, {"name", nd.name}, {"type", topo.type_name(nd.type)}, {"location", where}};
    text += "Node " + std::to_string(node.value) + " \"" + nd.name + "\" (" + topo.type_name(nd.type) + " at " + where +
            "), ";
  } else {
    doc["tenant"] = b.WhoJson(subject);
    text += "Tenant " + std::to_string(subject.value) + " \"" + b.Who(subject) + "\", ";
  }
  text += (viewer.valid() ? "as seen by " + b.Who(viewer) : std::string("operator's view")) + ", up to " +
          FormatTime(eng.now()) + ".\n";

  // Holdings.
  Json holdings = Json::array();
  std::string htext;
  for (const Holding& h : b.holdings_) {
    if (!involves(h.tenant)) continue;
    Json j;
    j["node"] = h.node.value;
    j["tenant"] = b.WhoJson(h.tenant);
    j["from"] = h.from;
    j["to"] = TimeJson(h.to);
    j["limit_at_start"] = PriceJson(h.start_limit);
    j["limit_at_end"] = PriceJson(h.last_limit);
    j["paid"] = h.paid;
    j["waived"] = h.waived;
    j["how_started"] = h.started;
    j["how_ended"] = h.to == kNever ? "still held" : h.ended;
    holdings.push_back(std::move(j));
    htext += "  " + Pad(FormatTime(h.from) + " .. " + (h.to == kNever ? std::string("now") : FormatTime(h.to)), 34) +
             Pad(b.Who(h.tenant), 14) + (node.valid() ? "" : "node " + std::to_string(h.node.value) + "  ") +
             "limit " + PriceText(h.start_limit) +
             (h.last_limit != h.start_limit ? " -> " + PriceText(h.last_limit) : "") + "; paid " +
             FormatMoney(h.paid) + (h.waived ? " (waived " + FormatMoney(h.waived) + ")" : "") + "; " +
             (h.to == kNever ? "still held" : h.ended) + "\n";
  }
  doc["holdings"] = std::move(holdings);
  text += std::string(node.valid() ? "\nWho held it\n" : "\nNodes held\n") + (htext.empty() ? "  nobody" + std::string(viewer.valid() ? " you can see" : "") + "\n"
                                             : htext);

  // Contests.
  Json contests = Json::array();
  std::string ctext;
  int k = 0;
  int evictions = 0;
  for (const Contest& c : b.contests_) {
    if (!involves(c.holder)) continue;
    bool lost = c.outcome == "transferred" || c.outcome == "released";
    evictions += lost;
    Json j;
    j["node"] = c.node.value;
    j["holder"] = b.WhoJson(c.holder);
    j["notice"] = c.notice;
    j["reasons"] = market::ReasonNames(c.reasons);
    j["winning_price"] = PriceJson(c.price);
    j["challenger"] = b.operator_view() ? b.WhoJson(c.challenger) : Json(nullptr);
    if (b.operator_view() && c.challenger_order.valid()) j["challenger_order"] = c.challenger_order.value;
    j["challengers"] = c.notices;
    j["holder_limit"] = PriceJson(c.holder_limit);
    j["deadline"] = TimeJson(c.deadline);
    j["outcome"] = c.outcome;
    j["ended"] = TimeJson(c.ended);
    if (c.outcome == "transferred") {
      j["new_holder"] = b.WhoJson(c.winner);
      if (b.Sees(c.winner)) j["new_holder_limit"] = PriceJson(c.winner_limit);
    }
    contests.push_back(std::move(j));
    ++k;
    ctext += "  " + std::to_string(k) + ". " + FormatTime(c.notice) + (node.valid() ? "" : " node " + std::to_string(c.node.value)) +
             ": " + b.Who(c.holder) + " was given notice (" + ReasonWords(c.reasons) + ").\n     Winning price " +
             PriceText(c.price) +
             (b.operator_view() && c.challenger.valid() ? " (" + b.Who(c.challenger) + ", order " +
                                                              std::to_string(c.challenger_order.value) + ")"
                                                        : "") +
             (c.notices > 1 ? ", after " + std::to_string(c.notices) + " bids" : "") + "; holder's limit " +
             PriceText(c.holder_limit) + "; grace deadline " + FormatTime(c.deadline) + ".\n     Outcome: ";
    if (c.outcome == "kept") {
      ctext += "kept at " + FormatTime(c.ended) +
               (c.raised ? " after raising the limit to " + PriceText(c.limit_after) : "") + ".\n";
    } else if (c.outcome == "transferred") {
      ctext += "the node moved to " + b.Who(c.winner) +
               (b.Sees(c.winner) ? " at limit " + PriceText(c.winner_limit) : "") + " at " + FormatTime(c.ended) +
               (c.ended < c.deadline ? " (early: the holder relinquished)" : "") + ".\n";
    } else if (c.outcome == "released") {
      ctext += "the holder lost the node at " + FormatTime(c.ended) + ".\n";
    } else {
      ctext += "still open.\n";
    }
  }
  doc["contests"] = std::move(contests);
  doc["evictions"] = evictions;
  text += "\nContests\n" + (ctext.empty() ? std::string("  none\n") : ctext);

  // Payments per settled interval.
  Json payments = Json::array();
  std::string ptext;
  Money total = 0, total_waived = 0;
  for (const Payment& p : b.payments_) {
    if (!involves(p.tenant)) continue;
    total += p.amount;
    total_waived += p.waived;
    payments.push_back(Json{{"node", p.node.value},
                            {"tenant", b.WhoJson(p.tenant)},
                            {"from", p.from},
                            {"to", p.to},
                            {"rate", PriceJson(p.rate)},
                            {"paid", p.amount},
                            {"waived", p.waived}});
    ptext += "  " + Pad(FormatTime(p.from) + " .. " + FormatTime(p.to), 34) + Pad(b.Who(p.tenant), 14) +
             (node.valid() ? "" : "node " + std::to_string(p.node.value) + "  ") + "at " + PriceText(p.rate) +
             ": paid " + FormatMoney(p.amount) + (p.waived ? ", waived " + FormatMoney(p.waived) : "") + "\n";
  }
  doc["payments"] = std::move(payments);
  doc["paid_total"] = total;
  doc["waived_total"] = total_waived;
  text += "\nPaid per settled interval (charges settle when the rate changes and when a holding ends)\n" +
          (ptext.empty() ? std::string("  nothing\n")
                         : ptext + "  total paid " + FormatMoney(total) +
                               (total_waived ? ", waived " + FormatMoney(total_waived) : "") + "\n");

  // History.
  Json history = Json::array();
  std::string ttext;
  for (const HistoryEntry& h : b.history_) {
    bool visible = h.kind == "node_added" || h.kind == "node_removed"
                       ? node.valid()
                       : (involves(h.a) || (h.b.valid() && involves(h.b)));
    if (!visible) continue;
    history.push_back(Json{{"t", h.t}, {"node", h.node.value}, {"kind", h.kind}, {"text", h.text}});
    ttext += "  " + Pad(FormatTime(h.t), 22) + (node.valid() ? "" : "node " + std::to_string(h.node.value) + ": ") +
             h.text + "\n";
  }
  doc["history"] = std::move(history);
  text += "\nHistory\n" + (ttext.empty() ? std::string("  nothing\n") : ttext);

  // Now.
  Json now;
  std::string ntext;
  if (node.valid()) {
    auto v = eng.GetNode(node);
    if (!v.ok()) {
      now["status"] = "removed";
      ntext = "the node has been removed.";
    } else if (v->holder.valid() && !b.Sees(v->holder)) {
      now["status"] = "not yours";
      ntext = "the node is not held by you.";
    } else {
      now["status"] = market::NodeStatusName(v->status);
      ntext = std::string(market::NodeStatusName(v->status));
      if (v->holder.valid()) {
        now["holder"] = b.WhoJson(v->holder);
        now["limit"] = PriceJson(v->limit);
        ntext += " by " + b.Who(v->holder) + " since " + FormatTime(v->held_since) + " at limit " + PriceText(v->limit);
        auto eq = eng.GetEvictionQuote(v->holder, node);
        if (eq.ok()) {
          now["pays"] = PriceJson(eq->pays);
          now["obtain"] = PriceJson(eq->obtain);
          now["competing"] = PriceJson(eq->competing);
          ntext += "; pays " + PriceText(eq->pays) + "; a challenger must bid " + PriceText(eq->obtain);
          if (eq->contested) {
            now["deadline"] = TimeJson(eq->deadline);
            ntext += "; contested, deadline " + FormatTime(eq->deadline);
          }
        }
      }
      if (b.operator_view() || !v->holder.valid()) {
        now["floor"] = PriceJson(v->floor);
        ntext += (v->holder.valid() ? "; floor " : " (floor ") + PriceText(v->floor) + (v->holder.valid() ? "" : ")");
      }
      ntext += ".";
    }
  } else {
    auto t = eng.GetTenant(subject);
    if (t.ok()) {
      now["balance"] = t->balance;
      now["paid"] = t->paid;
      now["waived"] = t->waived;
      now["exhausted"] = t->exhausted;
      Json held = Json::array();
      for (NodeId n : t->nodes) held.push_back(n.value);
      now["nodes"] = std::move(held);
      ntext = "balance " + FormatMoney(t->balance) + "; paid " + FormatMoney(t->paid) + " in all; holds " +
              std::to_string(t->nodes.size()) + " node(s); " + std::to_string(evictions) + " eviction(s) so far" +
              (t->exhausted ? "; out of money." : ".");
    }
  }
  doc["now"] = std::move(now);
  text += "\nAt " + FormatTime(eng.now()) + ": " + ntext + "\n";

  ExplainOutput out;
  out.json = doc.dump(1) + "\n";
  out.text = std::move(text);
  return out;
}

}  // namespace laissez::oplog
