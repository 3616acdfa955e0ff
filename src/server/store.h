// Store: the server's durable state behind a small interface, so the SQLite
// implementation, the in-memory one used by tests and a replicated backend
// added later are interchangeable (one typed test suite runs against each).
//
// What is stored:
//  - the journal: the operation log of docs/OPLOG.md, one engine operation per
//    record in apply order, with the principal that caused it (the audit log);
//  - the token table: SHA-256 hashes of bearer tokens with their role, never a
//    token itself.
// Recovery replays the journal into a fresh engine, which gives the same state
// because the engine is deterministic; a store may also keep snapshots (an
// image of the market core at a journal seq, MarketCore::TakeSnapshot), so
// recovery restores the newest and replays only the journal after it.
//
// Thread-safety: every method may be called from any thread; implementations
// serialize internally. Commit is called by one committer thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace laissez::server {

struct JournalRecord {
  uint64_t seq = 0;     // 1, 2, 3, ... in apply order; assigned by the caller.
  std::string actor;    // "tenant:acme", "operator:ops", "admin:root", "server".
  std::string line;     // One operation-log line (docs/OPLOG.md), no newline.
  bool operator==(const JournalRecord&) const = default;
};

struct TokenRecord {
  uint64_t id = 0;       // Assigned by the caller; unique.
  std::string hash;      // Lower-case hex SHA-256 of the token.
  std::string role;      // "tenant", "operator" or "admin".
  uint32_t tenant_id = UINT32_MAX;  // The engine's tenant id, for role "tenant".
  std::string name;      // Label: the tenant name or the operator's name.
  bool revoked = false;
  int64_t created = 0;   // Wall-clock microseconds.
  bool operator==(const TokenRecord&) const = default;
};

// A market core's image covering the journal up to and including `seq`
// (MarketCore::TakeSnapshot; docs/HA.md, "Snapshots and compaction").
struct StoredSnapshot {
  uint64_t seq = 0;
  std::string image;
  bool empty() const { return image.empty(); }
};

// One atomic unit of durability.
struct Batch {
  std::vector<JournalRecord> journal;
  std::vector<TokenRecord> tokens;  // Inserted, or replaced by id.
  // Set only in the batch that creates the market: the market's identity, a
  // random hex string that tells this database from any other.
  std::string identity;
  bool empty() const { return journal.empty() && tokens.empty() && identity.empty(); }
};

class Store {
 public:
  virtual ~Store() = default;

  // Appends the journal records and upserts the tokens atomically. When it
  // returns OK the batch survives a crash of the process or the machine
  // (SQLite: WAL committed with fsync). On error nothing of the batch is stored.
  virtual Status Commit(const Batch& batch) = 0;

  // Calls `fn` for every journal record with seq > `after`, ascending; stops at
  // the first non-OK Status from `fn` and returns it.
  virtual Status ReadJournal(uint64_t after, const std::function<Status(const JournalRecord&)>& fn) = 0;

  // The last `limit` journal records, oldest first.
  virtual Result<std::vector<JournalRecord>> RecentJournal(size_t limit) = 0;

  // Every token record, by id.
  virtual Result<std::vector<TokenRecord>> LoadTokens() = 0;

  // The highest journal seq stored; 0 when the journal is empty.
  virtual Result<uint64_t> LastSeq() = 0;

  // The identity committed with the market's creation; "" while the store
  // holds no market.
  virtual Result<std::string> Identity() = 0;

  // For a store that holds no market yet: the identity of a creation that was
  // begun (its sidecar written) but never committed, so a restart finishes it
  // with the same identity and admin token; "" otherwise.
  virtual std::string PendingIdentity() const { return {}; }

  // Housekeeping after a commit whose acknowledgements have left, so that no
  // acknowledgement waits for it. SQLite copies its write-ahead log into the
  // database once the log holds kCheckpointPages pages, on a thread and
  // connection of its own beside the commits, then copies the few frames
  // committed meanwhile here, and the next commit starts the log over
  // (docs/SERVER.md, "Durability: WAL checkpoints after the replies"). Called
  // by one committing thread at a time. Default: nothing.
  virtual Status AfterCommit() { return Status::Ok(); }
  // How many of AfterCommit's checkpoints ran on the store's own thread and
  // how many on the committing thread (tests; a store without checkpoints
  // counts none).
  struct CheckpointCounts {
    uint64_t asked = 0;      // Copies asked of the checkpoint thread.
    uint64_t on_thread = 0;  // Copies it finished.
    uint64_t on_commit = 0;  // Copies on the committing thread.
  };
  virtual CheckpointCounts Checkpoints() const { return {}; }

  // The newest complete snapshot; empty if the store keeps none (recovery
  // then replays the whole journal).
  virtual Result<StoredSnapshot> LoadSnapshot() { return StoredSnapshot{}; }
  // Keeps `snap` (whose seq must be committed) as the newest snapshot and
  // drops older ones. The journal is not touched (SQLite and memory keep it
  // whole for replay and explain; EtcdStore::Truncate shrinks etcd's).
  // UNIMPLEMENTED for a store that keeps none.
  virtual Status WriteSnapshot(const StoredSnapshot& snap) {
    (void)snap;
    return Unimplemented("store: this store keeps no snapshots");
  }
};

// The sidecar "DB.identity" beside a SQLite database: the market's identity
// and the last committed journal seq and commit count, rewritten in place
// after every commit and before any reply leaves. A database whose journal is
// behind its sidecar lost acknowledged commits (a deleted, truncated or
// damaged WAL), and the server refuses to start on it instead of serving a
// market that forgot them. The sidecar is not fsynced after each commit: it
// survives a killed process (the page cache keeps it), and after a power loss
// it can only lag behind the fsynced WAL, never run ahead, so it never raises a
// false alarm.
struct Sidecar {
  std::string identity;
  uint64_t seq = 0;      // Last committed journal seq.
  uint64_t commits = 0;  // Committed transactions; 0: creation begun, not committed.
};
std::string SidecarPath(const std::string& db);
// NOT_FOUND if there is none; DATA_LOSS if it cannot be parsed.
Result<Sidecar> ReadSidecar(const std::string& path);
// Creates the sidecar of a market about to be created (commits 0), fsynced.
// ALREADY_EXISTS if one is there: a sidecar is never replaced this way.
Status CreateSidecar(const std::string& path, const std::string& identity);
// 32 random hex digits.
std::string NewIdentity();

// What a file-backed store (SQLite, the journal file) holds when it opens,
// for CheckSidecar.
struct StoreState {
  std::string identity;   // "" while it holds no market.
  uint64_t last_seq = 0;  // The last journal seq it holds.
  uint64_t commits = 0;   // The commits it holds.
  bool has_data = false;  // Journal records or tokens.
};
// What a store does after CheckSidecar.
struct SidecarVerdict {
  std::string pending_identity;  // A creation begun (its sidecar written) and never committed.
  bool adopt = false;            // Data without an identity (before identities): commit a new one.
  bool create = false;           // No sidecar (e.g. a database copied without it): create it.
};
// The checks a file-backed store makes against its sidecar when it opens
// (OpenSqliteStore): a different identity is FAILED_PRECONDITION, a store
// behind its sidecar (or without a market the sidecar says it had) is
// DATA_LOSS. `lost_files` and `lost_tail` name what was lost, in the
// messages: the files that hold the market ("the database or its
// write-ahead log (-wal)") and what lost the tail of the journal.
Result<SidecarVerdict> CheckSidecar(const std::string& db, const StoreState& state, const std::string& lost_files,
                                    const std::string& lost_tail);

// A store's sidecar, rewritten in place after every commit with one pwrite of
// a fixed-length line, so a killed process leaves the old line or the new
// one. Not thread-safe: the committing store serializes its calls.
class SidecarFile {
 public:
  explicit SidecarFile(std::string db) : path_(SidecarPath(db)) {}
  ~SidecarFile();
  SidecarFile(const SidecarFile&) = delete;
  SidecarFile& operator=(const SidecarFile&) = delete;
  // Writes `s` (nothing while s.identity is empty); `create` fsyncs the file
  // and its directory.
  Status Write(const Sidecar& s, bool create);

 private:
  std::string path_;
  int fd_ = -1;
};

std::unique_ptr<Store> NewMemoryStore();

// Opens (creating if needed) a SQLite database in WAL mode with fsync at every
// commit (synchronous=FULL), and checks it against its sidecar
// (SidecarPath(path)): a different identity is FAILED_PRECONDITION, a journal
// or commit count behind the sidecar's is DATA_LOSS, both naming the files. A
// database written before sidecars existed gets an identity and a sidecar.
// SQLite does not checkpoint its write-ahead log inside a commit (as its
// automatic checkpoint would, every 1,000 pages); Store::AfterCommit does.
Result<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path);
// The journal file (`serve --store journal`; docs/SERVER.md, "The journal
// file"): the journal, tokens and identity as checksummed frames, one a
// commit, appended to a file whose space was written ahead of them, with one
// pwrite and one fdatasync a commit; snapshots in PATH.snapshot. The same
// sidecar checks as OpenSqliteStore. A SQLite database given as PATH is
// FAILED_PRECONDITION, naming --store sqlite.
struct JournalStoreOptions {
  // Space written with zeros ahead of the log, at least 1 MiB: a new file
  // gets this much, and the store grows the file by it (on a thread of its
  // own, after a commit) when less than half is left.
  uint64_t chunk_bytes = uint64_t{64} << 20;
};
Result<std::unique_ptr<Store>> OpenJournalStore(const std::string& path, const JournalStoreOptions& options = {});
// True if `path` is a journal file (its header), for choosing the store of an existing database.
bool IsJournalFile(const std::string& path);

// Write-ahead log pages after which Store::AfterCommit checkpoints.
inline constexpr int kCheckpointPages = 1000;
// The log's bound: at this length the committing thread waits for the
// checkpoint thread's copy, then copies the rest itself.
inline constexpr int kMaxLogPages = 4 * kCheckpointPages;

}  // namespace laissez::server
