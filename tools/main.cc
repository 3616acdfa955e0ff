// laissez: the one LaissezCloud binary (simulate, serve, bid, quote, operator
// commands, replay, bench). `laissez --help` lists the commands.
#include <CLI/CLI.hpp>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"laissez: LaissezCloud, a continuously renegotiated cloud resource market"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");
  int exit_code = 0;
  laissez::cli::RegisterDemoCommands(app, &exit_code);
  laissez::cli::RegisterBenchCommands(app, &exit_code);
#ifdef LAISSEZ_HAVE_SIM
  laissez::cli::RegisterSimCommands(app, &exit_code);
#endif
#ifdef LAISSEZ_HAVE_OPLOG
  laissez::cli::RegisterOplogCommands(app, &exit_code);
#endif
#ifdef LAISSEZ_HAVE_SERVER
  laissez::cli::RegisterServerCommands(app, &exit_code);
#endif
#ifdef LAISSEZ_HAVE_RUN
  laissez::cli::RegisterRunCommands(app, &exit_code);
#endif
#ifdef LAISSEZ_HAVE_DASHBOARD
  laissez::cli::RegisterReportCommands(app, &exit_code);
#endif
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
