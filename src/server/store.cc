#include "server/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "server/auth.h"

namespace laissez::server {
namespace {

// ---------------------------------------------------------------------------
// In memory: the reference behaviour of the interface, for tests.
class MemoryStore final : public Store {
 public:
  Status Commit(const Batch& batch) override {
    std::lock_guard lock(mu_);
    uint64_t last = journal_.empty() ? 0 : journal_.back().seq;
    for (const auto& r : batch.journal) {
      if (r.seq <= last) return InvalidArgument("journal.seq: must increase (got " + std::to_string(r.seq) + ")");
      last = r.seq;
    }
    journal_.insert(journal_.end(), batch.journal.begin(), batch.journal.end());
    for (const auto& t : batch.tokens) tokens_[t.id] = t;
    if (!batch.identity.empty()) identity_ = batch.identity;
    return Status::Ok();
  }
  Result<std::string> Identity() override {
    std::lock_guard lock(mu_);
    return identity_;
  }
  Status ReadJournal(uint64_t after, const std::function<Status(const JournalRecord&)>& fn) override {
    std::vector<JournalRecord> copy;
    {
      std::lock_guard lock(mu_);
      for (const auto& r : journal_) if (r.seq > after) copy.push_back(r);
    }
    for (const auto& r : copy) LZ_RETURN_IF_ERROR(fn(r));
    return Status::Ok();
  }
  Result<std::vector<JournalRecord>> RecentJournal(size_t limit) override {
    std::lock_guard lock(mu_);
    size_t from = journal_.size() > limit ? journal_.size() - limit : 0;
    return std::vector<JournalRecord>(journal_.begin() + static_cast<ptrdiff_t>(from), journal_.end());
  }
  Result<std::vector<TokenRecord>> LoadTokens() override {
    std::lock_guard lock(mu_);
    std::vector<TokenRecord> out;
    for (const auto& [id, t] : tokens_) out.push_back(t);
    return out;
  }
  Result<uint64_t> LastSeq() override {
    std::lock_guard lock(mu_);
    return journal_.empty() ? uint64_t{0} : journal_.back().seq;
  }
  Result<StoredSnapshot> LoadSnapshot() override {
    std::lock_guard lock(mu_);
    return snapshot_;
  }
  Status WriteSnapshot(const StoredSnapshot& snap) override {
    std::lock_guard lock(mu_);
    if (snap.seq > (journal_.empty() ? 0 : journal_.back().seq)) {
      return InvalidArgument("snapshot.seq: " + std::to_string(snap.seq) + " is beyond the journal");
    }
    snapshot_ = snap;
    return Status::Ok();
  }

 private:
  std::mutex mu_;
  StoredSnapshot snapshot_;
  std::vector<JournalRecord> journal_;
  std::map<uint64_t, TokenRecord> tokens_;
  std::string identity_;
};

// ---------------------------------------------------------------------------
// The sidecar: one fixed-length line, rewritten in place with one pwrite.

constexpr char kSidecarMagic[] = "laissez-sidecar v1";

std::string FormatSidecar(const Sidecar& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s identity=%s seq=%020" PRIu64 " commits=%020" PRIu64 "\n", kSidecarMagic,
                s.identity.c_str(), s.seq, s.commits);
  return buf;
}

Status FsyncDir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Status::Ok();  // Best effort: some file systems refuse.
  ::fsync(fd);
  ::close(fd);
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// SQLite, WAL mode, synchronous=FULL: a commit returns after the WAL is fsynced.
class SqliteStore final : public Store {
 public:
  SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  ~SqliteStore() override {
    {
      std::lock_guard lock(ckpt_mu_);
      ckpt_stop_ = true;
      ckpt_cv_.notify_all();
    }
    if (ckpt_thread_.joinable()) ckpt_thread_.join();
    for (auto* s : {insert_journal_, upsert_token_, put_meta_, count_commit_}) sqlite3_finalize(s);
    sqlite3_close(db_);
    sqlite3_close(side_db_);
  }

  Status Init() {
    const char* schema =
        "PRAGMA journal_mode=WAL;"
        "PRAGMA synchronous=FULL;"
        "CREATE TABLE IF NOT EXISTS journal(seq INTEGER PRIMARY KEY, actor TEXT NOT NULL, line TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS tokens(id INTEGER PRIMARY KEY, hash TEXT NOT NULL UNIQUE, role TEXT NOT NULL,"
        " tenant_id INTEGER NOT NULL, name TEXT NOT NULL, revoked INTEGER NOT NULL, created INTEGER NOT NULL);"
        "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS snapshots(seq INTEGER PRIMARY KEY, image BLOB NOT NULL);"
        "INSERT OR IGNORE INTO meta(key, value) VALUES('format', 'laissez-journal-v1');"
        "INSERT OR IGNORE INTO meta(key, value) VALUES('commits', '0');";
    LZ_RETURN_IF_ERROR(Exec(schema));
    // Our hook replaces SQLite's automatic checkpoint (which would run inside
    // the commit that crosses 1,000 pages, and every ack of that commit would
    // wait for it); AfterCommit checkpoints instead.
    sqlite3_wal_hook(db_, &SqliteStore::WalHook, this);
    // journal_mode=WAL answers with a row; check it took effect (not on :memory:).
    LZ_RETURN_IF_ERROR(Prepare("INSERT INTO journal(seq, actor, line) VALUES(?, ?, ?)", &insert_journal_));
    LZ_RETURN_IF_ERROR(Prepare(
        "INSERT OR REPLACE INTO tokens(id, hash, role, tenant_id, name, revoked, created) VALUES(?,?,?,?,?,?,?)",
        &upsert_token_));
    LZ_RETURN_IF_ERROR(Prepare("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", &put_meta_));
    LZ_RETURN_IF_ERROR(
        Prepare("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key = 'commits'", &count_commit_));
    return CheckSidecar();
  }

  // See OpenSqliteStore.
  Status CheckSidecar() {
    LZ_ASSIGN_OR_RETURN(identity_, Meta("identity"));
    LZ_ASSIGN_OR_RETURN(std::string commits, Meta("commits"));
    commits_ = std::strtoull(commits.c_str(), nullptr, 10);
    LZ_ASSIGN_OR_RETURN(last_seq_, LastSeq());
    LZ_ASSIGN_OR_RETURN(auto tokens, LoadTokens());
    LZ_ASSIGN_OR_RETURN(SidecarVerdict v,
                        server::CheckSidecar(path_, StoreState{identity_, last_seq_, commits_, last_seq_ > 0 || !tokens.empty()},
                                             "the database or its write-ahead log (-wal)",
                                             "the write-ahead log " + path_ + "-wal was lost or damaged"));
    pending_identity_ = v.pending_identity;
    if (v.adopt) {
      Batch b;
      b.identity = NewIdentity();
      return Commit(b);
    }
    return WriteSidecar(v.create);
  }

  Result<std::string> Identity() override {
    std::lock_guard lock(mu_);
    return identity_;
  }
  std::string PendingIdentity() const override { return pending_identity_; }

  Status Commit(const Batch& batch) override {
    if (batch.empty()) return Status::Ok();
    std::lock_guard lock(mu_);
    LZ_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status st = WriteBatch(batch);
    if (!st.ok()) {
      (void)Exec("ROLLBACK");
      return st;
    }
    st = Exec("COMMIT");
    if (!st.ok()) {
      (void)Exec("ROLLBACK");
      return st;
    }
    ++commits_;
    if (!batch.journal.empty()) last_seq_ = batch.journal.back().seq;
    if (!batch.identity.empty()) {
      identity_ = batch.identity;
      pending_identity_.clear();
    }
    // Before the caller acknowledges anything of this batch.
    return WriteSidecar(/*create=*/false);
  }

  // In two steps, so that no commit waits for the bulk of the copy: at
  // kCheckpointPages the checkpoint thread copies the log into the database
  // on its own connection while commits go on; after the next commit once it
  // is done, the committing connection copies the few frames committed
  // meanwhile, and the commit after that starts the log over. If the thread
  // falls behind, at kMaxLogPages the committing thread waits for its copy
  // (commits stop meanwhile), so the log stays bounded.
  Status AfterCommit() override {
    std::lock_guard lock(mu_);
    std::unique_lock c(ckpt_mu_);
    if (wal_pages_ < kCheckpointPages) {
      // The log started over since the thread's copy (nothing was committed
      // during it, so it copied everything): there is no rest to copy.
      ckpt_done_ = false;
      return Status::Ok();
    }
    if (ckpt_busy_ && wal_pages_ >= kMaxLogPages) ckpt_cv_.wait(c, [&] { return !ckpt_busy_; });
    if (ckpt_done_) {
      ckpt_done_ = false;
      Status thread_failure = std::exchange(ckpt_failure_, Status::Ok());
      ++checkpoints_.on_commit;
      c.unlock();
      LZ_RETURN_IF_ERROR(CheckpointLocked());
      return thread_failure;
    }
    if (!ckpt_busy_) {
      ckpt_busy_ = true;
      ++checkpoints_.asked;
      if (!ckpt_thread_.joinable()) ckpt_thread_ = std::thread([this] { CheckpointLoop(); });
      ckpt_cv_.notify_all();
    }
    return Status::Ok();
  }

  CheckpointCounts Checkpoints() const override {
    std::lock_guard lock(ckpt_mu_);
    return checkpoints_;
  }

  Status ReadJournal(uint64_t after, const std::function<Status(const JournalRecord&)>& fn) override {
    // A private statement so a long replay does not hold the lock against Commit;
    // rows are read in pages.
    uint64_t cursor = after;
    for (;;) {
      std::vector<JournalRecord> page;
      {
        std::lock_guard lock(mu_);
        sqlite3_stmt* s = nullptr;
        LZ_RETURN_IF_ERROR(Prepare("SELECT seq, actor, line FROM journal WHERE seq > ? ORDER BY seq LIMIT 4096", &s));
        sqlite3_bind_int64(s, 1, static_cast<sqlite3_int64>(cursor));
        int rc;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) page.push_back(RowToRecord(s));
        sqlite3_finalize(s);
        if (rc != SQLITE_DONE) return Error("read journal");
      }
      if (page.empty()) return Status::Ok();
      for (const auto& r : page) LZ_RETURN_IF_ERROR(fn(r));
      cursor = page.back().seq;
    }
  }

  Result<std::vector<JournalRecord>> RecentJournal(size_t limit) override {
    std::lock_guard lock(mu_);
    sqlite3_stmt* s = nullptr;
    LZ_RETURN_IF_ERROR(Prepare(
        "SELECT seq, actor, line FROM (SELECT * FROM journal ORDER BY seq DESC LIMIT ?) ORDER BY seq", &s));
    sqlite3_bind_int64(s, 1, static_cast<sqlite3_int64>(limit));
    std::vector<JournalRecord> out;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) out.push_back(RowToRecord(s));
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return Error("read journal");
    return out;
  }

  Result<std::vector<TokenRecord>> LoadTokens() override {
    std::lock_guard lock(mu_);
    sqlite3_stmt* s = nullptr;
    LZ_RETURN_IF_ERROR(
        Prepare("SELECT id, hash, role, tenant_id, name, revoked, created FROM tokens ORDER BY id", &s));
    std::vector<TokenRecord> out;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      TokenRecord t;
      t.id = static_cast<uint64_t>(sqlite3_column_int64(s, 0));
      t.hash = Text(s, 1);
      t.role = Text(s, 2);
      t.tenant_id = static_cast<uint32_t>(sqlite3_column_int64(s, 3));
      t.name = Text(s, 4);
      t.revoked = sqlite3_column_int64(s, 5) != 0;
      t.created = sqlite3_column_int64(s, 6);
      out.push_back(std::move(t));
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return Error("read tokens");
    return out;
  }

  // The newest snapshot only is kept; the journal stays whole.
  Status WriteSnapshot(const StoredSnapshot& snap) override {
    LZ_ASSIGN_OR_RETURN(bool long_log, CommitSnapshot(snap));
    // The image's pages are in the log now; copy them here, on the snapshot
    // thread's own connection and without mu_, so that neither the next
    // journal commit (which would wait for mu_) nor its AfterCommit (which
    // would meet a log of image pages) copies them on the acknowledgement
    // path. The snapshot is committed either way: a failed checkpoint leaves
    // the log long, and AfterCommit copies what is left after the next commit.
    if (long_log) (void)CheckpointOnSideConnection();
    return Status::Ok();
  }

  // Commits the snapshot; true if the log is long enough to checkpoint.
  Result<bool> CommitSnapshot(const StoredSnapshot& snap) {
    std::lock_guard lock(mu_);
    if (snap.seq > last_seq_) {
      return InvalidArgument("snapshot.seq: " + std::to_string(snap.seq) + " is beyond the journal");
    }
    LZ_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    sqlite3_stmt* put = nullptr;
    Status st = Prepare("INSERT OR REPLACE INTO snapshots(seq, image) VALUES(?, ?)", &put);
    if (st.ok()) {
      sqlite3_bind_int64(put, 1, static_cast<sqlite3_int64>(snap.seq));
      sqlite3_bind_blob64(put, 2, snap.image.data(), snap.image.size(), SQLITE_STATIC);
      if (sqlite3_step(put) != SQLITE_DONE) st = Error("write snapshot");
    }
    sqlite3_finalize(put);
    if (st.ok()) {
      std::string drop = "DELETE FROM snapshots WHERE seq < " + std::to_string(snap.seq);
      st = Exec(drop.c_str());
    }
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) {
      (void)Exec("ROLLBACK");
      return st;
    }
    return wal_pages_ >= kCheckpointPages;
  }

  Result<StoredSnapshot> LoadSnapshot() override {
    std::lock_guard lock(mu_);
    sqlite3_stmt* s = nullptr;
    LZ_RETURN_IF_ERROR(Prepare("SELECT seq, image FROM snapshots ORDER BY seq DESC LIMIT 1", &s));
    StoredSnapshot snap;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
      snap.seq = static_cast<uint64_t>(sqlite3_column_int64(s, 0));
      const void* p = sqlite3_column_blob(s, 1);
      snap.image.assign(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(s, 1)));
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read snapshot");
    return snap;
  }

  Result<uint64_t> LastSeq() override {
    std::lock_guard lock(mu_);
    sqlite3_stmt* s = nullptr;
    LZ_RETURN_IF_ERROR(Prepare("SELECT COALESCE(MAX(seq), 0) FROM journal", &s));
    uint64_t seq = 0;
    if (sqlite3_step(s) == SQLITE_ROW) seq = static_cast<uint64_t>(sqlite3_column_int64(s, 0));
    sqlite3_finalize(s);
    return seq;
  }

 private:
  static std::string Text(sqlite3_stmt* s, int col) {
    const unsigned char* p = sqlite3_column_text(s, col);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(s, col)))
             : std::string();
  }
  // A PASSIVE checkpoint on the committing connection, between commits (mu_
  // held): no frame is being added, so (with no reader in another process)
  // it copies every frame, and the next commit starts the log over.
  // SQLITE_BUSY: a checkpoint on the second connection (the snapshot
  // thread's) is running; the log stays long and a later AfterCommit tries
  // again.
  Status CheckpointLocked() {
    int log = 0, copied = 0;
    int rc = sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &copied);
    if (rc == SQLITE_BUSY) return Status::Ok();
    if (rc != SQLITE_OK) return Error("checkpoint");
    wal_pages_ = log - copied;
    return Status::Ok();
  }

  // The checkpoint thread (started by the first AfterCommit that needs it).
  void CheckpointLoop() {
    std::unique_lock lock(ckpt_mu_);
    for (;;) {
      ckpt_cv_.wait(lock, [&] { return ckpt_stop_ || (ckpt_busy_ && !ckpt_done_); });
      if (ckpt_stop_) return;
      lock.unlock();
      // A failure leaves the log long; the committing connection then copies
      // it itself and reports this failure (its own first, if any).
      Status st = CheckpointOnSideConnection();
      lock.lock();
      if (!st.ok()) ckpt_failure_ = std::move(st);
      ++checkpoints_.on_thread;
      ckpt_busy_ = false;
      ckpt_done_ = true;
      ckpt_cv_.notify_all();  // A committing thread may wait at kMaxLogPages.
    }
  }

  // A PASSIVE checkpoint on a second connection (the checkpoint thread's or
  // the snapshot thread's; not under mu_, so commits go on meanwhile): it
  // copies the frames committed when it began into the database and fsyncs
  // it. It does not start the log over (a commit may be adding frames); the
  // committing connection's next AfterCommit copies the few frames added
  // since, and the commit after it starts the log over.
  Status CheckpointOnSideConnection() {
    std::lock_guard lock(side_mu_);
    if (!side_db_) {
      sqlite3* db = nullptr;
      if (sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr) != SQLITE_OK) {
        std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
        sqlite3_close(db);
        return Unavailable("store: checkpoint on the second connection: cannot open " + path_ + ": " + msg);
      }
      side_db_ = db;
      // The database file is fsynced after the copy, as on the committing connection.
      if (sqlite3_exec(side_db_, "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr) != SQLITE_OK) {
        Status st = Internal(std::string("store: checkpoint on the second connection: ") + sqlite3_errmsg(side_db_));
        sqlite3_close(side_db_);  // Opened again, and the setting tried again, next time.
        side_db_ = nullptr;
        return st;
      }
    }
    int rc = sqlite3_wal_checkpoint_v2(side_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
      return Internal(std::string("store: checkpoint on the second connection: ") + sqlite3_errmsg(side_db_));
    }
    return Status::Ok();
  }

  // After every commit (inside it): the write-ahead log's length in pages.
  static int WalHook(void* self, sqlite3*, const char*, int pages) {
    static_cast<SqliteStore*>(self)->wal_pages_ = pages;
    return SQLITE_OK;
  }
  static JournalRecord RowToRecord(sqlite3_stmt* s) {
    return JournalRecord{static_cast<uint64_t>(sqlite3_column_int64(s, 0)), Text(s, 1), Text(s, 2)};
  }

  Status Error(std::string_view what) const {
    return Internal("store: " + std::string(what) + ": " + sqlite3_errmsg(db_));
  }
  Status Exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      return Internal("store: " + msg);
    }
    return Status::Ok();
  }
  Status Prepare(const char* sql, sqlite3_stmt** out) {
    if (sqlite3_prepare_v2(db_, sql, -1, out, nullptr) != SQLITE_OK) return Error("prepare");
    return Status::Ok();
  }

  Result<std::string> Meta(const char* key) {
    sqlite3_stmt* s = nullptr;
    LZ_RETURN_IF_ERROR(Prepare("SELECT value FROM meta WHERE key = ?", &s));
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    std::string out;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) out = Text(s, 0);
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read meta");
    return out;
  }

  // Called with `mu_` held or before the store is shared.
  Status WriteSidecar(bool create) { return sidecar_.Write(Sidecar{identity_, last_seq_, commits_}, create); }

  Status WriteBatch(const Batch& batch) {
    if (!batch.identity.empty()) {
      sqlite3_reset(put_meta_);
      sqlite3_bind_text(put_meta_, 1, "identity", -1, SQLITE_STATIC);
      sqlite3_bind_text(put_meta_, 2, batch.identity.data(), static_cast<int>(batch.identity.size()), SQLITE_STATIC);
      int rc = sqlite3_step(put_meta_);
      sqlite3_reset(put_meta_);
      if (rc != SQLITE_DONE) return Error("write identity");
    }
    sqlite3_reset(count_commit_);
    int crc = sqlite3_step(count_commit_);
    sqlite3_reset(count_commit_);
    if (crc != SQLITE_DONE) return Error("count commit");
    for (const auto& r : batch.journal) {
      sqlite3_stmt* s = insert_journal_;
      sqlite3_reset(s);
      sqlite3_bind_int64(s, 1, static_cast<sqlite3_int64>(r.seq));
      sqlite3_bind_text(s, 2, r.actor.data(), static_cast<int>(r.actor.size()), SQLITE_STATIC);
      sqlite3_bind_text(s, 3, r.line.data(), static_cast<int>(r.line.size()), SQLITE_STATIC);
      int rc = sqlite3_step(s);
      sqlite3_reset(s);
      if (rc == SQLITE_CONSTRAINT) return InvalidArgument("journal.seq: must increase (got " + std::to_string(r.seq) + ")");
      if (rc != SQLITE_DONE) return Error("append journal");
    }
    for (const auto& t : batch.tokens) {
      sqlite3_stmt* s = upsert_token_;
      sqlite3_reset(s);
      sqlite3_bind_int64(s, 1, static_cast<sqlite3_int64>(t.id));
      sqlite3_bind_text(s, 2, t.hash.data(), static_cast<int>(t.hash.size()), SQLITE_STATIC);
      sqlite3_bind_text(s, 3, t.role.data(), static_cast<int>(t.role.size()), SQLITE_STATIC);
      sqlite3_bind_int64(s, 4, t.tenant_id);
      sqlite3_bind_text(s, 5, t.name.data(), static_cast<int>(t.name.size()), SQLITE_STATIC);
      sqlite3_bind_int64(s, 6, t.revoked ? 1 : 0);
      sqlite3_bind_int64(s, 7, t.created);
      int rc = sqlite3_step(s);
      sqlite3_reset(s);
      if (rc != SQLITE_DONE) return Error("write token");
    }
    return Status::Ok();
  }

  std::mutex mu_;
  sqlite3* db_;
  const std::string path_;
  sqlite3_stmt* insert_journal_ = nullptr;
  sqlite3_stmt* upsert_token_ = nullptr;
  sqlite3_stmt* put_meta_ = nullptr;
  sqlite3_stmt* count_commit_ = nullptr;
  std::string identity_, pending_identity_;
  uint64_t last_seq_ = 0, commits_ = 0;
  SidecarFile sidecar_{path_};
  int wal_pages_ = 0;  // Under mu_ (WalHook runs inside Commit).
  // The second connection, for checkpoints beside the commits (opened on first use).
  std::mutex side_mu_;
  sqlite3* side_db_ = nullptr;
  // The checkpoint thread: busy from AfterCommit's request until its
  // checkpoint is done; done until the committing connection copied the rest.
  mutable std::mutex ckpt_mu_;
  std::condition_variable ckpt_cv_;
  bool ckpt_busy_ = false, ckpt_done_ = false, ckpt_stop_ = false;
  Status ckpt_failure_;  // The thread's last failure, reported by the AfterCommit that copies the rest.
  CheckpointCounts checkpoints_;
  std::thread ckpt_thread_;
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

std::string SidecarPath(const std::string& db) { return db + ".identity"; }

// 16 of a fresh token's 32 random bytes, as hex.
std::string NewIdentity() { return NewToken().substr(3, 32); }

Result<Sidecar> ReadSidecar(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return NotFound("sidecar: no " + path);
  char buf[256] = {};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  Sidecar s;
  char id[65] = {};
  unsigned long long seq = 0, commits = 0;
  std::string magic = std::string(kSidecarMagic) + " identity=%64[0-9a-f] seq=%llu commits=%llu";
  if (n == 0 || std::sscanf(buf, magic.c_str(), id, &seq, &commits) != 3) {
    return DataLoss("db: " + path + " is not a laissez sidecar (damaged?); refusing to guess the database's state");
  }
  s.identity = id;
  s.seq = seq;
  s.commits = commits;
  return s;
}

Status CreateSidecar(const std::string& path, const std::string& identity) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return AlreadyExists("db: " + path + " exists");
    return Unavailable("db: cannot create " + path + ": " + std::strerror(errno));
  }
  std::string line = FormatSidecar(Sidecar{identity, 0, 0});
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return Unavailable("db: cannot write " + path);
  return FsyncDir(path);
}

Result<SidecarVerdict> CheckSidecar(const std::string& db, const StoreState& state, const std::string& lost_files,
                                    const std::string& lost_tail) {
  SidecarVerdict v;
  std::string side = SidecarPath(db);
  auto sidecar = ReadSidecar(side);
  if (!sidecar.ok() && sidecar.status().code() != StatusCode::kNotFound) return sidecar.status();
  if (state.identity.empty() && state.has_data) {
    // A database from before identities: adopt it.
    if (sidecar.ok()) {
      return FailedPrecondition("db: " + db + " has no identity but " + side + " exists; it belongs to another database");
    }
    v.adopt = true;
    return v;
  }
  if (state.identity.empty()) {
    // No market yet.
    if (!sidecar.ok()) return v;
    if (sidecar->commits == 0) {
      v.pending_identity = sidecar->identity;  // A creation that never committed.
      return v;
    }
    return DataLoss("db: " + db + " holds no market, but " + side + " says market " + sidecar->identity +
                    " committed " + std::to_string(sidecar->commits) + " transactions up to journal seq " +
                    std::to_string(sidecar->seq) + ": " + lost_files +
                    " was lost. Restore them from a backup; to start a new market on purpose, move the old database, "
                    "its sidecar and admin-token file away");
  }
  if (!sidecar.ok()) {
    v.create = true;  // E.g. a database copied without it.
    return v;
  }
  if (sidecar->identity != state.identity) {
    return FailedPrecondition("db: " + db + " is market " + state.identity + " but " + side + " belongs to market " +
                              sidecar->identity + "; the database and its sidecar do not belong together");
  }
  if (sidecar->seq > state.last_seq || sidecar->commits > state.commits) {
    return DataLoss("db: " + db + " ends at journal seq " + std::to_string(state.last_seq) + " after " +
                    std::to_string(state.commits) + " commits, but " + side + " records seq " +
                    std::to_string(sidecar->seq) + " after " + std::to_string(sidecar->commits) +
                    " commits: acknowledged changes are missing (" + lost_tail +
                    "). Refusing to start; restore the database from a backup");
  }
  return v;
}

SidecarFile::~SidecarFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status SidecarFile::Write(const Sidecar& s, bool create) {
  if (s.identity.empty()) return Status::Ok();
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return Unavailable("db: cannot open " + path_ + ": " + std::strerror(errno));
  }
  std::string line = FormatSidecar(s);
  if (::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    return Unavailable("db: cannot write " + path_ + ": " + std::strerror(errno));
  }
  if (create) {
    ::fsync(fd_);
    (void)FsyncDir(path_);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Unavailable("db: cannot open " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteStore>(db, path);
  LZ_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace laissez::server
