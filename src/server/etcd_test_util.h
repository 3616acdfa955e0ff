// A single-member etcd on free loopback ports for the tests of the etcd client
// and store: started on first use, killed when the test binary exits.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "server/etcd.h"

namespace laissez::server::testing {

inline int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class LocalEtcd {
 public:
  // The shared instance; "" from endpoint() if etcd could not be started.
  static LocalEtcd& Get() {
    static LocalEtcd e;
    return e;
  }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& error() const { return error_; }
  ~LocalEtcd() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

 private:
  LocalEtcd() {
    int client = FreeLoopbackPort(), peer = FreeLoopbackPort();
    while (peer == client) peer = FreeLoopbackPort();
    dir_ = (std::filesystem::temp_directory_path() / ("laissez_etcd_test_" + std::to_string(::getpid()))).string();
    std::string c = "http://127.0.0.1:" + std::to_string(client), p = "http://127.0.0.1:" + std::to_string(peer);
    std::vector<std::string> args = {"etcd", "--name", "t", "--data-dir", dir_, "--listen-client-urls", c,
                                     "--advertise-client-urls", c, "--listen-peer-urls", p,
                                     "--initial-advertise-peer-urls", p, "--initial-cluster", "t=" + p,
                                     "--log-outputs", "stderr", "--log-level", "error", "--logger", "zap"};
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("etcd", argv.data());
      std::_Exit(127);
    }
    endpoint_ = "127.0.0.1:" + std::to_string(client);
    auto cl = etcd::Client::Create(endpoint_, std::chrono::milliseconds(500));
    for (int i = 0; i < 200; ++i) {
      if ((*cl)->Range("probe").ok()) return;
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = 0;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    error_ = "etcd did not start on " + endpoint_ + " (is etcd-server installed?)";
    endpoint_.clear();
  }
  pid_t pid_ = 0;
  std::string dir_, endpoint_, error_;
};

}  // namespace laissez::server::testing
