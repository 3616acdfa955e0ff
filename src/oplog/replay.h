// Replay: applies an operation log (docs/OPLOG.md) to a fresh engine, line by
// line, and reports the engine's events to a sink. The engine is deterministic,
// so the same log always gives the same events, state and ledger.
//
// An invalid line stops the replay with its line number and the reason, or,
// with `skip_invalid`, is recorded in `diagnostics()` and skipped; nothing is
// skipped silently. A call the engine rejects is not an invalid line: the live
// engine rejected it too (and still advanced its time), so replay makes the
// same call and goes on, counting it.
//
// Thread-safety: none; a Replayer and its engine belong to one thread. (With
// ReplayOptions::parse_ahead, ReplayText parses on a thread of its own, joined
// before it returns.)
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "market/market_engine.h"
#include "market/operation.h"
#include "oplog/oplog.h"

namespace laissez::oplog {

struct ReplayOptions {
  bool skip_invalid = false;   // Report invalid lines and go on instead of stopping.
  bool price_events = true;    // Build the engine with EngineOptions::price_events.
  bool retain_ledger = true;   // Keep every ledger entry (explain reads them).
  bool record_rejections = false;  // Add each rejected call to diagnostics().
  // Apply only operations with t <= stop_at; the first later line ends the
  // replay (explain --at). The engine is then advanced to stop_at.
  Micros stop_at = kNever;
  // ReplayText parses the lines on a thread of its own, ahead of the engine's (issue 12);
  // everything else (events, state, diagnostics, errors) is as without it.
  bool parse_ahead = false;
};

struct ReplayStats {
  uint64_t lines = 0;        // Lines read, including blank and comment lines.
  uint64_t operations = 0;   // Operations applied (accepted or rejected).
  uint64_t rejected = 0;     // Operations the engine rejected.
  uint64_t invalid = 0;      // Invalid lines skipped (only with skip_invalid).
  uint64_t blank = 0;        // Blank or `#` comment lines.
  uint64_t events = 0;       // Events delivered.
  bool stopped_at = false;   // Ended early because of ReplayOptions::stop_at.
};

class Replayer {
 public:
  // Called after each applied operation with its line number and the engine's answer.
  using OpObserver = std::function<void(uint64_t line, const LogRecord& rec, const market::ApplyResult& result)>;

  // `sink` (not owned, may be null) receives the engine's events.
  explicit Replayer(ReplayOptions options = {}, market::EventSink* sink = nullptr);
  ~Replayer();
  Replayer(const Replayer&) = delete;
  Replayer& operator=(const Replayer&) = delete;

  void set_observer(OpObserver observer) { observer_ = std::move(observer); }

  // Replays a whole log held in `text`. If `padded`, `text` is followed in
  // memory by Decoder::kPadding readable bytes (see ReadLogFile) and is parsed
  // in place. Returns the first fatal error ("line 12: price: ...").
  Status ReplayText(std::string_view text, bool padded = false);

  // Replays one line (no newline). `line_number` is used in messages.
  Status ReplayLine(std::string_view line, uint64_t line_number, bool padded = false);

  // Finishes the replay: with stop_at set, advances the engine to it.
  Status Finish();

  market::MarketEngine& engine() { return *engine_; }
  const market::MarketEngine& engine() const { return *engine_; }
  const ReplayStats& stats() const { return stats_; }
  // Skipped invalid lines and (with record_rejections) rejected calls, in order.
  const std::vector<std::string>& diagnostics() const { return diagnostics_; }
  // True once a line past stop_at was seen; further lines are ignored.
  bool done() const { return done_; }

 private:
  class CountingSink;
  struct Parsed;
  class AheadQueue;
  Status DecodeAndApply(std::string_view line, uint64_t line_number, bool padded);
  Status Invalid(const Status& status, uint64_t line_number);
  Status ApplyRecord(const LogRecord& rec, uint64_t line_number);
  Status ReplayTextAhead(std::string_view text, bool padded);
  static void ParseAhead(std::string_view text, bool padded, AheadQueue* queue);
  ReplayOptions options_;
  std::unique_ptr<CountingSink> counting_;
  std::unique_ptr<market::MarketEngine> engine_;
  Decoder decoder_;
  ReplayStats stats_;
  std::vector<std::string> diagnostics_;
  OpObserver observer_;
  bool done_ = false;
};

// A file's contents followed by Decoder::kPadding zero bytes, for in-place parsing.
struct PaddedText {
  std::string buffer;
  size_t size = 0;
  std::string_view text() const { return std::string_view(buffer.data(), size); }
};
Result<PaddedText> ReadLogFile(const std::string& path);

// Buffers encoded events as JSON lines; the caller drains `text()`.
class EventLineWriter : public market::EventSink {
 public:
  void OnEvents(std::span<const market::Event> events) override;
  std::string& text() { return text_; }

 private:
  std::string text_;
};

// Writes events to a file as JSON lines, formatted on a thread of its own (issue 12: the
// event text was 14% of a replay's instructions, on the engine's thread). The caller's
// thread copies each batch into a chunk; a full chunk goes to the writer thread, which
// formats it (WriteEvent) into large blocks and writes them, while the caller fills the
// next one. The file's bytes are those of writing the events in order on one thread.
// OnEvents belongs to one thread (the engine's); Finish is called from that thread too.
class EventFileWriter : public market::EventSink {
 public:
  // `f` (not owned) stays open until Finish. `chunk_events`: events per hand-over (> 0).
  // Without `own_thread` the events are formatted and written on the caller's thread, as
  // they come (for profiling, and to compare).
  explicit EventFileWriter(std::FILE* f, size_t chunk_events = 16384, bool own_thread = true);
  ~EventFileWriter() override;  // Finishes if Finish was not called.
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void OnEvents(std::span<const market::Event> events) override;
  // Writes every event received, flushes `f` and stops the thread. False if a write or the
  // flush failed (then later writes were skipped). Later calls return the same answer.
  bool Finish();

 private:
  void HandOver();
  void Run();
  void Write(std::span<const market::Event> events);
  void WriteRest();

  std::FILE* f_;
  size_t chunk_events_;
  std::vector<market::Event> filling_;  // The caller's.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<market::Event> handed_;  // Guarded by mu_: a full chunk for the writer.
  bool has_chunk_ = false;             // Guarded by mu_.
  bool stop_ = false;                  // Guarded by mu_.
  bool finished_ = false;              // The caller's.
  // The writer thread's until it is joined (the caller's without a thread of its own).
  std::unique_ptr<char[]> block_;
  size_t used_ = 0;
  bool ok_ = true;
  std::thread thread_;
};

// The engine's final state as one JSON document (docs/OPLOG.md, "Final state"):
// params, every node, open orders, tenants and ledger totals. Deterministic.
std::string StateJson(const market::MarketEngine& engine, const ReplayStats& stats);

}  // namespace laissez::oplog
