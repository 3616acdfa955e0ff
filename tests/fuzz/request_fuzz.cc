// libFuzzer target over request decoding and validation: the input picks a
// method and a caller and is decoded as that method's protobuf request, which
// goes to a live in-memory server over loopback gRPC. Properties:
//  - the server never crashes (ASan/UBSan in `make fuzz`);
//  - every refusal names a field: "field: reason";
//  - money is conserved after every call.
// Built and run by tests/fuzz/run.sh (`make fuzz`).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "laissez/v1/market.grpc.pb.h"
#include "server/server.h"

namespace {
namespace pb = ::laissez::v1;
using laissez::server::Server;
using laissez::server::ServerOptions;

struct Env {
  std::unique_ptr<Server> server;
  std::unique_ptr<pb::TenantService::Stub> tenant;
  std::unique_ptr<pb::OperatorService::Stub> op;
  std::unique_ptr<pb::AdminService::Stub> admin;
  std::string tokens[4];  // none, tenant, operator (admin token), garbage

  Env() {
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.rate_limit = 0;
    o.max_message_bytes = 64 << 10;
    server = std::make_unique<Server>(o);
    if (!server->Start().ok()) std::abort();
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->grpc_port()), grpc::InsecureChannelCredentials());
    tenant = pb::TenantService::NewStub(ch);
    op = pb::OperatorService::NewStub(ch);
    admin = pb::AdminService::NewStub(ch);
    tokens[2] = server->admin_token();
    tokens[3] = "lz_" + std::string(64, '0');
    pb::CreateTenantRequest ct;
    ct.set_name("fuzz");
    ct.set_balance(1'000'000'000);
    pb::CreateTenantResponse cr;
    if (!admin->CreateTenant(Ctx(2).get(), ct, &cr).ok()) std::abort();
    tokens[1] = cr.token();
    pb::AddNodesRequest an;
    for (int i = 0; i < 4; ++i) {
      auto* n = an.add_nodes();
      n->set_name("n" + std::to_string(i));
      n->set_type("gpu");
      n->set_region("eu");
      n->set_zone("z");
      n->set_row("r");
      n->set_rack(i < 2 ? "k1" : "k2");
    }
    pb::AddNodesResponse ar;
    if (!op->AddNodes(Ctx(2).get(), an, &ar).ok()) std::abort();
  }
  std::unique_ptr<grpc::ClientContext> Ctx(int who) {
    auto c = std::make_unique<grpc::ClientContext>();
    if (!tokens[who].empty()) c->AddMetadata("authorization", "Bearer " + tokens[who]);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  }
};

template <typename Req, typename Resp, typename Stub>
grpc::Status Call(Env& env, int who, Stub* stub,
                  grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*), const uint8_t* data,
                  size_t size, bool* parsed) {
  Req req;
  *parsed = req.ParseFromArray(data, static_cast<int>(size));
  if (!*parsed) return grpc::Status::OK;
  Resp resp;
  return (stub->*method)(env.Ctx(who).get(), req, &resp);
}

bool NamesAField(const std::string& m) {
  auto colon = m.find(": ");
  if (colon == std::string::npos || colon == 0) return false;
  for (size_t i = 0; i < colon; ++i) {
    char c = m[i];
    if (c == ' ') return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Env* env = new Env();
  if (size < 2) return 0;
  int method = data[0] % 20;
  int who = data[1] % 4;
  data += 2;
  size -= 2;
  bool parsed = false;
  grpc::Status st;
  auto* t = env->tenant.get();
  auto* o = env->op.get();
  auto* a = env->admin.get();
  using TS = pb::TenantService::Stub;
  using OS = pb::OperatorService::Stub;
  using AS = pb::AdminService::Stub;
  switch (method) {
    case 0: st = Call(*env, who, t, &TS::PlaceOrder, data, size, &parsed); break;
    case 1: st = Call(*env, who, t, &TS::UpdateOrder, data, size, &parsed); break;
    case 2: st = Call(*env, who, t, &TS::CancelOrder, data, size, &parsed); break;
    case 3: st = Call(*env, who, t, &TS::SetLimit, data, size, &parsed); break;
    case 4: st = Call(*env, who, t, &TS::Relinquish, data, size, &parsed); break;
    case 5: st = Call(*env, who, t, &TS::Quote, data, size, &parsed); break;
    case 6: st = Call(*env, who, t, &TS::EvictionQuote, data, size, &parsed); break;
    case 7: st = Call(*env, who, t, &TS::GetLedger, data, size, &parsed); break;
    case 8: st = Call(*env, who, o, &OS::AddNodes, data, size, &parsed); break;
    case 9: st = Call(*env, who, o, &OS::DrainNodes, data, size, &parsed); break;
    case 10: st = Call(*env, who, o, &OS::RemoveNodes, data, size, &parsed); break;
    case 11: st = Call(*env, who, o, &OS::SetFloor, data, size, &parsed); break;
    case 12: st = Call(*env, who, o, &OS::SetPowerCap, data, size, &parsed); break;
    case 13: st = Call(*env, who, o, &OS::RemovePolicy, data, size, &parsed); break;
    case 14: st = Call(*env, who, o, &OS::SetVolatility, data, size, &parsed); break;
    case 15: st = Call(*env, who, o, &OS::GetLedger, data, size, &parsed); break;
    case 16: st = Call(*env, who, a, &AS::CreateTenant, data, size, &parsed); break;
    case 17: st = Call(*env, who, a, &AS::Deposit, data, size, &parsed); break;
    case 18: st = Call(*env, who, a, &AS::IssueToken, data, size, &parsed); break;
    default: st = Call(*env, who, a, &AS::RevokeToken, data, size, &parsed); break;
  }
  if (!parsed) return 0;
  if (!st.ok() && st.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED && !NamesAField(st.error_message())) {
    std::fprintf(stderr, "refusal without a field: method %d code %d: %s\n", method, st.error_code(),
                 st.error_message().c_str());
    std::abort();
  }
  pb::OperatorLedgerRequest lq;
  lq.set_limit(1);
  pb::OperatorLedgerResponse led;
  if (env->op->GetLedger(env->Ctx(2).get(), lq, &led).ok() &&
      led.deposited() != led.tenant_balances() + led.operator_revenue()) {
    std::fprintf(stderr, "money not conserved after method %d\n", method);
    std::abort();
  }
  return 0;
}
