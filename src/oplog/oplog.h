// The operation log and the event stream as JSON lines (docs/OPLOG.md).
//
// An operation log holds one `market::Operation` per line; replaying it against
// a fresh engine reproduces the live engine's events, state and ledger exactly,
// because the engine is deterministic and takes time as an input. The event
// stream holds one `market::Event` per line. Both formats carry a version field
// `"v"` on every line so a line can be read on its own.
//
// Encoding is canonical (fixed key order, integers only), so the same
// operations and events always give the same bytes. Decoding accepts keys in
// any order but rejects unknown or repeated keys, non-integer numbers,
// negatives and overflow, naming the field and the reason.
//
// Thread-safety: the free functions are thread-safe (each thread has its own
// parser); a `Decoder` belongs to one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "market/operation.h"
#include "market/types.h"
#include "topology/topology.h"

namespace laissez::oplog {

// The newest version this build reads and writes. Version 2 adds the optional
// "key" (an idempotency key) to operation lines; every other line is written
// as version 1, so a version-1 reader reads all of them but those.
inline constexpr int kFormatVersion = 2;

// An idempotency key: 1 to 64 of letters, digits and - _ . : (so it never
// needs escaping). INVALID_ARGUMENT naming `field` otherwise.
inline constexpr size_t kMaxIdempotencyKey = 64;
Status CheckIdempotencyKey(std::string_view key, std::string_view field);

// No id was created (or none is recorded).
inline constexpr uint64_t kNoId = UINT64_MAX;

struct DecodeOptions {
  // When set, "scope", "location", "node" and "rel_to" may also be written by
  // name ("h100x8/eu/eu-1a", "eu/eu-1a/r3", "n-17"), resolved against this
  // topology at decode time. Without it only numeric ids are accepted. The
  // encoder always writes numeric ids.
  const topology::Topology* topology = nullptr;
};

// One line of an operation log: the operation and, for calls that create
// something (add_node, add_policy, create_tenant, place_order), optionally the
// id the live engine assigned ("id"), which replay checks.
struct LogRecord {
  market::Operation op;
  uint64_t created_id = kNoId;
  // The client's idempotency key ("key", version 2 only); empty if none.
  std::string idempotency_key;
};

// One operation as one JSON line (no trailing newline), e.g.
// {"v":1,"t":1500000,"op":"place_order","tenant":3,"scope":12,"price":2500000,"count":1}
std::string EncodeOperation(const market::Operation& op);
// The same with the engine's result recorded: "id" when `created_id` != kNoId.
std::string EncodeOperation(const market::Operation& op, uint64_t created_id);
// Appends the encoding (no newline) to `*out`; the allocation-free form.
void AppendOperation(const market::Operation& op, uint64_t created_id, std::string* out);
// With an idempotency key (written as version 2 when `key` is not empty).
void AppendOperation(const market::Operation& op, uint64_t created_id, std::string_view key, std::string* out);

// Parses one line. Errors are INVALID_ARGUMENT naming the field and the reason
// ("price: must not be negative (got -5)").
Result<market::Operation> DecodeOperation(std::string_view line, const DecodeOptions& options = {});
Result<LogRecord> DecodeRecord(std::string_view line, const DecodeOptions& options = {});

// One event as one JSON line (no trailing newline), e.g.
// {"v":1,"t":1500000,"event":"allocated","node":4,"tenant":3,"order":9,"price":2500000}
std::string EncodeEvent(const market::Event& e);
void AppendEvent(const market::Event& e, std::string* out);
// The same written at `out`, which must have kEventRoom writable bytes (the
// line is shorter; bytes past its end may be overwritten): returns the line's
// end. For a sink that formats straight into its own buffer (issue 12: no
// intermediate copy and append per line).
inline constexpr size_t kEventRoom = 768;
char* WriteEvent(const market::Event& e, char* out);
Result<market::Event> DecodeEvent(std::string_view line);

// A reusable decoder that keeps its parser and buffers between lines.
class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  Result<LogRecord> DecodeRecord(std::string_view line, const DecodeOptions& options = {});
  Result<market::Event> DecodeEvent(std::string_view line);
  // As DecodeRecord, without copying: `line` must be followed in memory by at
  // least `kPadding` readable bytes (e.g. a whole file read into a buffer with
  // kPadding spare bytes at its end).
  Result<LogRecord> DecodeRecordPadded(std::string_view line, const DecodeOptions& options = {});
  static const size_t kPadding;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Names for the wire (`"kind"` of add_policy).
std::string_view PolicyKindName(const market::PolicySpec& spec);

}  // namespace laissez::oplog
