#include "server/store.h"

#include <sqlite3.h>

#include <map>
#include <mutex>

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
    return Status::Ok();
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

 private:
  std::mutex mu_;
  std::vector<JournalRecord> journal_;
  std::map<uint64_t, TokenRecord> tokens_;
};

// ---------------------------------------------------------------------------
// SQLite, WAL mode, synchronous=FULL: a commit returns after the WAL is fsynced.
class SqliteStore final : public Store {
 public:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  ~SqliteStore() override {
    for (auto* s : {insert_journal_, upsert_token_}) sqlite3_finalize(s);
    sqlite3_close(db_);
  }

  Status Init() {
    const char* schema =
        "PRAGMA journal_mode=WAL;"
        "PRAGMA synchronous=FULL;"
        "CREATE TABLE IF NOT EXISTS journal(seq INTEGER PRIMARY KEY, actor TEXT NOT NULL, line TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS tokens(id INTEGER PRIMARY KEY, hash TEXT NOT NULL UNIQUE, role TEXT NOT NULL,"
        " tenant_id INTEGER NOT NULL, name TEXT NOT NULL, revoked INTEGER NOT NULL, created INTEGER NOT NULL);"
        "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT OR IGNORE INTO meta(key, value) VALUES('format', 'laissez-journal-v1');";
    LZ_RETURN_IF_ERROR(Exec(schema));
    // journal_mode=WAL answers with a row; check it took effect (not on :memory:).
    LZ_RETURN_IF_ERROR(Prepare("INSERT INTO journal(seq, actor, line) VALUES(?, ?, ?)", &insert_journal_));
    LZ_RETURN_IF_ERROR(Prepare(
        "INSERT OR REPLACE INTO tokens(id, hash, role, tenant_id, name, revoked, created) VALUES(?,?,?,?,?,?,?)",
        &upsert_token_));
    return Status::Ok();
  }

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
    if (!st.ok()) (void)Exec("ROLLBACK");
    return st;
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

  Status WriteBatch(const Batch& batch) {
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
  sqlite3_stmt* insert_journal_ = nullptr;
  sqlite3_stmt* upsert_token_ = nullptr;
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

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
  auto store = std::make_unique<SqliteStore>(db);
  LZ_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace laissez::server
