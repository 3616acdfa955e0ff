// Registration of the CLI's command families. Each Register* adds its
// subcommands to `app`; a command's callback stores its process exit code in
// `*exit_code`. Every `--json` command prints exactly one JSON document on
// stdout; progress and logs go to stderr.
#pragma once

#include <CLI/CLI.hpp>

namespace laissez::cli {

void RegisterDemoCommands(CLI::App& app, int* exit_code);   // demo story
void RegisterBenchCommands(CLI::App& app, int* exit_code);  // bench engine
void RegisterSimCommands(CLI::App& app, int* exit_code);    // simulate, experiment
void RegisterOplogCommands(CLI::App& app, int* exit_code);  // replay, explain, gen-log
void RegisterServerCommands(CLI::App& app, int* exit_code); // serve, agent, tenant/operator/admin clients
void RegisterRunCommands(CLI::App& app, int* exit_code);    // run (the tenant runtime)
void RegisterReportCommands(CLI::App& app, int* exit_code); // report (experiment directory as HTML)

}  // namespace laissez::cli
