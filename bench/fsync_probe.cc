// The disk's durable-write latency, the cost a durable commit cannot avoid
// (docs/PERFORMANCE_LOG.md, "Issue 12: the fsync's tail"). Built as
// build/bench/fsync_probe (or on its own: g++ -O2 -std=c++20 -pthread
// bench/fsync_probe.cc -o fsync_probe); run it on the directory the server's
// database lives in:
//
//   build/bench/fsync_probe DIR [--syncs N] [--rounds R] [--writes K] [--bytes B]
//
// One "sync" is K pwrite calls of B bytes each, one after another, then one
// fdatasync (a SQLite WAL commit is about a dozen frames of 4,120 bytes and
// one fdatasync). The cases take turns, N syncs each per round, R rounds
// (default 500 x 4), so a busy minute of a shared disk falls on all of them;
// each is printed as one line of latencies per sync:
//   append      the file grows: every sync also changes the file's size
//   overwrite   a preallocated, already written and synced file of 4 MiB
//               (about a WAL of 1,000 pages), written round and round
//   dsync       the same file opened with O_DSYNC, the K x B bytes in one
//               pwrite, durable on return, no fdatasync
//   pair-*      two threads at once, each doing overwrite (or dsync) on its
//               own half of one preallocated file (pair-same-*) or on a file
//               of its own (pair-two-*), started together each round; the
//               "round" line gives the round's time (the slower of the
//               two), to set against one sync's: near it, the two overlapped;
//               near twice it, they took turns; the "each" line gives each
//               thread's syncs, and its syncs/s both threads' together
// The files are removed at the end.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr off_t kFileBytes = 4 << 20;

struct Options {
  std::string dir;
  int syncs = 500;  // A case's syncs per round.
  int rounds = 4;
  int writes = 12;
  size_t bytes = 4120;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "fsync_probe: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

int Open(const std::string& path, int extra) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | extra, 0644);
  if (fd < 0) Die("open " + path);
  return fd;
}

// Writes the whole file once and syncs it, so later writes overwrite
// allocated, written blocks (as a reused WAL's do).
void Preallocate(int fd) {
  std::vector<char> block(1 << 20, 'p');
  for (off_t at = 0; at < kFileBytes; at += static_cast<off_t>(block.size())) {
    if (::pwrite(fd, block.data(), block.size(), at) != static_cast<ssize_t>(block.size())) Die("preallocate");
  }
  if (::fsync(fd) != 0) Die("fsync");
}

// One file position that walks [begin, end) round and round.
struct Cursor {
  off_t begin, end, at;
  off_t Next(size_t bytes) {
    if (at + static_cast<off_t>(bytes) > end) at = begin;
    off_t here = at;
    at += static_cast<off_t>(bytes);
    return here;
  }
};

// K writes and, unless the file is O_DSYNC, one fdatasync; returns microseconds.
double OneSync(int fd, Cursor* cursor, const Options& o, bool dsync, std::vector<char>& buf) {
  auto t0 = Clock::now();
  // O_DSYNC: the K writes as one call (a journal of our own would write a
  // batch at once); a call per write would make each one durable in turn.
  size_t bytes = dsync ? o.bytes * o.writes : o.bytes;
  for (int k = 0; k < (dsync ? 1 : o.writes); ++k) {
    buf[0] = static_cast<char>(buf[0] + 1);
    if (::pwrite(fd, buf.data(), bytes, cursor->Next(bytes)) != static_cast<ssize_t>(bytes)) Die("pwrite");
  }
  if (!dsync && ::fdatasync(fd) != 0) Die("fdatasync");
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Samples {
  std::vector<double> us;
  double seconds = 0;
  void Add(const std::vector<double>& more, double s) {
    us.insert(us.end(), more.begin(), more.end());
    seconds += s;
  }
};

void Print(const std::string& name, std::vector<double> us, double seconds) {
  std::sort(us.begin(), us.end());
  auto q = [&](double p) { return us[std::min(us.size() - 1, static_cast<size_t>(p * us.size()))]; };
  double mean = 0;
  for (double v : us) mean += v;
  mean /= static_cast<double>(us.size());
  std::printf("%-26s n=%-6zu mean %8.1f  p50 %8.1f  p90 %8.1f  p99 %8.1f  p999 %8.1f  max %8.1f us  %7.0f syncs/s\n",
              name.c_str(), us.size(), mean, q(0.5), q(0.9), q(0.99), q(0.999), us.back(),
              static_cast<double>(us.size()) / seconds);
  std::fflush(stdout);
}

void Single(const Options& o, bool append, bool dsync, Samples* out) {
  std::string path = o.dir + "/fsync_probe.single";
  int fd = Open(path, 0);
  if (!append) Preallocate(fd);
  if (dsync) {
    ::close(fd);
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_DSYNC);
    if (fd < 0) Die("open O_DSYNC");
  }
  std::vector<char> buf(o.bytes * o.writes, 'w');
  Cursor cursor{0, append ? off_t{1} << 40 : kFileBytes, 0};
  std::vector<double> us;
  auto t0 = Clock::now();
  for (int i = 0; i < o.syncs; ++i) us.push_back(OneSync(fd, &cursor, o, dsync, buf));
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd);
  ::unlink(path.c_str());
  out->Add(us, seconds);
}

// Two threads, started together each round; a round's time is the slower's.
void Pair(const Options& o, bool same_file, bool dsync, Samples* rounds, Samples* each) {
  std::string paths[2] = {o.dir + "/fsync_probe.pair0", o.dir + "/fsync_probe.pair1"};
  int fds[2];
  Cursor cursors[2];
  fds[0] = Open(paths[0], 0);
  Preallocate(fds[0]);
  if (same_file) {
    fds[1] = ::open(paths[0].c_str(), O_RDWR | O_CLOEXEC);
    cursors[0] = {0, kFileBytes / 2, 0};
    cursors[1] = {kFileBytes / 2, kFileBytes, kFileBytes / 2};
  } else {
    fds[1] = Open(paths[1], 0);
    Preallocate(fds[1]);
    cursors[0] = {0, kFileBytes, 0};
    cursors[1] = {0, kFileBytes, 0};
  }
  if (dsync) {
    for (int t = 0; t < 2; ++t) {
      ::close(fds[t]);
      fds[t] = ::open(paths[same_file ? 0 : t].c_str(), O_RDWR | O_CLOEXEC | O_DSYNC);
      if (fds[t] < 0) Die("open O_DSYNC");
    }
  }
  std::vector<double> own[2];
  std::vector<Clock::time_point> ends[2];
  std::vector<Clock::time_point> starts;
  std::barrier start(2, [&]() noexcept { starts.push_back(Clock::now()); });
  auto run = [&](int t) {
    std::vector<char> buf(o.bytes * o.writes, static_cast<char>('a' + t));
    for (int i = 0; i < o.syncs; ++i) {
      start.arrive_and_wait();
      own[t].push_back(OneSync(fds[t], &cursors[t], o, dsync, buf));
      ends[t].push_back(Clock::now());
    }
  };
  auto t0 = Clock::now();
  std::thread other(run, 1);
  run(0);
  other.join();
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> round;
  for (int i = 0; i < o.syncs; ++i) {
    round.push_back(std::chrono::duration<double, std::micro>(std::max(ends[0][i], ends[1][i]) - starts[i]).count());
  }
  for (int t = 0; t < 2; ++t) ::close(fds[t]);
  ::unlink(paths[0].c_str());
  if (!same_file) ::unlink(paths[1].c_str());
  std::vector<double> both = own[0];
  both.insert(both.end(), own[1].begin(), own[1].end());
  rounds->Add(round, seconds);
  each->Add(both, seconds);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fsync_probe: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      long v = std::strtol(argv[++i], nullptr, 10);
      if (v <= 0) {
        std::fprintf(stderr, "fsync_probe: %s must be a positive number\n", a.c_str());
        std::exit(2);
      }
      return v;
    };
    if (a == "--syncs") o.syncs = static_cast<int>(value());
    else if (a == "--rounds") o.rounds = static_cast<int>(value());
    else if (a == "--writes") o.writes = static_cast<int>(value());
    else if (a == "--bytes") o.bytes = static_cast<size_t>(value());
    else if (o.dir.empty() && a[0] != '-') o.dir = a;
    else {
      std::fprintf(stderr, "usage: fsync_probe DIR [--syncs N] [--rounds R] [--writes K] [--bytes B]\n");
      return 2;
    }
  }
  if (o.dir.empty()) {
    std::fprintf(stderr, "usage: fsync_probe DIR [--syncs N] [--rounds R] [--writes K] [--bytes B]\n");
    return 2;
  }
  if (static_cast<off_t>(o.bytes) * o.writes > kFileBytes / 4) {
    std::fprintf(stderr, "fsync_probe: --writes x --bytes must be at most 1 MiB\n");
    return 2;
  }
  std::printf("%d syncs a case in %d rounds, each sync %d x %zu bytes written, in %s\n", o.syncs * o.rounds,
              o.rounds, o.writes, o.bytes, o.dir.c_str());
  Samples append, overwrite, dsync;
  Samples pair_rounds[4], pair_each[4];
  const char* pair_names[4] = {"pair-same-overwrite", "pair-same-dsync", "pair-two-overwrite", "pair-two-dsync"};
  for (int r = 0; r < o.rounds; ++r) {
    Single(o, true, false, &append);
    Single(o, false, false, &overwrite);
    Single(o, false, true, &dsync);
    for (int c = 0; c < 4; ++c) Pair(o, /*same_file=*/c < 2, /*dsync=*/c % 2 == 1, &pair_rounds[c], &pair_each[c]);
  }
  Print("append", append.us, append.seconds);
  Print("overwrite", overwrite.us, overwrite.seconds);
  Print("dsync", dsync.us, dsync.seconds);
  for (int c = 0; c < 4; ++c) {
    Print(std::string(pair_names[c]) + " round", pair_rounds[c].us, pair_rounds[c].seconds);
    Print(std::string(pair_names[c]) + " each", pair_each[c].us, pair_each[c].seconds);
  }
  return 0;
}
