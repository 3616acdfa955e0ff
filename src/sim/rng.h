// Rng: a small deterministic random generator (xoshiro256** seeded by
// splitmix64) with the few distributions the simulator needs, written out so
// that the same seed gives the same numbers on every platform and standard
// library (std::*_distribution is implementation-defined).
#pragma once

#include <cmath>
#include <cstdint>

namespace laissez::sim {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) s = SplitMix(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [lo, hi].
  int64_t Int(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double Exponential(double mean) { return -mean * std::log(1.0 - Uniform()); }
  // exp(N(log(median), sigma)).
  double LogNormal(double median, double sigma) {
    double u1 = 1.0 - Uniform(), u2 = Uniform();
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    return median * std::exp(sigma * z);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t SplitMix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

}  // namespace laissez::sim
