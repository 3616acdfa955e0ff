#include "oplog/replay.h"

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/check.h"

namespace laissez::oplog {

using market::MarketEngine;

// Counts events on their way to the caller's sink.
class Replayer::CountingSink : public market::EventSink {
 public:
  CountingSink(market::EventSink* next, ReplayStats* stats) : next_(next), stats_(stats) {}
  void OnEvents(std::span<const market::Event> events) override {
    stats_->events += events.size();
    if (next_ != nullptr) next_->OnEvents(events);
  }

 private:
  market::EventSink* next_;
  ReplayStats* stats_;
};

Replayer::Replayer(ReplayOptions options, market::EventSink* sink)
    : options_(options), counting_(std::make_unique<CountingSink>(sink, &stats_)) {
  market::EngineOptions eo;
  eo.price_events = options.price_events;
  eo.retain_ledger = options.retain_ledger;
  engine_ = std::make_unique<MarketEngine>(market::MarketParams{}, eo);
  engine_->set_sink(counting_.get());
}

Replayer::~Replayer() = default;

namespace {

bool IsBlankOrComment(std::string_view line) {
  for (char c : line) {
    if (c == ' ' || c == '\t' || c == '\r') continue;
    return c == '#';
  }
  return true;
}

std::string LinePrefix(uint64_t line) { return "line " + std::to_string(line) + ": "; }

}  // namespace

Status Replayer::ReplayLine(std::string_view line, uint64_t line_number, bool padded) {
  if (done_) return Status::Ok();
  ++stats_.lines;
  if (IsBlankOrComment(line)) {
    ++stats_.blank;
    return Status::Ok();
  }
  DecodeOptions dopts{&engine_->topology()};
  Result<LogRecord> rec = padded ? decoder_.DecodeRecordPadded(line, dopts) : decoder_.DecodeRecord(line, dopts);
  if (!rec.ok()) {
    std::string msg = LinePrefix(line_number) + rec.status().message();
    if (options_.skip_invalid) {
      ++stats_.invalid;
      diagnostics_.push_back("skipped invalid " + msg);
      return Status::Ok();
    }
    return InvalidArgument(msg);
  }
  if (rec->op.time > options_.stop_at) {
    done_ = true;
    stats_.stopped_at = true;
    return Status::Ok();
  }
  market::ApplyResult result = market::Apply(*engine_, rec->op);
  ++stats_.operations;
  if (!result.status.ok()) {
    ++stats_.rejected;
    if (options_.record_rejections) {
      diagnostics_.push_back(LinePrefix(line_number) + "rejected " + std::string(market::OpName(rec->op.body)) + ": " +
                             result.status.ToString());
    }
  }
  if (rec->created_id != kNoId && rec->created_id != result.created_id) {
    std::string got = result.created_id == kNoId ? std::string("nothing (the call was rejected: ") +
                                                       result.status.ToString() + ")"
                                                 : std::to_string(result.created_id);
    return FailedPrecondition(LinePrefix(line_number) + "id: the log says " + std::to_string(rec->created_id) +
                              " but replay assigned " + got + " (the log does not match this engine)");
  }
  if (observer_) observer_(line_number, *rec, result);
  return Status::Ok();
}

Status Replayer::ReplayText(std::string_view text, bool padded) {
  const char* p = text.data();
  const char* end = text.data() + text.size();
  uint64_t line_number = 0;
  while (p < end && !done_) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
    const char* line_end = nl == nullptr ? end : nl;
    ++line_number;
    // A line inside the buffer is followed by the rest of the file and then
    // the padding, so in-place parsing stays within readable memory.
    LZ_RETURN_IF_ERROR(ReplayLine(std::string_view(p, static_cast<size_t>(line_end - p)), line_number, padded));
    p = nl == nullptr ? end : nl + 1;
  }
  return Status::Ok();
}

Status Replayer::Finish() {
  if (options_.stop_at != kNever && options_.stop_at > engine_->now()) {
    return engine_->Advance(options_.stop_at);
  }
  return Status::Ok();
}

Result<PaddedText> ReadLogFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return NotFound(path + ": cannot open (" + std::strerror(errno) + ")");
  PaddedText out;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) out.buffer.append(chunk, n);
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return DataLoss(path + ": read error");
  out.size = out.buffer.size();
  out.buffer.append(Decoder::kPadding, '\0');
  return out;
}

void EventLineWriter::OnEvents(std::span<const market::Event> events) {
  for (const market::Event& e : events) {
    AppendEvent(e, &text_);
    text_.push_back('\n');
  }
}

namespace {
constexpr size_t kBlock = 1 << 20;  // Bytes the writer formats before each fwrite.
}  // namespace

EventFileWriter::EventFileWriter(std::FILE* f, size_t chunk_events)
    : f_(f), chunk_events_(chunk_events), block_(new char[kBlock + kEventRoom + 1]) {
  LZ_CHECK(chunk_events_ > 0);
  filling_.reserve(chunk_events_);
  thread_ = std::thread([this] { Run(); });
}

EventFileWriter::~EventFileWriter() { Finish(); }

void EventFileWriter::OnEvents(std::span<const market::Event> events) {
  filling_.insert(filling_.end(), events.begin(), events.end());
  if (filling_.size() >= chunk_events_) HandOver();
}

// Gives the filled chunk to the writer once it has taken the previous one, and goes on with
// an empty one (the writer's last, its capacity kept).
void EventFileWriter::HandOver() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return !has_chunk_; });
  handed_.swap(filling_);
  has_chunk_ = true;
  lock.unlock();
  cv_.notify_all();
  filling_.clear();
}

bool EventFileWriter::Finish() {
  if (!finished_) {
    finished_ = true;
    if (!filling_.empty()) HandOver();
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  return ok_;
}

void EventFileWriter::Run() {
  std::vector<market::Event> chunk;
  while (true) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return has_chunk_ || stop_; });
    if (!has_chunk_) break;  // Stopped with nothing left.
    chunk.clear();
    chunk.swap(handed_);  // The caller gets an empty chunk back at its next hand-over.
    has_chunk_ = false;
    lock.unlock();
    cv_.notify_all();
    Write(chunk);
  }
  if (ok_ && used_ > 0) ok_ = std::fwrite(block_.get(), 1, used_, f_) == used_;
  used_ = 0;
  ok_ = std::fflush(f_) == 0 && ok_;
}

void EventFileWriter::Write(const std::vector<market::Event>& chunk) {
  if (!ok_) return;  // A write failed: the rest is not written (Finish says so).
  for (const market::Event& e : chunk) {
    if (used_ >= kBlock) {  // Room for one more line and its newline.
      ok_ = std::fwrite(block_.get(), 1, used_, f_) == used_;
      used_ = 0;
      if (!ok_) return;
    }
    char* end = WriteEvent(e, block_.get() + used_);
    *end++ = '\n';
    used_ = static_cast<size_t>(end - block_.get());
  }
}

namespace {

using Json = nlohmann::ordered_json;

Json PriceJson(int64_t p) { return p == kInfPrice ? Json("inf") : Json(p); }

}  // namespace

std::string StateJson(const MarketEngine& engine, const ReplayStats& stats) {
  const topology::Topology& topo = engine.topology();
  Json doc;
  doc["v"] = 1;  // This document's format did not change in version 2.
  doc["now"] = engine.now();
  doc["operations"] = stats.operations;
  doc["rejected"] = stats.rejected;
  const market::MarketParams& p = engine.params();
  doc["params"] = Json{{"grace", p.grace},
                       {"hysteresis_ppm", p.hysteresis_ppm},
                       {"tick", p.tick},
                       {"clip_alpha_ppm", p.clip_alpha_ppm},
                       {"clip_interval", p.clip_interval},
                       {"decay_beta", p.decay_beta},
                       {"min_hold", p.min_hold}};
  Json nodes = Json::array();
  for (uint32_t i = 0; i < topo.node_count(); ++i) {
    NodeId id(i);
    auto v = engine.GetNode(id);
    Json n;
    n["id"] = i;
    n["name"] = topo.node(id).name;
    n["type"] = topo.type_name(topo.node(id).type);
    if (!v.ok()) {
      n["status"] = "removed";
      nodes.push_back(std::move(n));
      continue;
    }
    n["status"] = market::NodeStatusName(v->status);
    if (v->holder.valid()) {
      n["holder"] = v->holder.value;
      n["limit"] = PriceJson(v->limit);
      n["held_since"] = v->held_since;
    }
    if (v->reserved_for.valid()) n["reserved_for"] = v->reserved_for.value;
    n["floor"] = PriceJson(v->floor);
    nodes.push_back(std::move(n));
  }
  doc["nodes"] = std::move(nodes);

  Json orders = Json::array();
  for (OrderId oid : engine.OpenOrders()) {
    auto o = engine.GetOrder(oid);
    if (!o.ok()) continue;
    Json j;
    j["id"] = oid.value;
    j["tenant"] = o->tenant.value;
    j["scope"] = o->spec.scope.value;
    j["scope_name"] = topo.VertexName(o->spec.scope);
    j["price"] = PriceJson(o->spec.price);
    j["effective_price"] = PriceJson(o->effective_price);
    j["count"] = o->spec.count;
    j["filled"] = o->filled;
    j["state"] = market::OrderStateName(o->state);
    j["locality"] = market::LocalityName(o->spec.locality);
    if (o->spec.rel_to.valid()) j["rel_to"] = o->spec.rel_to.value;
    j["seq"] = o->seq;
    if (o->cooldown_until != 0) j["cooldown_until"] = o->cooldown_until;
    Json claims = Json::array();
    for (NodeId c : o->claims) claims.push_back(c.value);
    j["claims"] = std::move(claims);
    orders.push_back(std::move(j));
  }
  doc["orders"] = std::move(orders);

  Json tenants = Json::array();
  for (uint32_t i = 0; i < engine.tenant_count(); ++i) {
    auto t = engine.GetTenant(TenantId(i));
    if (!t.ok()) continue;
    Json j;
    j["id"] = i;
    j["name"] = t->name;
    j["balance"] = t->balance;
    j["max_rate"] = PriceJson(t->max_rate);
    j["committed_rate"] = PriceJson(t->committed_rate);
    j["spend_rate"] = PriceJson(t->spend_rate);
    j["paid"] = t->paid;
    j["waived"] = t->waived;
    j["exhausted"] = t->exhausted;
    Json held = Json::array();
    for (NodeId n : t->nodes) held.push_back(n.value);
    j["nodes"] = std::move(held);
    Json open = Json::array();
    for (OrderId o : t->orders) open.push_back(o.value);
    j["orders"] = std::move(open);
    tenants.push_back(std::move(j));
  }
  doc["tenants"] = std::move(tenants);

  market::LedgerTotals lt = engine.ledger_totals();
  doc["ledger"] = Json{{"deposited", lt.deposited},
                       {"tenant_balances", lt.tenant_balances},
                       {"operator_revenue", lt.operator_revenue},
                       {"waived", lt.waived},
                       {"entries", lt.entries},
                       {"unsettled", engine.UnsettledCharges()}};
  return doc.dump(1) + "\n";
}

}  // namespace laissez::oplog
