#include "server/auth.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>

namespace laissez::server {
namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

constexpr std::string_view kPrefix = "lz_";
constexpr size_t kTokenHexLen = 64;

}  // namespace

std::string_view RoleName(Role r) {
  switch (r) {
    case Role::kTenant: return "tenant";
    case Role::kOperator: return "operator";
    case Role::kAdmin: return "admin";
  }
  return "?";
}

Result<Role> ParseRole(std::string_view text, std::string_view field) {
  if (text == "tenant") return Role::kTenant;
  if (text == "operator") return Role::kOperator;
  if (text == "admin") return Role::kAdmin;
  return InvalidArgument(std::string(field) + ": must be tenant, operator or admin (got \"" +
                         std::string(text.substr(0, 32)) + "\")");
}

std::string Principal::Actor() const { return std::string(RoleName(role)) + ":" + name; }

std::string HashToken(std::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return Hex(digest, sizeof digest);
}

std::string NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    // RAND_bytes fails only without an entropy source; a predictable token
    // would be worse than stopping.
    std::abort();
  }
  return std::string(kPrefix) + Hex(bytes, sizeof bytes);
}

void TokenTable::Put(const TokenRecord& record) {
  std::unique_lock lock(mu_);
  if (auto it = hash_by_id_.find(record.id); it != hash_by_id_.end()) by_hash_.erase(it->second);
  by_hash_[record.hash] = record;
  hash_by_id_[record.id] = record.hash;
  max_id_ = std::max(max_id_, record.id);
}

Result<Principal> TokenTable::Authenticate(std::string_view header) const {
  if (header.empty()) return Unauthenticated("authorization: missing bearer token");
  constexpr std::string_view kBearer = "Bearer ";
  if (header.substr(0, kBearer.size()) != kBearer) {
    return Unauthenticated("authorization: must be \"Bearer <token>\"");
  }
  std::string_view token = header.substr(kBearer.size());
  if (token.size() != kPrefix.size() + kTokenHexLen || token.substr(0, kPrefix.size()) != kPrefix ||
      !std::all_of(token.begin() + kPrefix.size(), token.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
    return Unauthenticated("authorization: malformed token");
  }
  std::string hash = HashToken(token);
  std::shared_lock lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return Unauthenticated("authorization: unknown token");
  const TokenRecord& r = it->second;
  if (r.revoked) return Unauthenticated("authorization: token revoked");
  Principal p;
  auto role = ParseRole(r.role, "role");
  if (!role.ok()) return Internal("token " + std::to_string(r.id) + ": bad role in store");
  p.role = *role;
  p.tenant = TenantId(r.tenant_id);
  p.name = r.name;
  p.token_id = r.id;
  return p;
}

Result<TokenRecord> TokenTable::Get(uint64_t id) const {
  std::shared_lock lock(mu_);
  auto it = hash_by_id_.find(id);
  if (it == hash_by_id_.end()) return NotFound("token_id: no token " + std::to_string(id));
  return by_hash_.at(it->second);
}

Status TokenTable::Recheck(const Principal& p) const {
  std::shared_lock lock(mu_);
  auto it = hash_by_id_.find(p.token_id);
  if (it == hash_by_id_.end()) return Unauthenticated("authorization: unknown token");
  const TokenRecord& r = by_hash_.at(it->second);
  if (r.revoked) return Unauthenticated("authorization: token revoked");
  if (r.role != RoleName(p.role) || r.tenant_id != p.tenant.value) {
    return Unauthenticated("authorization: the token's role changed; authenticate again");
  }
  return Status::Ok();
}

size_t TokenTable::size() const {
  std::shared_lock lock(mu_);
  return by_hash_.size();
}

uint64_t TokenTable::NextId() const {
  std::shared_lock lock(mu_);
  return max_id_ + 1;
}

bool RateLimiter::Allow(uint64_t key) {
  if (rate_ <= 0) return true;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  auto [it, inserted] = buckets_.try_emplace(key, Bucket{burst_, now});
  Bucket& b = it->second;
  if (!inserted) {
    double dt = std::chrono::duration<double>(now - b.last).count();
    b.tokens = std::min(burst_, b.tokens + dt * rate_);
    b.last = now;
  }
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

}  // namespace laissez::server
