// Write-read round trips of every operation kind and event type, and a table
// of invalid lines that must each fail naming the field. No engine needed.
#include <gtest/gtest.h>

#include <charconv>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "oplog/oplog.h"

namespace laissez::oplog {
namespace {

using namespace laissez::market;

std::vector<Operation> EveryOperation() {
  std::vector<Operation> ops;
  auto add = [&](Micros t, OpBody body) { ops.push_back(Operation{t, std::move(body)}); };
  add(0, OpAdvance{});
  add(1, OpAddNode{topology::NodeInfo{"n-1 \"quoted\"\\", "h100x8", "eu", "eu-1a", "r1", "k1\t", {8, 640, 7000}}});
  add(2, OpRemoveNode{NodeId(7)});
  MarketParams p;
  p.grace = 90 * kMicrosPerSecond;
  p.hysteresis_ppm = 50'000;
  p.tick = 10;
  p.clip_alpha_ppm = 100'000;
  p.clip_interval = 30 * kMicrosPerSecond;
  p.decay_beta = 3;
  p.min_hold = 600 * kMicrosPerSecond;
  add(3, OpSetParams{p});
  add(4, OpAddPolicy{StaticFloorSpec{FloorTarget{LocationId(3), NodeId()}, 1'500'000}});
  add(5, OpAddPolicy{StaticFloorSpec{FloorTarget{LocationId(), NodeId(9)}, kInfPrice}});
  add(6, OpAddPolicy{PowerCapSpec{LocationId(4), 100'000, {{0, 0}, {800'000, 2'000'000}, {1'000'000, kInfPrice}}}});
  add(7, OpAddPolicy{CarbonSpec{LocationId(1), 80'000'000, {{0, 300}, {3'600'000'000, 120}}}});
  add(8, OpAddPolicy{MaintenanceSpec{FloorTarget{LocationId(5), NodeId()}, 10'000'000, 20'000'000}});
  add(9, OpAddPolicy{MaintenanceSpec{FloorTarget{LocationId(), NodeId(2)}, 10'000'000, kNever}});
  add(9, OpAddPolicy{StaticFloorSpec{FloorTarget{}, 5}});  // No target: the engine rejects it, the log keeps it.
  add(9, OpAddPolicy{AdaptivePowerCapSpec{LocationId(4), 73'440, 150'000, 100'000, 60'000'000, 250'000, 1'000'000,
                                          20'000'000, 500'000, 0, kInfPrice}});
  add(9, OpAddPolicy{AdaptivePowerCapSpec{LocationId(4), 5'000, 0, 0, 1'000'000, 0, 1, 1, 0, 7, 9}});
  add(9, OpAddPolicy{AdaptiveCarbonBudgetSpec{LocationId(1), 2'500'000, {{0, 300}, {3'600'000'000, 120}}, 50'000,
                                              100'000, 300'000'000, 200'000, 5'000'000, 40'000'000, 2'000'000,
                                              10'000'000, kInfPrice}});
  add(9, OpAddPolicy{AdaptiveCarbonBudgetSpec{LocationId(2), 1, {}, 0, 0, 1'000'000, 0, 1, 1, 0, 0, 3}});
  add(10, OpRemovePolicy{PolicyId(2)});
  add(11, OpCreateTenant{"acme", 100'000'000, kInfPrice});
  add(12, OpCreateTenant{"b\u00e9ta", 0, 5'000'000});
  add(13, OpDeposit{TenantId(1), 42});
  add(14, OpSetMaxRate{TenantId(1), 7'000'000});
  add(15, OpSetMaxRate{TenantId(1), kInfPrice});
  add(16, OpPlaceOrder{TenantId(0), OrderSpec{VertexId(12), 2'500'000, 1, Locality::kAny, NodeId()}});
  add(17, OpPlaceOrder{TenantId(0), OrderSpec{VertexId(3), 2'500'001, 4, Locality::kSameRack, NodeId(5)}});
  add(18, OpUpdateOrder{TenantId(0), OrderId(123456789012ULL), 3'000'000});
  add(19, OpCancelOrder{TenantId(0), OrderId(0)});
  add(20, OpSetLimit{TenantId(2), NodeId(4), 9'000'000});
  add(21, OpRelinquish{TenantId(2), NodeId(4)});
  add(22, OpSetAdaptiveCap{PolicyId(3), 61'200});
  add(9'000'000'000'000'000'000, OpAdvance{});
  return ops;
}

TEST(OplogCodec, EveryOperationKindRoundTrips) {
  auto ops = EveryOperation();
  std::vector<bool> seen(std::variant_size_v<OpBody>, false);
  for (const Operation& op : ops) {
    seen[op.body.index()] = true;
    std::string line = EncodeOperation(op);
    SCOPED_TRACE(line);
    EXPECT_EQ(line.find('\n'), std::string::npos);
    auto back = DecodeOperation(line);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->time, op.time);
    EXPECT_EQ(back->body.index(), op.body.index());
    // Re-encoding is byte-identical: the encoding is canonical.
    EXPECT_EQ(EncodeOperation(*back), line);
    // Compare the bodies field by field through a second round trip of the
    // typed values where operator== exists.
    if (auto* a = std::get_if<OpPlaceOrder>(&op.body)) {
      auto* b = std::get_if<OpPlaceOrder>(&back->body);
      EXPECT_EQ(a->spec, b->spec);
      EXPECT_EQ(a->tenant, b->tenant);
    }
    if (auto* a = std::get_if<OpSetParams>(&op.body)) {
      EXPECT_EQ(a->params, std::get<OpSetParams>(back->body).params);
    }
    if (auto* a = std::get_if<OpAddPolicy>(&op.body)) {
      EXPECT_EQ(a->spec, std::get<OpAddPolicy>(back->body).spec);
    }
    if (auto* a = std::get_if<OpAddNode>(&op.body)) {
      const auto& b = std::get<OpAddNode>(back->body).info;
      EXPECT_EQ(a->info.name, b.name);
      EXPECT_EQ(a->info.type, b.type);
      EXPECT_EQ(a->info.rack, b.rack);
      EXPECT_EQ(a->info.meta.gpus, b.meta.gpus);
      EXPECT_EQ(a->info.meta.memory_gb, b.meta.memory_gb);
      EXPECT_EQ(a->info.meta.power_w, b.meta.power_w);
    }
    if (auto* a = std::get_if<OpCreateTenant>(&op.body)) {
      const auto& b = std::get<OpCreateTenant>(back->body);
      EXPECT_EQ(a->name, b.name);
      EXPECT_EQ(a->balance, b.balance);
      EXPECT_EQ(a->max_rate, b.max_rate);
    }
    if (auto* a = std::get_if<OpUpdateOrder>(&op.body)) {
      EXPECT_EQ(a->order, std::get<OpUpdateOrder>(back->body).order);
      EXPECT_EQ(a->price, std::get<OpUpdateOrder>(back->body).price);
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_TRUE(seen[i]) << "operation kind " << i << " not covered";
}

TEST(OplogCodec, ExampleLineIsDocumented) {
  Operation op{1'500'000, OpPlaceOrder{TenantId(3), OrderSpec{VertexId(12), 2'500'000, 1, Locality::kAny, NodeId()}}};
  EXPECT_EQ(EncodeOperation(op),
            R"({"v":1,"t":1500000,"op":"place_order","tenant":3,"scope":12,"price":2500000,"count":1})");
  EXPECT_EQ(EncodeOperation(op, 9),
            R"({"v":1,"t":1500000,"op":"place_order","id":9,"tenant":3,"scope":12,"price":2500000,"count":1})");
  auto rec = DecodeRecord(EncodeOperation(op, 9));
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->created_id, 9u);
  auto plain = DecodeRecord(EncodeOperation(op));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->created_id, kNoId);
}

// Version 2: an operation line may carry the client's idempotency key; lines
// without one are still written, and read, as version 1.
TEST(OplogCodec, IdempotencyKeyRoundTripsAsVersion2) {
  market::Operation op{7, market::OpDeposit{TenantId(3), 250}};
  std::string plain, keyed;
  AppendOperation(op, kNoId, &plain);
  AppendOperation(op, kNoId, "dep-1:a_b.c", &keyed);
  EXPECT_EQ(plain.rfind(R"({"v":1,)", 0), 0u) << plain;
  EXPECT_EQ(keyed, R"({"v":2,"t":7,"op":"deposit","key":"dep-1:a_b.c","tenant":3,"amount":250})");
  auto r = DecodeRecord(keyed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->idempotency_key, "dep-1:a_b.c");
  EXPECT_EQ(EncodeOperation(r->op), plain);
  auto old = DecodeRecord(plain);
  ASSERT_TRUE(old.ok());
  EXPECT_TRUE(old->idempotency_key.empty());
  EXPECT_FALSE(CheckIdempotencyKey(std::string(kMaxIdempotencyKey + 1, 'a'), "idempotency_key").ok());
  EXPECT_TRUE(CheckIdempotencyKey(std::string(kMaxIdempotencyKey, 'a'), "idempotency_key").ok());
}

TEST(OplogCodec, KeysInAnyOrderWhitespaceAndNewline) {
  auto r = DecodeOperation("  { \"price\" : 5 , \"op\":\"update_order\",\"order\":2,\"tenant\":1,\"t\":10,\"v\":1 }\r\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& o = std::get<OpUpdateOrder>(r->body);
  EXPECT_EQ(r->time, 10);
  EXPECT_EQ(o.price, 5);
  EXPECT_EQ(o.order, OrderId(2));
  EXPECT_EQ(o.tenant, TenantId(1));
}

TEST(OplogCodec, OptionalFieldsTakeDefaults) {
  auto r = DecodeOperation(R"({"v":1,"t":0,"op":"place_order","tenant":1,"scope":2,"price":3})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& o = std::get<OpPlaceOrder>(r->body);
  EXPECT_EQ(o.spec.count, 1u);
  EXPECT_EQ(o.spec.locality, Locality::kAny);
  EXPECT_FALSE(o.spec.rel_to.valid());
  auto t = DecodeOperation(R"({"v":1,"t":0,"op":"create_tenant","name":"x","balance":3})");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(std::get<OpCreateTenant>(t->body).max_rate, kInfPrice);
}

TEST(OplogCodec, NamesResolveThroughATopology) {
  topology::Topology topo;
  ASSERT_TRUE(topo.AddNode({"n-17", "h100x8", "eu", "eu-1a", "r1", "k1", {8, 640, 7000}}).ok());
  DecodeOptions opts{&topo};
  auto r = DecodeOperation(
      R"({"v":1,"t":0,"op":"place_order","tenant":1,"scope":"h100x8/eu/eu-1a","price":3,"locality":"same_zone","rel_to":"n-17"})",
      opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& o = std::get<OpPlaceOrder>(r->body);
  EXPECT_EQ(o.spec.scope, *topo.FindVertex("h100x8/eu/eu-1a"));
  EXPECT_EQ(o.spec.rel_to, *topo.FindNode("n-17"));
  auto f = DecodeOperation(R"({"v":1,"t":0,"op":"add_policy","kind":"static_floor","location":"eu/eu-1a","price":3})",
                           opts);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(std::get<StaticFloorSpec>(std::get<OpAddPolicy>(f->body).spec).target.location,
            *topo.FindLocation("eu/eu-1a"));
  // Without a topology, or with an unknown name, the field is named.
  auto no_topo = DecodeOperation(R"({"v":1,"t":0,"op":"relinquish","tenant":1,"node":"n-17"})");
  ASSERT_FALSE(no_topo.ok());
  EXPECT_EQ(no_topo.status().message().rfind("node:", 0), 0u) << no_topo.status().message();
  auto unknown = DecodeOperation(R"({"v":1,"t":0,"op":"relinquish","tenant":1,"node":"n-99"})", opts);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("n-99"), std::string::npos);
}

std::vector<Event> EveryEvent() {
  std::vector<Event> events;
  auto ev = [&](EventType type) -> Event& {
    Event e;
    e.time = 1000 + static_cast<Micros>(events.size());
    e.type = type;
    events.push_back(e);
    return events.back();
  };
  { auto& e = ev(EventType::kAllocated); e.node = NodeId(1); e.tenant = TenantId(2); e.order = OrderId(3); e.price = 0; }
  { auto& e = ev(EventType::kReserved); e.node = NodeId(1); e.tenant = TenantId(2); e.order = OrderId(3); }
  { auto& e = ev(EventType::kNotice); e.node = NodeId(1); e.tenant = TenantId(2); e.price = kInfPrice; e.deadline = 5000;
    e.reasons = kReasonFloor | kReasonMaintenance; }
  { auto& e = ev(EventType::kNotice); e.node = NodeId(1); e.tenant = TenantId(2); e.price = 7; e.deadline = kNever;
    e.reasons = kReasonOutbid; }
  { auto& e = ev(EventType::kContestEnded); e.node = NodeId(1); e.tenant = TenantId(2); }
  { auto& e = ev(EventType::kTransferred); e.node = NodeId(1); e.tenant = TenantId(2); e.other = TenantId(4);
    e.order = OrderId(3); e.price = 99; }
  { auto& e = ev(EventType::kReleased); e.node = NodeId(1); e.tenant = TenantId(2); e.reasons = kReasonRelinquish; }
  { auto& e = ev(EventType::kCharged); e.node = NodeId(1); e.tenant = TenantId(2); e.price = 5; e.amount = 17;
    e.waived = 3; }
  { auto& e = ev(EventType::kOrderCancelled); e.order = OrderId(3); e.tenant = TenantId(2);
    e.cancel_reason = CancelReason::kRelToLost; }
  { auto& e = ev(EventType::kOrderFilled); e.order = OrderId(3); e.tenant = TenantId(2); }
  { auto& e = ev(EventType::kGangDropped); e.order = OrderId(3); e.tenant = TenantId(2); e.deadline = 77; }
  { auto& e = ev(EventType::kExhausted); e.tenant = TenantId(2); }
  { auto& e = ev(EventType::kPriceChanged); e.vertex = VertexId(8); e.price = kInfPrice; }
  { auto& e = ev(EventType::kPriceChanged); e.vertex = VertexId(8); e.price = 1; }
  // Price changes with more than a vertex and a price (the engine makes none)
  // take the general path, not the price change's short one, and keep every field.
  { auto& e = ev(EventType::kPriceChanged); e.vertex = VertexId(8); e.price = 1; e.node = NodeId(2); }
  { auto& e = ev(EventType::kPriceChanged); e.vertex = VertexId(8); e.price = 1; e.order = OrderId(4); e.amount = 7; }
  { auto& e = ev(EventType::kPriceChanged); e.price = 3; e.deadline = 9; e.reasons = kReasonFloor; }
  { auto& e = ev(EventType::kPriceChanged); e.vertex = VertexId(8); e.price = 1; e.tenant = TenantId(3);
    e.other = TenantId(4); e.waived = 2; e.cancel_reason = CancelReason::kScopeGone; }
  { auto& e = ev(EventType::kNodeAdded); e.node = NodeId(0); }
  { auto& e = ev(EventType::kNodeRemoved); e.node = NodeId(0); }
  // Every cancel reason, and a field a type does not usually carry.
  for (int i = 0; i < 6; ++i) {
    auto& e = ev(EventType::kOrderCancelled);
    e.order = OrderId(40 + i);
    e.tenant = TenantId(1);
    e.cancel_reason = static_cast<CancelReason>(i);
  }
  { auto& e = ev(EventType::kExhausted); e.tenant = TenantId(2); e.amount = 12; e.vertex = VertexId(1); }
  return events;
}

TEST(OplogCodec, EveryEventTypeRoundTrips) {
  std::vector<bool> seen(static_cast<int>(EventType::kNodeRemoved) + 1, false);
  for (const Event& e : EveryEvent()) {
    seen[static_cast<int>(e.type)] = true;
    std::string line = EncodeEvent(e);
    SCOPED_TRACE(line);
    auto back = DecodeEvent(line);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, e);
    EXPECT_EQ(EncodeEvent(*back), line);
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_TRUE(seen[i]) << "event type " << i << " not covered";
}

// The decoder reads the codec's own compact lines on a short path and any
// other JSON through simdjson. The same line with a space after each key (the
// general parse) must give the same operation or event.
std::string SpacedOut(const std::string& line) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    out.push_back(c);
    if (c == '\\' && in_string) {
      out.push_back(line[++i]);
      continue;
    }
    if (c == '"') in_string = !in_string;
    if (c == ':' && !in_string) out.push_back(' ');
  }
  return out;
}

// A compact line decodes as the spaced one: the same operation or the same error.
void ExpectDecodesAsSpaced(const std::string& line) {
  SCOPED_TRACE(line);
  auto a = DecodeOperation(line);
  auto b = DecodeOperation(SpacedOut(line));
  ASSERT_EQ(a.ok(), b.ok()) << a.status().ToString() << " | " << b.status().ToString();
  if (a.ok()) {
    EXPECT_EQ(EncodeOperation(*a), EncodeOperation(*b));
  } else {
    EXPECT_EQ(a.status().ToString(), b.status().ToString());
  }
}

TEST(OplogCodec, CompactAndSpacedLinesDecodeAlike) {
  for (const Operation& op : EveryOperation()) {
    std::string line = EncodeOperation(op);
    std::string spaced = SpacedOut(line);
    SCOPED_TRACE(spaced);
    ASSERT_NE(spaced, line);
    auto a = DecodeOperation(line);
    auto b = DecodeOperation(spaced);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(EncodeOperation(*a), EncodeOperation(*b));
  }
  for (const Event& e : EveryEvent()) {
    std::string line = EncodeEvent(e);
    auto a = DecodeEvent(line);
    auto b = DecodeEvent(SpacedOut(line));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(*a, *b);
  }
  // A JSON escape and UTF-8 text in a compact line (the short decoder hands
  // such a line to simdjson).
  auto t = DecodeOperation(
      "{\"v\":1,\"t\":9000000000000000000,\"op\":\"create_tenant\",\"name\":\"a\\\"b\\u00e9 \u00e9\",\"balance\":3}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->time, 9000000000000000000);
  EXPECT_EQ(std::get<OpCreateTenant>(t->body).name, "a\"b\u00e9 \u00e9");
  // Plain numbers at the short decoder's limits: 19 digits it reads itself,
  // 20 it hands on; either way the compact line decodes as the spaced one,
  // the same value or the same error.
  for (std::string_view t_text : {"9000000000000000000", "9223372036854775807", "18446744073709551615",
                                  "18446744073709551616", "99999999999999999999", "00", "-1"}) {
    ExpectDecodesAsSpaced("{\"v\":1,\"t\":" + std::string(t_text) +
                          ",\"op\":\"create_tenant\",\"name\":\"a\",\"balance\":3}");
  }
  auto big = DecodeOperation("{\"v\":1,\"t\":9000000000000000000,\"op\":\"create_tenant\",\"name\":\"a\",\"balance\":3}");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->time, 9000000000000000000);
}

// The short decoder compares a key of up to eight letters as one word (issue 12): keys one
// letter off, and numbers of every length from 1 to 21 digits, decode as the spaced line does
// (simdjson's), the same value or the same error.
TEST(OplogCodec, CompactNumbersAndKeysOfEveryLengthDecodeAsSpaced) {
  auto same = ExpectDecodesAsSpaced;
  const std::string digits = "918273645546372819012";
  for (size_t n = 1; n <= digits.size(); ++n) {
    for (const std::string& number : {digits.substr(0, n), std::string(n, '9'), "1" + std::string(n - 1, '0')}) {
      same("{\"v\":1,\"t\":" + number + ",\"op\":\"deposit\",\"tenant\":1,\"amount\":" + number + "}");
    }
  }
  const std::string deposit = R"({"v":1,"t":5,"op":"deposit","tenant":12,"amount":34567})";
  auto ok = DecodeOperation(deposit);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(std::get<OpDeposit>(ok->body).amount, 34567);
  EXPECT_EQ(std::get<OpDeposit>(ok->body).tenant, TenantId(12));
  for (const std::string key : {"tenant", "amount", "op"}) {
    const size_t at = deposit.find("\"" + key + "\"") + 1;
    std::string last = deposit, longer = deposit, shorter = deposit, nul = deposit;
    last[at + key.size() - 1] = 'x';
    longer.insert(at + key.size(), "s");
    shorter.erase(at + key.size() - 1, 1);
    nul.insert(at + key.size(), std::string(1, '\0'));
    for (const std::string& line : {last, longer, shorter, nul}) {
      auto r = DecodeOperation(line);
      EXPECT_FALSE(r.ok()) << line;  // A key one letter off is no key of the table.
      same(line);
    }
  }
  // Keys of eight letters and of nine (compared by name).
  same(R"({"v":1,"t":5,"op":"set_max_rate","tenant":1,"max_rate":20})");
  same(R"({"v":1,"t":5,"op":"set_max_rate","tenant":1,"max_ratf":20})");
  same(R"({"v":1,"t":5,"op":"add_node","name":"n","type":"a","region":"r","zone":"z","row":"w","rack":"k","gpus":8,"memory_gb":64,"power_w":700})");
  same(R"({"v":1,"t":5,"op":"add_node","name":"n","type":"a","region":"r","zone":"z","row":"w","rack":"k","gpus":8,"memory_gc":64,"power_w":700})");
}

// An event type outside the enum is a broken invariant, not a line to write.
TEST(OplogCodecDeathTest, EventTypeOutsideTheEnumAborts) {
  Event e;
  e.type = static_cast<EventType>(static_cast<int>(EventType::kNodeRemoved) + 1);
  EXPECT_DEATH(EncodeEvent(e), "CHECK failed");
}

TEST(OplogCodec, EventExample) {
  Event e;
  e.time = 1'500'000;
  e.type = EventType::kNotice;
  e.node = NodeId(4);
  e.tenant = TenantId(3);
  e.price = 2'600'000;
  e.deadline = 121'500'000;
  e.reasons = kReasonOutbid;
  EXPECT_EQ(EncodeEvent(e),
            R"({"v":1,"t":1500000,"event":"notice","node":4,"tenant":3,"price":2600000,"deadline":121500000,"reasons":"outbid"})");
}

// Event lines format their numbers without std::to_chars (issue 12): the
// bytes must be to_chars' at every digit count and at the ends of the range,
// including times, which the encoder caches from line to line.
TEST(OplogCodec, EventNumbersAsToChars) {
  auto dec = [](int64_t v) {
    char buf[24];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  };
  std::vector<int64_t> values = {0, 1, -1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max() - 1, 999'999'999'999'999'999,
                                 1'000'000'000'000'000'000, 1'000'000'000'000'000'001};
  for (int64_t p = 1; p <= std::numeric_limits<int64_t>::max() / 10; p *= 10) {
    for (int64_t v : {p - 1, p, p + 1, 10 * p - 1, 3 * p + 7 * (p / 10)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  for (int64_t v : values) {
    Event e;
    e.time = v;
    e.type = EventType::kCharged;
    e.node = NodeId(static_cast<uint32_t>(static_cast<uint64_t>(v) >> 33));
    e.tenant = TenantId(static_cast<uint32_t>(v) & 0x7fff'ffff);
    e.price = v;
    e.amount = v / 7;
    e.waived = v == std::numeric_limits<int64_t>::min() ? 3 : -v;
    e.deadline = v == 0 || v == kNever ? 5 : v;  // 0 would leave the field out.
    std::string want = "{\"v\":1,\"t\":" + dec(v) + ",\"event\":\"charged\",\"node\":" + dec(e.node.value) +
                       ",\"tenant\":" + dec(e.tenant.value) + ",\"price\":" + (v == kInfPrice ? "\"inf\"" : dec(v)) +
                       ",\"amount\":" + dec(v / 7) + ",\"waived\":" + dec(e.waived) + ",\"deadline\":" + dec(e.deadline) + "}";
    EXPECT_EQ(EncodeEvent(e), want);
  }
}

// The same, densely: every number below 10^6 and numbers of every length
// from a fixed pseudo-random stream, as a price change's vertex and price
// and as a charge's fields.
TEST(OplogCodec, EventNumbersAsToCharsDense) {
  auto dec = [](auto v) {
    char buf[24];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  };
  std::vector<int64_t> values;
  for (int64_t v = 0; v < 1'000'000; ++v) values.push_back(v);
  uint64_t x = 0x9e3779b97f4a7c15;
  for (int i = 0; i < 400'000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    values.push_back(static_cast<int64_t>(x >> (x % 64)) * ((x >> 6) % 2 == 0 ? 1 : -1));
  }
  for (int64_t v : values) {
    Event e;
    e.time = 5;
    e.type = EventType::kPriceChanged;
    e.vertex = VertexId(static_cast<uint32_t>(v) & 0x7fff'ffff);
    e.price = v;
    ASSERT_EQ(EncodeEvent(e), "{\"v\":1,\"t\":5,\"event\":\"price_changed\",\"vertex\":" + dec(e.vertex.value) +
                                  ",\"price\":" + (v == kInfPrice ? "\"inf\"" : dec(v)) + "}");
    e.type = EventType::kCharged;
    e.vertex = VertexId();
    e.node = NodeId(static_cast<uint32_t>(v >> 31) & 0x7fff'ffff);
    e.amount = v;
    ASSERT_EQ(EncodeEvent(e), "{\"v\":1,\"t\":5,\"event\":\"charged\",\"node\":" + dec(e.node.value) +
                                  ",\"price\":" + (v == kInfPrice ? "\"inf\"" : dec(v)) + ",\"amount\":" + dec(v) + ",\"waived\":0}");
  }
}

struct BadLine {
  const char* line;
  const char* field;  // The message must start with "field:".
  const char* reason; // ... and contain this.
};

void PrintTo(const BadLine& c, std::ostream* os) { *os << c.line; }

class OplogInvalidLine : public ::testing::TestWithParam<BadLine> {};

TEST_P(OplogInvalidLine, FailsNamingTheField) {
  const BadLine& c = GetParam();
  auto r = DecodeOperation(c.line);
  ASSERT_FALSE(r.ok()) << c.line;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind(std::string(c.field) + ":", 0), 0u) << "message: " << m;
  EXPECT_NE(m.find(c.reason), std::string::npos) << "message: " << m;
}

#define OP_PREFIX R"({"v":1,"t":5,)"
INSTANTIATE_TEST_SUITE_P(
    Table, OplogInvalidLine,
    ::testing::Values(
        BadLine{"", "line", "not valid JSON"},
        BadLine{"not json", "line", "not valid JSON"},
        BadLine{"[1,2]", "line", "expected an object"},
        BadLine{R"({"v":1,"t":5,"op":"advance"} trailing)", "line", ""},
        BadLine{R"({"t":5,"op":"advance"})", "v", "required"},
        BadLine{R"({"v":3,"t":5,"op":"advance"})", "v", "unsupported format version 3"},
        BadLine{R"({"v":0,"t":5,"op":"advance"})", "v", "unsupported format version 0"},
        BadLine{R"({"v":1,"t":5,"op":"deposit","tenant":0,"amount":1,"key":"k1"})", "key", "needs format version 2"},
        BadLine{R"({"v":2,"t":5,"op":"deposit","tenant":0,"amount":1,"key":""})", "key", "must not be empty"},
        BadLine{R"({"v":2,"t":5,"op":"deposit","tenant":0,"amount":1,"key":"a b"})", "key", "only letters"},
        BadLine{R"({"v":2,"t":5,"op":"deposit","tenant":0,"amount":1,"key":7})", "key", "must be a string"},
        BadLine{R"({"v":1,"op":"advance"})", "t", "required"},
        BadLine{R"({"v":1,"t":-5,"op":"advance"})", "t", "negative"},
        BadLine{R"({"v":1,"t":1.5,"op":"advance"})", "t", "whole number"},
        BadLine{R"({"v":1,"t":"soon","op":"advance"})", "t", "microseconds"},
        BadLine{R"({"v":1,"t":5})", "op", "required"},
        BadLine{OP_PREFIX R"("op":"fly"})", "op", "not an operation"},
        BadLine{OP_PREFIX R"("op":7})", "op", "must be a string"},
        BadLine{OP_PREFIX R"("op":"advance","op":"advance"})", "op", "appears twice"},
        BadLine{OP_PREFIX R"("op":"advance","prcie":3})", "prcie", "unknown field"},
        BadLine{OP_PREFIX R"("op":"advance","price":3})", "price", "not a field of advance"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":-1})", "price", "negative"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":2.5})", "price", "whole number"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":1e6})", "price", "whole number"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":"nan"})", "price", "integer count"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":NaN})", "price", "not a number"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":"2.5"})", "price", "integer count"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":9223372036854775807})", "price",
                "overflows"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":99999999999999999999999})", "price",
                "overflows"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":null})", "price", "integer"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2,"price":007})", "price", ""},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"order":2})", "price", "required"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":1,"price":2})", "order", "required"},
        BadLine{OP_PREFIX R"("op":"update_order","tenant":4294967296,"order":1,"price":2})", "tenant", "not a valid id"},
        BadLine{OP_PREFIX R"("op":"deposit","tenant":1,"amount":"inf"})", "amount", "finite"},
        BadLine{OP_PREFIX R"("op":"deposit","tenant":1,"amount":0.0000001})", "amount", "whole number"},
        BadLine{OP_PREFIX R"("op":"create_tenant","name":"a","balance":-3})", "balance", "negative"},
        BadLine{OP_PREFIX R"("op":"create_tenant","name":7,"balance":3})", "name", "must be a string"},
        BadLine{OP_PREFIX R"("op":"create_tenant","balance":3})", "name", "required"},
        BadLine{OP_PREFIX R"("op":"set_max_rate","tenant":1,"max_rate":"unlimited"})", "max_rate", "\"inf\""},
        BadLine{OP_PREFIX R"("op":"set_limit","tenant":1,"node":2,"limit":true})", "limit", "integer"},
        BadLine{OP_PREFIX R"("op":"place_order","tenant":1,"scope":2,"price":3,"count":4294967296})", "count",
                "at most"},
        BadLine{OP_PREFIX R"("op":"place_order","tenant":1,"scope":2,"price":3,"locality":"same_planet"})", "locality",
                "not a locality"},
        BadLine{OP_PREFIX R"("op":"place_order","tenant":1,"scope":"h100x8","price":3})", "scope", "topology"},
        BadLine{OP_PREFIX R"("op":"add_node","name":"n","type":"t","region":"r","zone":"z","row":"w","rack":"k","gpus":3000000000})",
                "gpus", "at most"},
        BadLine{OP_PREFIX R"("op":"add_node","name":"n","type":"t","region":"r","zone":"z","row":"w"})", "rack",
                "required"},
        BadLine{OP_PREFIX R"("op":"set_params","grace":1,"hysteresis_ppm":0,"tick":1,"clip_alpha_ppm":0,"clip_interval":0,"decay_beta":0})",
                "min_hold", "required"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"vibes","location":1})", "kind", "not a policy kind"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"static_floor","location":1})", "price", "required"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"static_floor","location":1,"price":1,"cap_w":3})", "cap_w",
                "not a field of add_policy static_floor"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"power_cap","location":1,"cap_w":5})", "steps", "required"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"power_cap","location":1,"cap_w":5,"steps":[[1]]})", "steps[0]",
                "exactly 2"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"power_cap","location":1,"cap_w":5,"steps":[[1,2],[3,-4]]})",
                "steps[1]", "negative"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"power_cap","location":1,"cap_w":5,"steps":[[1,"lots"]]})",
                "steps[0]", "\"inf\""},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"adaptive_power_cap","location":1,"cap_w":5,"margin_ppm":0,"band_ppm":0,)"
                R"("interval":1000000,"rise_ppm":0,"rise_min":1,"rise_max":1,"fall_step":0,"min_floor":0})",
                "max_floor", "required"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"adaptive_power_cap","location":1,"cap_w":5,"margin_ppm":0,"band_ppm":0,)"
                R"("interval":1000000,"rise_ppm":0,"rise_min":"inf","rise_max":1,"fall_step":0,"min_floor":0,"max_floor":1})",
                "rise_min", "finite"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"adaptive_power_cap","location":1,"cap_w":5,"margin_ppm":0,"band_ppm":0,)"
                R"("interval":1000000,"rise_ppm":0,"rise_min":1,"rise_max":1,"fall_step":0,"min_floor":0,"max_floor":1,"steps":[]})",
                "steps", "not a field of add_policy adaptive_power_cap"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"adaptive_power_cap","location":1,"cap_w":5,"margin_ppm":0,"band_ppm":0,)"
                R"("interval":1000000,"rise_ppm":-1,"rise_min":1,"rise_max":1,"fall_step":0,"min_floor":0,"max_floor":1})",
                "rise_ppm", ""},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"carbon","location":1,"price_per_tonne":5,"series":7})", "series",
                "array"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"adaptive_carbon_budget","location":1,"budget_g_per_h":5,"series":[],)"
                R"("margin_ppm":0,"band_ppm":0,"interval":1000000,"rise_ppm":0,"rise_min":1,"rise_max":1,"fall_step":0,)"
                R"("min_price":0})",
                "max_price", "required"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"adaptive_carbon_budget","location":1,"budget_g_per_h":5,"series":[],)"
                R"("margin_ppm":0,"band_ppm":0,"interval":1000000,"rise_ppm":0,"rise_min":1,"rise_max":1,"fall_step":0,)"
                R"("min_price":0,"max_price":1,"min_floor":0})",
                "min_floor", "not a field of add_policy adaptive_carbon_budget"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"adaptive_carbon_budget","location":1,"budget_g_per_h":5,)"
                R"("margin_ppm":0,"band_ppm":0,"interval":1000000,"rise_ppm":0,"rise_min":1,"rise_max":1,"fall_step":0,)"
                R"("min_price":0,"max_price":1})",
                "series", "required"},
        BadLine{OP_PREFIX R"("op":"set_adaptive_cap","policy":1})", "cap", "required"},
        BadLine{OP_PREFIX R"("op":"set_adaptive_cap","policy":1,"cap":5,"cap_w":5})", "cap_w",
                "not a field of set_adaptive_cap"},
        BadLine{OP_PREFIX R"("op":"add_policy","kind":"maintenance","node":1,"start":5,"end":"later"})", "end",
                "\"never\""}));

TEST(OplogCodec, InvalidEvents) {
  struct Case { const char* line; const char* field; };
  const Case cases[] = {
      {R"({"v":1,"t":1,"event":"teleported"})", "event"},
      {R"({"v":1,"t":1,"op":"advance"})", "event"},  // An operation is not an event.
      {R"({"v":1,"t":1,"event":"notice","reasons":"outbid,bored"})", "reasons"},
      {R"({"v":1,"t":1,"event":"order_cancelled","cancel_reason":"whim"})", "cancel_reason"},
      {R"({"v":1,"t":1,"event":"charged","amount":-3})", "amount"},
      {R"({"v":1,"t":1,"event":"charged","scope":3})", "scope"},
  };
  for (const Case& c : cases) {
    auto r = DecodeEvent(c.line);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.status().message().rfind(std::string(c.field) + ":", 0), 0u) << r.status().message();
  }
  // An event line is not an operation either.
  auto op = DecodeOperation(R"({"v":1,"t":1,"event":"exhausted","tenant":1})");
  ASSERT_FALSE(op.ok());
  EXPECT_NE(op.status().message().find("event"), std::string::npos);
}

TEST(OplogCodec, PaddedDecoderReadsLinesInPlace) {
  std::string buf = EncodeOperation(Operation{5, OpDeposit{TenantId(1), 10}}) + "\n" +
                    EncodeOperation(Operation{6, OpAdvance{}}) + "\n";
  size_t first_end = buf.find('\n');
  buf.resize(buf.size() + Decoder::kPadding, '\0');
  Decoder d;
  auto a = d.DecodeRecordPadded(std::string_view(buf.data(), first_end));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(std::get<OpDeposit>(a->op.body).amount, 10);
  size_t second_end = buf.find('\n', first_end + 1);
  auto b = d.DecodeRecordPadded(std::string_view(buf.data() + first_end + 1, second_end - first_end - 1));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->op.time, 6);
}

}  // namespace
}  // namespace laissez::oplog
