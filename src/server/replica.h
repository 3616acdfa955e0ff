// The replicated market (docs/HA.md): the journal in etcd, leader election on
// an etcd lease, followers that apply the journal tail to a hot engine.
//
// Keys, under a prefix P (default "/laissez/"):
//   P identity            the market's identity (store.h)
//   P j/<seq, 20 digits>  a chunk of journal records, the first with that seq:
//                         "seq\tactor\tline\n" per record (docs/OPLOG.md lines)
//   P t/<id, 20 digits>   a token record (JSON; a hash, never a token)
//   P e/<lease, hex>      a replica's election key, on its lease; value: the
//                         replica's gRPC address. The key with the lowest create
//                         revision is the leader (etcd's election recipe).
//   P s/<seq, 20 digits>/<part, 6 digits>
//                         a part of the snapshot covering the journal up to seq
//                         (MarketCore::TakeSnapshot), at most kChunkBytes each
//   P m/<seq, 20 digits>  that snapshot's manifest, written last: "parts bytes
//                         fnv1a64" (decimal). A snapshot without one is torn and
//                         ignored.
//
// EtcdStore is the Store of a replica. Commit writes a group-commit batch in
// one etcd transaction fenced on the leader's election key: it succeeds only
// while that key still has the create revision it had when this replica won,
// so a deposed or paused leader can never append. A batch larger than one
// request (etcd's limit is 1.5 MiB) is split into several fenced transactions,
// each of whole records in seq order; the batch is acknowledged only when all
// have committed.
//
// Snapshots (docs/HA.md, "Snapshots and compaction"): every snapshot period
// the leader takes a core snapshot at seq S, writes its parts and then its
// manifest (fenced transactions of at most kTxnBytes), deletes the journal
// keys wholly covered by it and every older snapshot, and compacts etcd's
// history up to the revision of the previous round. Between snapshots it
// folds runs of small batch keys into chunks of up to 512 KiB. A replica that
// joins reads the newest complete snapshot and the journal after it at one
// revision, restores, replays the tail, then watches from that revision on.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "server/etcd.h"
#include "server/market_core.h"
#include "server/store.h"

namespace laissez::server {

// Journal chunk values: encode and parse ("seq\tactor\tline\n" per record).
std::string EncodeJournalChunk(const std::vector<JournalRecord>& records);
Result<std::vector<JournalRecord>> DecodeJournalChunk(std::string_view value);

class EtcdStore final : public Store {
 public:
  static constexpr size_t kChunkBytes = 512 << 10;  // Largest journal value.
  static constexpr size_t kTxnBytes = 1 << 20;      // Largest transaction payload (etcd refuses > 1.5 MiB).

  EtcdStore(std::shared_ptr<etcd::Client> client, std::string prefix);

  // Reads at one revision from now on (0: the latest); returns it.
  Result<int64_t> Pin();
  int64_t pinned() const { return pinned_; }
  void Unpin() { pinned_ = 0; }
  // Commits succeed only while `key` has create revision `rev`.
  void Fence(std::string key, int64_t rev);

  Status Commit(const Batch& batch) override;
  Status ReadJournal(uint64_t after, const std::function<Status(const JournalRecord&)>& fn) override;
  Result<std::vector<JournalRecord>> RecentJournal(size_t limit) override;
  Result<std::vector<TokenRecord>> LoadTokens() override;
  Result<uint64_t> LastSeq() override;
  Result<std::string> Identity() override;

  // Folds runs of small journal keys into chunks (at most `max_txns` fenced
  // transactions), starting where the previous call left off. Returns how
  // many keys it removed. Not thread-safe: one caller (the leader's loop).
  Result<size_t> Fold(size_t max_txns = 64);

  // Snapshots (fenced; the leader's loop only). WriteSnapshot writes the parts,
  // then the manifest. Truncate deletes the journal keys whose records are all
  // at or below `seq` and the snapshots older than `seq`; returns the number
  // of journal keys deleted.
  Status WriteSnapshot(const StoredSnapshot& snap) override;
  Result<size_t> Truncate(uint64_t seq);
  // The newest snapshot with a manifest, read at the pinned revision. A
  // manifest whose parts do not match it is DATA_LOSS naming the key.
  Result<StoredSnapshot> LoadSnapshot() override;

  const std::string& prefix() const { return prefix_; }
  etcd::Client& client() { return *client_; }

 private:
  Result<std::vector<etcd::KeyValue>> JournalKeys(int64_t rev);
  Status CommitTxn(etcd::Txn txn);
  Status CommitRecords(const Batch& batch);

  std::shared_ptr<etcd::Client> client_;
  const std::string prefix_;
  std::atomic<int64_t> pinned_{0};
  std::mutex fence_mu_;
  std::string fence_key_;
  int64_t fence_rev_ = 0;
  std::mutex commit_mu_;
  int64_t last_seq_ = -1;  // Last committed journal seq; -1 until read.
  std::string fold_from_;  // Fold's start: keys before it are folded for good.
};

std::string TokenToJson(const TokenRecord& t);
Result<TokenRecord> TokenFromJson(std::string_view s);

struct ReplicaOptions {
  std::string etcd;  // Endpoints, "HOST:PORT,...".
  std::string prefix = "/laissez/";
  std::string advertise;  // This replica's gRPC address for clients.
  int lease_ttl_s = 2;    // Election lease TTL; a dead leader is replaced after about this long.
  std::chrono::milliseconds snapshot_every{10000};  // Snapshot + truncate + compact period of the leader.
};

// Runs the election and the follower's tail for one Server. Lost() turns true
// when the replica must start over (its lease expired, its fence failed, the
// tail it follows was compacted away): the caller shuts the Server down and
// starts a new one, which joins as a follower.
class Replica {
 public:
  Replica(ReplicaOptions options, EtcdStore* store, MarketCore* core, MarketCreation creation);
  ~Replica();
  // Grants the lease, puts the election key, starts the threads.
  Status Start();
  // Stops the threads and revokes the lease (a graceful leader hands over at once).
  void Stop();

  bool lost() const { return lost_.load(); }
  bool leader() const { return leader_.load(); }
  std::string leader_address() const;
  std::string why_lost() const;

 private:
  void KeepAliveLoop();
  void FollowLoop();
  // Reads the election: true if this replica holds the first key.
  Result<bool> CheckElection();
  Status Promote();
  void Lose(const std::string& why);

  ReplicaOptions options_;
  EtcdStore* store_;
  MarketCore* core_;
  MarketCreation creation_;
  int64_t lease_ = 0;
  std::string key_;
  int64_t key_rev_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> lost_{false};
  std::atomic<bool> leader_{false};
  mutable std::mutex mu_;
  std::string leader_address_;
  std::string why_lost_;
  std::thread keepalive_, follow_;
};

}  // namespace laissez::server
