// The journal file store (`serve --store journal`; docs/SERVER.md, "The
// journal file"): a commit is one frame appended to a file whose space was
// written with zeros ahead of it, one pwrite and one fdatasync. SQLite writes
// each record twice (its log, then the checkpoint's copy) in pages, and its
// checkpoint's large syncs stall the log's (issue 12).
//
// The file: a 4 KiB header (kMagic, then zeros), then frames from offset 4096.
// A frame is `u32 length, u32 crc32(payload), payload`; its payload holds the
// entries of one Batch (EncodeBatch). The zeros after the last frame end the
// log: a length of 0, or a frame that does not fit the file or fails its CRC
// (a write a crash cut short), ends the scan at open. The sidecar
// (store.h) then tells a torn tail, which nothing acknowledged, from lost
// commits. Snapshots live beside the file, in PATH.snapshot, replaced by rename.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "common/check.h"
#include "server/store.h"

namespace laissez::server {
namespace {

static_assert(std::endian::native == std::endian::little, "the journal file's integers are little-endian");

constexpr char kMagic[] = "laissez-journal-file v1\n";
constexpr char kSnapshotMagic[] = "laissez-snapshot v1\n";
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kFrameHeader = 8;
// Every kMarkBytes of frames the store remembers where a frame starts, so
// reads from a seq skip what comes before (ReadJournal, RecentJournal).
constexpr uint64_t kMarkBytes = uint64_t{1} << 20;
constexpr size_t kZeros = size_t{1} << 20;  // The file grows by whole MiB.
constexpr size_t kPiece = size_t{256} << 10;  // Zeros written and synced at a time (GrowPiece).
constexpr auto kPiecePause = std::chrono::milliseconds(1);  // The grower's pause between pieces.
// What the sidecar's messages call this store's file, and what lost its tail (CheckSidecar).
constexpr char kLostFiles[] = "the journal file";
constexpr char kLostTail[] = "the journal file was truncated, replaced or damaged";

enum Entry : uint8_t { kJournal = 1, kToken = 2, kIdentity = 3 };

uint32_t Crc(std::string_view s) {
  uLong c = crc32(0L, Z_NULL, 0);
  // zlib takes at most 4 GiB a call; a frame is far smaller (its length is 32 bits).
  return static_cast<uint32_t>(crc32(c, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}
void PutString(std::string* out, std::string_view s) {
  Put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

// The entries of one batch, in the order Commit applies them.
void EncodeBatch(const Batch& b, std::string* out) {
  if (!b.identity.empty()) {
    Put<uint8_t>(out, kIdentity);
    PutString(out, b.identity);
  }
  for (const JournalRecord& r : b.journal) {
    Put<uint8_t>(out, kJournal);
    Put<uint64_t>(out, r.seq);
    PutString(out, r.actor);
    PutString(out, r.line);
  }
  for (const TokenRecord& t : b.tokens) {
    Put<uint8_t>(out, kToken);
    Put<uint64_t>(out, t.id);
    PutString(out, t.hash);
    PutString(out, t.role);
    Put<uint32_t>(out, t.tenant_id);
    PutString(out, t.name);
    Put<uint8_t>(out, t.revoked ? 1 : 0);
    Put<int64_t>(out, t.created);
  }
}

// Reads a frame's entries; false at the first that does not parse.
class PayloadReader {
 public:
  explicit PayloadReader(std::string_view p) : p_(p) {}
  bool done() const { return p_.empty(); }
  template <typename T>
  bool Get(T* v) {
    if (p_.size() < sizeof(T)) return false;
    std::memcpy(v, p_.data(), sizeof(T));
    p_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n = 0;
    if (!Get(&n) || p_.size() < n) return false;
    s->assign(p_.data(), n);
    p_.remove_prefix(n);
    return true;
  }

 private:
  std::string_view p_;
};

// One entry of a frame: a journal record, a token, or the identity.
struct Decoded {
  Entry kind = kJournal;
  JournalRecord record;
  TokenRecord token;
  std::string identity;
};
bool DecodeEntry(PayloadReader* r, Decoded* d) {
  uint8_t kind = 0;
  if (!r->Get(&kind)) return false;
  d->kind = static_cast<Entry>(kind);
  switch (kind) {
    case kJournal:
      return r->Get(&d->record.seq) && r->GetString(&d->record.actor) && r->GetString(&d->record.line);
    case kToken: {
      uint8_t revoked = 0;
      TokenRecord& t = d->token;
      bool ok = r->Get(&t.id) && r->GetString(&t.hash) && r->GetString(&t.role) && r->Get(&t.tenant_id) &&
                r->GetString(&t.name) && r->Get(&revoked) && r->Get(&t.created);
      t.revoked = revoked != 0;
      return ok;
    }
    case kIdentity:
      return r->GetString(&d->identity);
    default:
      return false;
  }
}

Status Errno(const std::string& what, const std::string& path) {
  return Unavailable("db: " + what + " " + path + ": " + std::strerror(errno));
}

Status PwriteAll(int fd, const char* data, size_t n, uint64_t at) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Unavailable(std::string("write: ") + (w < 0 ? std::strerror(errno) : "no progress"));
    data += w;
    n -= static_cast<size_t>(w);
    at += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

// Reads [from, to) of fd into *out; false on a short read or an error.
bool PreadAll(int fd, uint64_t from, uint64_t to, std::string* out) {
  out->resize(to - from);
  size_t done = 0;
  while (done < out->size()) {
    ssize_t r = ::pread(fd, out->data() + done, out->size() - done, static_cast<off_t>(from + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

// Calls fn(offset, payload) for each whole frame in [from, to) of fd, in
// order, reading a window at a time, and returns the end of the last one. It
// stops at the log's end: a zero length, a frame past `to`, or a bad CRC (a
// write that a crash cut short; SQLite's write-ahead log also ends at its
// first bad frame), or at fn's first error.
template <typename Fn>
Result<uint64_t> ScanFrames(int fd, const std::string& path, uint64_t from, uint64_t to, Fn&& fn) {
  std::string window;
  uint64_t window_at = from;
  // The bytes [at, at + n) of the file, from the window (read again when they are past it).
  auto bytes = [&](uint64_t at, uint64_t n) -> const char* {
    if (at < window_at || at + n > window_at + window.size()) {
      window_at = at;
      if (!PreadAll(fd, at, std::min(to, at + std::max<uint64_t>(n, 4 * kMarkBytes)), &window)) return nullptr;
    }
    return window.data() + (at - window_at);
  };
  uint64_t at = from;
  while (at + kFrameHeader <= to) {
    const char* h = bytes(at, kFrameHeader);
    if (!h) return Unavailable("db: cannot read " + path + " at offset " + std::to_string(at));
    uint32_t len, crc;
    std::memcpy(&len, h, 4);
    std::memcpy(&crc, h + 4, 4);
    if (len == 0 || at + kFrameHeader + len > to) break;
    const char* p = bytes(at + kFrameHeader, len);
    if (!p) return Unavailable("db: cannot read " + path + " at offset " + std::to_string(at));
    std::string_view payload(p, len);
    if (Crc(payload) != crc) break;
    LZ_RETURN_IF_ERROR(fn(at, payload));
    at += kFrameHeader + len;
  }
  return at;
}

// The end of the last byte that is not zero in [from, to) of fd, or `from`.
Result<uint64_t> LastNonZero(int fd, const std::string& path, uint64_t from, uint64_t to) {
  uint64_t last = from;
  std::string window;
  for (uint64_t at = from; at < to; at += kZeros) {
    const uint64_t n = std::min<uint64_t>(kZeros, to - at);
    if (!PreadAll(fd, at, at + n, &window)) return Unavailable("db: cannot read " + path + " at offset " + std::to_string(at));
    for (uint64_t i = n; i > 0; --i) {
      if (window[i - 1] != '\0') {
        last = at + i;
        break;
      }
    }
  }
  return last;
}

Status FsyncDirOf(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (dir.empty()) dir = path.find('/') == 0 ? "/" : ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Ok();  // Best effort: some file systems refuse.
  ::fsync(fd);
  ::close(fd);
  return Status::Ok();
}

class JournalFileStore final : public Store {
 public:
  JournalFileStore(std::string path, int fd, JournalStoreOptions options)
      : path_(std::move(path)), fd_(fd), options_(options), sidecar_(path_) {}
  ~JournalFileStore() override {
    {
      std::lock_guard lock(grow_mu_);
      grow_stop_ = true;
      grow_cv_.notify_all();
    }
    if (grower_.joinable()) grower_.join();
    if (direct_fd_ >= 0) ::close(direct_fd_);
    if (grow_fd_ >= 0) ::close(grow_fd_);
    ::close(fd_);
  }

  // Scans the file, checks the sidecar, zeroes a cut-short write after the log and makes room.
  Status Open(uint64_t size) {
    size_.store(size);
    // The grower writes and syncs through descriptors of its own: a sync's
    // write error is reported once to each open file description, so a
    // failure of the grower's sync that hit a commit's page is still the
    // commit's own sync's to report (a shared descriptor would take it).
    grow_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (grow_fd_ < 0) return Errno("cannot open", path_);
    direct_fd_ = ::open(path_.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    struct stat mine {}, grow {}, direct {};
    if (::fstat(fd_, &mine) != 0 || ::fstat(grow_fd_, &grow) != 0 ||
        (direct_fd_ >= 0 && ::fstat(direct_fd_, &direct) != 0)) {
      return Errno("cannot read", path_);
    }
    auto same = [&](const struct stat& o) { return o.st_dev == mine.st_dev && o.st_ino == mine.st_ino; };
    if (!same(grow) || (direct_fd_ >= 0 && !same(direct))) {
      return Unavailable("db: " + path_ + " was replaced while it was being opened");
    }
    std::string header;
    if (size < kHeaderBytes || !PreadAll(fd_, 0, kHeaderBytes, &header) ||
        header.compare(0, sizeof kMagic - 1, kMagic) != 0) {
      const bool sqlite = header.compare(0, 15, "SQLite format 3") == 0;
      return FailedPrecondition("db: " + path_ + (sqlite ? " is a SQLite database: open it with --store sqlite"
                                                         : " is not a laissez journal file (no header)"));
    }
    uint64_t marked = 0;
    auto scan = ScanFrames(fd_, path_, kHeaderBytes, size, [&](uint64_t at, std::string_view payload) -> Status {
      if (at >= marked) {
        marks_.push_back(Mark{at, records_, last_seq_});
        marked = at + kMarkBytes;
      }
      PayloadReader r(payload);
      Decoded d;
      while (!r.done()) {
        if (!DecodeEntry(&r, &d)) {
          return DataLoss("db: " + path_ + ": the frame at offset " + std::to_string(at) +
                          " passes its checksum but does not parse (written by a newer version?)");
        }
        LZ_RETURN_IF_ERROR(ApplyEntry(std::move(d), at));
      }
      ++commits_;
      return Status::Ok();
    });
    if (!scan.ok()) return scan.status();
    end_ = *scan;
    next_mark_ = marked;
    LZ_ASSIGN_OR_RETURN(SidecarVerdict v,
                        CheckSidecar(path_, StoreState{identity_, last_seq_, commits_, records_ > 0 || !tokens_.empty()},
                                     kLostFiles, kLostTail));
    pending_identity_ = v.pending_identity;
    // Bytes after the log's end are a write that a crash cut short (any of
    // its pages may have reached the disk, the first or not): nothing of it
    // was acknowledged, as its sync had not returned. They are zeroed, so that
    // a shorter frame written over them leaves nothing that reads as a frame.
    LZ_ASSIGN_OR_RETURN(uint64_t stale_end, LastNonZero(fd_, path_, end_, size_.load()));
    if (stale_end > end_) {
      std::string zeros(stale_end - end_, '\0');
      if (Status st = PwriteAll(fd_, zeros.data(), zeros.size(), end_); !st.ok()) {
        return Unavailable("db: cannot zero the cut-short write at the end of " + path_ + ": " + st.message());
      }
      if (::fdatasync(fd_) != 0) return Errno("cannot sync", path_);
    }
    LZ_RETURN_IF_ERROR(RequestGrowth(end_));
    if (v.adopt) {
      // Records without an identity (as a SQLite database from before identities): give them one.
      Batch b;
      b.identity = NewIdentity();
      return Commit(b);
    }
    return sidecar_.Write(Sidecar{identity_, last_seq_, commits_}, v.create);
  }

  Status Commit(const Batch& batch) override {
    if (batch.empty()) return Status::Ok();
    std::lock_guard lock(mu_);
    if (!failure_.ok()) return failure_;
    uint64_t last = last_seq_;
    for (const auto& r : batch.journal) {
      if (r.seq <= last) return InvalidArgument("journal.seq: must increase (got " + std::to_string(r.seq) + ")");
      last = r.seq;
    }
    frame_.assign(kFrameHeader, '\0');
    EncodeBatch(batch, &frame_);
    const uint64_t len = frame_.size() - kFrameHeader;
    if (len > UINT32_MAX) return InvalidArgument("batch: too large for one journal frame");
    const uint32_t len32 = static_cast<uint32_t>(len), crc = Crc(std::string_view(frame_).substr(kFrameHeader));
    std::memcpy(frame_.data(), &len32, 4);
    std::memcpy(frame_.data() + 4, &crc, 4);
    // The frame and the zeros after it (a length of 0 ends the log) lie in
    // space already written. A commit that finds too little grows only what
    // it needs (the grower thread keeps the chunk ahead: AfterCommit).
    if (end_ + frame_.size() + kFrameHeader > size_.load()) {
      LZ_RETURN_IF_ERROR(Grow(end_ + frame_.size() + kFrameHeader));
    }
    Status st = PwriteAll(fd_, frame_.data(), frame_.size(), end_);
    if (st.ok() && ::fdatasync(fd_) != 0) st = Unavailable(std::string("sync: ") + std::strerror(errno));
    if (!st.ok()) {
      // After a failed write or sync the page cache may hold the frame or
      // not (a failed fsync's pages can be dropped). The frame's length is
      // zeroed and synced, best effort, so that a restart ends the log before
      // it; the store refuses every later commit rather than build on a state
      // it cannot know. A restart scans the file again.
      static constexpr char kNoFrame[kFrameHeader] = {};
      const bool unwritten = PwriteAll(fd_, kNoFrame, kFrameHeader, end_).ok() && ::fdatasync(fd_) == 0;
      failure_ = Unavailable("store: the journal file " + path_ + " could not be written (" + st.message() +
                             (unwritten ? "; the batch is not in it"
                                        : "; the batch, not acknowledged, may or may not be found after a restart") +
                             "); restart the server");
      return failure_;
    }
    if (end_ >= next_mark_) {
      marks_.push_back(Mark{end_, records_, last_seq_});
      next_mark_ = end_ + kMarkBytes;
    }
    end_ += frame_.size();
    ++commits_;
    for (const auto& r : batch.journal) {
      last_seq_ = r.seq;
      ++records_;
    }
    for (const auto& t : batch.tokens) tokens_[t.id] = t;
    if (!batch.identity.empty()) {
      identity_ = batch.identity;
      pending_identity_.clear();
    }
    // Before the caller acknowledges anything of this batch.
    return sidecar_.Write(Sidecar{identity_, last_seq_, commits_}, false);
  }

  // Keeps a chunk of written space ahead of the log, on a thread of its own,
  // so that commits seldom grow the file themselves.
  Status AfterCommit() override {
    uint64_t end;
    {
      std::lock_guard lock(mu_);
      end = end_;
    }
    return RequestGrowth(end);
  }

  Status ReadJournal(uint64_t after, const std::function<Status(const JournalRecord&)>& fn) override {
    uint64_t from, to;
    {
      std::lock_guard lock(mu_);
      // The last mark at or before the first record after `after`.
      auto it = std::upper_bound(marks_.begin(), marks_.end(), after,
                                 [](uint64_t seq, const Mark& m) { return seq < m.last_seq_before; });
      from = it == marks_.begin() ? kHeaderBytes : std::prev(it)->offset;
      to = end_;
    }
    return ForEachRecord(from, to, [&](JournalRecord&& r) { return r.seq > after ? fn(r) : Status::Ok(); });
  }

  Result<std::vector<JournalRecord>> RecentJournal(size_t limit) override {
    if (limit == 0) return std::vector<JournalRecord>{};
    uint64_t from = kHeaderBytes, to;
    {
      std::lock_guard lock(mu_);
      for (auto it = marks_.rbegin(); it != marks_.rend(); ++it) {
        if (records_ - it->records_before >= limit) {
          from = it->offset;
          break;
        }
      }
      to = end_;
    }
    std::deque<JournalRecord> last;
    LZ_RETURN_IF_ERROR(ForEachRecord(from, to, [&](JournalRecord&& r) {
      last.push_back(std::move(r));
      if (last.size() > limit) last.pop_front();
      return Status::Ok();
    }));
    return std::vector<JournalRecord>(std::make_move_iterator(last.begin()), std::make_move_iterator(last.end()));
  }

  Result<std::vector<TokenRecord>> LoadTokens() override {
    std::lock_guard lock(mu_);
    std::vector<TokenRecord> out;
    for (const auto& [id, t] : tokens_) out.push_back(t);
    return out;
  }
  Result<uint64_t> LastSeq() override {
    std::lock_guard lock(mu_);
    return last_seq_;
  }
  Result<std::string> Identity() override {
    std::lock_guard lock(mu_);
    return identity_;
  }
  std::string PendingIdentity() const override {
    std::lock_guard lock(mu_);
    return pending_identity_;
  }

  // PATH.snapshot: kSnapshotMagic, u64 seq, u64 size, u32 crc32(image), the
  // image; written beside and renamed over the old one, so a crash leaves one
  // or the other whole.
  Status WriteSnapshot(const StoredSnapshot& snap) override {
    {
      std::lock_guard lock(mu_);
      if (snap.seq > last_seq_) {
        return InvalidArgument("snapshot.seq: " + std::to_string(snap.seq) + " is beyond the journal");
      }
    }
    std::string data(kSnapshotMagic);
    Put<uint64_t>(&data, snap.seq);
    Put<uint64_t>(&data, snap.image.size());
    Put<uint32_t>(&data, Crc(snap.image));
    data += snap.image;
    const std::string final_path = path_ + ".snapshot", tmp = final_path + ".new";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("cannot create", tmp);
    Status st = PwriteAll(fd, data.data(), data.size(), 0);
    if (!st.ok()) st = Unavailable("db: cannot write " + tmp + ": " + st.message());
    if (st.ok() && ::fsync(fd) != 0) st = Errno("cannot sync", tmp);
    ::close(fd);
    if (st.ok() && ::rename(tmp.c_str(), final_path.c_str()) != 0) st = Errno("cannot rename to", final_path);
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st;
    }
    return FsyncDirOf(final_path);
  }

  Result<StoredSnapshot> LoadSnapshot() override {
    const std::string file = path_ + ".snapshot";
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return StoredSnapshot{};
      return Errno("cannot open", file);
    }
    struct stat st {};
    std::string data;
    errno = 0;
    const bool read = ::fstat(fd, &st) == 0 && PreadAll(fd, 0, static_cast<uint64_t>(st.st_size), &data);
    const std::string read_error = read ? "" : errno != 0 ? std::strerror(errno) : "it ended early";
    ::close(fd);
    const size_t head = sizeof kSnapshotMagic - 1 + 8 + 8 + 4;
    StoredSnapshot snap;
    uint64_t size = 0;
    uint32_t crc = 0;
    if (read && data.size() >= head && data.compare(0, sizeof kSnapshotMagic - 1, kSnapshotMagic) == 0) {
      const char* p = data.data() + sizeof kSnapshotMagic - 1;
      std::memcpy(&snap.seq, p, 8);
      std::memcpy(&size, p + 8, 8);
      std::memcpy(&crc, p + 16, 4);
      snap.image = data.substr(head);
    }
    if (!read || data.size() < head || snap.image.size() != size || Crc(snap.image) != crc) {
      // The journal is whole (this store never truncates it): recovery does
      // without the snapshot, as MarketCore does with an image that does not restore.
      if (read) {
        std::fprintf(stderr, "laissez serve: warning: %s is damaged; replaying the whole journal instead\n",
                     file.c_str());
      } else {
        std::fprintf(stderr, "laissez serve: warning: cannot read %s (%s); replaying the whole journal instead\n",
                     file.c_str(), read_error.c_str());
      }
      return StoredSnapshot{};
    }
    std::lock_guard lock(mu_);
    if (snap.seq > last_seq_) {
      return DataLoss("db: " + file + " covers journal seq " + std::to_string(snap.seq) + " but " + path_ +
                      " ends at " + std::to_string(last_seq_) + ": the journal file lost its tail");
    }
    return snap;
  }

 private:
  // A frame boundary every kMarkBytes or so, with what came before it.
  struct Mark {
    uint64_t offset;
    uint64_t records_before;
    uint64_t last_seq_before;
  };

  Status ApplyEntry(Decoded&& d, uint64_t at) {
    switch (d.kind) {
      case kJournal:
        if (d.record.seq <= last_seq_) {
          return DataLoss("db: " + path_ + ": journal seq " + std::to_string(d.record.seq) + " at offset " +
                          std::to_string(at) + " does not follow " + std::to_string(last_seq_));
        }
        last_seq_ = d.record.seq;
        ++records_;
        return Status::Ok();
      case kToken:
        tokens_[d.token.id] = std::move(d.token);
        return Status::Ok();
      case kIdentity:
        identity_ = std::move(d.identity);
        return Status::Ok();
    }
    return Status::Ok();
  }

  // Every journal record in the frames of [from, to), in order.
  Status ForEachRecord(uint64_t from, uint64_t to, const std::function<Status(JournalRecord&&)>& fn) {
    auto scan = ScanFrames(fd_, path_, from, to, [&](uint64_t at, std::string_view payload) -> Status {
      PayloadReader r(payload);
      Decoded d;
      while (!r.done()) {
        if (!DecodeEntry(&r, &d)) return DataLoss("db: " + path_ + ": the frame at offset " + std::to_string(at) + " does not parse");
        if (d.kind == kJournal) LZ_RETURN_IF_ERROR(fn(std::move(d.record)));
      }
      return Status::Ok();
    });
    if (!scan.ok()) return scan.status();
    if (*scan != to) {
      return DataLoss("db: " + path_ + ": the journal ends at offset " + std::to_string(*scan) +
                      " where it held frames up to " + std::to_string(to) + " (changed behind the server?)");
    }
    return Status::Ok();
  }

  // Asks the grower thread for a chunk of space past `end` once less than
  // half a chunk is left; returns (and clears) the grower's last failure.
  Status RequestGrowth(uint64_t end) {
    if (size_.load() - end >= options_.chunk_bytes / 2) return Status::Ok();
    std::lock_guard lock(grow_mu_);
    grow_to_ = std::max(grow_to_, end + options_.chunk_bytes);
    if (!grower_.joinable()) grower_ = std::thread([this] { GrowLoop(); });
    grow_cv_.notify_all();
    return std::exchange(grow_failure_, Status::Ok());
  }

  // Writes zeros up to `target` (rounded up to kZeros) past the file's end, a
  // piece at a time, each synced before the next (GrowPiece).
  Status Grow(uint64_t target) {
    std::lock_guard lock(grow_mu_);
    while (size_.load() < target) LZ_RETURN_IF_ERROR(GrowPiece(target));
    return Status::Ok();
  }
  // One kPiece of zeros at the file's end (grow_mu_ held), synced, then
  // published in size_. The file grows by small synced pieces because a
  // commit's fdatasync writes every dirty page of the file: 64 MiB of zeros
  // written at once and synced later were in one commit's sync (a p99 of
  // 60 ms at 50k updates/s, 2026-12-02). The zeros go past the page cache
  // (O_DIRECT) where the file system allows it, so they are never a commit's
  // pages to write.
  Status GrowPiece(uint64_t target) {
    const uint64_t at = size_.load();
    target = (target + kZeros - 1) / kZeros * kZeros;
    const uint64_t n = std::min<uint64_t>(kPiece, target - at);
    static char* const zeros = [] {
      auto* z = static_cast<char*>(std::aligned_alloc(4096, kPiece));
      LZ_CHECK(z != nullptr);
      std::memset(z, 0, kPiece);
      return z;
    }();
    uint64_t done = 0;  // Bytes written past the cache.
    if (direct_fd_ >= 0 && at % 4096 == 0 && n % 4096 == 0) {
      ssize_t w;
      do {
        w = ::pwrite(direct_fd_, zeros, n, static_cast<off_t>(at));
      } while (w < 0 && errno == EINTR);
      if (w < 0 && errno == EINVAL) {  // Opens O_DIRECT but refuses its writes: through the cache from now on.
        ::close(direct_fd_);
        direct_fd_ = -1;
      } else if (w < 0) {
        return Errno("cannot grow", path_);
      } else {
        done = static_cast<uint64_t>(w);
      }
    }
    if (done < n) {
      if (Status st = PwriteAll(grow_fd_, zeros + done, n - done, at + done); !st.ok()) {
        return Unavailable("db: cannot grow " + path_ + ": " + st.message());
      }
    }
    if (::fdatasync(grow_fd_) != 0) return Errno("cannot sync the space grown in", path_);
    size_.store(at + n);
    return Status::Ok();
  }
  // The grower thread: a piece at a time up to grow_to_, a pause between
  // pieces so that the commits' syncs take turns with its own.
  void GrowLoop() {
    std::unique_lock lock(grow_mu_);
    for (;;) {
      grow_cv_.wait(lock, [&] { return grow_stop_ || grow_to_ > size_.load(); });
      if (grow_stop_) return;
      // A failure is reported by the next AfterCommit; a commit that needs
      // the space tries again itself.
      if (Status st = GrowPiece(grow_to_); !st.ok()) {
        grow_failure_ = st;
        grow_to_ = 0;
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(kPiecePause);
      lock.lock();
    }
  }

  const std::string path_;
  const int fd_;
  int grow_fd_ = -1;    // The file opened again, for GrowPiece's writes through the cache and its syncs.
  int direct_fd_ = -1;  // The file opened O_DIRECT, for GrowPiece; -1 where the file system refuses it.
  const JournalStoreOptions options_;
  mutable std::mutex mu_;  // The state below, and the commits.
  SidecarFile sidecar_;
  uint64_t end_ = kHeaderBytes;  // Where the next frame goes.
  uint64_t next_mark_ = 0;
  uint64_t commits_ = 0, records_ = 0, last_seq_ = 0;
  std::vector<Mark> marks_;
  std::map<uint64_t, TokenRecord> tokens_;
  std::string identity_, pending_identity_;
  std::string frame_;  // The frame being written (kept for its capacity).
  Status failure_;     // After a failed write: every commit's answer.
  // The space written ahead of the log. Grown under grow_mu_ by a commit that
  // needs it or by the grower thread.
  std::atomic<uint64_t> size_{0};
  std::mutex grow_mu_;
  std::condition_variable grow_cv_;
  uint64_t grow_to_ = 0;
  bool grow_stop_ = false;
  Status grow_failure_;
  std::thread grower_;
};

}  // namespace

bool IsJournalFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[sizeof kMagic - 1];
  bool yes = ::pread(fd, buf, sizeof buf, 0) == static_cast<ssize_t>(sizeof buf) &&
             std::memcmp(buf, kMagic, sizeof buf) == 0;
  ::close(fd);
  return yes;
}

Result<std::unique_ptr<Store>> OpenJournalStore(const std::string& path, const JournalStoreOptions& options) {
  if (options.chunk_bytes < kZeros) return InvalidArgument("journal: chunk_bytes must be at least 1 MiB");
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    // A sidecar that says a market was here: refused before a new file is made.
    LZ_RETURN_IF_ERROR(CheckSidecar(path, StoreState{}, kLostFiles, kLostTail)
                           .status());
    // A new file: its header and first chunk written beside it and renamed in
    // place, so PATH is whole or absent after a crash.
    const std::string tmp = path + ".new";
    int t = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (t < 0) return Errno("cannot create", tmp);
    std::string head(kHeaderBytes, '\0');
    std::memcpy(head.data(), kMagic, sizeof kMagic - 1);
    Status st = PwriteAll(t, head.data(), head.size(), 0);
    static const std::string zeros(kZeros, '\0');
    for (uint64_t at = kHeaderBytes; st.ok() && at < kHeaderBytes + options.chunk_bytes; at += kZeros) {
      st = PwriteAll(t, zeros.data(), zeros.size(), at);
    }
    if (!st.ok()) st = Unavailable("db: cannot write " + tmp + ": " + st.message());
    if (st.ok() && ::fsync(t) != 0) st = Errno("cannot sync", tmp);
    ::close(t);
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = Errno("cannot create", path);
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st;
    }
    (void)FsyncDirOf(path);
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  }
  if (fd < 0) return Errno("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = Errno("cannot read", path);
    ::close(fd);
    return s;
  }
  auto store = std::make_unique<JournalFileStore>(path, fd, options);
  LZ_RETURN_IF_ERROR(store->Open(static_cast<uint64_t>(st.st_size)));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace laissez::server
