// `smolrt chat`: interactive multi-turn chat. Replies stream to stdout; status lines go to
// stderr. With stdin a terminal: a "> " prompt, line editing and history (libedit); otherwise
// plain lines in, plain replies out (one reply per input line, then a newline).
// Commands: /reset (forget the conversation), /exit (or end of input) quits.
// Context policy (--context-policy): "drop" (default) drops the oldest exchanges and re-reads the
// rest when the next message would not fit; "stop" refuses the message and asks for /reset.
#include <cstdio>
#include <memory>

#include "app/backend_flags.h"
#include "app/command.h"
#include "app/line_reader.h"
#include "app/sampling_flags.h"
#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/chat.h"
#include "tokenizer/tokenizer.h"

namespace smolrt::app {

namespace {

struct ChatArgs {
  std::string model;
  std::string system;
  bool system_given = false;
  std::string chat_template = "auto";
  std::string policy = "drop";
  int n_predict = -1;
  BackendOptions backend;  // --backend, --ctx, --threads (app/backend_flags.h)
  bool stats = false;
  SamplingParams sampling;
  std::vector<std::string> stops;
};

void out(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

int chat_main(const ChatArgs& a) {
  validate(a.sampling);

  const std::string path = resolve_model_path(a.model);
  const Model model = load_model(path);
  const Tokenizer tok(vocab_from_gguf(*model.file));
  const std::string& tmpl = tok.vocab().chat_template;
  const ChatFormat format = resolve_chat_format(a.chat_template, tmpl);  // or an Error

  std::unique_ptr<Backend> be = make_backend(model, a.backend);

  ChatOptions co;
  co.sampling = a.sampling;
  co.stops = a.stops;
  co.max_tokens = a.n_predict;
  co.system = a.system_given ? a.system : template_default_system(tmpl);
  co.policy = a.policy == "stop" ? ContextPolicy::kStop : ContextPolicy::kDropOldest;
  co.format = format;
  ChatSession session(*be, tok, co);

  LineReader reader;
  if (reader.interactive()) {
    std::fprintf(stderr,
                 "smolrt chat: %s on %s, context %d tokens, %s (seed %llu). /reset clears the "
                 "conversation, /exit quits.\n",
                 path.c_str(), be->name().c_str(), be->n_ctx(),
                 a.sampling.greedy() ? "greedy" : "sampling",
                 static_cast<unsigned long long>(session.seed()));
  }
  while (std::optional<std::string> line = reader.read("> ")) {
    if (*line == "/exit" || *line == "/quit") break;
    if (*line == "/reset") {
      session.reset();
      if (reader.interactive()) std::fprintf(stderr, "[conversation reset]\n");
      continue;
    }
    if (line->empty()) continue;
    if ((*line)[0] == '/' && line->find(' ') == std::string::npos) {
      std::fprintf(stderr, "unknown command '%s': use /reset or /exit\n", line->c_str());
      continue;
    }
    TurnResult r;
    try {
      r = session.turn(*line, out);
    } catch (const Error& e) {
      if (!reader.interactive()) throw;
      std::fprintf(stderr, "smolrt chat: error: %s\n", e.what());
      continue;
    }
    out("\n");
    if (r.n_dropped > 0) {
      std::fprintf(stderr,
                   "[context full: dropped the %d oldest exchange(s) and re-read the rest]\n",
                   r.n_dropped);
    }
    if (r.stop == StopCause::kContextFull) {
      std::fprintf(stderr,
                   "[context full (%d tokens): the reply was cut; the next message drops the "
                   "oldest exchanges, or type /reset]\n",
                   be->n_ctx());
    }
    if (a.stats) {
      std::fprintf(stderr,
                   "[prefill %d tokens %.1f ms, %zu tokens %.1f ms (%.1f tok/s), stop: %s]\n",
                   r.n_prefilled, r.prefill_s * 1e3, r.tokens.size(), r.decode_s * 1e3,
                   r.decode_s > 0 ? r.tokens.size() / r.decode_s : 0.0, stop_cause_name(r.stop));
    }
  }
  return 0;
}

REGISTER_COMMAND(Command{
    "chat", "Interactive multi-turn chat (ChatML)", 20, [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ChatArgs>();
      sub.add_option("-m,--model", a->model, "GGUF model file (default: the cached SmolLM2-135M)");
      sub.add_option("--system", a->system,
                     "System prompt (default: the one in the model's chat template, if any; "
                     "\"\" for none)")
          ->each([a](const std::string&) { a->system_given = true; });
      sub.add_option("--chat-template", a->chat_template,
                     "chatml | gemma | llama3 | auto (the format of the model's "
                     "tokenizer.chat_template)")
          ->capture_default_str();
      sub.add_option("--context-policy", a->policy,
                     "when the context is full: drop (the oldest exchanges) | stop")
          ->check(CLI::IsMember({"drop", "stop"}))
          ->capture_default_str();
      sub.add_option("-n,--n-predict", a->n_predict,
                     "Tokens per reply at most (-1 = until the reply ends or the context fills)")
          ->capture_default_str();
      add_backend_flags(sub, a->backend);
      sub.add_flag("--stats", a->stats, "Print prefill/decode timings after each reply (stderr)");
      add_sampling_flags(sub, a->sampling, a->stops);
      return [a] { return chat_main(*a); };
    }});

}  // namespace

}  // namespace smolrt::app
