// One typed suite for every Store implementation (store.h): the in-memory
// store is the reference; SQLite must behave the same and survive reopening.
#include "server/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#ifdef LAISSEZ_STORE_TEST_ETCD
#include "server/etcd_test_util.h"
#include "server/replica.h"
#endif

namespace laissez::server {
namespace {

struct MemoryFactory {
  std::unique_ptr<Store> Open() {
    if (!store) store = NewMemoryStore();
    // The memory store cannot be reopened; tests of reopening share the object.
    return std::unique_ptr<Store>(new Forward(store.get()));
  }
  static constexpr bool kPersistent = false;
  std::unique_ptr<Store> store;

  // Lets a test hold several "opens" of the same memory store.
  struct Forward final : Store {
    explicit Forward(Store* s) : s_(s) {}
    Status Commit(const Batch& b) override { return s_->Commit(b); }
    Status ReadJournal(uint64_t a, const std::function<Status(const JournalRecord&)>& f) override {
      return s_->ReadJournal(a, f);
    }
    Result<std::vector<JournalRecord>> RecentJournal(size_t l) override { return s_->RecentJournal(l); }
    Result<std::vector<TokenRecord>> LoadTokens() override { return s_->LoadTokens(); }
    Result<uint64_t> LastSeq() override { return s_->LastSeq(); }
    Result<std::string> Identity() override { return s_->Identity(); }
    Store* s_;
  };
};

struct SqliteFactory {
  SqliteFactory() {
    path = (std::filesystem::temp_directory_path() /
            ("laissez_store_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".db"))
               .string();
  }
  ~SqliteFactory() {
    for (const char* suffix : {"", "-wal", "-shm", ".identity"}) std::filesystem::remove(path + suffix);
  }
  std::unique_ptr<Store> Open() {
    auto s = OpenSqliteStore(path);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }
  static constexpr bool kPersistent = true;
  std::string path;
  static inline int counter = 0;
};

// The journal file (journal_store.cc), growing by 1 MiB at a time.
struct JournalFactory {
  JournalFactory() {
    path = (std::filesystem::temp_directory_path() /
            ("laissez_store_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".journal"))
               .string();
  }
  ~JournalFactory() {
    for (const char* suffix : {"", ".new", ".identity", ".snapshot", ".snapshot.new"}) std::filesystem::remove(path + suffix);
  }
  std::unique_ptr<Store> Open(JournalStoreOptions options = JournalStoreOptions{uint64_t{1} << 20}) {
    auto s = OpenJournalStore(path, options);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  static constexpr bool kPersistent = true;
  std::string path;
  static inline int counter = 0;
};

template <typename F>
class StoreTest : public ::testing::Test {
 protected:
  F factory;
};
#ifdef LAISSEZ_STORE_TEST_ETCD
// The same suite against the replicated store (replica.h), built into
// server_etcd_test: each factory uses its own key prefix on a local etcd, and
// holds the fence of a key it created, as a leader does.
struct EtcdFactory {
  EtcdFactory() : prefix("/store-test-" + std::to_string(counter++) + "/") {
    auto& e = testing::LocalEtcd::Get();
    if (e.endpoint().empty()) ADD_FAILURE() << e.error();
    client = *etcd::Client::Create(e.endpoint().empty() ? "127.0.0.1:1" : e.endpoint());
    auto rev = client->Put(prefix + "e/leader", "test");
    if (rev.ok()) fence_rev = *rev;
  }
  std::unique_ptr<Store> Open() {
    auto s = std::make_unique<EtcdStore>(client, prefix);
    s->Fence(prefix + "e/leader", fence_rev);
    return s;
  }
  static constexpr bool kPersistent = true;
  std::shared_ptr<etcd::Client> client;
  std::string prefix;
  int64_t fence_rev = 0;
  static inline int counter = 0;
};
using Factories = ::testing::Types<EtcdFactory>;
#else
using Factories = ::testing::Types<MemoryFactory, SqliteFactory, JournalFactory>;
#endif
TYPED_TEST_SUITE(StoreTest, Factories);

Batch Records(uint64_t from, uint64_t to) {
  Batch b;
  for (uint64_t s = from; s <= to; ++s) b.journal.push_back({s, "tenant:t" + std::to_string(s % 3), "line " + std::to_string(s)});
  return b;
}

std::vector<JournalRecord> ReadAll(Store& s, uint64_t after = 0) {
  std::vector<JournalRecord> out;
  EXPECT_TRUE(s.ReadJournal(after, [&](const JournalRecord& r) {
                 out.push_back(r);
                 return Status::Ok();
               }).ok());
  return out;
}

TYPED_TEST(StoreTest, EmptyStoreHasNothing) {
  auto s = this->factory.Open();
  EXPECT_EQ(*s->LastSeq(), 0u);
  EXPECT_TRUE(ReadAll(*s).empty());
  EXPECT_TRUE(s->LoadTokens()->empty());
  EXPECT_TRUE(s->RecentJournal(10)->empty());
  EXPECT_TRUE(s->Commit(Batch{}).ok());  // An empty batch is a no-op.
}

TYPED_TEST(StoreTest, CommittedRecordsReadBackInOrder) {
  auto s = this->factory.Open();
  ASSERT_TRUE(s->Commit(Records(1, 3)).ok());
  ASSERT_TRUE(s->Commit(Records(4, 5)).ok());
  auto all = ReadAll(*s);
  ASSERT_EQ(all.size(), 5u);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].seq, i + 1);
    EXPECT_EQ(all[i].line, "line " + std::to_string(i + 1));
  }
  EXPECT_EQ(*s->LastSeq(), 5u);
  auto tail = ReadAll(*s, 3);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].seq, 4u);
  auto recent = *s->RecentJournal(2);
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_EQ(recent[0].seq, 4u);
  EXPECT_EQ(recent[1].seq, 5u);
}

TYPED_TEST(StoreTest, ABatchWithARepeatedSeqStoresNothing) {
  auto s = this->factory.Open();
  ASSERT_TRUE(s->Commit(Records(1, 2)).ok());
  Batch bad = Records(3, 4);
  bad.journal.push_back({2, "x", "dup"});
  bad.tokens.push_back(TokenRecord{1, "abc", "admin", UINT32_MAX, "admin", false, 1});
  Status st = s->Commit(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("journal.seq"), std::string::npos);
  EXPECT_EQ(*s->LastSeq(), 2u);
  EXPECT_TRUE(s->LoadTokens()->empty());
}

TYPED_TEST(StoreTest, TokensUpsertById) {
  auto s = this->factory.Open();
  TokenRecord t{7, "hash7", "tenant", 3, "acme", false, 100};
  Batch b;
  b.tokens.push_back(t);
  ASSERT_TRUE(s->Commit(b).ok());
  t.revoked = true;
  b.tokens = {t, TokenRecord{8, "hash8", "operator", UINT32_MAX, "ops", false, 200}};
  ASSERT_TRUE(s->Commit(b).ok());
  auto tokens = *s->LoadTokens();
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(tokens[0], t);
  EXPECT_EQ(tokens[1].role, "operator");
}

TYPED_TEST(StoreTest, StateSurvivesReopening) {
  {
    auto s = this->factory.Open();
    Batch b = Records(1, 100);
    b.tokens.push_back(TokenRecord{1, "h", "admin", UINT32_MAX, "admin", false, 5});
    ASSERT_TRUE(s->Commit(b).ok());
  }
  auto s = this->factory.Open();
  EXPECT_EQ(*s->LastSeq(), 100u);
  EXPECT_EQ(ReadAll(*s).size(), 100u);
  EXPECT_EQ(s->LoadTokens()->size(), 1u);
}

TYPED_TEST(StoreTest, LongJournalsReadAcrossPages) {
  auto s = this->factory.Open();
  ASSERT_TRUE(s->Commit(Records(1, 10000)).ok());
  auto all = ReadAll(*s);
  ASSERT_EQ(all.size(), 10000u);
  EXPECT_EQ(all.back().seq, 10000u);
}

TYPED_TEST(StoreTest, ReadStopsAtTheCallbacksError) {
  auto s = this->factory.Open();
  ASSERT_TRUE(s->Commit(Records(1, 10)).ok());
  int seen = 0;
  Status st = s->ReadJournal(0, [&](const JournalRecord& r) {
    ++seen;
    return r.seq == 4 ? DataLoss("stop") : Status::Ok();
  });
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(seen, 4);
}

TYPED_TEST(StoreTest, TheIdentityCommitsWithItsBatchAndSurvivesReopening) {
  {
    auto s = this->factory.Open();
    EXPECT_EQ(*s->Identity(), "");
    Batch b = Records(1, 2);
    b.identity = NewIdentity();
    ASSERT_TRUE(s->Commit(b).ok());
    EXPECT_EQ(s->Identity()->size(), 32u);
  }
  auto s = this->factory.Open();
  EXPECT_EQ(s->Identity()->size(), 32u);
}

#ifndef LAISSEZ_STORE_TEST_ETCD  // SQLite only.
// The sidecar follows every commit, so a database that lost commits (a lost
// or damaged write-ahead log) is caught on open.
TEST(SqliteStore, ASidecarAheadOfTheDatabaseIsDataLoss) {
  SqliteFactory f;
  std::string id = NewIdentity();
  {
    auto s = f.Open();
    Batch b = Records(1, 3);
    b.identity = id;
    ASSERT_TRUE(s->Commit(b).ok());
    ASSERT_TRUE(s->Commit(Records(4, 5)).ok());
    auto side = ReadSidecar(SidecarPath(f.path));
    ASSERT_TRUE(side.ok()) << side.status().ToString();
    EXPECT_EQ(side->identity, id);
    EXPECT_EQ(side->seq, 5u);
    EXPECT_EQ(side->commits, 2u);
  }
  // Keep the sidecar, lose the database: refused, not a new empty store.
  std::string side = SidecarPath(f.path);
  std::string keep = f.path + ".keep";
  std::filesystem::rename(side, keep);
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(f.path + suffix);
  std::filesystem::rename(keep, side);
  auto s = OpenSqliteStore(f.path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("write-ahead log"), std::string::npos) << s.status().ToString();
}

TEST(SqliteStore, AnUncommittedCreationIsPending) {
  SqliteFactory f;
  std::string id = NewIdentity();
  ASSERT_TRUE(CreateSidecar(SidecarPath(f.path), id).ok());
  EXPECT_EQ(CreateSidecar(SidecarPath(f.path), id).code(), StatusCode::kAlreadyExists);
  auto s = f.Open();
  EXPECT_EQ(s->PendingIdentity(), id);
  EXPECT_EQ(*s->Identity(), "");
}

// SQLite's automatic checkpoint is off (it would run inside a commit, and
// every ack of that commit would wait); AfterCommit checkpoints instead, and
// the log stays bounded: at kMaxLogPages the committing thread waits for the
// checkpoint thread's copy and copies the rest itself.
TEST(SqliteStore, AfterCommitBoundsTheWriteAheadLog) {
  constexpr uintmax_t kFrame = 24 + 4096;  // A WAL frame: header and one page.
  auto wal_pages = [&](const SqliteFactory& f) { return std::filesystem::file_size(f.path + "-wal") / kFrame; };
  // About 23 WAL frames a commit (ten records of two overflow pages each, a
  // leaf page, the meta page): 300 commits pass kMaxLogPages.
  constexpr uint64_t kCommits = 300, kPerCommit = 10, kSlack = 50;
  auto line = [](uint64_t seq) { return std::string(9000, 'x') + std::to_string(seq); };
  auto fill = [&](SqliteFactory& f, bool after_commit) {
    auto s = f.Open();
    for (uint64_t c = 0; c < kCommits; ++c) {
      Batch b;
      for (uint64_t k = 1; k <= kPerCommit; ++k) b.journal.push_back({c * kPerCommit + k, "tenant:t", line(c * kPerCommit + k)});
      EXPECT_TRUE(s->Commit(b).ok());
      if (after_commit) {
        EXPECT_TRUE(s->AfterCommit().ok());
      }
    }
    return s;
  };
  SqliteFactory none, after;
  auto s = fill(none, false);
  EXPECT_GT(wal_pages(none), uintmax_t{kMaxLogPages});  // Nothing checkpointed.
  auto a = fill(after, true);
  EXPECT_LE(wal_pages(after), uintmax_t{kMaxLogPages} + kSlack);
  a.reset();
  auto reopened = after.Open();
  auto all = ReadAll(*reopened);
  ASSERT_EQ(all.size(), kCommits * kPerCommit);
  EXPECT_EQ(all.back().line, line(kCommits * kPerCommit));
}

// The frames in the log, asked through a connection of the test's own.
int LogFrames(const std::string& path) {
  sqlite3* other = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  // Reading the schema opens the database (and finds it in WAL mode).
  EXPECT_EQ(sqlite3_exec(other, "SELECT count(*) FROM sqlite_master", nullptr, nullptr, nullptr), SQLITE_OK);
  int log = -1, copied = -1;
  EXPECT_EQ(sqlite3_wal_checkpoint_v2(other, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &copied), SQLITE_OK);
  sqlite3_close(other);
  return log;
}

// The bulk of a checkpoint is copied by the store's checkpoint thread while
// nothing else happens on the committing connection (so no commit waits for
// it); the committing connection then copies only the frames committed
// meanwhile, and the commit after that starts the log over.
TEST(SqliteStore, TheCheckpointThreadCopiesTheLogBesideTheCommits) {
  SqliteFactory f;
  auto s = f.Open();
  constexpr uintmax_t kFrame = 24 + 4096;
  uint64_t seq = 0;
  auto commit = [&] {
    Batch b;
    for (int k = 0; k < 10; ++k, ++seq) b.journal.push_back({seq + 1, "tenant:t", std::string(9000, 'x')});
    EXPECT_TRUE(s->Commit(b).ok());
  };
  auto wait_for_thread = [&](uint64_t copies) {
    for (int i = 0; i < 2000 && s->Checkpoints().on_thread < copies; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(s->Checkpoints().on_thread, copies) << "the checkpoint thread did not copy";
  };
  while (std::filesystem::file_size(f.path + "-wal") / kFrame < kCheckpointPages) commit();
  const uintmax_t before = std::filesystem::file_size(f.path);
  ASSERT_TRUE(s->AfterCommit().ok());  // Asks the thread; copies nothing itself.
  EXPECT_EQ(s->Checkpoints().on_commit, 0u);
  wait_for_thread(1);
  EXPECT_GE(std::filesystem::file_size(f.path), before + kCheckpointPages / 2 * 4096)
      << "half the log's pages should be in the database";
  // Nothing was committed during the copy, so the next commit starts the log
  // over and there is no rest to copy: when the log is long again, the
  // committing thread asks the checkpoint thread again instead of copying the
  // whole log itself.
  const uint64_t on_commit = s->Checkpoints().on_commit;
  for (int i = 0; i < 1000 && s->Checkpoints().on_thread == 1 && s->Checkpoints().on_commit == on_commit; ++i) {
    commit();
    ASSERT_TRUE(s->AfterCommit().ok());
  }
  // Either no copy on the committing thread yet, or the rest after the
  // thread's second copy (which may finish before the loop sees it).
  const auto counts = s->Checkpoints();
  EXPECT_TRUE(counts.on_commit == on_commit || counts.on_thread == 2)
      << "the committing thread copied the whole log again (" << counts.on_commit - on_commit
      << " copies) instead of asking the checkpoint thread";
  wait_for_thread(2);
  // Once the thread is done, an AfterCommit copies the rest and the next
  // commit starts the log over, so the log's file stops growing: 100 more
  // commits (about 2,300 frames) stay within it (without the restart the
  // log would pass 3,000 pages). Whenever the log is long enough to ask the
  // thread again, the test waits for its copy before committing more, so a
  // slow thread on a busy machine cannot let the log grow meanwhile.
  for (int i = 0; i < 100; ++i) {
    commit();
    ASSERT_TRUE(s->AfterCommit().ok());
    const auto now = s->Checkpoints();
    if (now.asked > now.on_thread) wait_for_thread(now.asked);
  }
  EXPECT_LT(std::filesystem::file_size(f.path + "-wal") / kFrame, kCheckpointPages * 3 / 2);
  EXPECT_EQ(ReadAll(*s).size(), seq);
}

// A snapshot's image goes through the write-ahead log like any commit; the
// snapshot thread copies it into the database itself, on the second
// connection and without the store's lock (so a commit meanwhile does not
// wait for the copy), and the next journal commit starts the log over: its
// AfterCommit (on the acknowledgement path) finds a short log instead of
// thousands of image pages to copy.
TEST(SqliteStore, WriteSnapshotCheckpointsItsOwnPages) {
  SqliteFactory f;
  auto s = f.Open();
  Batch b;
  b.journal.push_back({1, "tenant:t", "x"});
  ASSERT_TRUE(s->Commit(b).ok());
  StoredSnapshot snap;
  snap.seq = 1;
  snap.image.assign(static_cast<size_t>(6 * kCheckpointPages) * 4096, 'i');  // About 6,000 pages.
  ASSERT_TRUE(s->WriteSnapshot(snap).ok());
  Batch next;
  next.journal.push_back({2, "tenant:t", "y"});
  ASSERT_TRUE(s->Commit(next).ok());
  int log = LogFrames(f.path);
  EXPECT_GE(log, 1);
  EXPECT_LT(log, 100);  // Without the snapshot's checkpoint: over 6,000.
  auto loaded = s->LoadSnapshot();
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->image.size(), snap.image.size());
}

TEST(SqliteStore, UnwritablePathIsAnError) {
  auto s = OpenSqliteStore("/nonexistent-dir/x/y.db");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("db:"), std::string::npos);
}

// ---------------------------------------------------------------- the journal file

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteBytes(const std::string& path, uint64_t at, const std::string& bytes) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
// The offsets of the file's frames (a 4 KiB header, then u32 length, u32
// checksum, payload), and the end of the last.
std::vector<uint64_t> FrameStarts(const std::string& bytes) {
  std::vector<uint64_t> out;
  uint64_t at = 4096;
  for (;;) {
    uint32_t len = 0;
    if (at + 8 > bytes.size()) break;
    std::memcpy(&len, bytes.data() + at, 4);
    out.push_back(at);
    if (len == 0) break;
    at += 8 + len;
  }
  return out;
}

// A commit whose write a crash cut short was never acknowledged: its sync had
// not returned, so the sidecar does not count it either. On open the log ends
// before it, its bytes are zeroed, and a shorter frame written over them later
// reads back alone. Any of its pages may have reached the disk, the first or
// only later ones.
TEST(JournalFile, AWriteCutShortEndsTheLogAndIsZeroed) {
  for (const bool header_lost : {false, true}) {
    SCOPED_TRACE(header_lost ? "only the frame's later bytes reached the disk" : "the frame's end did not");
    JournalFactory f;
    std::string sidecar_before;
    {
      auto s = f.Open();
      Batch b = Records(1, 3);
      b.identity = NewIdentity();
      ASSERT_TRUE(s->Commit(b).ok());
      sidecar_before = FileBytes(SidecarPath(f.path));
      Batch big;
      for (uint64_t seq = 4; seq <= 5; ++seq) big.journal.push_back({seq, "tenant:t", std::string(3000, 'b')});
      ASSERT_TRUE(s->Commit(big).ok());
    }
    const std::string bytes = FileBytes(f.path);
    const std::vector<uint64_t> frames = FrameStarts(bytes);
    ASSERT_EQ(frames.size(), 3u);  // Two frames and the end.
    const uint64_t torn = frames[1], end = frames[2];
    if (header_lost) {
      WriteBytes(f.path, torn, std::string(8, '\0'));
    } else {
      WriteBytes(f.path, end - 100, std::string(100, '\0'));
    }
    // As the sidecar was before the cut-short commit.
    WriteBytes(SidecarPath(f.path), 0, sidecar_before);
    {
      auto s = f.Open();
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(*s->LastSeq(), 3u);
      EXPECT_EQ(ReadAll(*s).size(), 3u);
      const std::string mended = FileBytes(f.path);
      EXPECT_EQ(mended.find_first_not_of('\0', torn), std::string::npos) << "stale bytes after the log";
      Batch c;
      c.journal.push_back({4, "tenant:t", "short"});
      ASSERT_TRUE(s->Commit(c).ok());
    }
    auto s = f.Open();
    ASSERT_NE(s, nullptr);
    auto all = ReadAll(*s);
    ASSERT_EQ(all.size(), 4u);
    EXPECT_EQ(all.back().line, "short");
    Batch d;
    d.journal.push_back({5, "tenant:t", "after"});
    EXPECT_TRUE(s->Commit(d).ok());
  }
}

// A journal file that lost acknowledged commits (damaged, truncated or
// replaced) is refused, as a SQLite database that lost its write-ahead log.
TEST(JournalFile, LostCommitsAreDataLoss) {
  JournalFactory f;
  {
    auto s = f.Open();
    Batch b = Records(1, 3);
    b.identity = NewIdentity();
    ASSERT_TRUE(s->Commit(b).ok());
    ASSERT_TRUE(s->Commit(Records(4, 5)).ok());
  }
  const std::vector<uint64_t> frames = FrameStarts(FileBytes(f.path));
  ASSERT_EQ(frames.size(), 3u);
  WriteBytes(f.path, frames[2] - 1, "!");  // The last frame's checksum fails.
  auto s = OpenJournalStore(f.path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
  EXPECT_NE(s.status().message().find("journal file"), std::string::npos) << s.status().ToString();
  // Nothing was zeroed: the damage stays for whoever repairs it.
  EXPECT_EQ(FrameStarts(FileBytes(f.path)).size(), 3u);

  std::filesystem::remove(f.path);  // The file gone, its sidecar kept.
  s = OpenJournalStore(f.path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
}

// The store keeps written space ahead of the log: a commit that finds too
// little grows the file itself, and AfterCommit has the grower thread do it.
TEST(JournalFile, TheFileGrowsAheadOfTheLog) {
  JournalFactory f;
  constexpr uint64_t kCommits = 600, kPerCommit = 4;  // About 22 MB of records.
  auto line = [](uint64_t seq) { return std::string(9000, 'g') + std::to_string(seq); };
  {
    auto s = f.Open();
    for (uint64_t c = 0; c < kCommits; ++c) {
      Batch b;
      for (uint64_t k = 1; k <= kPerCommit; ++k) b.journal.push_back({c * kPerCommit + k, "tenant:t", line(c * kPerCommit + k)});
      ASSERT_TRUE(s->Commit(b).ok());
      // Every other commit without it: commits then find the space themselves.
      if (c % 2 == 0) {
        ASSERT_TRUE(s->AfterCommit().ok());
      }
    }
  }
  EXPECT_GT(std::filesystem::file_size(f.path), kCommits * kPerCommit * 9000);
  auto s = f.Open();
  auto all = ReadAll(*s);
  ASSERT_EQ(all.size(), kCommits * kPerCommit);
  EXPECT_EQ(all.back().line, line(kCommits * kPerCommit));
}

// Reads from a seq start at the last mark (every MiB of frames) before it,
// before and after reopening.
TEST(JournalFile, ReadsFromASeqSkipToItsMark) {
  JournalFactory f;
  constexpr uint64_t kRecords = 2000;  // About 8 MB in 500 frames.
  {
    auto s = f.Open();
    for (uint64_t seq = 1; seq <= kRecords; seq += 4) {
      Batch b;
      for (uint64_t k = seq; k < seq + 4; ++k) b.journal.push_back({k, "tenant:t", std::string(4000, 'm') + std::to_string(k)});
      ASSERT_TRUE(s->Commit(b).ok());
    }
  }
  for (int round = 0; round < 2; ++round) {
    auto s = f.Open();
    if (round == 1) {  // Marks made by commits, not by the scan.
      Batch b;
      b.journal.push_back({kRecords + 1, "tenant:t", "last"});
      ASSERT_TRUE(s->Commit(b).ok());
    }
    const uint64_t total = kRecords + static_cast<uint64_t>(round);
    for (uint64_t after : {uint64_t{0}, uint64_t{1}, uint64_t{255}, uint64_t{256}, uint64_t{1001}, total - 1, total}) {
      auto got = ReadAll(*s, after);
      ASSERT_EQ(got.size(), total - after) << "after " << after;
      if (!got.empty()) {
        EXPECT_EQ(got.front().seq, after + 1);
      }
    }
    for (size_t limit : {size_t{1}, size_t{3}, size_t{700}, size_t{5000}}) {
      auto recent = *s->RecentJournal(limit);
      ASSERT_EQ(recent.size(), std::min<uint64_t>(limit, total)) << "limit " << limit;
      EXPECT_EQ(recent.back().seq, total);
      EXPECT_EQ(recent.front().seq, total - recent.size() + 1);
    }
  }
  // A read from a mark does not touch the frames before it: with the first
  // frame damaged behind the open store, a read from seq 1001 still succeeds
  // and a read from the start is data loss.
  auto s = f.Open();
  WriteBytes(f.path, 4096 + 8 + 100, "?");
  EXPECT_EQ(ReadAll(*s, 1001).size(), kRecords + 1 - 1001);
  Status whole = s->ReadJournal(0, [](const JournalRecord&) { return Status::Ok(); });
  EXPECT_EQ(whole.code(), StatusCode::kDataLoss) << whole.ToString();
}

// The grower thread keeps a chunk of written space ahead of the log once
// less than half a chunk is left, without a commit asking for it.
TEST(JournalFile, TheGrowerKeepsAChunkAhead) {
  JournalFactory f;
  constexpr uint64_t kChunk = uint64_t{4} << 20, kCommits = 30, kLine = 100000;
  auto s = f.Open(JournalStoreOptions{kChunk});
  EXPECT_EQ(std::filesystem::file_size(f.path), 4096 + kChunk);  // A new file's header and first chunk.
  for (uint64_t c = 1; c <= kCommits; ++c) {
    Batch b;
    b.journal.push_back({c, "tenant:t", std::string(kLine, 'c')});
    ASSERT_TRUE(s->Commit(b).ok());
  }
  ASSERT_TRUE(s->AfterCommit().ok());  // The log's end is past 3 MB: less than half a chunk left.
  const uint64_t want = kCommits * kLine + kChunk;
  for (int i = 0; i < 600 && std::filesystem::file_size(f.path) < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(std::filesystem::file_size(f.path), want);
  EXPECT_EQ(ReadAll(*s).size(), kCommits);
}

// A commit that cannot grow the file fails, leaves the log as it was and
// does not stop later commits (nothing of it was written).
TEST(JournalFile, AFailedGrowthFailsOnlyItsCommit) {
  JournalFactory f;
  auto s = f.Open();  // 1 MiB ahead: no growth is due.
  ASSERT_TRUE(s->Commit(Records(1, 2)).ok());
  Batch big;
  big.journal.push_back({3, "tenant:t", std::string(size_t{3} << 20, 'b')});
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  // Room for one piece of 256 KiB and part of the next: the growth fails part-way.
  struct rlimit cap = old;
  cap.rlim_cur = std::filesystem::file_size(f.path) + (300 << 10);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &cap), 0);
  Status st = s->Commit(big);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("cannot grow " + f.path), std::string::npos) << st.ToString();
  EXPECT_EQ(*s->LastSeq(), 2u);
  ASSERT_TRUE(s->Commit(Records(3, 3)).ok());  // In the space the store had.
  big.journal[0].seq = 4;
  ASSERT_TRUE(s->Commit(big).ok());
  s.reset();
  s = f.Open();
  auto all = ReadAll(*s);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all.back().line.size(), size_t{3} << 20);
}

// A journal file deleted behind its sidecar is refused, and no new file is made.
TEST(JournalFile, ADeletedFileIsRefusedWithoutMakingANewOne) {
  JournalFactory f;
  Batch b = Records(1, 2);
  b.identity = NewIdentity();
  ASSERT_TRUE(f.Open()->Commit(b).ok());
  std::filesystem::remove(f.path);
  auto s = OpenJournalStore(f.path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(f.path));
}

// Reads run beside commits: each sees a whole prefix of the log.
TEST(JournalFile, ReadsSeeWholePrefixesWhileCommitsRun) {
  JournalFactory f;
  auto s = f.Open();
  constexpr uint64_t kRecords = 3000;
  std::atomic<bool> done{false};
  Status written = Status::Ok();
  std::thread writer([&] {
    for (uint64_t seq = 1; seq <= kRecords && written.ok(); seq += 3) {
      Batch b;
      for (uint64_t k = seq; k < seq + 3; ++k) b.journal.push_back({k, "tenant:t", std::string(700, 'r') + std::to_string(k)});
      written = s->Commit(b);
      if (written.ok() && seq % 30 == 1) written = s->AfterCommit();
    }
    done = true;
  });
  uint64_t seen = 0;
  int reads = 0;
  bool last = false;
  Status read = Status::Ok();
  while (!last && read.ok()) {
    last = done;  // One more read after the writer is done.
    uint64_t next = 0;
    read = s->ReadJournal(0, [&](const JournalRecord& r) {
      if (r.seq != next + 1 || r.line != std::string(700, 'r') + std::to_string(r.seq)) {
        return DataLoss("out of order or changed at seq " + std::to_string(r.seq));
      }
      next = r.seq;
      return Status::Ok();
    });
    if (read.ok() && (next < seen || next % 3 != 0)) read = DataLoss("not a whole prefix: " + std::to_string(next));
    seen = next;
    ++reads;
  }
  writer.join();
  ASSERT_TRUE(written.ok()) << written.ToString();
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_EQ(seen, kRecords);
  EXPECT_GT(reads, 1);
}

// Snapshots live in PATH.snapshot, replaced whole by rename.
TEST(JournalFile, SnapshotsSurviveReopeningAndAreChecked) {
  JournalFactory f;
  StoredSnapshot snap;
  snap.seq = 2;
  snap.image = "image bytes";
  {
    auto s = f.Open();
    EXPECT_TRUE(s->LoadSnapshot()->empty());
    ASSERT_TRUE(s->Commit(Records(1, 2)).ok());
    StoredSnapshot ahead{3, "x"};
    EXPECT_EQ(s->WriteSnapshot(ahead).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(s->WriteSnapshot(StoredSnapshot{1, "older"}).ok());
    ASSERT_TRUE(s->WriteSnapshot(snap).ok());
  }
  {
    auto s = f.Open();
    auto got = s->LoadSnapshot();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->seq, 2u);
    EXPECT_EQ(got->image, "image bytes");
  }
  // A damaged snapshot is done without: the journal is whole.
  WriteBytes(f.path + ".snapshot", std::filesystem::file_size(f.path + ".snapshot") - 1, "?");
  auto s = f.Open();
  auto got = s->LoadSnapshot();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->empty());
  EXPECT_EQ(ReadAll(*s).size(), 2u);
}

TEST(JournalFile, AnUncommittedCreationIsPending) {
  JournalFactory f;
  std::string id = NewIdentity();
  ASSERT_TRUE(CreateSidecar(SidecarPath(f.path), id).ok());
  auto s = f.Open();
  EXPECT_EQ(s->PendingIdentity(), id);
  EXPECT_EQ(*s->Identity(), "");
}

TEST(JournalFile, OtherFilesAreRefusedByName) {
  SqliteFactory sqlite;
  sqlite.Open().reset();
  EXPECT_FALSE(IsJournalFile(sqlite.path));
  auto s = OpenJournalStore(sqlite.path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("--store sqlite"), std::string::npos) << s.status().ToString();

  JournalFactory f;
  f.Open().reset();
  EXPECT_TRUE(IsJournalFile(f.path));
  WriteBytes(f.path, 0, "not a journal");
  s = OpenJournalStore(f.path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not a laissez journal file"), std::string::npos) << s.status().ToString();
  EXPECT_EQ(OpenJournalStore("/nonexistent-dir/x/y.journal").status().code(), StatusCode::kUnavailable);
}

#endif

}  // namespace
}  // namespace laissez::server
