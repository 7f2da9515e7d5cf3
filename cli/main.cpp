// ftplan: size, time, price and choose a distributed fine-tuning plan before renting GPUs.
// Thin layer: each subcommand binds an options struct and calls the planner library.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "planner/errors.h"

int main(int argc, char** argv) {
  CLI::App app{"ftplan: memory, time, cost and strategy for fine-tuning LLMs on GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ftplan ") + FTPLAN_VERSION);  // project(ftplan VERSION ...)
  ftplan::cli::Commands commands;
  ftplan::cli::add_commands(app, commands);
  try {
    app.parse(argc, argv);
    return ftplan::cli::run_selected(app, commands);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ftplan: error: " << e.what() << "\n";
    return 2;
  } catch (const ftplan::InputError& e) {
    std::cerr << "ftplan: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ftplan: internal error: " << e.what() << "\n";
    return 3;
  }
}
