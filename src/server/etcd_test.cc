// The etcd client (etcd.h) and the replicated store's own rules (replica.h)
// against a local single-member etcd; store_test.cc runs the Store suite on it
// in the same binary.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server/etcd.h"
#include "server/etcd_test_util.h"
#include "server/replica.h"

namespace laissez::server {
namespace {

std::shared_ptr<etcd::Client> Connect() {
  auto& e = testing::LocalEtcd::Get();
  EXPECT_FALSE(e.endpoint().empty()) << e.error();
  // A dead endpoint first: calls must fail over to the live member.
  auto c = etcd::Client::Create("127.0.0.1:1," + e.endpoint());
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(Etcd, Base64RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n < 5; ++n) {
    std::string s = all.substr(0, all.size() - n);
    EXPECT_EQ(*etcd::Base64Decode(etcd::Base64Encode(s)), s);
  }
  EXPECT_FALSE(etcd::Base64Decode("a*b=").ok());
  EXPECT_EQ(etcd::PrefixEnd("/a/"), "/a0");
}

TEST(Etcd, EndpointsAreCheckedWithoutACall) {
  EXPECT_EQ(etcd::Client::Create("").status().code(), StatusCode::kInvalidArgument);
  auto bad = etcd::Client::Create("127.0.0.1");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("HOST:PORT"), std::string::npos);
  EXPECT_EQ((*etcd::Client::Create("http://127.0.0.1:2379/,h:1"))->endpoints().size(), 2u);
}

TEST(Etcd, PutRangeTxnAndFailover) {
  auto c = Connect();
  ASSERT_TRUE(c->Put("/t1/a", "1").ok());
  ASSERT_TRUE(c->Put("/t1/b", std::string("\0\xff", 2)).ok());
  auto r = c->Range("/t1/", etcd::PrefixEnd("/t1/"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[1].value, std::string("\0\xff", 2));
  // Create-if-absent, as the election does.
  etcd::Txn t;
  t.IfCreateRevision("/t1/a", 0);
  t.success.push_back(etcd::Txn::Put("/t1/a", "2"));
  auto tr = c->Commit(t);
  ASSERT_TRUE(tr.ok());
  EXPECT_FALSE(tr->succeeded);
  etcd::Txn t2;
  t2.IfCreateRevision("/t1/a", r->kvs[0].create_revision);
  t2.success.push_back(etcd::Txn::Put("/t1/a", "3"));
  EXPECT_TRUE(c->Commit(t2)->succeeded);
  EXPECT_EQ(c->Range("/t1/a")->kvs[0].value, "3");
}

TEST(Etcd, AllMembersDownIsUnavailable) {
  auto c = *etcd::Client::Create("127.0.0.1:1,127.0.0.1:2", std::chrono::milliseconds(200));
  Status st = c->Put("/x", "y").status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("etcd: no member answered"), std::string::npos) << st.message();
}

TEST(Etcd, LeasesExpireWithTheirKeys) {
  auto c = Connect();
  auto lease = c->LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(c->Put("/t2/e", "me", *lease).ok());
  EXPECT_GT(*c->LeaseKeepAlive(*lease), 0);
  ASSERT_TRUE(c->LeaseRevoke(*lease).ok());
  EXPECT_TRUE(c->Range("/t2/e")->kvs.empty());
  EXPECT_EQ(*c->LeaseKeepAlive(*lease), 0);  // Gone: the replica must step down.
}

TEST(Etcd, WatchSeesPutsFromARevision) {
  auto c = Connect();
  int64_t from = *c->Put("/t3/a", "1");
  ASSERT_TRUE(c->Put("/t3/b", "2").ok());
  std::vector<std::string> seen;
  std::atomic<bool> stop{false};
  Status st = c->Watch(
      "/t3/", etcd::PrefixEnd("/t3/"), from,
      [&](const std::vector<etcd::WatchEvent>& events, int64_t) {
        for (const auto& e : events) seen.push_back(e.kv.key + "=" + e.kv.value);
        return seen.size() < 2;  // Done after both.
      },
      &stop, std::chrono::milliseconds(200));
  EXPECT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], "/t3/a=1");
  EXPECT_EQ(seen[1], "/t3/b=2");
}

TEST(Etcd, AWatchFromACompactedRevisionIsOutOfRange) {
  auto c = Connect();
  int64_t old = *c->Put("/t4/a", "1");
  int64_t now = *c->Put("/t4/a", "2");
  ASSERT_TRUE(c->Compact(now).ok());
  std::atomic<bool> stop{false};
  Status st = c->Watch("/t4/", etcd::PrefixEnd("/t4/"), old, [](auto&, int64_t) { return true; }, &stop);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
}

TEST(EtcdStore, AStoreWithoutItsFenceAppendsNothing) {
  auto c = Connect();
  EtcdStore s(c, "/t5/");
  Batch b;
  b.journal.push_back({1, "server", "x"});
  EXPECT_EQ(s.Commit(b).code(), StatusCode::kFailedPrecondition);  // Never elected.
  int64_t rev = *c->Put("/t5/e/me", "addr");
  s.Fence("/t5/e/me", rev);
  ASSERT_TRUE(s.Commit(b).ok());
  // Deposed: the key is gone (its lease expired) or another one replaced it.
  etcd::Txn del;
  del.success.push_back(etcd::Txn::Delete("/t5/e/me"));
  ASSERT_TRUE(c->Commit(del).ok());
  ASSERT_TRUE(c->Put("/t5/e/me", "someone else").ok());
  b.journal = {{2, "server", "y"}};
  Status st = s.Commit(b);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("fenced"), std::string::npos);
  EXPECT_EQ(*s.LastSeq(), 1u);
}

// One small batch per record, as a lightly loaded leader commits them.
void CommitOneByOne(EtcdStore& s, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i <= to; ++i) {
    Batch one;
    one.journal.push_back({i, "server", "small"});
    ASSERT_TRUE(s.Commit(one).ok());
  }
}

// The journal reads back as records 1..n in order.
void ExpectJournal(EtcdStore& s, uint64_t n) {
  uint64_t expect = 1;
  ASSERT_TRUE(s.ReadJournal(0, [&](const JournalRecord& r) {
                 EXPECT_EQ(r.seq, expect++);
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(expect, n + 1);
}

TEST(EtcdStore, LargeBatchesSplitIntoChunksAndTransactions) {
  auto c = Connect();
  EtcdStore s(c, "/t6/");
  s.Fence("/t6/e/me", *c->Put("/t6/e/me", "addr"));
  Batch b;
  std::string line(3000, 'x');  // ~3 MB in all: over etcd's 1.5 MiB request limit.
  for (uint64_t i = 1; i <= 1000; ++i) b.journal.push_back({i, "tenant:t", line});
  ASSERT_TRUE(s.Commit(b).ok());
  auto keys = c->Range("/t6/j/", etcd::PrefixEnd("/t6/j/"), 0, 0, etcd::Sort::kNone, true);
  EXPECT_GE(keys->kvs.size(), 6u);  // At most 512 KiB a chunk.
  ExpectJournal(s, 1000);
  // Folding small batches keeps the records and their order.
  CommitOneByOne(s, 1001, 1100);
  auto removed = s.Fold();
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_GT(*removed, 50u);
  ExpectJournal(s, 1100);
  uint64_t tail = 0;
  ASSERT_TRUE(s.ReadJournal(1050, [&](const JournalRecord& r) {
                 if (tail == 0) {
                   EXPECT_EQ(r.seq, 1051u);
                 }
                 ++tail;
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(tail, 50u);
  // The next round starts where this one left off and folds the new tail too.
  CommitOneByOne(s, 1101, 1200);
  auto again = s.Fold();
  ASSERT_TRUE(again.ok());
  EXPECT_GT(*again, 90u);
  ExpectJournal(s, 1200);
}

// The journal keys under a store's prefix.
size_t JournalKeys(etcd::Client& c, const std::string& prefix) {
  auto r = c.Range(prefix + "j/", etcd::PrefixEnd(prefix + "j/"), 0, 0, etcd::Sort::kNone, true);
  return r.ok() ? r->kvs.size() : 0;
}

// An image of `bytes` bytes that tells its seq apart.
StoredSnapshot Image(uint64_t seq, size_t bytes) {
  StoredSnapshot s;
  s.seq = seq;
  s.image.resize(bytes);
  for (size_t i = 0; i < bytes; ++i) s.image[i] = static_cast<char>((i * 131 + seq) % 251);
  return s;
}

TEST(EtcdStore, SnapshotsSplitIntoPartsReadBackAndTruncateTheJournal) {
  auto c = Connect();
  EtcdStore s(c, "/t7/");
  s.Fence("/t7/e/me", *c->Put("/t7/e/me", "addr"));
  EXPECT_TRUE(s.LoadSnapshot()->empty());  // None yet: recovery replays everything.
  CommitOneByOne(s, 1, 300);
  EXPECT_EQ(JournalKeys(*c, "/t7/"), 300u);
  // Over etcd's request limit: several parts in several fenced transactions.
  StoredSnapshot snap = Image(200, 3 * EtcdStore::kChunkBytes + 12345);
  ASSERT_TRUE(s.WriteSnapshot(snap).ok());
  auto parts = c->Range("/t7/s/", etcd::PrefixEnd("/t7/s/"), 0, 0, etcd::Sort::kNone, true);
  EXPECT_EQ(parts->kvs.size(), 4u);
  auto back = s.LoadSnapshot();
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->seq, 200u);
  EXPECT_TRUE(back->image == snap.image);

  auto deleted = s.Truncate(200);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(*deleted, 200u);  // Keys 1..200 each held one record, all covered.
  EXPECT_EQ(JournalKeys(*c, "/t7/"), 100u);
  uint64_t expect = 201;
  ASSERT_TRUE(s.ReadJournal(200, [&](const JournalRecord& r) {
                 EXPECT_EQ(r.seq, expect++);
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(expect, 301u);
  EXPECT_EQ(*s.LastSeq(), 300u);

  // A chunk that straddles the snapshot's seq stays: its later records are needed.
  Batch b;
  for (uint64_t i = 301; i <= 310; ++i) b.journal.push_back({i, "server", "r"});
  ASSERT_TRUE(s.Commit(b).ok());
  ASSERT_TRUE(s.WriteSnapshot(Image(305, 100)).ok());
  ASSERT_TRUE(s.Truncate(305).ok());
  expect = 306;
  ASSERT_TRUE(s.ReadJournal(305, [&](const JournalRecord& r) {
                 EXPECT_EQ(r.seq, expect++);
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(expect, 311u);
  // The older snapshot is gone, parts and manifest.
  auto left = c->Range("/t7/s/", etcd::PrefixEnd("/t7/s/"), 0, 0, etcd::Sort::kNone, true);
  EXPECT_EQ(left->kvs.size(), 1u);
  auto manifests = c->Range("/t7/m/", etcd::PrefixEnd("/t7/m/"), 0, 0, etcd::Sort::kNone, true);
  ASSERT_EQ(manifests->kvs.size(), 1u);
  EXPECT_EQ(manifests->kvs[0].key, "/t7/m/00000000000000000305");
}

TEST(EtcdStore, ATornSnapshotIsIgnoredAndTheNewestCompleteOneWins) {
  auto c = Connect();
  EtcdStore s(c, "/t8/");
  s.Fence("/t8/e/me", *c->Put("/t8/e/me", "addr"));
  CommitOneByOne(s, 1, 20);
  ASSERT_TRUE(s.WriteSnapshot(Image(5, 1000)).ok());
  ASSERT_TRUE(s.WriteSnapshot(Image(10, 2000)).ok());
  // A leader that died after writing the parts of seq 15, before its manifest.
  ASSERT_TRUE(c->Put("/t8/s/00000000000000000015/000000", Image(15, 500).image).ok());
  auto got = s.LoadSnapshot();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->seq, 10u);
  EXPECT_TRUE(got->image == Image(10, 2000).image);
  // Truncating at 10 drops the snapshot at 5, keeps the torn parts above.
  ASSERT_TRUE(s.Truncate(10).ok());
  EXPECT_EQ(s.LoadSnapshot()->seq, 10u);
  auto parts = c->Range("/t8/s/", etcd::PrefixEnd("/t8/s/"), 0, 0, etcd::Sort::kNone, true);
  EXPECT_EQ(parts->kvs.size(), 2u);  // Seq 10's one part and the torn one.

  // A manifest whose parts do not match is data loss, named.
  ASSERT_TRUE(c->Put("/t8/m/00000000000000000015", "1 499 7").ok());
  auto bad = s.LoadSnapshot();
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("/t8/m/00000000000000000015"), std::string::npos) << bad.status().ToString();
  // Pinned at an earlier revision, the reader sees what was complete then.
  ASSERT_TRUE(s.WriteSnapshot(Image(18, 700)).ok());
  ASSERT_TRUE(s.Pin().ok());
  ASSERT_TRUE(s.WriteSnapshot(Image(19, 800)).ok());
  EXPECT_EQ(s.LoadSnapshot()->seq, 18u);
  s.Unpin();
  EXPECT_EQ(s.LoadSnapshot()->seq, 19u);
}

TEST(EtcdStore, ChunksDecodeOrFailClearly) {
  std::vector<JournalRecord> recs = {{5, "tenant:a", "{\"v\":1}"}, {6, "server", "x\ty"}};
  auto back = DecodeJournalChunk(EncodeJournalChunk(recs));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, recs);
  EXPECT_EQ(DecodeJournalChunk("5\ta").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeJournalChunk("x\ta\tb\n").status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace laissez::server
