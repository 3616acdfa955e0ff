#include "oplog/replay.h"

#include <cstdio>
#include <cstring>
#include <deque>
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
  return DecodeAndApply(line, line_number, padded);
}

Status Replayer::DecodeAndApply(std::string_view line, uint64_t line_number, bool padded) {
  DecodeOptions dopts{&engine_->topology()};
  Result<LogRecord> rec = padded ? decoder_.DecodeRecordPadded(line, dopts) : decoder_.DecodeRecord(line, dopts);
  if (!rec.ok()) return Invalid(rec.status(), line_number);
  return ApplyRecord(*rec, line_number);
}

Status Replayer::Invalid(const Status& status, uint64_t line_number) {
  std::string msg = LinePrefix(line_number) + status.message();
  if (options_.skip_invalid) {
    ++stats_.invalid;
    diagnostics_.push_back("skipped invalid " + msg);
    return Status::Ok();
  }
  return InvalidArgument(msg);
}

Status Replayer::ApplyRecord(const LogRecord& rec, uint64_t line_number) {
  if (rec.op.time > options_.stop_at) {
    done_ = true;
    stats_.stopped_at = true;
    return Status::Ok();
  }
  market::ApplyResult result = market::Apply(*engine_, rec.op);
  ++stats_.operations;
  if (!result.status.ok()) {
    ++stats_.rejected;
    if (options_.record_rejections) {
      diagnostics_.push_back(LinePrefix(line_number) + "rejected " + std::string(market::OpName(rec.op.body)) + ": " +
                             result.status.ToString());
    }
  }
  if (rec.created_id != kNoId && rec.created_id != result.created_id) {
    std::string got = result.created_id == kNoId ? std::string("nothing (the call was rejected: ") +
                                                       result.status.ToString() + ")"
                                                 : std::to_string(result.created_id);
    return FailedPrecondition(LinePrefix(line_number) + "id: the log says " + std::to_string(rec.created_id) +
                              " but replay assigned " + got + " (the log does not match this engine)");
  }
  if (observer_) observer_(line_number, rec, result);
  return Status::Ok();
}

Status Replayer::ReplayText(std::string_view text, bool padded) {
  if (options_.parse_ahead) return ReplayTextAhead(text, padded);
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

// ---------------------------------------------------------------- parsing ahead

// A line as the parsing thread left it.
struct Replayer::Parsed {
  enum Kind : uint8_t {
    kBlank,   // Blank or a comment.
    kRecord,  // Decoded: `rec`.
    kAgain,   // Not decoded without the engine's topology (a name, or an invalid line):
              // decoded again on the engine's thread, as ReplayLine would.
  };
  std::string_view line;
  uint64_t line_number = 0;
  Kind kind = kBlank;
  LogRecord rec;
};

// Chunks of parsed lines from the parsing thread to the engine's, at most kDepth waiting;
// emptied chunks go back to be refilled (their records' storage kept).
class Replayer::AheadQueue {
 public:
  static constexpr size_t kChunkLines = 1024;
  static constexpr size_t kDepth = 4;

  // The parsing thread's: false once the engine's thread has stopped taking chunks.
  bool Push(std::vector<Parsed>* chunk) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return full_.size() < kDepth || cancelled_; });
    if (cancelled_) return false;
    full_.push_back(std::move(*chunk));
    lock.unlock();
    cv_.notify_all();
    return true;
  }
  // The parsing thread's: an emptied chunk to refill, or a new one.
  std::vector<Parsed> Recycled() {
    std::lock_guard lock(mu_);
    if (empty_.empty()) return {};
    std::vector<Parsed> chunk = std::move(empty_.back());
    empty_.pop_back();
    return chunk;
  }
  void Close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // The engine thread's: false when the log has ended.
  bool Pop(std::vector<Parsed>* chunk) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return !full_.empty() || closed_; });
    if (full_.empty()) return false;
    *chunk = std::move(full_.front());
    full_.pop_front();
    lock.unlock();
    cv_.notify_all();
    return true;
  }
  void GiveBack(std::vector<Parsed>* chunk) {
    std::lock_guard lock(mu_);
    empty_.push_back(std::move(*chunk));
  }
  void Cancel() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<Parsed>> full_;
  std::vector<std::vector<Parsed>> empty_;
  bool closed_ = false;
  bool cancelled_ = false;
};

// The parsing thread: every line of `text` in order, decoded without a topology (a record
// whose ids are numbers decodes to the same record with one or without).
void Replayer::ParseAhead(std::string_view text, bool padded, AheadQueue* queue) {
  Decoder decoder;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  uint64_t line_number = 0;
  std::vector<Parsed> chunk = queue->Recycled();
  size_t used = 0;
  while (p < end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
    const char* line_end = nl == nullptr ? end : nl;
    if (used == chunk.size()) chunk.emplace_back();
    Parsed& out = chunk[used++];
    out.line = std::string_view(p, static_cast<size_t>(line_end - p));
    out.line_number = ++line_number;
    if (IsBlankOrComment(out.line)) {
      out.kind = Parsed::kBlank;
    } else {
      Result<LogRecord> rec = padded ? decoder.DecodeRecordPadded(out.line) : decoder.DecodeRecord(out.line);
      out.kind = rec.ok() ? Parsed::kRecord : Parsed::kAgain;
      if (rec.ok()) out.rec = std::move(*rec);
    }
    p = nl == nullptr ? end : nl + 1;
    if (used == AheadQueue::kChunkLines || p >= end) {
      chunk.resize(used);
      if (!queue->Push(&chunk)) return;
      chunk = queue->Recycled();
      used = 0;
    }
  }
}

Status Replayer::ReplayTextAhead(std::string_view text, bool padded) {
  AheadQueue queue;
  std::thread parser([&] {
    ParseAhead(text, padded, &queue);
    queue.Close();
  });
  // However this ends (an error, stop_at, an exception), the parser is stopped and joined.
  struct Join {
    AheadQueue& q;
    std::thread& t;
    ~Join() {
      q.Cancel();
      t.join();
    }
  } join{queue, parser};
  std::vector<Parsed> chunk;
  while (!done_ && queue.Pop(&chunk)) {
    for (Parsed& line : chunk) {
      if (done_) break;  // As ReplayLine: nothing after stop_at's first later line.
      ++stats_.lines;
      Status st;
      switch (line.kind) {
        case Parsed::kBlank:
          ++stats_.blank;
          break;
        case Parsed::kRecord:
          st = ApplyRecord(line.rec, line.line_number);
          break;
        case Parsed::kAgain:
          st = DecodeAndApply(line.line, line.line_number, padded);
          break;
      }
      LZ_RETURN_IF_ERROR(st);
    }
    queue.GiveBack(&chunk);
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

EventFileWriter::EventFileWriter(std::FILE* f, size_t chunk_events, bool own_thread)
    : f_(f), chunk_events_(chunk_events), block_(new char[kBlock + kEventRoom + 1]) {
  LZ_CHECK(chunk_events_ > 0);
  if (!own_thread) return;
  filling_.reserve(chunk_events_);
  thread_ = std::thread([this] { Run(); });
}

EventFileWriter::~EventFileWriter() { Finish(); }

void EventFileWriter::OnEvents(std::span<const market::Event> events) {
  LZ_CHECK(!finished_);  // Events after Finish would be lost.
  if (!thread_.joinable()) return Write(events);
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
  if (!finished_ && !thread_.joinable()) {
    finished_ = true;
    WriteRest();
  } else if (!finished_) {
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
  WriteRest();
}

void EventFileWriter::WriteRest() {
  if (ok_ && used_ > 0) ok_ = std::fwrite(block_.get(), 1, used_, f_) == used_;
  used_ = 0;
  ok_ = std::fflush(f_) == 0 && ok_;
}

void EventFileWriter::Write(std::span<const market::Event> events) {
  if (!ok_) return;  // A write failed: the rest is not written (Finish says so).
  for (const market::Event& e : events) {
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
