#include "server/tenant_run.h"

#include <errno.h>
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/money.h"
#include "common/time_format.h"
#include "server/grpc_client.h"

extern char** environ;

namespace laissez::server {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct SignalName {
  const char* name;
  int number;
};
constexpr SignalName kSignals[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
                                   {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"CONT", SIGCONT},
                                   {"STOP", SIGSTOP}, {"WINCH", SIGWINCH}, {"ALRM", SIGALRM}, {"PWR", SIGPWR}};

std::string SignalNameOf(int sig) {
  for (const auto& s : kSignals)
    if (s.number == sig) return s.name;
  return std::to_string(sig);
}

// Single-quotes `s` for /bin/sh.
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

// Writes `text` to `path` through a temporary file and a rename, so a reader
// never sees half a notice.
Status WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return Internal("notice file: cannot write " + tmp);
    f << text << "\n";
    if (!f.flush()) return Internal("notice file: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Internal("notice file: cannot rename to " + path);
  return Status::Ok();
}

// The notice in force, shared with the metadata endpoint's threads.
struct NoticeBoard {
  std::mutex mu;
  std::string notice_json;  // "" when there is none.
  std::string job_json;
};

// What the adapter reported during one OnEvents/Reprice, handled by the loop.
struct Happening {
  enum Kind { kGained, kLost, kNotice, kKept, kCancelled } kind;
  NodeId node;
  Micros deadline = 0;
  Price price = 0;
  uint8_t reasons = 0;
  market::CancelReason cancel = market::CancelReason::kNone;
};

class Recorder final : public sdk::AdapterListener {
 public:
  void OnNodeGained(sdk::RequestId, NodeId n, Price limit) override {
    queue.push_back({Happening::kGained, n, 0, limit});
  }
  void OnNodeLost(sdk::RequestId, NodeId n, uint8_t reasons) override {
    queue.push_back({Happening::kLost, n, 0, 0, reasons});
  }
  void OnNotice(sdk::RequestId, NodeId n, Micros deadline, Price price, uint8_t reasons) override {
    queue.push_back({Happening::kNotice, n, deadline, price, reasons});
  }
  void OnContestEnded(sdk::RequestId, NodeId n) override { queue.push_back({Happening::kKept, n}); }
  void OnOrderCancelled(sdk::RequestId, market::CancelReason why) override {
    Happening h{Happening::kCancelled, NodeId()};
    h.cancel = why;
    queue.push_back(h);
  }
  void OnCharged(NodeId n, Money amount) override { charges.emplace_back(n, amount); }

  std::deque<Happening> queue;
  std::vector<std::pair<NodeId, Money>> charges;
};

class Runner {
 public:
  Runner(const RunOptions& o, const std::atomic<bool>* stop, const std::function<void(const RunEvent&)>& emit)
      : o_(o), stop_(stop), emit_(emit) {}
  ~Runner() {
    if (http_) {
      http_->stop();
      if (http_thread_.joinable()) http_thread_.join();
    }
  }

  Result<RunReport> Run();

 private:
  Status Validate();
  Status Setup();
  void Emit(const std::string& text, json j);
  std::string NodeName(NodeId n);
  std::string NodesOfJob() const;
  Micros Now() const { return client_->Now(); }
  Status StartJob();
  void Signal(int sig);
  void StopJob(const std::string& why);
  // Reaps the job if it exited; returns true once (with its status in `*code`).
  bool Reap(int* code, bool* signalled);
  void HandleHappenings();
  void HandleExit(int code, bool signalled);
  void RelinquishAll();
  void ClearNotice();
  Status StartMetadata();
  void PublishJob();
  // Cancels, relinquishes and waits (bounded) for the releases' charges.
  void ReleaseEverything();
  void PrintStatus(bool force);
  Status Budget(const std::string& market_message);

  const RunOptions& o_;
  const std::atomic<bool>* stop_;
  const std::function<void(const RunEvent&)>& emit_;
  RunReport report_;
  std::unique_ptr<GrpcMarketClient> client_;
  std::unique_ptr<GrpcMarketClient::EventStream> stream_;
  std::unique_ptr<sdk::PricingStrategy> strategy_;
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<sdk::EconAdapter> adapter_;
  sdk::RequestId request_ = 0;
  std::string state_dir_, notice_path_;
  bool own_state_dir_ = false;  // Made by us, so removed at the end.
  NoticeBoard board_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int metadata_port_ = 0;

  // The job.
  Micros arrival_ = 0;         // When the runner started (cost-of-delay's clock).
  Micros worked_ = 0;          // Time the job ran, over all attempts (an estimate of its progress).
  Micros running_since_ = -1;  // Start of the current attempt; -1 while no process runs.
  pid_t pid_ = -1;
  bool resume_ = false;
  std::vector<NodeId> job_nodes_;
  bool stopping_ = false;          // SIGTERM sent; waiting for the exit.
  bool killed_ = false;            // SIGKILL sent.
  Clock::time_point stop_sent_;
  std::string stop_reason_;
  Micros deadline_ = kNever;       // Earliest deadline of a notice on a job node.
  bool finished_ = false;
  int restarts_ = 0;
  // Nodes relinquished after the job left them, until the market confirms;
  // the job never restarts on them.
  std::vector<NodeId> yielded_;
  Status failure_;
  Clock::time_point last_status_ = Clock::now();
  std::map<uint32_t, std::string> names_;
};

Status Runner::Validate() {
  if (o_.command.empty()) return InvalidArgument("command: give the job after --, e.g. laissez run -- python3 train.py");
  if (o_.agent.count == 0) return InvalidArgument("count: must be at least 1");
  if (o_.agent.node_type.empty()) return InvalidArgument("type: must not be empty");
  if (o_.signal <= 0 || o_.signal >= 65) return InvalidArgument("signal: not a signal number: " + std::to_string(o_.signal));
  if (o_.checkpoint_exit_code <= 0 || o_.checkpoint_exit_code > 255)
    return InvalidArgument("checkpoint-exit-code: must be between 1 and 255");
  if (!(o_.kill_grace_seconds >= 0 && o_.kill_grace_seconds <= 3600))
    return InvalidArgument("kill-grace: must be between 0 and 3600 seconds");
  if (o_.max_restarts < 0) return InvalidArgument("max-restarts: must not be negative");
  if (!(o_.status_interval_seconds >= 0)) return InvalidArgument("status-interval: must not be negative");
  if (!o_.launcher.empty() && o_.launcher.find("{command}") == std::string::npos)
    return InvalidArgument("launcher: the template must contain {command}");
  return Status::Ok();
}

void Runner::Emit(const std::string& text, json j) {
  if (!j.contains("time")) j["time"] = client_ ? Now() : 0;
  emit_(RunEvent{text, j.dump()});
}

std::string Runner::NodeName(NodeId n) {
  auto it = names_.find(n.value);
  if (it != names_.end()) return it->second;
  auto d = client_->DescribeNode(n);
  std::string name = d.ok() ? d->name : "node-" + std::to_string(n.value);
  names_[n.value] = name;
  return name;
}

std::string Runner::NodesOfJob() const {
  std::string s;
  for (NodeId n : job_nodes_) {
    if (!s.empty()) s += ",";
    auto it = names_.find(n.value);
    s += it != names_.end() ? it->second : std::to_string(n.value);
  }
  return s;
}

Status Runner::Budget(const std::string& market_message) {
  const std::string msg = "budget: the market refused the bid (" + market_message + "); the balance must cover " +
                          std::to_string(o_.agent.count) + " node(s) at the bid for one grace window. Deposit more, " +
                          "lower --value or ask for fewer nodes";
  Emit("refused: " + msg, {{"event", "refused"}, {"reason", msg}});
  return ResourceExhausted(msg);
}

Status Runner::StartMetadata() {
  if (o_.metadata_listen.empty()) return Status::Ok();
  auto hp = o_.metadata_listen.rfind(':');
  if (hp == std::string::npos) return InvalidArgument("metadata-listen: expected HOST:PORT");
  std::string host = o_.metadata_listen.substr(0, hp);
  int port = 0;
  try {
    port = std::stoi(o_.metadata_listen.substr(hp + 1));
  } catch (...) {
    return InvalidArgument("metadata-listen: bad port in " + o_.metadata_listen);
  }
  if (port < 0 || port > 65535) return InvalidArgument("metadata-listen: port out of range");
  http_ = std::make_unique<httplib::Server>();
  NoticeBoard* b = &board_;
  // Like a cloud's instance metadata: 404 while there is no notice.
  http_->Get("/laissez/v1/notice", [b](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lock(b->mu);
    if (b->notice_json.empty()) {
      res.status = 404;
      res.set_content("{\"notice\":false}\n", "application/json");
    } else {
      res.set_content(b->notice_json + "\n", "application/json");
    }
  });
  http_->Get("/laissez/v1/job", [b](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lock(b->mu);
    res.set_content(b->job_json + "\n", "application/json");
  });
  if (port == 0) {
    metadata_port_ = http_->bind_to_any_port(host);
    if (metadata_port_ <= 0) return InvalidArgument("metadata-listen: cannot bind " + o_.metadata_listen);
  } else {
    if (!http_->bind_to_port(host, port)) return InvalidArgument("metadata-listen: cannot bind " + o_.metadata_listen);
    metadata_port_ = port;
  }
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  return Status::Ok();
}

Status Runner::Setup() {
  LZ_RETURN_IF_ERROR(Validate());
  LZ_RETURN_IF_ERROR(MakeStrategy(o_.agent).status());  // Bad options fail before connecting.
  LZ_ASSIGN_OR_RETURN(client_, GrpcMarketClient::Connect(o_.agent.connect));
  // cost-of-delay: the job entered the system now and works while its process runs.
  arrival_ = Now();
  LZ_ASSIGN_OR_RETURN(strategy_, MakeStrategy(o_.agent, arrival_, [this] {
                        Micros w = worked_ + (running_since_ >= 0 ? Now() - running_since_ : 0);
                        return std::max<Micros>(0, static_cast<Micros>(o_.agent.hours * kMicrosPerHour) - w);
                      }));
  report_.tenant = client_->tenant_name();
  LZ_ASSIGN_OR_RETURN(stream_, client_->Watch({o_.agent.node_type}));
  // A balance that is gone cannot cover any grace window: refuse before bidding.
  auto bal = client_->Balance();
  if (!bal.ok()) return bal.status();
  if (*bal <= 0) return Budget("available balance is " + FormatMoney(*bal));

  state_dir_ = o_.state_dir;
  if (state_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/laissez-run-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) return Internal("state-dir: cannot create a temporary directory");
    state_dir_ = buf.data();
    own_state_dir_ = true;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(state_dir_, ec);
    if (ec) return InvalidArgument("state-dir: cannot create " + state_dir_ + ": " + ec.message());
  }
  notice_path_ = state_dir_ + "/notice.json";
  std::remove(notice_path_.c_str());
  LZ_RETURN_IF_ERROR(StartMetadata());

  recorder_ = std::make_unique<Recorder>();
  adapter_ = std::make_unique<sdk::EconAdapter>(client_.get(), strategy_.get(), recorder_.get());
  sdk::Request req;
  sdk::NodeSpec spec;
  spec.node_type = o_.agent.node_type;
  spec.location = o_.agent.location;
  if (o_.agent.strategy == "locality") spec.locality = market::Locality::kSameRack;
  req.options.push_back(spec);
  req.count = o_.agent.count;
  req.gang = o_.agent.gang;
  LZ_ASSIGN_OR_RETURN(request_, adapter_->Add(req));
  PublishJob();
  Emit("tenant " + report_.tenant + ": bidding for " + std::to_string(o_.agent.count) + " x " + o_.agent.node_type +
           " (strategy " + o_.agent.strategy + ", value " + FormatMoney(o_.agent.value) + "/h, balance " +
           FormatMoney(*bal) + "); notice file " + notice_path_ +
           (metadata_port_ ? "; metadata http://127.0.0.1:" + std::to_string(metadata_port_) + "/laissez/v1/notice" : ""),
       {{"event", "bidding"}, {"tenant", report_.tenant}, {"type", o_.agent.node_type}, {"count", o_.agent.count},
        {"strategy", o_.agent.strategy}, {"value", o_.agent.value}, {"balance", *bal},
        {"notice_file", notice_path_}, {"metadata_port", metadata_port_}});
  return Status::Ok();
}

void Runner::PublishJob() {
  json j = {{"tenant", report_.tenant}, {"nodes", NodesOfJob()}, {"attempt", report_.attempts},
            {"resume", resume_}, {"running", pid_ > 0}, {"notice_file", notice_path_}};
  std::lock_guard lock(board_.mu);
  board_.job_json = j.dump();
}

Status Runner::StartJob() {
  job_nodes_.clear();
  if (const auto* rs = adapter_->request(request_)) {
    for (const auto& h : rs->nodes) {
      job_nodes_.push_back(h.node);
      NodeName(h.node);
    }
  }
  ClearNotice();
  deadline_ = kNever;
  stopping_ = killed_ = false;
  ++report_.attempts;
  const std::string nodes = NodesOfJob();
  const std::string first = names_[job_nodes_.front().value];
  std::vector<std::pair<std::string, std::string>> vars = {
      {"LAISSEZ_NODES", nodes},
      {"LAISSEZ_NODE", first},
      {"LAISSEZ_TENANT", report_.tenant},
      {"LAISSEZ_NOTICE_FILE", notice_path_},
      {"LAISSEZ_NOTICE_SIGNAL", SignalNameOf(o_.signal)},
      {"LAISSEZ_CHECKPOINT_EXIT_CODE", std::to_string(o_.checkpoint_exit_code)},
      {"LAISSEZ_RESUME", resume_ ? "1" : "0"},
      {"LAISSEZ_ATTEMPT", std::to_string(report_.attempts)},
  };
  if (metadata_port_) vars.push_back({"LAISSEZ_METADATA_URL", "http://127.0.0.1:" + std::to_string(metadata_port_) + "/laissez/v1"});

  // argv and envp are built before fork: the child only execs.
  std::vector<std::string> args;
  if (o_.launcher.empty()) {
    args = o_.command;
  } else {
    args = {"/bin/sh", "-c", ExpandLauncher(o_.launcher, o_.command, vars, nodes, first, report_.tenant)};
  }
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string s(*e);
    bool ours = false;
    for (const auto& [k, v] : vars) ours |= s.rfind(k + "=", 0) == 0;
    if (!ours) env.push_back(s);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid < 0) return Internal(std::string("command: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    if (o_.job_stdout_to_stderr) ::dup2(2, 1);
    // The job gets default signal dispositions, whatever the runner installed.
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP, SIGPIPE}) ::sigaction(s, &sa, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    std::fprintf(stderr, "laissez run: command: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // Also in the parent, so a signal sent at once finds the group.
  pid_ = pid;
  running_since_ = Now();
  report_.nodes_used.push_back(nodes);
  PublishJob();
  std::string prices;
  json jn = json::array();
  for (NodeId n : job_nodes_) {
    Price limit = 0;
    if (const auto* rs = adapter_->request(request_))
      for (const auto& h : rs->nodes)
        if (h.node == n) limit = h.limit;
    jn.push_back({{"node", names_[n.value]}, {"limit", limit}});
    prices += (prices.empty() ? "" : ", ") + names_[n.value] + " at " + FormatMoney(limit) + "/h";
  }
  Emit(std::string(resume_ ? "resumed" : "started") + " job (attempt " + std::to_string(report_.attempts) + ", pid " +
           std::to_string(pid) + ") on " + prices,
       {{"event", "started"}, {"attempt", report_.attempts}, {"pid", pid}, {"resume", resume_}, {"nodes", jn}});
  return Status::Ok();
}

void Runner::Signal(int sig) {
  if (pid_ > 0) ::kill(-pid_, sig);
}

void Runner::StopJob(const std::string& why) {
  if (pid_ <= 0 || stopping_) return;
  stopping_ = true;
  stop_reason_ = why;
  stop_sent_ = Clock::now();
  Signal(SIGTERM);
  Emit("stopping job: " + why + "; SIGTERM sent, SIGKILL in " + FormatMoney(static_cast<Money>(o_.kill_grace_seconds * 1e6)) +
           " s",
       {{"event", "terminating"}, {"reason", why}, {"kill_grace_us", static_cast<int64_t>(o_.kill_grace_seconds * 1e6)}});
}

bool Runner::Reap(int* code, bool* signalled) {
  if (pid_ <= 0) return false;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r != pid_) return false;
  // Anything the job left behind in its group goes with it.
  ::kill(-pid_, SIGKILL);
  pid_ = -1;
  if (running_since_ >= 0) {
    worked_ += Now() - running_since_;
    running_since_ = -1;
  }
  *signalled = WIFSIGNALED(st);
  *code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return true;
}

void Runner::ClearNotice() {
  std::remove(notice_path_.c_str());
  std::lock_guard lock(board_.mu);
  board_.notice_json.clear();
}

void Runner::RelinquishAll() {
  const auto* rs = adapter_->request(request_);
  if (!rs) return;
  std::vector<NodeId> nodes;
  for (const auto& h : rs->nodes) nodes.push_back(h.node);
  for (NodeId n : nodes) {
    Status s = adapter_->Yield(request_, n);
    if (s.ok()) yielded_.push_back(n);
    Emit("relinquished " + NodeName(n) + (s.ok() ? "" : " (" + s.ToString() + ")"),
         {{"event", "relinquished"}, {"node", NodeName(n)}, {"ok", s.ok()}});
  }
}

void Runner::HandleHappenings() {
  while (!recorder_->queue.empty()) {
    Happening h = recorder_->queue.front();
    recorder_->queue.pop_front();
    const bool on_job = std::find(job_nodes_.begin(), job_nodes_.end(), h.node) != job_nodes_.end() && pid_ > 0;
    switch (h.kind) {
      case Happening::kGained:
        Emit("obtained " + NodeName(h.node) + " with limit " + FormatMoney(h.price) + "/h",
             {{"event", "allocated"}, {"node", NodeName(h.node)}, {"limit", h.price}});
        break;
      case Happening::kLost: {
        auto y = std::find(yielded_.begin(), yielded_.end(), h.node);
        if (y != yielded_.end()) {  // The market confirms a relinquish already reported.
          yielded_.erase(y);
          break;
        }
        Emit("lost " + NodeName(h.node) + " (" + market::ReasonNames(h.reasons) + ")",
             {{"event", "lost"}, {"node", NodeName(h.node)}, {"reasons", market::ReasonNames(h.reasons)}});
        if (on_job) StopJob("node " + NodeName(h.node) + " lost");
        break;
      }
      case Happening::kNotice: {
        ++report_.notices;
        Micros left = h.deadline - Now();
        json n = {{"node", NodeName(h.node)},
                  {"deadline", h.deadline},
                  {"deadline_iso", FormatIsoTime(h.deadline)},
                  {"seconds_left", std::max<Micros>(0, left) / kMicrosPerSecond},
                  {"price", h.price},
                  {"reasons", market::ReasonNames(h.reasons)},
                  {"signal", SignalNameOf(o_.signal)},
                  {"checkpoint_exit_code", o_.checkpoint_exit_code}};
        Status ws = WriteFileAtomic(notice_path_, n.dump());
        {
          std::lock_guard lock(board_.mu);
          board_.notice_json = n.dump();
        }
        json ev = n;
        ev["event"] = "notice";
        Emit("notice on " + NodeName(h.node) + ": " + market::ReasonNames(h.reasons) + " at " + FormatMoney(h.price) +
                 "/h; deadline in " + std::to_string(std::max<Micros>(0, left) / kMicrosPerSecond) + " s (" +
                 FormatIsoTime(h.deadline) + ")" + (ws.ok() ? "" : "; " + ws.ToString()),
             ev);
        if (on_job) {
          deadline_ = std::min(deadline_, h.deadline);
          Signal(o_.signal);
          Emit("sent SIG" + SignalNameOf(o_.signal) + " to the job's process group " + std::to_string(pid_),
               {{"event", "signalled"}, {"signal", SignalNameOf(o_.signal)}, {"pid", pid_}});
        }
        break;
      }
      case Happening::kKept: {
        Emit("kept " + NodeName(h.node) + ": the contest ended", {{"event", "contest_ended"}, {"node", NodeName(h.node)}});
        bool any = false;
        if (const auto* rs = adapter_->request(request_))
          for (const auto& x : rs->nodes) any |= x.contested;
        if (!any) {
          ClearNotice();
          deadline_ = kNever;
        }
        break;
      }
      case Happening::kCancelled:
        Emit(std::string("order cancelled by the market (") + std::string(market::CancelReasonName(h.cancel)) + ")",
             {{"event", "order_cancelled"}, {"reason", std::string(market::CancelReasonName(h.cancel))}});
        if (h.cancel == market::CancelReason::kOutOfMoney && failure_.ok()) {
          failure_ = Budget("order cancelled: out of money");
        }
        break;
    }
  }
  for (const auto& [n, amount] : recorder_->charges) {
    report_.paid += amount;
    report_.paid_by_node[NodeName(n)] += amount;
  }
  recorder_->charges.clear();
}

void Runner::HandleExit(int code, bool signalled) {
  report_.job_exit_code = code;
  const bool we_stopped = stopping_;
  stopping_ = false;
  PublishJob();
  if (!we_stopped && !signalled && code == 0) {
    Emit("job finished (exit 0)", {{"event", "exited"}, {"code", 0}, {"outcome", "finished"}});
    finished_ = true;
    return;
  }
  if (!we_stopped && !signalled && code == o_.checkpoint_exit_code) {
    ++report_.checkpoints;
    Emit("job checkpointed (exit " + std::to_string(code) + "); moving", {{"event", "exited"}, {"code", code}, {"outcome", "checkpointed"}});
    ClearNotice();
    RelinquishAll();
  } else if (signalled && code == 128 + o_.signal) {
    // The job did not handle the notice signal (its default action ends the
    // process): it stopped without a checkpoint, so it restarts from its last one.
    ++report_.deadline_stops;
    Emit("job ended by SIG" + SignalNameOf(o_.signal) + " (it does not handle the notice signal); it restarts "
             "from its last checkpoint",
         {{"event", "exited"}, {"code", code}, {"outcome", "stopped"}, {"reason", "notice signal not handled"}});
    ClearNotice();
    RelinquishAll();
  } else if (we_stopped) {
    ++report_.deadline_stops;
    Emit("job stopped (" + stop_reason_ + ", exit " + std::to_string(code) + "); it restarts from its last checkpoint",
         {{"event", "exited"}, {"code", code}, {"outcome", "stopped"}, {"reason", stop_reason_}});
    ClearNotice();
    RelinquishAll();
  } else {
    Emit("job failed (exit " + std::to_string(code) + ")", {{"event", "exited"}, {"code", code}, {"outcome", "failed"}});
    ClearNotice();
    deadline_ = kNever;
    finished_ = true;
    return;
  }
  if (restarts_ >= o_.max_restarts) {
    failure_ = Status(StatusCode::kAborted, "max-restarts: the job was restarted " + std::to_string(restarts_) + " times; giving up");
    return;
  }
  ++restarts_;
  resume_ = true;
  job_nodes_.clear();
  deadline_ = kNever;
  adapter_->MarkDirty();
  Emit("bidding again for " + std::to_string(o_.agent.count) + " x " + o_.agent.node_type,
       {{"event", "bidding"}, {"restart", restarts_}});
}

void Runner::ReleaseEverything() {
  std::vector<NodeId> held;
  if (const auto* rs = adapter_->request(request_))
    for (const auto& h : rs->nodes) held.push_back(h.node);
  Status s = adapter_->Remove(request_);
  request_ = 0;
  // Remove reports each node as lost; "released" below says it once.
  std::erase_if(recorder_->queue, [](const Happening& h) { return h.kind == Happening::kLost; });
  for (NodeId n : held) Emit("released " + NodeName(n), {{"event", "released"}, {"node", NodeName(n)}});
  if (!s.ok()) Emit("release: " + s.ToString(), {{"event", "error"}, {"message", s.ToString()}});
  // The market settles each node as it leaves (a charge, then the release);
  // wait a bounded time for those events so the report's spend is complete.
  std::vector<uint32_t> pending;
  for (NodeId n : held) pending.push_back(n.value);
  auto until = Clock::now() + std::chrono::seconds(30);
  while (!pending.empty() && Clock::now() < until && stream_->open()) {
    std::vector<market::Event> events;
    if (!stream_->Poll(&events, 100).ok()) break;
    for (const auto& e : events) {
      if (e.type == market::EventType::kCharged && e.tenant == client_->tenant()) {
        report_.paid += e.amount;
        report_.paid_by_node[NodeName(e.node)] += e.amount;
      }
      bool gone = (e.type == market::EventType::kReleased && e.tenant == client_->tenant()) ||
                  (e.type == market::EventType::kTransferred && e.other == client_->tenant());
      if (gone) pending.erase(std::remove(pending.begin(), pending.end(), e.node.value), pending.end());
    }
  }
}

void Runner::PrintStatus(bool force) {
  if (!force && (o_.status_interval_seconds <= 0 ||
                 Clock::now() - last_status_ < std::chrono::duration<double>(o_.status_interval_seconds)))
    return;
  last_status_ = Clock::now();
  std::string state = request_ == 0 ? "done"
                      : pid_ > 0    ? (stopping_ ? "stopping" : deadline_ != kNever ? "noticed" : "running")
                                    : "bidding";
  std::string text = "status: " + state;
  json j = {{"event", "status"}, {"state", state}, {"paid", report_.paid}, {"attempt", report_.attempts}};
  if (pid_ > 0) {
    text += " on " + NodesOfJob();
    j["nodes"] = NodesOfJob();
  }
  if (const auto* rs = adapter_->request(request_)) {
    Price rate = 0;
    for (const auto& h : rs->nodes) rate += h.limit;
    text += ", limit " + FormatMoney(rate) + "/h";
    j["limit"] = rate;
  }
  text += ", spent " + FormatMoney(report_.paid);
  if (deadline_ != kNever) {
    Micros left = std::max<Micros>(0, deadline_ - Now());
    text += ", deadline in " + std::to_string(left / kMicrosPerSecond) + " s";
    j["deadline"] = deadline_;
  }
  Emit(text, j);
}

Result<RunReport> Runner::Run() {
  LZ_RETURN_IF_ERROR(Setup());
  auto last_reprice = Clock::now() - std::chrono::hours(1);
  auto last_refresh = Clock::now();
  Status end;
  for (;;) {
    if (stop_ && stop_->load() && !report_.interrupted) {
      report_.interrupted = true;
      Emit("interrupted: cancelling orders, stopping the job, relinquishing", {{"event", "interrupted"}});
      if (pid_ > 0) StopJob("interrupted");
    }
    if (report_.interrupted && pid_ <= 0) break;
    if (finished_ || !failure_.ok()) break;

    // The job.
    int code = 0;
    bool signalled = false;
    if (Reap(&code, &signalled)) {
      if (report_.interrupted) break;
      HandleExit(code, signalled);
      if (finished_ || !failure_.ok()) break;
    }
    if (pid_ > 0 && !stopping_ && deadline_ != kNever && Now() >= deadline_) {
      StopJob("the notice deadline passed while the job still ran");
    }
    if (pid_ > 0 && stopping_ && !killed_ &&
        Clock::now() - stop_sent_ >= std::chrono::duration<double>(o_.kill_grace_seconds)) {
      killed_ = true;
      Signal(SIGKILL);
      Emit("job still running " + Seconds(o_.kill_grace_seconds) + " s after SIGTERM: SIGKILL",
           {{"event", "killed"}, {"pid", pid_}});
    }

    // The market.
    if (!report_.interrupted) {
      auto now = Clock::now();
      if (adapter_->dirty() && now - last_reprice >= std::chrono::milliseconds(o_.agent.reprice_interval_ms)) {
        Status st = adapter_->Reprice();
        last_reprice = now;
        if (!st.ok()) {
          if (st.code() == StatusCode::kUnavailable) {
            end = st;
            break;
          }
          if (st.code() == StatusCode::kResourceExhausted && adapter_->held_count() == 0) {
            failure_ = Budget(st.message());
            break;
          }
          Emit("market: " + st.ToString(), {{"event", "error"}, {"message", st.ToString()}});
        }
      }
      if (now - last_refresh >= std::chrono::milliseconds(o_.agent.refresh_interval_ms)) {
        adapter_->MarkDirty();
        last_refresh = now;
      }
    }
    std::vector<market::Event> events;
    Status st = stream_->Poll(&events, 50);
    if (!st.ok()) {
      end = st.code() == StatusCode::kOk ? Unavailable("watch: the stream ended") : st;
      break;
    }
    bool prices = false;
    for (const auto& e : events) prices |= e.type == market::EventType::kPriceChanged;
    if (!events.empty()) adapter_->OnEvents(events);
    if (prices) adapter_->MarkDirty();
    HandleHappenings();
    if (!failure_.ok()) break;

    bool ready = adapter_->held_count() >= o_.agent.count;
    if (const auto* rs = adapter_->request(request_))
      for (const auto& h : rs->nodes)
        ready &= std::find(yielded_.begin(), yielded_.end(), h.node) == yielded_.end();
    if (pid_ <= 0 && !report_.interrupted && ready) {
      Status s = StartJob();
      if (!s.ok()) {
        failure_ = s;
        break;
      }
      PrintStatus(true);
    }
    PrintStatus(false);
  }

  // Leaving: stop the job (bounded by the kill grace), then release.
  if (pid_ > 0) {
    StopJob(report_.interrupted ? "interrupted" : "the runner is stopping");
    auto until = stop_sent_ + std::chrono::duration<double>(o_.kill_grace_seconds);
    int code = 0;
    bool signalled = false;
    while (!Reap(&code, &signalled)) {
      if (Clock::now() >= until && !killed_) {
        killed_ = true;
        Signal(SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    report_.job_exit_code = code;
  }
  ClearNotice();
  if (own_state_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(state_dir_, ec);
  }
  if (request_) ReleaseEverything();
  HandleHappenings();
  PrintStatus(true);
  if (!end.ok()) return end;
  if (!failure_.ok()) return failure_;
  return report_;
}

}  // namespace

std::string ExpandLauncher(const std::string& tmpl, const std::vector<std::string>& command,
                           const std::vector<std::pair<std::string, std::string>>& env, const std::string& nodes,
                           const std::string& node, const std::string& tenant) {
  std::string cmd, assignments;
  for (const auto& w : command) cmd += (cmd.empty() ? "" : " ") + ShellQuote(w);
  for (const auto& [k, v] : env) assignments += (assignments.empty() ? "" : " ") + k + "=" + ShellQuote(v);
  const std::pair<const char*, std::string> fields[] = {{"{command}", cmd},
                                                        {"{env}", assignments},
                                                        {"{nodes}", ShellQuote(nodes)},
                                                        {"{node}", ShellQuote(node)},
                                                        {"{tenant}", ShellQuote(tenant)}};
  // One pass, so text that a field brings in (an argument "{node}") stays as it is.
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    bool replaced = false;
    for (const auto& [key, value] : fields) {
      if (tmpl.compare(i, std::strlen(key), key) == 0) {
        out += value;
        i += std::strlen(key);
        replaced = true;
        break;
      }
    }
    if (!replaced) out += tmpl[i++];
  }
  return out;
}

Result<int> ParseSignal(const std::string& text, std::string_view field) {
  if (text.empty()) return InvalidArgument(std::string(field) + ": must not be empty");
  if (std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (text.size() > 2) return InvalidArgument(std::string(field) + ": not a signal number: " + text);
    int n = std::stoi(text);
    if (n <= 0 || n >= 65) return InvalidArgument(std::string(field) + ": not a signal number: " + text);
    return n;
  }
  std::string name = text;
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (const auto& s : kSignals)
    if (name == s.name) return s.number;
  return InvalidArgument(std::string(field) + ": unknown signal \"" + text + "\" (e.g. USR1, USR2, TERM, INT, HUP)");
}

Result<RunReport> RunTenantJob(const RunOptions& o, const std::atomic<bool>* stop,
                               const std::function<void(const RunEvent&)>& emit) {
  Runner r(o, stop, emit);
  return r.Run();
}

}  // namespace laissez::server
