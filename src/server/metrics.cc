#include "server/metrics.h"

#include <sstream>

namespace laissez::server {

void MethodStats::Observe(int code, int64_t micros) {
  if (code < 0 || code > 16) code = 2;
  by_code_[static_cast<size_t>(code)].fetch_add(1, std::memory_order_relaxed);
  size_t b = 0;
  while (b < kBucketsUs.size() && micros > kBucketsUs[b]) ++b;
  buckets_[b].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(micros, std::memory_order_relaxed);
}

MethodStats* Metrics::Method(const std::string& name) {
  std::lock_guard lock(mu_);
  auto& slot = methods_[name];
  if (!slot) slot = std::make_unique<MethodStats>();
  return slot.get();
}

std::string Metrics::Render() const {
  static const char* kCodes[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                 "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                 "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  std::ostringstream o;
  o << "# HELP laissez_requests_total gRPC requests by method and status code.\n"
       "# TYPE laissez_requests_total counter\n";
  std::lock_guard lock(mu_);
  for (const auto& [name, m] : methods_) {
    for (size_t c = 0; c < m->by_code_.size(); ++c) {
      uint64_t v = m->by_code_[c].load(std::memory_order_relaxed);
      if (v) o << "laissez_requests_total{method=\"" << name << "\",code=\"" << kCodes[c] << "\"} " << v << "\n";
    }
  }
  o << "# HELP laissez_request_seconds gRPC request latency, receipt to reply (durable for mutations).\n"
       "# TYPE laissez_request_seconds histogram\n";
  for (const auto& [name, m] : methods_) {
    uint64_t cum = 0;
    for (size_t b = 0; b < MethodStats::kBucketsUs.size(); ++b) {
      cum += m->buckets_[b].load(std::memory_order_relaxed);
      o << "laissez_request_seconds_bucket{method=\"" << name << "\",le=\""
        << static_cast<double>(MethodStats::kBucketsUs[b]) / 1e6 << "\"} " << cum << "\n";
    }
    cum += m->buckets_.back().load(std::memory_order_relaxed);
    o << "laissez_request_seconds_bucket{method=\"" << name << "\",le=\"+Inf\"} " << cum << "\n";
    o << "laissez_request_seconds_sum{method=\"" << name << "\"} "
      << static_cast<double>(m->sum_us_.load(std::memory_order_relaxed)) / 1e6 << "\n";
    o << "laissez_request_seconds_count{method=\"" << name << "\"} " << m->count_.load(std::memory_order_relaxed)
      << "\n";
  }
  auto gauge = [&o](const char* name, const char* help, int64_t v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n" << name << " " << v << "\n";
  };
  auto counter = [&o](const char* name, const char* help, uint64_t v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
  };
  gauge("laissez_engine_queue_length", "Commands waiting for the engine's writer thread.", queue_length.load());
  gauge("laissez_market_resting_orders", "Resting orders in the book (market depth).", resting_orders.load());
  gauge("laissez_market_live_nodes", "Nodes in the market.", live_nodes.load());
  gauge("laissez_market_tenants", "Tenants.", tenants.load());
  gauge("laissez_engine_time_microseconds", "The engine's current time.", engine_time_us.load());
  gauge("laissez_journal_seq", "Last journal record applied.", journal_seq.load());
  gauge("laissez_watch_streams", "Open watch streams.", watchers.load());
  counter("laissez_store_commits_total", "Durable store commits (group commits).", commits.load());
  counter("laissez_store_committed_records_total", "Journal records committed.", committed_records.load());
  o << "# HELP laissez_store_commit_seconds_sum Time spent in durable commits.\n"
       "# TYPE laissez_store_commit_seconds_sum counter\nlaissez_store_commit_seconds_sum "
    << static_cast<double>(commit_us_sum.load()) / 1e6 << "\n";
  counter("laissez_rate_limited_total", "Requests refused by per-tenant rate limits.", rate_limited.load());
  return o.str();
}

}  // namespace laissez::server
