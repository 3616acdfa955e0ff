// `laissez demo story`: the paper's two-application story (Fig. 1 and 2) on the
// real engine, told in plain words.
//
// Three nodes of three hardware types. App A (checkpointed training) holds HW1.
// App B arrives, takes HW2 and raises its willingness to pay for HW1 over time.
// A is outbid, finishes its checkpoint inside the grace window and migrates to
// the remaining free node (its next-best hardware); B gets HW1.
#include <cstdio>
#include <string>

#include "common/money.h"
#include "market/market_engine.h"
#include "tools/commands.h"
#include "tools/story.h"

namespace laissez::cli {
namespace {

using market::Event;
using market::EventType;
using market::MarketEngine;
using market::OrderSpec;

constexpr Micros kMin = 60 * kMicrosPerSecond;
constexpr Price kUnit = kMicroUnits;

std::string Clock(Micros t) {
  char buf[32];
  long s = static_cast<long>(t / kMicrosPerSecond);
  std::snprintf(buf, sizeof buf, "%02ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// Prints the market's events as sentences; remembers nothing but names.
class Narrator : public market::EventSink {
 public:
  explicit Narrator(const MarketEngine& e) : e_(e) {}
  void OnEvents(std::span<const Event> events) override {
    for (const Event& ev : events) {
      log.push_back(ev);
      if (out_) Say(ev);
    }
  }
  void set_out(std::FILE* out) { out_ = out; }
  std::vector<Event> log;

 private:
  std::string Tenant(TenantId t) const { return t.valid() ? e_.GetTenant(t)->name : "?"; }
  std::string NodeName(NodeId n) const {
    const auto& node = e_.topology().node(n);
    return node.name + " (" + e_.topology().type_name(node.type) + ")";
  }
  void Say(const Event& ev) const {
    std::string when = Clock(ev.time);
    switch (ev.type) {
      case EventType::kAllocated:
        std::fprintf(out_, "%s  %s gets %s; it will keep it while its bid beats competing demand (limit %s/h)\n",
                    when.c_str(), Tenant(ev.tenant).c_str(), NodeName(ev.node).c_str(), FormatMoney(ev.price).c_str());
        break;
      case EventType::kNotice:
        std::fprintf(out_, "%s  NOTICE to %s: %s is wanted at %s/h (%s); it must raise its limit or leave by %s\n",
                    when.c_str(), Tenant(ev.tenant).c_str(), NodeName(ev.node).c_str(),
                    FormatMoney(ev.price).c_str(), market::ReasonNames(ev.reasons).c_str(), Clock(ev.deadline).c_str());
        break;
      case EventType::kContestEnded:
        std::fprintf(out_, "%s  %s keeps %s: its raised limit beats the challenger\n", when.c_str(),
                    Tenant(ev.tenant).c_str(), NodeName(ev.node).c_str());
        break;
      case EventType::kTransferred:
        std::fprintf(out_, "%s  %s moves from %s to %s (new limit %s/h)\n", when.c_str(), NodeName(ev.node).c_str(),
                    Tenant(ev.other).c_str(), Tenant(ev.tenant).c_str(), FormatMoney(ev.price).c_str());
        break;
      case EventType::kReleased:
        std::fprintf(out_, "%s  %s releases %s (%s)\n", when.c_str(), Tenant(ev.tenant).c_str(), NodeName(ev.node).c_str(),
                    market::ReasonNames(ev.reasons).c_str());
        break;
      case EventType::kCharged:
        std::fprintf(out_, "%s  %s paid %s for %s from %s at %s/h (the second price, never above its limit)\n",
                    when.c_str(), Tenant(ev.tenant).c_str(), FormatMoney(ev.amount).c_str(),
                    NodeName(ev.node).c_str(), Clock(ev.deadline).c_str(), FormatMoney(ev.price).c_str());
        break;
      default:
        break;
    }
  }
  const MarketEngine& e_;
  std::FILE* out_ = nullptr;
};

}  // namespace

StoryOutcome RunStory(std::FILE* out) {
  market::MarketParams params;
  params.grace = 10 * kMin;
  MarketEngine e(params);
  Narrator narrator(e);
  narrator.set_out(out);
  auto P = [out](const char* fmt, auto... args) {
    if (out) std::fprintf(out, fmt, args...);
  };
  e.set_sink(&narrator);
  auto add = [&](const char* name, const char* type, int gpus, int power) {
    return *e.AddNode(0, topology::NodeInfo{name, type, "us", "us-1a", "row1", "rack1", {gpus, 640, power}});
  };
  NodeId hw1 = add("hw1", "h100x8", 8, 10200);
  NodeId hw2 = add("hw2", "a100x8", 8, 6500);
  NodeId hw3 = add("hw3", "l40sx8", 8, 4200);
  auto vx = [&](NodeId n) { return e.topology().node(n).leaf; };
  // Operator floors (InfraMaps static floors): what each node costs the operator to run.
  Price floors[] = {3 * kUnit, 2 * kUnit, 1 * kUnit};
  NodeId all[] = {hw1, hw2, hw3};
  for (int i = 0; i < 3; ++i) {
    market::FloorTarget target;
    target.node = all[i];
    (void)e.AddPolicy(0, market::StaticFloorSpec{target, floors[i]});
  }
  TenantId a = *e.CreateTenant(0, "app-A (training)", 10'000 * kUnit);
  TenantId b = *e.CreateTenant(0, "app-B (serving)", 10'000 * kUnit);

  P("LaissezCloud story: three nodes (hw1 h100x8, hw2 a100x8, hw3 l40sx8); grace %s;\n"
              "operator floors 3/h, 2/h, 1/h.\n",
              Clock(params.grace).c_str());
  P("App A values hw1 at 12/h and hw3 at 5/h; it checkpoints every 20 minutes.\n\n");
  auto must = [](const Status& s) {
    if (!s.ok()) std::fprintf(stderr, "demo: %s\n", s.ToString().c_str());
  };
  auto a1 = e.PlaceOrder(0, a, OrderSpec{vx(hw1), 12 * kUnit});
  must(a1.status());

  P("\n-- 00:06 app B arrives: it prefers hw1, settles for hw2, and bids low for hw1 --\n");
  Micros t = 6 * kMin;
  must(e.PlaceOrder(t, b, OrderSpec{vx(hw2), 6 * kUnit}).status());
  auto b1 = e.PlaceOrder(t, b, OrderSpec{vx(hw1), 8 * kUnit});
  must(b1.status());
  auto q = e.GetEvictionQuote(a, hw1);
  P("%s  A's eviction quote on hw1: competing demand %s/h, A pays %s/h, a challenger needs %s/h\n",
              Clock(t).c_str(), FormatMoney(q->competing).c_str(), FormatMoney(q->pays).c_str(),
              FormatMoney(q->obtain).c_str());

  P("\n-- B's load grows: it raises its bid for hw1 step by step --\n");
  for (Price p : {10 * kUnit, 14 * kUnit}) {
    t += 4 * kMin;
    must(e.UpdateOrder(t, b, *b1, p));
    P("%s  B bids %s/h for hw1\n", Clock(t).c_str(), FormatMoney(p).c_str());
  }
  Micros notice = t;

  P("\n-- A is outbid: hw1 is worth 12/h to it, so it will not match 14/h.\n");
  P("   Its next checkpoint is at 00:20, inside the grace window: it finishes it, then moves. --\n");
  t = 20 * kMin;
  must(e.Advance(t));
  P("%s  A's checkpoint is saved (the epoch's work is kept)\n", Clock(t).c_str());
  must(e.Relinquish(t, a, hw1));
  must(e.PlaceOrder(t, a, OrderSpec{vx(hw3), 5 * kUnit}).status());
  Micros restore = 3 * kMin;
  P("%s  A restores its checkpoint on hw3: %s of restart gap, then it trains on hw3\n",
              Clock(t + restore).c_str(), Clock(restore).c_str());
  P("\n-- B no longer needs hw2 --\n");
  must(e.Relinquish(t + 5 * kMin, b, hw2));

  t = 60 * kMin;
  must(e.Relinquish(t, a, hw3));
  must(e.Relinquish(t, b, hw1));
  auto ta = e.GetTenant(a), tb = e.GetTenant(b);
  auto totals = e.ledger_totals();
  P("\nAfter one hour: A paid %s, B paid %s; the operator earned %s. A was noticed at %s and left at "
              "00:20 with its checkpoint, so no work was lost.\n",
              FormatMoney(ta->paid).c_str(), FormatMoney(tb->paid).c_str(), FormatMoney(totals.operator_revenue).c_str(),
              Clock(notice).c_str());
  StoryOutcome o;
  o.events = narrator.log;
  o.hw1 = hw1;
  o.hw2 = hw2;
  o.hw3 = hw3;
  o.a = a;
  o.b = b;
  o.notice_time = notice;
  o.a_paid = ta->paid;
  o.b_paid = tb->paid;
  o.money_conserved = totals.deposited == totals.tenant_balances + totals.operator_revenue;
  P("Money conserved: %s\n", o.money_conserved ? "yes" : "NO");
  return o;
}

namespace {
int RunStoryCommand() { return RunStory(stdout).money_conserved ? 0 : 1; }
}  // namespace

void RegisterDemoCommands(CLI::App& app, int* exit_code) {
  auto* demo = app.add_subcommand("demo", "Run a demonstration");
  demo->require_subcommand(1);
  auto* story = demo->add_subcommand("story", "The paper's two-application story (Fig. 1 and 2) in plain words");
  story->callback([exit_code] { *exit_code = RunStoryCommand(); });
}

}  // namespace laissez::cli
