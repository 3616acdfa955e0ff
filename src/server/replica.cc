#include "server/replica.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/fnv.h"

namespace laissez::server {

using nlohmann::json;

namespace {
std::string Padded(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%020" PRIu64, v);
  return buf;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }


void SleepUnless(const std::atomic<bool>& stop, std::chrono::milliseconds d) {
  auto end = std::chrono::steady_clock::now() + d;
  while (!stop.load() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(d, std::chrono::milliseconds(50)));
  }
}
}  // namespace

// ---------------------------------------------------------------------------
// Encodings.

std::string EncodeJournalChunk(const std::vector<JournalRecord>& records) {
  std::string out;
  for (const auto& r : records) {
    std::string actor = r.actor;
    std::replace_if(
        actor.begin(), actor.end(), [](char c) { return c == '\t' || c == '\n'; }, '?');
    out += std::to_string(r.seq);
    out += '\t';
    out += actor;
    out += '\t';
    out += r.line;
    out += '\n';
  }
  return out;
}

Result<std::vector<JournalRecord>> DecodeJournalChunk(std::string_view value) {
  std::vector<JournalRecord> out;
  while (!value.empty()) {
    size_t nl = value.find('\n');
    if (nl == std::string_view::npos) return DataLoss("journal chunk: a record without its newline");
    std::string_view rec = value.substr(0, nl);
    value.remove_prefix(nl + 1);
    size_t t1 = rec.find('\t');
    size_t t2 = t1 == std::string_view::npos ? t1 : rec.find('\t', t1 + 1);
    if (t2 == std::string_view::npos) return DataLoss("journal chunk: a record without seq and actor");
    JournalRecord r;
    for (char c : rec.substr(0, t1)) {
      if (c < '0' || c > '9') return DataLoss("journal chunk: a bad seq");
      r.seq = r.seq * 10 + static_cast<uint64_t>(c - '0');
    }
    r.actor = std::string(rec.substr(t1 + 1, t2 - t1 - 1));
    r.line = std::string(rec.substr(t2 + 1));
    out.push_back(std::move(r));
  }
  return out;
}

std::string TokenToJson(const TokenRecord& t) {
  return json{{"id", t.id},     {"hash", t.hash},       {"role", t.role},      {"tenant_id", t.tenant_id},
              {"name", t.name}, {"revoked", t.revoked}, {"created", t.created}}
      .dump();
}

Result<TokenRecord> TokenFromJson(std::string_view s) {
  json j = json::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return DataLoss("token record: not JSON");
  TokenRecord t;
  t.id = j.value("id", uint64_t{0});
  t.hash = j.value("hash", "");
  t.role = j.value("role", "");
  t.tenant_id = j.value("tenant_id", UINT32_MAX);
  t.name = j.value("name", "");
  t.revoked = j.value("revoked", false);
  t.created = j.value("created", int64_t{0});
  return t;
}

// ---------------------------------------------------------------------------
// EtcdStore.

EtcdStore::EtcdStore(std::shared_ptr<etcd::Client> client, std::string prefix)
    : client_(std::move(client)), prefix_(std::move(prefix)) {}

Result<int64_t> EtcdStore::Pin() {
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult r, client_->Range(prefix_ + "identity"));
  pinned_ = r.revision;
  return r.revision;
}

void EtcdStore::Fence(std::string key, int64_t rev) {
  std::lock_guard lock(fence_mu_);
  fence_key_ = std::move(key);
  fence_rev_ = rev;
}

Status EtcdStore::CommitTxn(etcd::Txn txn) {
  {
    std::lock_guard lock(fence_mu_);
    if (fence_rev_ == 0)
      return FailedPrecondition("etcd: this replica is not the leader; nothing was appended");
    txn.IfCreateRevision(fence_key_, fence_rev_);
  }
  LZ_ASSIGN_OR_RETURN(etcd::TxnResult r, client_->Commit(txn));
  if (!r.succeeded) {
    return FailedPrecondition(
        "etcd: fenced: this replica's election key is gone or replaced, so it is no longer "
        "the leader; nothing was appended");
  }
  return Status::Ok();
}

Status EtcdStore::Commit(const Batch& batch) {
  std::lock_guard commit_lock(commit_mu_);
  if (last_seq_ < 0) {
    LZ_ASSIGN_OR_RETURN(uint64_t last, LastSeq());
    last_seq_ = static_cast<int64_t>(last);
  }
  uint64_t last = static_cast<uint64_t>(last_seq_);
  for (const auto& r : batch.journal) {
    if (r.seq <= last) return InvalidArgument("journal.seq: must increase (got " + std::to_string(r.seq) + ")");
    last = r.seq;
  }
  // A failed transaction may still have committed (a timeout): read the last seq again next time.
  last_seq_ = -1;
  LZ_RETURN_IF_ERROR(CommitRecords(batch));
  last_seq_ = static_cast<int64_t>(last);
  return Status::Ok();
}

Status EtcdStore::CommitRecords(const Batch& batch) {
  // Whole records in seq order, in chunks of at most kChunkBytes (one record
  // may exceed it alone), in transactions of at most kTxnBytes and 64 ops.
  etcd::Txn txn;
  size_t txn_bytes = 0;
  if (!batch.identity.empty()) txn.success.push_back(etcd::Txn::Put(prefix_ + "identity", batch.identity));
  for (const auto& t : batch.tokens) {
    std::string v = TokenToJson(t);
    txn_bytes += v.size();
    txn.success.push_back(etcd::Txn::Put(prefix_ + "t/" + Padded(t.id), v));
  }
  auto flush_txn = [&]() -> Status {
    if (txn.success.empty()) return Status::Ok();
    LZ_RETURN_IF_ERROR(CommitTxn(std::move(txn)));
    txn = etcd::Txn();
    txn_bytes = 0;
    return Status::Ok();
  };
  std::vector<JournalRecord> chunk;
  size_t chunk_bytes = 0;
  auto flush_chunk = [&]() -> Status {
    if (chunk.empty()) return Status::Ok();
    std::string v = EncodeJournalChunk(chunk);
    if (txn_bytes + v.size() > kTxnBytes || txn.success.size() >= 64) LZ_RETURN_IF_ERROR(flush_txn());
    txn_bytes += v.size();
    txn.success.push_back(etcd::Txn::Put(prefix_ + "j/" + Padded(chunk.front().seq), v));
    chunk.clear();
    chunk_bytes = 0;
    return Status::Ok();
  };
  for (const auto& r : batch.journal) {
    size_t n = r.line.size() + r.actor.size() + 24;
    if (chunk_bytes + n > kChunkBytes) LZ_RETURN_IF_ERROR(flush_chunk());
    chunk.push_back(r);
    chunk_bytes += n;
  }
  LZ_RETURN_IF_ERROR(flush_chunk());
  return flush_txn();
}

Status EtcdStore::ReadJournal(uint64_t after, const std::function<Status(const JournalRecord&)>& fn) {
  const std::string jp = prefix_ + "j/";
  const std::string end = etcd::PrefixEnd(jp);
  int64_t rev = pinned_;
  // The chunk that holds seq after+1 starts at or before it.
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult first, client_->Range(jp, jp + Padded(after + 1) + '\0', rev, 1,
                                                              etcd::Sort::kKeyDescend, true));
  if (rev == 0) rev = first.revision;  // One revision for every page.
  std::string from = first.kvs.empty() ? jp : first.kvs.front().key;
  for (;;) {
    LZ_ASSIGN_OR_RETURN(etcd::RangeResult page, client_->Range(from, end, rev, 4));
    for (const auto& kv : page.kvs) {
      LZ_ASSIGN_OR_RETURN(std::vector<JournalRecord> recs, DecodeJournalChunk(kv.value));
      for (const auto& r : recs) {
        if (r.seq > after) LZ_RETURN_IF_ERROR(fn(r));
      }
    }
    if (!page.more || page.kvs.empty()) return Status::Ok();
    from = page.kvs.back().key + '\0';
  }
}

Result<std::vector<JournalRecord>> EtcdStore::RecentJournal(size_t limit) {
  const std::string jp = prefix_ + "j/";
  std::vector<JournalRecord> out;
  std::string end = etcd::PrefixEnd(jp);
  while (out.size() < limit) {
    LZ_ASSIGN_OR_RETURN(etcd::RangeResult page, client_->Range(jp, end, pinned_, 1, etcd::Sort::kKeyDescend));
    if (page.kvs.empty()) break;
    LZ_ASSIGN_OR_RETURN(std::vector<JournalRecord> recs, DecodeJournalChunk(page.kvs.front().value));
    out.insert(out.begin(), recs.begin(), recs.end());
    end = page.kvs.front().key;
  }
  if (out.size() > limit) out.erase(out.begin(), out.end() - static_cast<ptrdiff_t>(limit));
  return out;
}

Result<std::vector<TokenRecord>> EtcdStore::LoadTokens() {
  const std::string tp = prefix_ + "t/";
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult r, client_->Range(tp, etcd::PrefixEnd(tp), pinned_));
  std::vector<TokenRecord> out;
  for (const auto& kv : r.kvs) {
    LZ_ASSIGN_OR_RETURN(TokenRecord t, TokenFromJson(kv.value));
    out.push_back(std::move(t));
  }
  return out;
}

Result<uint64_t> EtcdStore::LastSeq() {
  const std::string jp = prefix_ + "j/";
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult r,
                      client_->Range(jp, etcd::PrefixEnd(jp), pinned_, 1, etcd::Sort::kKeyDescend));
  if (r.kvs.empty()) return uint64_t{0};
  LZ_ASSIGN_OR_RETURN(std::vector<JournalRecord> recs, DecodeJournalChunk(r.kvs.front().value));
  return recs.empty() ? uint64_t{0} : recs.back().seq;
}

Result<std::string> EtcdStore::Identity() {
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult r, client_->Range(prefix_ + "identity", "", pinned_));
  return r.kvs.empty() ? std::string() : r.kvs.front().value;
}

Result<size_t> EtcdStore::Fold(size_t max_txns) {
  const std::string jp = prefix_ + "j/";
  const std::string end = etcd::PrefixEnd(jp);
  // Runs already flushed are final: the next round starts after them, so a
  // round reads only the journal's tail, not the whole journal.
  std::string from = fold_from_.empty() ? jp : fold_from_;
  size_t removed = 0, txns = 0;
  std::vector<etcd::KeyValue> run;
  size_t run_bytes = 0;
  auto fold_run = [&]() -> Status {
    if (run.size() >= 2) {
      std::string value;
      for (const auto& kv : run) value += kv.value;
      etcd::Txn txn;
      // Fold only what is still there unchanged.
      for (const auto& kv : run) {
        txn.compares.push_back({{"target", "MOD"},
                                {"result", "EQUAL"},
                                {"key", etcd::Base64Encode(kv.key)},
                                {"mod_revision", std::to_string(kv.mod_revision)}});
      }
      txn.success.push_back(etcd::Txn::Put(run.front().key, value));
      for (size_t i = 1; i < run.size(); ++i) txn.success.push_back(etcd::Txn::Delete(run[i].key));
      LZ_RETURN_IF_ERROR(CommitTxn(std::move(txn)));
      removed += run.size() - 1;
      ++txns;
    }
    run.clear();
    run_bytes = 0;
    return Status::Ok();
  };
  for (;;) {
    LZ_ASSIGN_OR_RETURN(etcd::RangeResult page, client_->Range(from, end, 0, 32));
    if (page.kvs.empty()) break;
    std::string last = page.kvs.back().key;
    for (auto& kv : page.kvs) {
      if (txns >= max_txns) {
        fold_from_ = run.empty() ? kv.key : run.front().key;
        return removed;
      }
      if (run_bytes + kv.value.size() > kChunkBytes || run.size() >= 60) LZ_RETURN_IF_ERROR(fold_run());
      run_bytes += kv.value.size();
      run.push_back(std::move(kv));
    }
    if (!page.more) break;
    from = last + '\0';
  }
  // The newest run stays as it is (it is still growing by small batches).
  if (!run.empty()) fold_from_ = run.front().key;
  return removed;
}

// ---------------------------------------------------------------------------
// Snapshots.

namespace {
std::string Manifest(const StoredSnapshot& snap, size_t parts) {
  return std::to_string(parts) + " " + std::to_string(snap.image.size()) + " " + std::to_string(Fnv1a64(snap.image));
}
}  // namespace

Status EtcdStore::WriteSnapshot(const StoredSnapshot& snap) {
  const std::string base = prefix_ + "s/" + Padded(snap.seq) + "/";
  etcd::Txn txn;
  size_t txn_bytes = 0, parts = 0;
  for (size_t at = 0; at < snap.image.size(); at += kChunkBytes) {
    std::string part = snap.image.substr(at, kChunkBytes);
    if (txn_bytes + part.size() > kTxnBytes) {
      LZ_RETURN_IF_ERROR(CommitTxn(std::move(txn)));
      txn = etcd::Txn();
      txn_bytes = 0;
    }
    char name[16];
    std::snprintf(name, sizeof name, "%06zu", parts++);
    txn_bytes += part.size();
    txn.success.push_back(etcd::Txn::Put(base + name, part));
  }
  // The manifest goes last, alone or with the last parts: a reader that sees
  // it sees every part.
  txn.success.push_back(etcd::Txn::Put(prefix_ + "m/" + Padded(snap.seq), Manifest(snap, parts)));
  return CommitTxn(std::move(txn));
}

Result<size_t> EtcdStore::Truncate(uint64_t seq) {
  const std::string jp = prefix_ + "j/";
  size_t deleted = 0;
  etcd::Txn txn;
  auto flush = [&]() -> Status {
    if (txn.success.empty()) return Status::Ok();
    LZ_RETURN_IF_ERROR(CommitTxn(std::move(txn)));
    txn = etcd::Txn();
    return Status::Ok();
  };
  auto del = [&](const std::string& key, const std::string& end) -> Status {
    txn.success.push_back(etcd::Txn::DeleteRange(key, end));
    return txn.success.size() >= 64 ? flush() : Status::Ok();
  };
  // Journal keys: a key's records run up to the next key's first seq, so every
  // key below the last one that starts at or before seq is covered; that last
  // one is too if a key starts at seq + 1. ReadJournal(seq) still finds the
  // chunk that holds seq + 1.
  const std::string next = jp + Padded(seq + 1);
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult covered, client_->Range(jp, next, 0, 0, etcd::Sort::kNone, true));
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult after, client_->Range(next, "", 0, 0, etcd::Sort::kNone, true));
  size_t keep = after.kvs.empty() && !covered.kvs.empty() ? 1 : 0;
  for (size_t i = 0; i + keep < covered.kvs.size(); ++i) {
    LZ_RETURN_IF_ERROR(del(covered.kvs[i].key, ""));
    ++deleted;
  }
  // Older snapshots: their manifests first (in key order, before their parts),
  // so no reader ever sees a manifest whose parts are gone.
  const std::string mp = prefix_ + "m/", sp = prefix_ + "s/";
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult old, client_->Range(mp, mp + Padded(seq), 0, 0, etcd::Sort::kNone, true));
  for (const auto& kv : old.kvs) LZ_RETURN_IF_ERROR(del(kv.key, ""));
  LZ_RETURN_IF_ERROR(flush());
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult parts, client_->Range(sp, sp + Padded(seq), 0, 1, etcd::Sort::kNone, true));
  if (!parts.kvs.empty()) LZ_RETURN_IF_ERROR(del(sp, sp + Padded(seq)));
  LZ_RETURN_IF_ERROR(flush());
  return deleted;
}

Result<StoredSnapshot> EtcdStore::LoadSnapshot() {
  const std::string mp = prefix_ + "m/";
  int64_t rev = pinned_;
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult m, client_->Range(mp, etcd::PrefixEnd(mp), rev, 1, etcd::Sort::kKeyDescend));
  if (m.kvs.empty()) return StoredSnapshot{};
  if (rev == 0) rev = m.revision;
  const etcd::KeyValue& manifest = m.kvs.front();
  StoredSnapshot snap;
  for (char c : std::string_view(manifest.key).substr(mp.size())) snap.seq = snap.seq * 10 + static_cast<uint64_t>(c - '0');
  unsigned long long parts = 0, bytes = 0, sum = 0;
  if (std::sscanf(manifest.value.c_str(), "%llu %llu %llu", &parts, &bytes, &sum) != 3) {
    return DataLoss("snapshot: manifest " + manifest.key + " does not parse");
  }
  const std::string base = prefix_ + "s/" + Padded(snap.seq) + "/";
  std::string from = base;
  size_t got = 0;
  for (;;) {
    LZ_ASSIGN_OR_RETURN(etcd::RangeResult page, client_->Range(from, etcd::PrefixEnd(base), rev, 4));
    for (const auto& kv : page.kvs) {
      snap.image += kv.value;
      ++got;
    }
    if (!page.more || page.kvs.empty()) break;
    from = page.kvs.back().key + '\0';
  }
  if (got != parts || snap.image.size() != bytes || Fnv1a64(snap.image) != sum) {
    return DataLoss("snapshot: the parts under " + base + " do not match manifest " + manifest.key + " (" +
                    std::to_string(got) + " parts, " + std::to_string(snap.image.size()) + " bytes)");
  }
  return snap;
}

// ---------------------------------------------------------------------------
// Replica.

Replica::Replica(ReplicaOptions options, EtcdStore* store, MarketCore* core, MarketCreation creation)
    : options_(std::move(options)), store_(store), core_(core), creation_(std::move(creation)) {}

Replica::~Replica() { Stop(); }

std::string Replica::leader_address() const {
  std::lock_guard lock(mu_);
  return leader_address_;
}

std::string Replica::why_lost() const {
  std::lock_guard lock(mu_);
  return why_lost_;
}

void Replica::Lose(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (why_lost_.empty()) why_lost_ = why;
  }
  // Refuse mutations at once; the caller restarts this replica as a follower.
  core_->StepDown(why);
  leader_.store(false);
  lost_.store(true);
}

Status Replica::Start() {
  etcd::Client& c = store_->client();
  LZ_ASSIGN_OR_RETURN(lease_, c.LeaseGrant(options_.lease_ttl_s));
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, static_cast<uint64_t>(lease_));
  key_ = store_->prefix() + "e/" + hex;
  etcd::Txn txn;
  txn.IfCreateRevision(key_, 0);
  txn.success.push_back(etcd::Txn::Put(key_, options_.advertise, lease_));
  txn.failure.push_back(etcd::Txn::Get(key_));
  LZ_ASSIGN_OR_RETURN(etcd::TxnResult r, c.Commit(txn));
  key_rev_ = r.revision;
  if (!r.succeeded) return Internal("election: key " + key_ + " already exists");
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  follow_ = std::thread([this] { FollowLoop(); });
  return Status::Ok();
}

void Replica::Stop() {
  if (stop_.exchange(true)) return;
  if (keepalive_.joinable()) keepalive_.join();
  if (follow_.joinable()) follow_.join();
  if (lease_ != 0) (void)store_->client().LeaseRevoke(lease_);
}

void Replica::KeepAliveLoop() {
  auto last_ok = std::chrono::steady_clock::now();
  const auto ttl = std::chrono::seconds(options_.lease_ttl_s);
  while (!stop_.load() && !lost_.load()) {
    SleepUnless(stop_, std::chrono::milliseconds(options_.lease_ttl_s * 1000 / 4));
    if (stop_.load()) return;
    auto r = store_->client().LeaseKeepAlive(lease_);
    if (r.ok() && *r > 0) {
      last_ok = std::chrono::steady_clock::now();
    } else if (r.ok()) {
      Lose("election: the lease expired (this replica was paused or cut off longer than its TTL)");
    } else if (std::chrono::steady_clock::now() - last_ok > ttl) {
      Lose("election: cannot renew the lease: " + r.status().message());
    }
  }
}

Result<bool> Replica::CheckElection() {
  const std::string ep = store_->prefix() + "e/";
  LZ_ASSIGN_OR_RETURN(etcd::RangeResult r,
                      store_->client().Range(ep, etcd::PrefixEnd(ep), 0, 1, etcd::Sort::kCreateAscend));
  std::lock_guard lock(mu_);
  leader_address_ = r.kvs.empty() ? std::string() : r.kvs.front().value;
  core_->SetLeaderHint(leader_address_);
  return !r.kvs.empty() && r.kvs.front().key == key_ && r.kvs.front().create_revision == key_rev_;
}

Status Replica::Promote() {
  store_->Fence(key_, key_rev_);
  store_->Unpin();
  // Everything the previous leader appended is in etcd now (its fence fails
  // from the moment our key is first): apply the tail, then take over.
  std::vector<JournalRecord> tail;
  LZ_RETURN_IF_ERROR(store_->ReadJournal(core_->applied_seq(), [&](const JournalRecord& r) {
    tail.push_back(r);
    return Status::Ok();
  }));
  LZ_ASSIGN_OR_RETURN(std::vector<TokenRecord> tokens, store_->LoadTokens());
  LZ_RETURN_IF_ERROR(core_->Replicate(std::move(tail), std::move(tokens)));
  LZ_ASSIGN_OR_RETURN(std::string identity, store_->Identity());
  LZ_RETURN_IF_ERROR(core_->Promote(identity.empty() ? creation_ : MarketCreation()));
  leader_.store(true);
  std::fprintf(stderr, "laissez serve: elected leader (%s); journal at seq %llu\n",
               options_.advertise.c_str(), static_cast<unsigned long long>(core_->applied_seq()));
  return Status::Ok();
}

void Replica::FollowLoop() {
  int64_t rev = store_->pinned();
  store_->Unpin();
  const std::string& p = store_->prefix();
  auto last_snapshot = std::chrono::steady_clock::now();
  int64_t compact_to = 0;
  uint64_t snapshot_seq = 0;  // The last snapshot this leader wrote.
  bool check = true;
  while (!stop_.load() && !lost_.load()) {
    if (leader_.load()) {
      SleepUnless(stop_, std::chrono::milliseconds(100));
      if (std::chrono::steady_clock::now() - last_snapshot < options_.snapshot_every) continue;
      last_snapshot = std::chrono::steady_clock::now();
      // A snapshot when the journal moved on since the last one; then the
      // keys it covers go. A step that fails (etcd busy, a compare that no
      // longer holds) is tried again next round; losing the fence shows in
      // the next commit.
      if (core_->applied_seq() > snapshot_seq) {
        auto snap = core_->TakeSnapshot();
        if (snap.ok() && store_->WriteSnapshot(*snap).ok()) {
          snapshot_seq = snap->seq;
          (void)store_->Truncate(snap->seq);
        }
      }
      if (!store_->Fold().ok()) continue;
      auto now = store_->Pin();
      store_->Unpin();
      if (compact_to > 0) (void)store_->client().Compact(compact_to);
      if (now.ok()) compact_to = *now;
      continue;
    }
    if (check) {
      auto me = CheckElection();
      if (!me.ok()) {
        SleepUnless(stop_, std::chrono::milliseconds(200));
        continue;
      }
      check = false;
      if (*me) {
        Status st = Promote();
        if (!st.ok()) Lose("promotion failed: " + st.message());
        continue;
      }
    }
    Status st = store_->client().Watch(
        p, etcd::PrefixEnd(p), rev + 1,
        [&](const std::vector<etcd::WatchEvent>& events, int64_t) -> bool {
          std::vector<JournalRecord> records;
          std::vector<TokenRecord> tokens;
          for (const auto& e : events) {
            rev = std::max(rev, e.kv.mod_revision);
            std::string_view k(e.kv.key);
            if (!StartsWith(k, p)) continue;
            k.remove_prefix(p.size());
            if (StartsWith(k, "e/")) {
              check = true;
            } else if (e.deleted) {
              continue;
            } else if (StartsWith(k, "j/")) {
              auto recs = DecodeJournalChunk(e.kv.value);
              if (!recs.ok()) {
                Lose("journal: " + recs.status().message());
                return false;
              }
              records.insert(records.end(), recs->begin(), recs->end());
            } else if (StartsWith(k, "t/")) {
              auto t = TokenFromJson(e.kv.value);
              if (t.ok()) tokens.push_back(*t);
            }
          }
          std::sort(records.begin(), records.end(), [](auto& a, auto& b) { return a.seq < b.seq; });
          if (!records.empty() || !tokens.empty()) {
            Status s = core_->Replicate(std::move(records), std::move(tokens));
            if (!s.ok()) {
              Lose("follower: " + s.message());
              return false;
            }
          }
          return !check;
        },
        &stop_, std::chrono::milliseconds(300));
    if (st.code() == StatusCode::kOutOfRange) {
      Lose("follower: " + st.message() + "; starting again from the snapshot");
    } else if (!st.ok()) {
      SleepUnless(stop_, std::chrono::milliseconds(200));
      check = true;
    }
  }
}

}  // namespace laissez::server
