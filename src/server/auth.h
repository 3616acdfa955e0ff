// Authentication and per-tenant rate limiting.
//
// Bearer tokens are 32 random bytes, hex-encoded with the prefix "lz_". The
// server keeps only their SHA-256 (store.h `TokenRecord`), so a stolen database
// does not give working tokens. Roles: a tenant token acts for one tenant; an
// operator token manages the cluster; an admin token can do what an operator
// can plus create tenants and issue or revoke tokens.
//
// Thread-safety: TokenTable and RateLimiter are safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "server/store.h"

namespace laissez::server {

enum class Role : uint8_t { kTenant = 0, kOperator = 1, kAdmin = 2 };
std::string_view RoleName(Role r);
Result<Role> ParseRole(std::string_view text, std::string_view field);

// Who is calling.
struct Principal {
  Role role = Role::kTenant;
  TenantId tenant;       // Valid for kTenant.
  std::string name;      // Tenant name or token label.
  uint64_t token_id = 0;
  std::string Actor() const;  // "tenant:NAME", for the audit log.
};

// Lower-case hex SHA-256 of `token`.
std::string HashToken(std::string_view token);
// A fresh random token ("lz_" + 64 hex digits).
std::string NewToken();

class TokenTable {
 public:
  // Inserts or replaces a record (by id).
  void Put(const TokenRecord& record);
  // UNAUTHENTICATED for a missing, malformed, unknown or revoked token.
  // `header` is the value of the `authorization` metadata ("Bearer lz_...").
  Result<Principal> Authenticate(std::string_view header) const;
  Result<TokenRecord> Get(uint64_t id) const;
  // Whether a principal authenticated earlier still stands: UNAUTHENTICATED
  // once its token was revoked or its role or tenant changed. Long-lived calls
  // (streams) and queued commands re-check with this.
  Status Recheck(const Principal& p) const;
  size_t size() const;
  uint64_t NextId() const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, TokenRecord> by_hash_;
  std::unordered_map<uint64_t, std::string> hash_by_id_;
  uint64_t max_id_ = 0;
};

// A token bucket per key (tenant): `rate` requests per second with bursts of
// `burst`. rate == 0 disables limiting.
class RateLimiter {
 public:
  RateLimiter(double rate, double burst) : rate_(rate), burst_(burst) {}
  // True if a request may go ahead now (and takes a token).
  bool Allow(uint64_t key);

 private:
  struct Bucket {
    double tokens;
    std::chrono::steady_clock::time_point last;
  };
  double rate_, burst_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Bucket> buckets_;
};

}  // namespace laissez::server
