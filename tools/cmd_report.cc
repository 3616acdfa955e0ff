// laissez report DIR: an experiment directory as one HTML page (figures
// inlined, tables, report.md), written to a file or served over HTTP.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/dashboard/report.h"
#include "server/http.h"
#include "tools/commands.h"

namespace laissez::cli {
namespace {

volatile sig_atomic_t g_report_stop = 0;
void OnReportSignal(int) { g_report_stop = 1; }

int RunReport(const std::string& dir, std::string out, const std::string& serve, bool as_json) {
  auto html = server::dashboard::RenderReport(dir);
  if (!html.ok()) {
    std::fprintf(stderr, "laissez report: %s\n", html.status().message().c_str());
    return 1;
  }
  if (!serve.empty()) {
    server::HttpServer http;
    std::string page = *html;
    http.router().Get("/", [page](const httplib::Request&, httplib::Response& res) {
      res.set_content(page, "text/html; charset=utf-8");
    });
    Status st = http.Start(serve);
    if (!st.ok()) {
      std::fprintf(stderr, "laissez report: %s\n", st.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "laissez report: serving %s on http://%s/ (port %d); Ctrl-C stops\n", dir.c_str(),
                 serve.c_str(), http.port());
    std::signal(SIGINT, OnReportSignal);
    std::signal(SIGTERM, OnReportSignal);
    while (!g_report_stop) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    http.Stop();
    return 0;
  }
  if (out.empty()) out = dir + "/report.html";
  std::ofstream f(out, std::ios::binary);
  f << *html;
  f.close();
  if (!f) {
    std::fprintf(stderr, "laissez report: --out: cannot write \"%s\"\n", out.c_str());
    return 1;
  }
  if (as_json) {
    std::printf("%s\n", nlohmann::json{{"out", out}, {"bytes", html->size()}}.dump().c_str());
  } else {
    std::fprintf(stderr, "laissez report: wrote %s (%zu bytes)\n", out.c_str(), html->size());
  }
  return 0;
}

}  // namespace

void RegisterReportCommands(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("report", "Write (or serve) an HTML page of an experiment directory's figures and tables");
  static std::string dir, out, serve;
  static bool as_json = false;
  cmd->add_option("DIR", dir, "Experiment directory (report.md, *.csv, *.png, *.svg)")->required();
  cmd->add_option("--out", out, "HTML file to write (default DIR/report.html)");
  cmd->add_option("--serve", serve, "Serve the page on HOST:PORT instead of writing it");
  cmd->add_flag("--json", as_json, "Print {\"out\", \"bytes\"} as JSON");
  cmd->callback([exit_code] { *exit_code = RunReport(dir, out, serve, as_json); });
}

}  // namespace laissez::cli
