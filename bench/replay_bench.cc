// Replay speed (docs/PERFORMANCE.md, "Replay"): operations per second of a
// mixed operation log, parsing included, on one core.
//
// The log is made once by the seeded random driver (src/oplog/random_log.h)
// against a live engine: orders (single, gang, locality), price updates,
// cancels, retention limits, relinquishes, deposits, floors, maintenance,
// power caps, carbon, parameter changes, time advances and rejected calls.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

#include "oplog/oplog.h"
#include "oplog/random_log.h"
#include "oplog/replay.h"

namespace laissez::oplog {
namespace {

struct MixedLog {
  std::string text;
  size_t operations = 0;
};

const MixedLog& Log(int nodes, int tenants, size_t ops) {
  static std::vector<std::pair<std::tuple<int, int, size_t>, MixedLog>> cache;
  for (auto& [key, log] : cache) {
    if (key == std::make_tuple(nodes, tenants, ops)) return log;
  }
  RandomLogOptions o;
  o.seed = 42;
  o.operations = ops;
  o.nodes = nodes;
  o.tenants = tenants;
  // A market's traffic: bids, price updates, cancels, limits and time
  // advances, with 1% operator calls (floors, maintenance, power caps, carbon,
  // parameters, node removals) and 1% calls the engine rejects by design.
  o.operator_permille = 10;
  o.bad_permille = 10;
  MixedLog log;
  log.text = RandomLogText(o, &log.operations);
  cache.emplace_back(std::make_tuple(nodes, tenants, ops), std::move(log));
  return cache.back().second;
}

// Parsing alone: every line decoded in place.
void BM_DecodeOnly(benchmark::State& state) {
  const MixedLog& log = Log(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), 200'000);
  PaddedText padded;
  padded.buffer = log.text;
  padded.size = log.text.size();
  padded.buffer.append(Decoder::kPadding, '\0');
  Decoder d;
  for (auto _ : state) {
    std::string_view text = padded.text();
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      auto r = d.DecodeRecordPadded(text.substr(pos, nl - pos));
      benchmark::DoNotOptimize(r);
      pos = nl + 1;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * log.operations));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * log.text.size()));
}
BENCHMARK(BM_DecodeOnly)->Args({256, 64})->Unit(benchmark::kMillisecond);

// What `laissez replay` does: read the file, parse it (in place, on a thread of its own
// unless `one_thread`), apply to a fresh engine with price events on, and format every event
// as a JSON line into /dev/null (on a thread of its own unless `one_thread`).
void ReplayFile(benchmark::State& state, bool one_thread) {
  const MixedLog& log = Log(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), 200'000);
  std::string path = "/tmp/laissez_replay_bench_" + std::to_string(state.range(0)) + ".oplog";
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(log.text.data(), 1, log.text.size(), f);
    std::fclose(f);
  }
  uint64_t events = 0;
  for (auto _ : state) {
    auto text = ReadLogFile(path);
    std::FILE* out = std::fopen("/dev/null", "wb");
    if (!text.ok() || out == nullptr) {
      state.SkipWithError(text.ok() ? "cannot open /dev/null" : text.status().message().c_str());
      if (out != nullptr) std::fclose(out);
      return;
    }
    EventFileWriter sink(out, 16384, /*own_thread=*/!one_thread);
    ReplayOptions ro;
    ro.parse_ahead = !one_thread;
    Replayer r(ro, &sink);
    Status st = r.ReplayText(text->text(), true);
    const bool wrote = sink.Finish();
    std::fclose(out);
    if (!st.ok() || !wrote) {
      state.SkipWithError(st.ok() ? "event write failed" : st.message().c_str());
      return;
    }
    events = r.stats().events;
  }
  std::remove(path.c_str());
  state.counters["events"] = static_cast<double>(events);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * log.operations));
}
void BM_ReplayFile(benchmark::State& state) { ReplayFile(state, false); }
void BM_ReplayFileOneThread(benchmark::State& state) { ReplayFile(state, true); }
BENCHMARK(BM_ReplayFile)->Args({256, 64})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReplayFileOneThread)->Args({256, 64})->Unit(benchmark::kMillisecond)->UseRealTime();

// Apply alone (operations already decoded): the engine's share of replay.
void BM_ApplyOnly(benchmark::State& state) {
  const MixedLog& log = Log(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), 200'000);
  std::vector<market::Operation> ops;
  std::string_view text = log.text;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    auto op = DecodeOperation(text.substr(pos, nl - pos));
    if (!op.ok()) {
      state.SkipWithError(op.status().message().c_str());
      return;
    }
    ops.push_back(std::move(*op));
    pos = nl + 1;
  }
  for (auto _ : state) {
    market::EngineOptions eo;
    eo.price_events = true;
    market::MarketEngine engine(market::MarketParams{}, eo);
    EventLineWriter sink;
    engine.set_sink(&sink);
    for (const auto& op : ops) benchmark::DoNotOptimize(market::Apply(engine, op));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ops.size()));
}
BENCHMARK(BM_ApplyOnly)->Args({256, 64})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace laissez::oplog
