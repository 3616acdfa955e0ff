#include "tools/commands.h"
namespace laissez::cli {
void RegisterServerCommands(CLI::App&, int*) {}
}
