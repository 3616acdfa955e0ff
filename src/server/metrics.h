// Server metrics in the Prometheus text exposition format: per-method request
// counts by status code and latency histograms, plus gauges the market core
// sets (queue length, market depth, journal position).
//
// Thread-safety: all methods are safe from any thread; the hot path (Observe)
// takes no lock once a method's series exists.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace laissez::server {

class MethodStats {
 public:
  // Latency bucket upper bounds, microseconds.
  static constexpr std::array<int64_t, 12> kBucketsUs = {50, 100, 250, 500, 1000, 2000, 5000,
                                                         10000, 25000, 100000, 1000000, 10000000};
  void Observe(int code, int64_t micros);

 private:
  friend class Metrics;
  std::array<std::atomic<uint64_t>, 17> by_code_{};  // gRPC codes 0..16.
  std::array<std::atomic<uint64_t>, kBucketsUs.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<int64_t> sum_us_{0};
};

class Metrics {
 public:
  // The series of one method (created on first use; the pointer stays valid).
  MethodStats* Method(const std::string& name);

  std::atomic<int64_t> queue_length{0};
  std::atomic<int64_t> resting_orders{0};
  std::atomic<int64_t> live_nodes{0};
  std::atomic<int64_t> held_nodes{0};
  std::atomic<int64_t> tenants{0};
  std::atomic<int64_t> engine_time_us{0};
  std::atomic<int64_t> journal_seq{0};
  std::atomic<uint64_t> commits{0};
  std::atomic<uint64_t> committed_records{0};
  std::atomic<int64_t> commit_us_sum{0};
  std::atomic<uint64_t> rate_limited{0};
  std::atomic<int64_t> watchers{0};

  std::string Render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<MethodStats>> methods_;
};

}  // namespace laissez::server
