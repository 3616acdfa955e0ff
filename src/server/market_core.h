// MarketCore: the engine on one writer thread, fed by a command queue, with a
// journal committed to the durable store before any reply leaves.
//
// Request threads call Submit (or Execute) with a closure; the writer thread
// runs closures in arrival order against the engine at the current wall-clock
// time, each mutation through WriterContext::Apply, which journals the applied
// operation (docs/OPLOG.md format). After a batch of closures, the batch's
// journal records, token changes, completions and events are committed to the
// store in one transaction, and only then are the completions run and the
// events delivered to watchers. So nothing is acknowledged, and no reader sees
// anything, before it is durable. Who commits: if more commands are already
// waiting, or the committer thread is busy, the batch goes to the committer
// thread (group commit, while the writer carries on with the next batch);
// otherwise the writer commits it itself, which spares an ack one thread
// wake-up. Batches commit in apply order either way.
//
// Time: wall-clock microseconds since the Unix epoch are the engine's time.
// Every time advance is journaled (as an `advance` operation), so replaying the
// journal into a fresh engine gives the same state. On Start the journal is
// replayed and the market catches up to the wall clock (DESIGN.md §3 rule 11).
//
// Invariants:
//  - Only the writer thread touches the engine after Start.
//  - Journal seqs are contiguous and in apply order; a record is in the store
//    before the completion of the command that produced it runs.
//  - If a commit fails, the core stops: every pending and later command
//    completes with UNAVAILABLE and `failed()` turns true (the process should
//    exit; a restart replays what was committed).
#pragma once

#include <atomic>
#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "market/market_engine.h"
#include "market/operation.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/store.h"

namespace laissez::server {

using Clock = std::function<Micros()>;
// Microseconds since the Unix epoch.
Micros WallClockMicros();

// The journal line format is the operation log (src/oplog); these wrap it.
std::string EncodeJournalLine(const market::Operation& op);
Result<market::Operation> DecodeJournalLine(std::string_view line);

// Where an event stands in the market's history: the seq of the journal record
// whose application produced it and its index among that record's events.
// Every replica applies the same records in the same order, so an event has
// the same position on all of them (docs/HA.md, "Resumable watches").
struct EventPos {
  uint64_t seq = 0;
  uint32_t index = 0;
  // Every event of record `seq` and before.
  static EventPos AllOf(uint64_t seq) { return EventPos{seq, UINT32_MAX}; }
  auto operator<=>(const EventPos&) const = default;
};

// A market event rendered with names, ready for any wire format. Ids are kept
// for filtering; names are what clients see.
struct WireEvent {
  EventPos pos;
  market::Event event;
  std::string type;      // EventTypeName.
  std::string node;      // Node name, if any.
  std::string vertex;    // Vertex name, if any.
  std::string tenant;    // Tenant name, if any (operator view only).
  std::string other;     // Previous holder's name (operator view only).
  std::string reasons;   // ReasonNames.
  std::string cancel_reason;
};

// A watch stream's queue. Filled by the committing thread (the committer, or
// the writer when it commits its own batch), drained by one stream thread.
class Subscription {
 public:
  // Operator view: every event with names. Tenant view: the tenant's own events
  // and price changes at `vertices`, without other tenants' names.
  // Only events after `after` are queued.
  Subscription(bool operator_view, TenantId tenant, std::unordered_set<uint32_t> vertices, EventPos after = {})
      : operator_view_(operator_view), tenant_(tenant), vertices_(std::move(vertices)), after_(after) {}

  // Waits up to `timeout` for events and moves them into `out`. Returns false
  // once the subscription is closed (and `out` holds what was left).
  bool Next(std::vector<WireEvent>* out, std::chrono::milliseconds timeout);
  // Why it was closed (OK after a normal shutdown).
  Status close_status() const;
  void Close(Status why);

  bool Wants(const WireEvent& e) const;
  void Push(const WireEvent& e);  // Closes with RESOURCE_EXHAUSTED if the reader lags far behind.
  bool operator_view() const { return operator_view_; }

 private:
  static constexpr size_t kMaxQueued = 65536;
  const bool operator_view_;
  const TenantId tenant_;
  const std::unordered_set<uint32_t> vertices_;
  const EventPos after_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WireEvent> queue_;
  bool closed_ = false;
  Status close_status_;
};

class WriterContext;

// What a call made with an idempotency key did (docs/SERVER.md, "Idempotency
// keys"): enough to answer a repeat with the original result.
struct KeyedOutcome {
  std::string fingerprint;  // Its operations' lines without time, id or key, one a line.
  Micros time = 0;          // The engine time its first operation applied at.
  uint64_t created_id = UINT64_MAX;  // What its first operation created.
  std::vector<uint64_t> more_ids;    // What its later operations created (calls of several).
  int64_t balance = 0;      // The tenant's balance right after it (deposits).
  uint64_t last_seq = 0;    // Its last journal record.
};

struct CoreOptions {
  Clock clock;                                         // Default: WallClockMicros.
  std::chrono::milliseconds idle_tick{1000};           // Wake at least this often when idle.
  // When idle, journal a time advance only if something fell due or this much
  // time passed since the last one (an idle market needs no advance: charges
  // accrue by time and settle when rates change).
  std::chrono::milliseconds idle_advance{60000};
  Micros min_advance = 1000;                           // Skip advances smaller than this while busy.
  size_t max_batch = 4096;                             // Commands per writer batch.
  size_t max_uncommitted = 65536;                      // Journal records the writer may run ahead.
  // Recent events kept for watches that resume (WatchRequest.resume). 0: none
  // kept, and events are rendered only while someone watches.
  size_t event_ring = 65536;
  // Start as a follower of a replicated market (replica.h): replay, commit
  // nothing, refuse mutations until Promote.
  bool follower = false;
  // Idempotency keys remembered (the most recent ones, over all actors).
  size_t idempotency_keys = 100000;
};

// What a new market starts with: runs on a store that holds no market, after
// the first time advance, and everything it applies and every token it puts
// is committed in one transaction together with `identity` (the market's
// identity, store.h). A crash before that commit leaves no market at all.
struct MarketCreation {
  std::string identity;
  std::string actor = "server";
  std::function<Status(WriterContext&)> create;
};

class MarketCore {
 public:
  // Not owned: `store`, `tokens`, `metrics` must outlive the core.
  MarketCore(Store* store, TokenTable* tokens, Metrics* metrics, CoreOptions options = {});
  ~MarketCore();
  MarketCore(const MarketCore&) = delete;
  MarketCore& operator=(const MarketCore&) = delete;


  // Loads the tokens, restores the store's newest snapshot if it has one and
  // replays the journal after it (all of it otherwise) into a fresh engine
  // (DATA_LOSS if the snapshot or a record does not decode or apply), catches up to the clock (on a store with
  // no market: runs `creation` in the same commit), starts the threads.
  Status Start(const MarketCreation& creation = MarketCreation());
  // Drains the queue, commits, stops the threads, closes subscriptions.
  void Stop();

  // True if the store held no journal and no tokens before Start.
  bool fresh() const { return fresh_; }
  bool failed() const { return failed_.load(); }
  // Journal records replayed by Start (after the snapshot, if one was restored).
  uint64_t replayed() const { return replayed_; }
  // The seq of the snapshot Start restored; 0 if none.
  uint64_t restored_seq() const { return restored_seq_; }

  // An image of the core at the last applied journal seq: the engine
  // (with the last ledger entries a GetLedger may list) and the state the
  // core rebuilds from the journal besides it - the idempotency key table.
  // Tokens are not in it (the store keeps them). Runs on the writer thread and
  // returns once every record it covers is durable.
  Result<StoredSnapshot> TakeSnapshot();
  // Ledger entries kept in a snapshot (the most GetLedger lists).
  static constexpr size_t kSnapshotLedgerTail = 10000;

  using Work = std::function<void(WriterContext&)>;
  using Done = std::function<void(const Status& durable)>;
  // Queues `work` for the writer thread; `done` runs on the committer or the
  // writer thread once everything `work` journaled is durable (OK), or with
  // UNAVAILABLE if the core stopped or failed. `done` must be quick and must
  // not Submit.
  void Submit(std::string actor, Work work, Done done);

  // Runs `work` on the writer thread and, once everything it journaled is
  // durable, calls `done` with its result (UNAVAILABLE if the commit failed
  // or the core stopped first). Nothing waits: `done` runs on the committing
  // thread, so like Submit's it must be quick and must not Submit.
  template <typename T>
  void ExecAsync(std::string actor, std::function<Result<T>(WriterContext&)> work,
                 std::function<void(Result<T>)> done) {
    ExecAsyncAs<Result<T>>(std::move(actor), std::move(work), std::move(done));
  }
  // The same for work that yields only a Status.
  void ExecAsync(std::string actor, std::function<Status(WriterContext&)> work, std::function<void(Status)> done) {
    ExecAsyncAs<Status>(std::move(actor), std::move(work), std::move(done));
  }

  // ExecAsync, waiting for the result.
  template <typename T>
  Result<T> Execute(std::string actor, std::function<Result<T>(WriterContext&)> work) {
    return ExecuteAs<Result<T>>(std::move(actor), std::move(work));
  }
  Status Execute(std::string actor, std::function<Status(WriterContext&)> work) {
    return ExecuteAs<Status>(std::move(actor), std::move(work));
  }

  std::shared_ptr<Subscription> Subscribe(bool operator_view, TenantId tenant, std::unordered_set<uint32_t> vertices);
  // A subscription that resumes after `after`: it first gets the ring's
  // events after that position, then live ones, with no gap and no duplicate.
  // OUT_OF_RANGE if the ring no longer reaches back to `after` (events after
  // it were dropped, or came before this process started). `*live_from` (if
  // given) is set to the position the subscription is complete from: every
  // event after it reaches the subscription (filters aside).
  Result<std::shared_ptr<Subscription>> SubscribeAfter(bool operator_view, TenantId tenant,
                                                       std::unordered_set<uint32_t> vertices,
                                                       std::optional<EventPos> after, EventPos* live_from = nullptr);
  void Unsubscribe(const std::shared_ptr<Subscription>& sub);

  size_t queue_length() const;

  // Replication (replica.h, docs/HA.md). A follower applies only what
  // Replicate hands it and answers every mutation UNAVAILABLE naming the
  // leader; it journals no time advances.
  bool follower() const { return follower_.load(); }
  void SetFollower(bool follower) { follower_.store(follower); }
  // A leader that lost its lease: refuses mutations, saying why.
  void StepDown(std::string why);
  // Refuses every call from now on (as after a failed commit), saying why.
  void Refuse(std::string why);
  void SetLeaderHint(std::string address);
  std::string LeaderHint() const;
  // The last journal seq applied to the engine.
  uint64_t applied_seq() const { return applied_seq_.load(); }
  // Applies `records` (those at or below applied_seq() are skipped; a gap is
  // DATA_LOSS) and `tokens` on the writer thread, delivers their events to
  // watchers, and waits until done.
  Status Replicate(std::vector<JournalRecord> records, std::vector<TokenRecord> tokens);
  // Makes a follower the leader: catches up to the clock and, on a store
  // with no market, runs `creation`; waits until that is durable.
  Status Promote(MarketCreation creation);

 private:
  friend class WriterContext;
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Command {
    std::string actor;
    Work work;
    Done done;
    TimePoint queued{};  // Set only while tracing (Trace).
  };
  struct Pending {
    Batch batch;
    std::vector<Done> dones;
    std::vector<WireEvent> events;
    uint64_t last_seq = 0;  // The last journal seq applied when the batch ended.
    // While tracing: when each command was queued, when the writer began the
    // batch and when it handed the batch off.
    std::vector<TimePoint> queued;
    TimePoint started{}, handed{};
  };
  class Sink;
  class Trace;

  // ExecAsync and Execute for a result type R (Status or Result<T>).
  template <typename R>
  void ExecAsyncAs(std::string actor, std::function<R(WriterContext&)> work, std::function<void(R)> done);
  template <typename R>
  R ExecuteAs(std::string actor, std::function<R(WriterContext&)> work);
  // What a call's completion reports: the commit's failure, else the work's
  // result (`result`, set on the writer thread; empty if the work never ran).
  template <typename R>
  static R Outcome(const Status& durable, std::optional<R>& result) {
    if (!durable.ok()) return R(durable);
    if (!result) return R(Unavailable("server: stopping"));
    return std::move(*result);
  }

  void WriterLoop();
  void CommitterLoop();
  void RunBatch(std::vector<Command>& cmds);
  // Writer thread: commits a finished batch, itself or through the committer
  // (see the top of this file). `wait_for_room`: first wait until fewer than
  // max_uncommitted records are uncommitted.
  void HandOff(std::unique_ptr<Pending> p, bool wait_for_room);
  // Commits `work` in one transaction, then runs its completions and delivers
  // its events. On one thread at a time (committing_), in batch order.
  void CommitWork(std::vector<std::unique_ptr<Pending>>& work);
  // Journals the batch's time advance the first time a command of the batch
  // mutates the market, so reads and calls rejected at the edge journal nothing.
  void AdvanceForMutation();
  // `encoded`, if given, is the line op was decoded from, as EncodeOperation
  // wrote it: the record takes it (moved from, so unusable after the call)
  // when it needs no created id and no key (issue 12: an update's line was
  // written twice).
  void Journal(const std::string& actor, const market::Operation& op, uint64_t created_id = UINT64_MAX,
               std::string_view key = {}, std::string* encoded = nullptr);
  bool MaybeAdvance(bool force);
  void Render(std::span<const market::Event> events);
  const std::string& TenantName(TenantId id);
  void FailAll(const Status& why);
  std::string FailedMessage() const;
  // Applies one journal record to the engine as replay does.
  Status ApplyRecord(const JournalRecord& r);
  // Under subs_mu_: keeps `e` in the ring, dropping the oldest beyond event_ring.
  void PushRing(WireEvent e);
  // Start: moves the events rendered so far (pending_) into the ring, which
  // then covers everything up to record `seq`.
  void RingReplayed(uint64_t seq);
  // Before the threads start: the engine and key table from a snapshot.
  Status RestoreSnapshot(const StoredSnapshot& snap);

  Store* store_;
  TokenTable* tokens_;
  Metrics* metrics_;
  CoreOptions options_;
  std::unique_ptr<market::MarketEngine> engine_;
  std::unique_ptr<Sink> sink_;
  bool fresh_ = false;
  uint64_t replayed_ = 0;
  uint64_t restored_seq_ = 0;
  std::atomic<bool> failed_{false};
  std::atomic<bool> follower_{false};
  std::atomic<uint64_t> applied_seq_{0};
  mutable std::mutex hint_mu_;
  std::string leader_hint_;
  std::string step_down_why_;

  // Writer state (writer thread only after Start).
  uint64_t next_seq_ = 1;
  uint64_t next_token_id_ = 1;
  std::unique_ptr<Pending> pending_;
  bool batch_advanced_ = false;
  std::unordered_map<uint32_t, std::string> tenant_names_;
  std::atomic<int> subscriber_count_{0};
  // Idempotency keys (writer thread): actor + key -> what the keyed call
  // did, rebuilt from the journal by replay and replication.
  std::unordered_map<std::string, KeyedOutcome> keyed_;
  std::deque<std::string> keyed_order_;
  // `seq`: the record's journal seq. A record with the key of the record just
  // before it (same actor) continues that call (a call of several operations).
  void RememberKey(const std::string& actor, const std::string& key, const market::Operation& op,
                   uint64_t created_id, uint64_t seq);
  uint64_t event_seq_ = 0;    // Position of the last rendered event.
  uint32_t event_index_ = 0;
  // Position of the last event the engine emitted, rendered or not (writer
  // thread). A snapshot keeps it, so a watch that saw every event up to the
  // snapshot resumes after a restore although the ring starts after it.
  EventPos last_event_;
  EventPos restored_last_event_;  // last_event_ as the restored snapshot had it.
  std::chrono::steady_clock::time_point last_advance_;

  // Command queue.
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Command> queue_;
  bool stopping_ = false;
  bool started_ = false;

  // Commit queue.
  std::mutex commit_mu_;
  std::condition_variable commit_cv_;     // Committer waits for work.
  std::condition_variable commit_space_;  // Writer waits for room.
  std::deque<std::unique_ptr<Pending>> commit_queue_;
  size_t uncommitted_records_ = 0;
  bool writer_done_ = false;
  bool committing_ = false;  // A CommitWork is running (committer or writer).

  std::mutex subs_mu_;
  std::vector<std::shared_ptr<Subscription>> subs_;
  // Under subs_mu_: the last delivered events, and the positions the ring
  // covers: every event after ring_floor_ and up to delivered_ is in ring_.
  std::deque<WireEvent> ring_;
  EventPos ring_floor_;
  EventPos delivered_;

  // LAISSEZ_COMMIT_TRACE (market_core.cc): the phases of each command's path
  // through the core; null unless that variable names a file.
  std::unique_ptr<Trace> trace_;

  std::thread writer_, committer_;
};

// What a command's closure sees on the writer thread.
class WriterContext {
 public:
  const market::MarketEngine& engine() const { return *core_->engine_; }
  Micros now() const { return core_->engine_->now(); }
  const std::string& actor() const { return *actor_; }
  // Applies the operation at the current engine time; on success journals it.
  // The operation is first encoded as its journal line and decoded back the
  // way replay reads it (market::Apply then runs market::ValidateOperation on
  // it, as replay does), so nothing is applied that a restart could not
  // replay: such a call is INVALID_ARGUMENT and changes nothing.
  market::ApplyResult Apply(market::OpBody body);
  // Apply with the client's idempotency key (empty: plain Apply). The key is
  // journaled in the operation's own record. If this actor already applied an
  // operation with `key` (and it is still remembered, CoreOptions::
  // idempotency_keys), nothing is applied: the result is the original one
  // (`*repeated` true, `*balance` the tenant's balance right after the
  // original), or FAILED_PRECONDITION naming `idempotency_key` if `body`
  // differs from the original.
  market::ApplyResult ApplyKeyed(market::OpBody body, const std::string& key, bool* repeated = nullptr,
                                 int64_t* balance = nullptr);
  // For calls that check the market before they apply (a repeat would fail
  // those checks: the order is already cancelled) or apply several
  // operations: what this actor's earlier call with `key` did, or null (also
  // for an empty key). Ask first; if null, apply each operation with
  // ApplyKeyed(body, key): the operations of one call share the key, and a
  // repeat gets all their results.
  const KeyedOutcome* Repeat(const std::string& key) const;
  // The engine time this call's operations apply at (the batch's time advance
  // is made now if it was not yet): what a keyed repeat's KeyedOutcome::time
  // says, for a request that means "now".
  Micros MutationTime();
  // OK if `bodies` are the operations of `prior`; else FAILED_PRECONDITION
  // naming `idempotency_key`.
  static Status SameRequest(const KeyedOutcome& prior, const std::vector<market::OpBody>& bodies);
  // A token change committed with this batch; also applied to the token table
  // once durable... and at once, so later commands in the batch see it.
  void PutToken(const TokenRecord& record);
  // OK on the leader (or a single server); UNAVAILABLE naming the leader on a follower.
  Status Writable() const;
  uint64_t NextTokenId() { return core_->next_token_id_++; }
  // The name of a tenant (cached).
  const std::string& TenantName(TenantId id) { return core_->TenantName(id); }

 private:
  friend class MarketCore;
  WriterContext(MarketCore* core, const std::string* actor) : core_(core), actor_(actor) {}
  MarketCore* core_;
  const std::string* actor_;
  std::string applying_key_;  // The key this call applies under (its later operations are no repeats).
};

template <typename R>
void MarketCore::ExecAsyncAs(std::string actor, std::function<R(WriterContext&)> work, std::function<void(R)> done) {
  // Set on the writer thread; read by the committing thread after the commit.
  auto result = std::make_shared<std::optional<R>>();
  Submit(
      std::move(actor), [result, work = std::move(work)](WriterContext& ctx) { result->emplace(work(ctx)); },
      [result, done = std::move(done)](const Status& durable) { done(Outcome(durable, *result)); });
}

template <typename R>
R MarketCore::ExecuteAs(std::string actor, std::function<R(WriterContext&)> work) {
  // One shared state: the writer sets `result`, the committing thread
  // resolves it into `out` once durable and wakes the caller.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<R> result;
    R out = R(Status::Ok());  // A placeholder until `done`.
  };
  auto st = std::make_shared<State>();
  Submit(
      std::move(actor), [st, work = std::move(work)](WriterContext& ctx) { st->result.emplace(work(ctx)); },
      [st](const Status& durable) {
        R out = Outcome(durable, st->result);
        std::lock_guard lock(st->mu);
        st->out = std::move(out);
        st->done = true;
        st->cv.notify_one();
      });
  std::unique_lock lock(st->mu);
  st->cv.wait(lock, [&] { return st->done; });
  return std::move(st->out);
}

}  // namespace laissez::server
