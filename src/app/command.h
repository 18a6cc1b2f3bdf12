// Subcommand registry: each src/app/cmd_*.cpp registers itself with REGISTER_COMMAND, so adding a
// command touches no other file. The app is the only layer that prints for the user.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace smolrt::app {

// setup() adds the subcommand's options to `sub`, and returns the action to run when it is chosen.
// The action returns the process exit code; it may throw smolrt::Error (printed as
// "smolrt <cmd>: error: <message>", exit 1).
struct Command {
  std::string name;
  std::string help;
  int order;  // position in --help
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { command_registry().push_back(std::move(c)); }
};

#define SMOLRT_CONCAT2(a, b) a##b
#define SMOLRT_CONCAT(a, b) SMOLRT_CONCAT2(a, b)
#define REGISTER_COMMAND(...) \
  static ::smolrt::app::CommandRegistrar SMOLRT_CONCAT(smolrt_cmd_, __LINE__)(__VA_ARGS__)

// Resolves -m: the given path, else the default model (core/paths.h). When the default is
// missing, throws Error telling the user to run scripts/fetch_model.sh or pass -m.
std::string resolve_model_path(const std::string& given);

// Path of the synthetic SmolLM-135M-shaped Q4_0 model (seed 42) with the real SmolLM2 tokenizer
// when the fixtures' tokenizer.json is present (else the built-in byte vocab padded to 49152),
// generated into the cache dir on first use and reused after.
std::string ensure_synthetic_model();

}  // namespace smolrt::app
