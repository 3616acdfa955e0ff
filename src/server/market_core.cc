#include "server/market_core.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "common/fnv.h"
#include "market/validate.h"
#include "oplog/oplog.h"

namespace laissez::server {

Micros WallClockMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string EncodeJournalLine(const market::Operation& op) { return oplog::EncodeOperation(op); }

Result<market::Operation> DecodeJournalLine(std::string_view line) { return oplog::DecodeOperation(line); }

namespace {
// The journal records the id each creating call got ("id"), so replay checks
// that it assigns the same ones.
std::string EncodeJournalRecord(const market::Operation& op, uint64_t created_id, std::string_view key) {
  std::string line;
  line.reserve(128);
  oplog::AppendOperation(op, created_id == UINT64_MAX ? oplog::kNoId : created_id, key, &line);
  return line;
}

// The core's snapshot image (TakeSnapshot): "LZCORE01", the journal seq it
// covers, the position (seq, index) of the last event at or before it, the
// idempotency keys oldest first, the engine's image, then an
// FNV-1a 64 checksum of all before it. Fixed-width little-endian integers,
// strings with a u64 length.
constexpr std::string_view kCoreMagic = "LZCORE01";

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutStr(std::string* out, std::string_view s) {
  PutU64(out, s.size());
  out->append(s);
}

// Reads what PutU64 and PutStr wrote; the first shortfall sets `error`.
struct ImageReader {
  std::string_view in;
  std::string error;
  uint64_t U64(const char* field) {
    if (in.size() < 8) {
      if (error.empty()) error = std::string(field) + ": truncated";
      in = {};
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
    in.remove_prefix(8);
    return v;
  }
  std::string_view Str(const char* field) {
    uint64_t n = U64(field);
    if (n > in.size()) {
      if (error.empty()) error = std::string(field) + ": truncated";
      in = {};
      return {};
    }
    std::string_view s = in.substr(0, n);
    in.remove_prefix(n);
    return s;
  }
};

// What identifies a keyed operation's arguments: its line without time and id.
std::string Fingerprint(const market::Operation& op) {
  market::Operation o{0, op.body};
  return oplog::EncodeOperation(o);
}
}  // namespace

// ---------------------------------------------------------------------------
// Subscription.

bool Subscription::Next(std::vector<WireEvent>* out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return closed_ || !queue_.empty(); });
  for (auto& e : queue_) out->push_back(std::move(e));
  queue_.clear();
  return !closed_;
}

Status Subscription::close_status() const {
  std::lock_guard lock(mu_);
  return close_status_;
}

void Subscription::Close(Status why) {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  close_status_ = std::move(why);
  cv_.notify_all();
}

bool Subscription::Wants(const WireEvent& e) const {
  if (e.pos <= after_) return false;  // Already delivered (or replayed from the ring).
  if (operator_view_) return true;
  const market::Event& ev = e.event;
  if (ev.type == market::EventType::kPriceChanged) return vertices_.count(ev.vertex.value) > 0;
  if (ev.type == market::EventType::kNodeAdded || ev.type == market::EventType::kNodeRemoved) return false;
  if (ev.tenant == tenant_) return true;
  // The previous holder learns that its node moved, not to whom.
  return ev.type == market::EventType::kTransferred && ev.other == tenant_;
}

void Subscription::Push(const WireEvent& e) {
  std::lock_guard lock(mu_);
  if (closed_) return;
  if (queue_.size() >= kMaxQueued) {
    closed_ = true;
    close_status_ = ResourceExhausted("watch: the client fell too far behind; reconnect");
    queue_.clear();
    cv_.notify_all();
    return;
  }
  queue_.push_back(e);
  if (!operator_view_) {
    WireEvent& w = queue_.back();
    w.tenant.clear();
    w.other.clear();
    if (w.event.other != tenant_) w.event.other = TenantId();
    if (w.event.tenant != tenant_) w.event.tenant = TenantId();
    // A notice names the challenger's order; a transfer away names the new
    // holder's. Order ids of other tenants never reach a tenant.
    bool own_order = w.event.tenant == tenant_ && w.event.type != market::EventType::kNotice &&
                     w.event.type != market::EventType::kContestEnded;
    if (!own_order) w.event.order = OrderId();
  }
  cv_.notify_one();
}

// ---------------------------------------------------------------------------
// LAISSEZ_COMMIT_TRACE=FILE: stamps each command's way through the core
// (queued, the writer's batch begins, handed off, its COMMIT begins and ends,
// its completion returned) and, when the core stops, writes per-phase figures
// to FILE (docs/PERFORMANCE_LOG.md, "Issue 12: the commit's wait"). Unset, each
// stamp costs one test of a null pointer.

class MarketCore::Trace {
 public:
  explicit Trace(std::string path) : path_(std::move(path)) {}

  struct Cmd {
    TimePoint queued, started, handed, commit_start, commit_end, done;
  };
  struct Commit {
    size_t records = 0, commands = 0;
    double after_commit_us = 0;
  };

  void Add(const Cmd& c) {
    std::lock_guard lock(mu_);
    if (cmds_.size() < kMaxSamples) cmds_.push_back(c);
  }
  void AddCommit(const Commit& c) {
    std::lock_guard lock(mu_);
    if (commits_.size() < kMaxSamples) commits_.push_back(c);
  }

  void Write() const {
    std::lock_guard lock(mu_);
    FILE* f = std::fopen(path_.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "laissez serve: LAISSEZ_COMMIT_TRACE: cannot write %s\n", path_.c_str());
      return;
    }
    auto ms = [](TimePoint a, TimePoint b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    struct Phase {
      const char* name;
      TimePoint Cmd::*from;
      TimePoint Cmd::*to;
    };
    const Phase phases[] = {
        {"queued -> the writer begins its batch", &Cmd::queued, &Cmd::started},
        {"the writer applies the batch, hands it off", &Cmd::started, &Cmd::handed},
        {"handed off -> its COMMIT begins (the commit before it)", &Cmd::handed, &Cmd::commit_start},
        {"COMMIT (WAL writes, fsync)", &Cmd::commit_start, &Cmd::commit_end},
        {"COMMIT ends -> its completion returned (completions in turn)", &Cmd::commit_end, &Cmd::done},
        {"total, queued -> completion returned", &Cmd::queued, &Cmd::done},
    };
    size_t n = cmds_.size();
    std::fprintf(f, "commands %zu, commits %zu\n", n, commits_.size());
    if (n == 0) {
      std::fclose(f);
      return;
    }
    // The slowest 1% by total time.
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ms(cmds_[a].queued, cmds_[a].done) < ms(cmds_[b].queued, cmds_[b].done);
    });
    size_t slow_from = n - std::max<size_t>(1, n / 100);
    double total_mean = 0;
    for (const Cmd& c : cmds_) total_mean += ms(c.queued, c.done) / static_cast<double>(n);
    std::fprintf(f, "phase | mean | p50 | p90 | p99 | p999 | mean in the slowest 1%% | share of the mean\n");
    for (const Phase& ph : phases) {
      std::vector<double> v(n);
      double mean = 0, slow = 0;
      for (size_t i = 0; i < n; ++i) {
        v[i] = ms(cmds_[i].*ph.from, cmds_[i].*ph.to);
        mean += v[i] / static_cast<double>(n);
      }
      for (size_t i = slow_from; i < n; ++i) slow += v[order[i]] / static_cast<double>(n - slow_from);
      std::sort(v.begin(), v.end());
      auto q = [&](double p) { return v[std::min(n - 1, static_cast<size_t>(p * static_cast<double>(n)))]; };
      std::fprintf(f, "%s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f%%\n", ph.name, mean, q(0.5), q(0.9), q(0.99),
                   q(0.999), slow, 100.0 * mean / total_mean);
    }
    double records = 0, after = 0, after_max = 0;
    for (const Commit& c : commits_) {
      records += static_cast<double>(c.records);
      after += c.after_commit_us;
      after_max = std::max(after_max, c.after_commit_us);
    }
    size_t k = std::max<size_t>(1, commits_.size());
    std::fprintf(f, "records a commit %.1f, AfterCommit mean %.1f us, max %.1f us\n", records / static_cast<double>(k),
                 after / static_cast<double>(k), after_max);
    std::fclose(f);
  }

 private:
  static constexpr size_t kMaxSamples = 4'000'000;
  const std::string path_;
  mutable std::mutex mu_;
  std::vector<Cmd> cmds_;
  std::vector<Commit> commits_;
};

// ---------------------------------------------------------------------------
// The engine's event sink: renders events for watchers while the engine is
// consistent (names need the engine's lookups).

class MarketCore::Sink final : public market::EventSink {
 public:
  explicit Sink(MarketCore* core) : core_(core) {}
  void OnEvents(std::span<const market::Event> events) override {
    if (!events.empty()) {  // Counted as Render numbers them.
      EventPos& last = core_->last_event_;
      uint32_t n = static_cast<uint32_t>(events.size());
      last = last.seq == core_->next_seq_ ? EventPos{last.seq, last.index + n} : EventPos{core_->next_seq_, n - 1};
    }
    if (core_->pending_ &&
        (core_->options_.event_ring > 0 || core_->subscriber_count_.load(std::memory_order_relaxed) > 0)) {
      core_->Render(events);
    }
  }

 private:
  MarketCore* core_;
};

MarketCore::MarketCore(Store* store, TokenTable* tokens, Metrics* metrics, CoreOptions options)
    : store_(store), tokens_(tokens), metrics_(metrics), options_(std::move(options)) {
  if (!options_.clock) options_.clock = WallClockMicros;
  market::EngineOptions eo;
  eo.price_events = true;
  eo.retain_ledger = true;
  engine_ = std::make_unique<market::MarketEngine>(market::MarketParams{}, eo);
  sink_ = std::make_unique<Sink>(this);
  engine_->set_sink(sink_.get());
  if (const char* path = std::getenv("LAISSEZ_COMMIT_TRACE"); path && *path) trace_ = std::make_unique<Trace>(path);
}

MarketCore::~MarketCore() { Stop(); }

Status MarketCore::Start(const MarketCreation& creation) {
  LZ_ASSIGN_OR_RETURN(std::vector<TokenRecord> tokens, store_->LoadTokens());
  for (const auto& t : tokens) {
    tokens_->Put(t);
    next_token_id_ = std::max(next_token_id_, t.id + 1);
  }
  // Restore the newest snapshot, if the store keeps one, then replay the
  // journal after it: every record decodes and applies exactly as it did live.
  LZ_ASSIGN_OR_RETURN(StoredSnapshot snap, store_->LoadSnapshot());
  if (!snap.empty()) {
    Status restored = RestoreSnapshot(snap);
    if (!restored.ok()) {
      // A store that keeps its whole journal (SQLite) does without the
      // snapshot; one whose journal was truncated (etcd) cannot.
      bool whole = false;
      (void)store_->ReadJournal(0, [&](const JournalRecord& r) {
        whole = r.seq == 1;
        return Internal("first record read");
      });
      if (!whole) return restored;
      std::fprintf(stderr, "laissez serve: warning: %s; replaying the whole journal instead\n",
                   restored.message().c_str());
    }
  }
  // The events of the last `event_ring` records replayed refill the ring,
  // with the positions they had live, so a watch resumes across a restart.
  // Records a snapshot covers are not replayed: the ring starts after it.
  uint64_t ring_from = UINT64_MAX;
  if (options_.event_ring > 0) {
    LZ_ASSIGN_OR_RETURN(std::vector<JournalRecord> last, store_->RecentJournal(1));
    if (!last.empty()) ring_from = last.back().seq > options_.event_ring ? last.back().seq - options_.event_ring + 1 : 1;
    ring_from = std::max(ring_from == UINT64_MAX ? 1 : ring_from, restored_seq_ + 1);
  }
  // After a restore the ring holds nothing before the snapshot; a watch that
  // saw the snapshot's last event missed nothing, so it may resume.
  EventPos start_floor = restored_seq_ > 0 ? restored_last_event_ : EventPos{};
  if (restored_seq_ > 0) {
    std::lock_guard lock(subs_mu_);
    delivered_ = EventPos::AllOf(restored_seq_);
    ring_floor_ = start_floor;
  }
  uint64_t expect = restored_seq_ + 1;
  Status st = store_->ReadJournal(restored_seq_, [&](const JournalRecord& r) -> Status {
    if (r.seq != expect) {
      return DataLoss("journal: record " + std::to_string(expect) + " missing (next is " + std::to_string(r.seq) + ")");
    }
    if (r.seq == ring_from) {
      pending_ = std::make_unique<Pending>();  // The sink renders from here on.
      std::lock_guard lock(subs_mu_);
      delivered_ = EventPos::AllOf(r.seq - 1);
      // From the very first event, or the last one the snapshot covers.
      ring_floor_ = r.seq == restored_seq_ + 1 ? start_floor : delivered_;
    }
    next_seq_ = r.seq;  // The seq the sink gives this record's events.
    LZ_RETURN_IF_ERROR(ApplyRecord(r));
    if (pending_) RingReplayed(r.seq);
    ++expect;
    return Status::Ok();
  });
  pending_.reset();
  LZ_RETURN_IF_ERROR(st);
  replayed_ = expect - 1 - restored_seq_;
  next_seq_ = expect;
  applied_seq_.store(expect - 1);
  follower_.store(options_.follower);
  fresh_ = expect == 1 && tokens.empty();

  LZ_ASSIGN_OR_RETURN(std::string identity, store_->Identity());
  bool creating = identity.empty() && expect == 1 && tokens.empty();

  // A journal ahead of the wall clock (the clock was set back, or the database
  // moved to a machine whose clock is behind): time never runs backwards, so
  // the market holds still until the clock catches up. Holders were already
  // charged up to the journal's time; they are not charged twice.
  Micros wall = options_.clock();
  if (engine_->now() > wall + kMicrosPerSecond) {
    std::fprintf(stderr,
                 "laissez serve: warning: the journal's time is %.3f s ahead of the wall clock; the market's time "
                 "stands still until the clock catches up\n",
                 static_cast<double>(engine_->now() - wall) / 1e6);
  }

  // Catch up to the wall clock and make that advance durable before serving;
  // a new market's creation joins that commit. A follower commits nothing:
  // the leader does that (Promote).
  if (options_.follower) creating = false;
  pending_ = std::make_unique<Pending>();
  MaybeAdvance(/*force=*/true);
  if (creating) {
    pending_->batch.identity = creation.identity.empty() ? NewIdentity() : creation.identity;
    if (creation.create) {
      WriterContext ctx(this, &creation.actor);
      Status st = creation.create(ctx);
      if (!st.ok()) {
        pending_.reset();
        return st;
      }
    }
  }
  if (!options_.follower) LZ_RETURN_IF_ERROR(store_->Commit(pending_->batch));
  // The catch-up advance's events follow the replayed ones in the ring.
  if (expect >= ring_from || expect == 1) {
    RingReplayed(next_seq_ - 1);
  } else {
    std::lock_guard lock(subs_mu_);
    ring_floor_ = delivered_ = EventPos::AllOf(next_seq_ - 1);  // No ring (event_ring 0).
  }
  pending_.reset();
  applied_seq_.store(next_seq_ - 1);
  metrics_->journal_seq = static_cast<int64_t>(next_seq_ - 1);
  metrics_->engine_time_us.store(engine_->now(), std::memory_order_relaxed);
  metrics_->resting_orders.store(static_cast<int64_t>(engine_->resting_order_count()), std::memory_order_relaxed);
  metrics_->live_nodes.store(static_cast<int64_t>(engine_->topology().live_node_count()), std::memory_order_relaxed);
  metrics_->tenants.store(static_cast<int64_t>(engine_->tenant_count()), std::memory_order_relaxed);
  last_advance_ = std::chrono::steady_clock::now();

  std::lock_guard lock(queue_mu_);
  started_ = true;
  writer_ = std::thread([this] { WriterLoop(); });
  committer_ = std::thread([this] { CommitterLoop(); });
  return Status::Ok();
}

void MarketCore::Stop() {
  {
    std::lock_guard lock(queue_mu_);
    bool running = started_ && !stopping_;
    stopping_ = true;
    queue_cv_.notify_all();
    if (!running) return;
  }
  if (writer_.joinable()) writer_.join();
  if (committer_.joinable()) committer_.join();
  if (trace_) trace_->Write();
  // A watcher learns that this server went away (UNAVAILABLE), so it can
  // resume on another replica or after a restart.
  std::lock_guard lock(subs_mu_);
  for (auto& s : subs_) s->Close(Unavailable("server: stopping; watch again (resume after the last event)"));
  subs_.clear();
}

void MarketCore::Submit(std::string actor, Work work, Done done) {
  {
    std::lock_guard lock(queue_mu_);
    if (started_ && !stopping_ && !failed_.load()) {
      queue_.push_back(Command{std::move(actor), std::move(work), std::move(done)});
      if (trace_) queue_.back().queued = std::chrono::steady_clock::now();
      metrics_->queue_length.store(static_cast<int64_t>(queue_.size()), std::memory_order_relaxed);
      queue_cv_.notify_one();
      return;
    }
  }
  done(Unavailable(failed_.load() ? FailedMessage() : "server: not running"));
}

size_t MarketCore::queue_length() const {
  std::lock_guard lock(queue_mu_);
  return queue_.size();
}

std::shared_ptr<Subscription> MarketCore::Subscribe(bool operator_view, TenantId tenant,
                                                     std::unordered_set<uint32_t> vertices) {
  return *SubscribeAfter(operator_view, tenant, std::move(vertices), std::nullopt);
}

namespace {
std::string PosString(EventPos p) {
  return "seq " + std::to_string(p.seq) +
         (p.index == UINT32_MAX ? std::string(" (all its events)") : " index " + std::to_string(p.index));
}
}  // namespace

Result<std::shared_ptr<Subscription>> MarketCore::SubscribeAfter(bool operator_view, TenantId tenant,
                                                                 std::unordered_set<uint32_t> vertices,
                                                                 std::optional<EventPos> after,
                                                                 EventPos* live_from) {
  std::lock_guard lock(subs_mu_);
  if (after && *after < ring_floor_) {
    return OutOfRange("after: this server no longer has the events after " + PosString(*after) +
                      " (its event ring holds those after " + PosString(ring_floor_) +
                      "); re-read the state and watch again without resuming");
  }
  auto sub = std::make_shared<Subscription>(operator_view, tenant, std::move(vertices), after.value_or(delivered_));
  if (after) {
    for (const WireEvent& e : ring_) {
      if (e.pos > *after && sub->Wants(e)) sub->Push(e);
    }
  }
  if (live_from) *live_from = after ? *after : delivered_;
  subs_.push_back(sub);
  subscriber_count_.store(static_cast<int>(subs_.size()));
  metrics_->watchers.store(static_cast<int64_t>(subs_.size()));
  return sub;
}

void MarketCore::Unsubscribe(const std::shared_ptr<Subscription>& sub) {
  sub->Close(Status::Ok());
  std::lock_guard lock(subs_mu_);
  std::erase(subs_, sub);
  subscriber_count_.store(static_cast<int>(subs_.size()));
  metrics_->watchers.store(static_cast<int64_t>(subs_.size()));
}

// ---------------------------------------------------------------------------
// Writer thread.

void MarketCore::Journal(const std::string& actor, const market::Operation& op, uint64_t created_id,
                         std::string_view key, std::string* encoded) {
  std::string line = encoded != nullptr && created_id == UINT64_MAX && key.empty()
                         ? std::move(*encoded)
                         : EncodeJournalRecord(op, created_id, key);
  pending_->batch.journal.push_back(JournalRecord{next_seq_++, actor, std::move(line)});
  applied_seq_.store(next_seq_ - 1);
}

void MarketCore::RememberKey(const std::string& actor, const std::string& key, const market::Operation& op,
                             uint64_t created_id, uint64_t seq) {
  std::string id = actor + '\n' + key;
  auto it = keyed_.find(id);
  if (it != keyed_.end() && seq > 1 && it->second.last_seq == seq - 1) {
    // The next operation of the same call.
    it->second.fingerprint += '\n' + Fingerprint(op);
    it->second.more_ids.push_back(created_id);
    it->second.last_seq = seq;
    return;
  }
  KeyedOutcome out;
  out.fingerprint = Fingerprint(op);
  out.time = op.time;
  out.created_id = created_id;
  out.last_seq = seq;
  if (const auto* d = std::get_if<market::OpDeposit>(&op.body)) {
    auto v = engine_->GetTenant(d->tenant);
    if (v.ok()) out.balance = v->balance;
  }
  if (keyed_.insert_or_assign(id, std::move(out)).second) keyed_order_.push_back(std::move(id));
  while (keyed_order_.size() > options_.idempotency_keys) {
    keyed_.erase(keyed_order_.front());
    keyed_order_.pop_front();
  }
}

void MarketCore::PushRing(WireEvent e) {
  if (options_.event_ring == 0) return;
  if (ring_.size() >= options_.event_ring) {
    ring_floor_ = ring_.front().pos;
    ring_.pop_front();
  }
  ring_.push_back(std::move(e));
}

void MarketCore::RingReplayed(uint64_t seq) {
  std::lock_guard lock(subs_mu_);
  for (WireEvent& e : pending_->events) PushRing(std::move(e));
  pending_->events.clear();
  delivered_ = std::max(delivered_, EventPos::AllOf(seq));
  if (options_.event_ring == 0) ring_floor_ = delivered_;
}

Status MarketCore::ApplyRecord(const JournalRecord& r) {
  auto rec = oplog::DecodeRecord(r.line);
  if (!rec.ok()) return DataLoss("journal: record " + std::to_string(r.seq) + ": " + rec.status().message());
  market::ApplyResult res = market::Apply(*engine_, rec->op);
  if (!res.status.ok()) {
    return DataLoss("journal: record " + std::to_string(r.seq) + " no longer applies: " + res.status.message());
  }
  if (rec->created_id != oplog::kNoId && rec->created_id != res.created_id) {
    return DataLoss("journal: record " + std::to_string(r.seq) + " created id " + std::to_string(res.created_id) +
                    ", the journal says " + std::to_string(rec->created_id));
  }
  if (!rec->idempotency_key.empty()) RememberKey(r.actor, rec->idempotency_key, rec->op, res.created_id, r.seq);
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Snapshots.

namespace {
// One idempotency key's entry: the one place that knows KeyedOutcome's fields.
template <typename Outcome>
void PutKeyed(std::string* out, const std::string& id, const Outcome& o) {
  PutStr(out, id);
  PutStr(out, o.fingerprint);
  PutU64(out, o.created_id);
  PutU64(out, static_cast<uint64_t>(o.balance));
}
template <typename Outcome>
std::string GetKeyed(ImageReader& r, Outcome* o) {
  std::string id(r.Str("snapshot key"));
  o->fingerprint = std::string(r.Str("snapshot key fingerprint"));
  o->created_id = r.U64("snapshot key created_id");
  o->balance = static_cast<int64_t>(r.U64("snapshot key balance"));
  return id;
}
}  // namespace

Result<StoredSnapshot> MarketCore::TakeSnapshot() {
  auto snap = std::make_shared<StoredSnapshot>();
  // Execute returns once the batch this runs in, and every batch before
  // it, is durable: the image never covers an uncommitted record.
  LZ_RETURN_IF_ERROR(Execute("server", [this, snap](WriterContext&) -> Status {
    snap->seq = next_seq_ - 1;
    std::string& out = snap->image;
    out.append(kCoreMagic);
    PutU64(&out, snap->seq);
    PutU64(&out, last_event_.seq);
    PutU64(&out, last_event_.index);
    PutU64(&out, keyed_order_.size());
    for (const std::string& id : keyed_order_) PutKeyed(&out, id, keyed_.at(id));
    PutStr(&out, engine_->Snapshot(kSnapshotLedgerTail));
    PutU64(&out, Fnv1a64(out));
    return Status::Ok();
  }));
  return std::move(*snap);
}

Status MarketCore::RestoreSnapshot(const StoredSnapshot& snap) {
  std::string_view image = snap.image;
  auto bad = [&](const std::string& why) {
    return DataLoss("snapshot at seq " + std::to_string(snap.seq) + ": " + why);
  };
  if (image.size() < kCoreMagic.size() + 8 || image.substr(0, kCoreMagic.size()) != kCoreMagic) {
    return bad("not a market core snapshot (bad magic)");
  }
  ImageReader sum{image.substr(image.size() - 8)};
  if (sum.U64("checksum") != Fnv1a64(image.substr(0, image.size() - 8))) return bad("checksum mismatch (corrupt image)");
  ImageReader r{image.substr(kCoreMagic.size(), image.size() - kCoreMagic.size() - 8)};
  uint64_t seq = r.U64("snapshot seq");
  if (r.error.empty() && seq != snap.seq) return bad("the image covers seq " + std::to_string(seq));
  EventPos last_event;
  last_event.seq = r.U64("snapshot last event seq");
  last_event.index = static_cast<uint32_t>(r.U64("snapshot last event index"));
  if (r.error.empty() && last_event.seq > seq) return bad("the last event's seq is past the image's");
  uint64_t keys = r.U64("snapshot key count");
  std::unordered_map<std::string, KeyedOutcome> keyed;
  std::deque<std::string> order;
  for (uint64_t i = 0; i < keys && r.error.empty(); ++i) {
    KeyedOutcome o;
    std::string id = GetKeyed(r, &o);
    keyed.insert_or_assign(id, std::move(o));
    order.push_back(std::move(id));
  }
  std::string_view engine_image = r.Str("snapshot engine image");
  if (!r.error.empty()) return bad(r.error);
  if (!r.in.empty()) return bad("trailing bytes");
  Status st = engine_->Restore(engine_image);
  if (!st.ok()) return bad(st.message());
  keyed_ = std::move(keyed);
  keyed_order_ = std::move(order);
  restored_seq_ = seq;
  last_event_ = restored_last_event_ = last_event;
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Replication.

void MarketCore::SetLeaderHint(std::string address) {
  std::lock_guard lock(hint_mu_);
  leader_hint_ = std::move(address);
}

void MarketCore::Refuse(std::string why) {
  {
    std::lock_guard lock(hint_mu_);
    step_down_why_ = std::move(why);
  }
  failed_.store(true);
}

std::string MarketCore::FailedMessage() const {
  std::lock_guard lock(hint_mu_);
  return "server: the store failed; restart the server" +
         (step_down_why_.empty() ? std::string() : " (" + step_down_why_ + ")");
}

void MarketCore::StepDown(std::string why) {
  {
    std::lock_guard lock(hint_mu_);
    step_down_why_ = std::move(why);
    leader_hint_.clear();
  }
  follower_.store(true);
}

std::string MarketCore::LeaderHint() const {
  std::lock_guard lock(hint_mu_);
  return leader_hint_;
}

Status MarketCore::Replicate(std::vector<JournalRecord> records, std::vector<TokenRecord> tokens) {
  return Execute("server", [this, records = std::move(records), tokens = std::move(tokens)](WriterContext&) -> Status {
    for (const auto& t : tokens) {
      tokens_->Put(t);
      next_token_id_ = std::max(next_token_id_, t.id + 1);
    }
    for (const auto& r : records) {
      if (r.seq < next_seq_) continue;
      if (r.seq > next_seq_) {
        return DataLoss("journal: record " + std::to_string(next_seq_) + " missing (next is " +
                        std::to_string(r.seq) + ")");
      }
      LZ_RETURN_IF_ERROR(ApplyRecord(r));
      applied_seq_.store(next_seq_++);
    }
    return Status::Ok();
  });
}

Status MarketCore::Promote(MarketCreation creation) {
  return Execute("server", [this, creation = std::move(creation)](WriterContext&) -> Status {
    bool empty = next_seq_ == 1;
    follower_.store(false);
    batch_advanced_ = true;
    MaybeAdvance(/*force=*/true);
    if (empty && creation.create) {
      pending_->batch.identity = creation.identity.empty() ? NewIdentity() : creation.identity;
      WriterContext ctx(this, &creation.actor);
      return creation.create(ctx);
    }
    return Status::Ok();
  });
}

Status WriterContext::Writable() const {
  if (!core_->follower_.load()) return Status::Ok();
  std::string leader = core_->LeaderHint();
  {
    std::lock_guard lock(core_->hint_mu_);
    if (!core_->step_down_why_.empty()) {
      return Unavailable("not the leader: this replica stepped down (" + core_->step_down_why_ + "); retry");
    }
  }
  return Unavailable("not the leader: this replica follows" +
                     (leader.empty() ? std::string("; no leader is elected yet, retry")
                                     : "; the leader is " + leader + " (leader=" + leader + ")"));
}

bool MarketCore::MaybeAdvance(bool force) {
  if (follower_.load()) return false;
  Micros t = options_.clock();
  Micros now = engine_->now();
  if (t <= now) return false;
  if (!force && t - now < options_.min_advance && engine_->NextEventTime() > t) return false;
  market::Operation op{t, market::OpAdvance{}};
  market::ApplyResult r = market::Apply(*engine_, op);
  if (!r.status.ok()) return false;
  Journal("server", op);
  last_advance_ = std::chrono::steady_clock::now();
  return true;
}

void MarketCore::AdvanceForMutation() {
  if (batch_advanced_) return;
  batch_advanced_ = true;
  MaybeAdvance(/*force=*/false);
}

market::ApplyResult WriterContext::Apply(market::OpBody body) { return ApplyKeyed(std::move(body), {}); }

market::ApplyResult WriterContext::ApplyKeyed(market::OpBody body, const std::string& key, bool* repeated,
                                              int64_t* balance) {
  if (repeated) *repeated = false;
  if (Status w = Writable(); !w.ok()) return {std::move(w), UINT64_MAX};
  if (!key.empty() && key != applying_key_) {
    if (Status st = oplog::CheckIdempotencyKey(key, "idempotency_key"); !st.ok()) {
      return {InvalidArgument(st.message()), UINT64_MAX};
    }
    auto it = core_->keyed_.find(*actor_ + '\n' + key);
    if (it != core_->keyed_.end()) {
      if (Status st = SameRequest(it->second, {body}); !st.ok()) return {std::move(st), UINT64_MAX};
      if (repeated) *repeated = true;
      if (balance) *balance = it->second.balance;
      return {Status::Ok(), it->second.created_id};
    }
  }
  core_->AdvanceForMutation();
  market::Operation op{core_->engine_->now(), std::move(body)};
  // The server accepts only what replay accepts: the shared field checks
  // first (for their messages), then replay's reading of this line.
  if (Status st = market::ValidateOperation(op); !st.ok()) return {std::move(st), UINT64_MAX};
  std::string line = oplog::EncodeOperation(op);
  auto replayed = oplog::DecodeRecord(line);
  if (!replayed.ok()) return {InvalidArgument(replayed.status().message()), UINT64_MAX};
  market::ApplyResult r = market::Apply(*core_->engine_, replayed->op);
  if (r.status.ok()) {
    core_->Journal(*actor_, replayed->op, r.created_id, key, &line);
    if (!key.empty()) {
      core_->RememberKey(*actor_, key, replayed->op, r.created_id, core_->next_seq_ - 1);
      applying_key_ = key;
    }
    if (balance) {
      if (const auto* d = std::get_if<market::OpDeposit>(&replayed->op.body)) {
        auto v = core_->engine_->GetTenant(d->tenant);
        if (v.ok()) *balance = v->balance;
      }
    }
  }
  return r;
}

Micros WriterContext::MutationTime() {
  core_->AdvanceForMutation();
  return core_->engine_->now();
}

const KeyedOutcome* WriterContext::Repeat(const std::string& key) const {
  if (key.empty() || key == applying_key_) return nullptr;
  auto it = core_->keyed_.find(*actor_ + '\n' + key);
  return it == core_->keyed_.end() ? nullptr : &it->second;
}

Status WriterContext::SameRequest(const KeyedOutcome& prior, const std::vector<market::OpBody>& bodies) {
  std::string fp;
  for (const auto& b : bodies) {
    if (!fp.empty()) fp += '\n';
    fp += Fingerprint(market::Operation{0, b});
  }
  if (fp == prior.fingerprint) return Status::Ok();
  return FailedPrecondition("idempotency_key: already used for a different request (" +
                            prior.fingerprint.substr(0, 512) + "); use a new key for a new request");
}

void WriterContext::PutToken(const TokenRecord& record) {
  core_->pending_->batch.tokens.push_back(record);
  core_->tokens_->Put(record);
}

const std::string& MarketCore::TenantName(TenantId id) {
  auto it = tenant_names_.find(id.value);
  if (it != tenant_names_.end()) return it->second;
  auto view = engine_->GetTenant(id);
  std::string name = view.ok() ? view->name : std::string();
  if (!view.ok()) {
    static const std::string kEmpty;
    return kEmpty;
  }
  return tenant_names_.emplace(id.value, std::move(name)).first->second;
}

void MarketCore::Render(std::span<const market::Event> events) {
  const auto& topo = engine_->topology();
  for (const market::Event& e : events) {
    WireEvent w;
    w.event = e;
    w.type = std::string(market::EventTypeName(e.type));
    if (e.node.valid() && e.node.value < topo.node_count()) w.node = topo.node(e.node).name;
    if (e.vertex.valid() && e.vertex.value < topo.vertex_count()) w.vertex = topo.VertexName(e.vertex);
    if (e.tenant.valid()) w.tenant = TenantName(e.tenant);
    if (e.other.valid()) w.other = TenantName(e.other);
    if (e.reasons) w.reasons = market::ReasonNames(e.reasons);
    if (e.cancel_reason != market::CancelReason::kNone) w.cancel_reason = market::CancelReasonName(e.cancel_reason);
    // The record being applied gets seq next_seq_ (it is journaled, or was
    // replicated, under that seq once it applies).
    if (event_seq_ != next_seq_) {
      event_seq_ = next_seq_;
      event_index_ = 0;
    } else {
      ++event_index_;
    }
    w.pos = EventPos{event_seq_, event_index_};
    pending_->events.push_back(std::move(w));
  }
}

void MarketCore::RunBatch(std::vector<Command>& cmds) {
  pending_ = std::make_unique<Pending>();
  if (trace_) pending_->started = std::chrono::steady_clock::now();
  // Time advances at most once per batch, when its first mutation applies (if
  // the clock moved enough or something is due); later commands apply at that
  // time. A batch of reads journals nothing, unless something fell due
  // (a grace deadline, maintenance): that applies first even under a steady
  // stream of reads that keeps the timer from firing.
  batch_advanced_ = false;
  if (engine_->NextEventTime() <= options_.clock()) AdvanceForMutation();
  for (Command& c : cmds) {
    WriterContext ctx(this, &c.actor);
    c.work(ctx);
    pending_->dones.push_back(std::move(c.done));
    if (trace_) pending_->queued.push_back(c.queued);
  }
  metrics_->resting_orders.store(static_cast<int64_t>(engine_->resting_order_count()), std::memory_order_relaxed);
  metrics_->live_nodes.store(static_cast<int64_t>(engine_->topology().live_node_count()), std::memory_order_relaxed);
  metrics_->tenants.store(static_cast<int64_t>(engine_->tenant_count()), std::memory_order_relaxed);
  metrics_->engine_time_us.store(engine_->now(), std::memory_order_relaxed);
  metrics_->journal_seq.store(static_cast<int64_t>(next_seq_ - 1), std::memory_order_relaxed);
  pending_->last_seq = next_seq_ - 1;
  if (trace_) pending_->handed = std::chrono::steady_clock::now();

  HandOff(std::move(pending_), /*wait_for_room=*/true);
}

void MarketCore::HandOff(std::unique_ptr<Pending> p, bool wait_for_room) {
  // Commands already waiting: the committer commits this batch while the
  // writer applies them (the overlap of a group commit). Nothing waiting:
  // the writer commits the batch itself, one thread wake-up fewer on the way
  // to the acks. Either way batches commit in order: the writer commits only
  // when the committer has nothing queued or in hand.
  bool waiting;
  {
    std::lock_guard lock(queue_mu_);
    waiting = !queue_.empty();
  }
  std::unique_lock lock(commit_mu_);
  if (wait_for_room) {
    commit_space_.wait(lock, [&] { return uncommitted_records_ < options_.max_uncommitted || failed_.load(); });
  }
  uncommitted_records_ += p->batch.journal.size();
  if (waiting || committing_ || !commit_queue_.empty()) {
    commit_queue_.push_back(std::move(p));
    commit_cv_.notify_one();
    return;
  }
  committing_ = true;
  lock.unlock();
  std::vector<std::unique_ptr<Pending>> work;
  work.push_back(std::move(p));
  CommitWork(work);
  lock.lock();
  committing_ = false;
}

void MarketCore::WriterLoop() {
  std::vector<Command> cmds;
  for (;;) {
    {
      std::unique_lock lock(queue_mu_);
      // Wake for commands, or when the engine has something due, or on the idle tick.
      auto wake = std::chrono::steady_clock::now() + options_.idle_tick;
      Micros next = engine_->NextEventTime();
      if (next != kNever) {
        Micros in = next - options_.clock();
        auto due = std::chrono::steady_clock::now() + std::chrono::microseconds(std::max<Micros>(in, 0));
        if (due < wake) wake = due;
      }
      queue_cv_.wait_until(lock, wake, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) break;
      size_t n = std::min(queue_.size(), options_.max_batch);
      for (size_t i = 0; i < n; ++i) {
        cmds.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      metrics_->queue_length.store(static_cast<int64_t>(queue_.size()), std::memory_order_relaxed);
    }
    if (failed_.load()) {
      for (auto& c : cmds) c.done(Unavailable(FailedMessage()));
      cmds.clear();
      continue;
    }
    if (cmds.empty()) {
      // Timer wake-up: apply what fell due (deadlines, floors) even with no traffic.
      pending_ = std::make_unique<Pending>();
      bool due = engine_->NextEventTime() <= options_.clock() ||
                 std::chrono::steady_clock::now() - last_advance_ >= options_.idle_advance;
      bool advanced = due && MaybeAdvance(/*force=*/true);
      if (!advanced) {
        pending_.reset();
        continue;
      }
      HandOff(std::move(pending_), /*wait_for_room=*/false);
      continue;
    }
    RunBatch(cmds);
    cmds.clear();
  }
  std::lock_guard lock(commit_mu_);
  writer_done_ = true;
  commit_cv_.notify_one();
}

// ---------------------------------------------------------------------------
// Committer thread.

void MarketCore::FailAll(const Status& why) {
  failed_.store(true);
  std::fprintf(stderr, "laissez serve: %s; refusing further requests\n", why.ToString().c_str());
}

void MarketCore::CommitterLoop() {
  for (;;) {
    std::vector<std::unique_ptr<Pending>> work;
    {
      std::unique_lock lock(commit_mu_);
      commit_cv_.wait(lock, [&] { return writer_done_ || !commit_queue_.empty(); });
      if (commit_queue_.empty() && writer_done_) return;
      while (!commit_queue_.empty()) {
        work.push_back(std::move(commit_queue_.front()));
        commit_queue_.pop_front();
      }
      committing_ = true;
    }
    CommitWork(work);
    std::lock_guard lock(commit_mu_);
    committing_ = false;
  }
}

void MarketCore::CommitWork(std::vector<std::unique_ptr<Pending>>& work) {
  // One transaction for everything queued: group commit.
  Batch merged;
  size_t records = 0;
  for (auto& p : work) {
    records += p->batch.journal.size();
    if (work.size() == 1) {
      merged = std::move(p->batch);
      break;
    }
    for (auto& r : p->batch.journal) merged.journal.push_back(std::move(r));
    for (auto& t : p->batch.tokens) merged.tokens.push_back(std::move(t));
  }
  Status st = failed_.load() ? Unavailable(FailedMessage()) : Status::Ok();
  Trace::Cmd stamp;  // While tracing: the commit's, shared by its commands.
  if (trace_) stamp.commit_start = stamp.commit_end = std::chrono::steady_clock::now();
  if (st.ok() && !merged.empty()) {
    auto t0 = std::chrono::steady_clock::now();
    stamp.commit_start = t0;
    Status c = store_->Commit(merged);
    stamp.commit_end = std::chrono::steady_clock::now();
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(stamp.commit_end - t0).count();
    metrics_->commits.fetch_add(1, std::memory_order_relaxed);
    metrics_->committed_records.fetch_add(records, std::memory_order_relaxed);
    metrics_->commit_us_sum.fetch_add(us, std::memory_order_relaxed);
    if (!c.ok()) {
      FailAll(c);
      st = Unavailable("server: the store failed (" + c.message() + "); the request was not made durable");
    }
  }
  {
    std::lock_guard lock(commit_mu_);
    uncommitted_records_ -= records;
    commit_space_.notify_all();
  }
  size_t commands = 0;
  for (auto& p : work) {
    for (size_t i = 0; i < p->dones.size(); ++i) {
      p->dones[i](st);
      if (trace_ && i < p->queued.size()) {
        stamp.queued = p->queued[i];
        stamp.started = p->started;
        stamp.handed = p->handed;
        stamp.done = std::chrono::steady_clock::now();
        trace_->Add(stamp);
      }
    }
    commands += p->dones.size();
  }
  if (st.ok()) {
    // Ring and subscriptions under one lock, so a subscription that resumes
    // sees each event exactly once: from the ring or live.
    std::lock_guard lock(subs_mu_);
    for (auto& p : work) {
      for (WireEvent& e : p->events) {
        for (auto& s : subs_) {
          if (s->Wants(e)) s->Push(e);
        }
        PushRing(std::move(e));
      }
      if (p->last_seq > 0) delivered_ = std::max(delivered_, EventPos::AllOf(p->last_seq));
      if (options_.event_ring == 0) ring_floor_ = delivered_;
    }
  }
  if (st.ok()) {
    // The acks have left: the store's housekeeping (a WAL checkpoint, most
    // of it on a thread of its own) delays at most what comes next.
    const TimePoint t0 = trace_ ? std::chrono::steady_clock::now() : TimePoint{};
    if (Status c = store_->AfterCommit(); !c.ok()) {
      std::fprintf(stderr, "laissez serve: %s (the commit itself is durable)\n", c.ToString().c_str());
    }
    if (trace_) {
      trace_->AddCommit({records, commands,
                         std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()});
    }
  }
}

}  // namespace laissez::server
