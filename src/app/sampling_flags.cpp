#include "app/sampling_flags.h"

namespace smolrt::app {

void add_sampling_flags(CLI::App& sub, SamplingParams& p, std::vector<std::string>& stops) {
  sub.add_option("--temp", p.temp, "sampling temperature; 0 = greedy (argmax)")
      ->capture_default_str();
  sub.add_option("--top-k", p.top_k, "keep the k most likely tokens; 0 = off")
      ->capture_default_str();
  sub.add_option("--top-p", p.top_p,
                 "nucleus sampling: keep tokens up to this mass, (0,1]; 1 = off")
      ->capture_default_str();
  sub.add_option("--min-p", p.min_p,
                 "drop tokens below min-p x the top probability, [0,1]; 0 = off")
      ->capture_default_str();
  sub.add_option("--repeat-penalty", p.repeat_penalty, "penalize repeated tokens; 1 = off")
      ->capture_default_str();
  sub.add_option("--repeat-last-n", p.repeat_last_n,
                 "tokens of history the penalties look at; 0 = off, -1 = all")
      ->capture_default_str();
  sub.add_option("--presence-penalty", p.presence_penalty,
                 "subtracted once per seen token; 0 = off")
      ->capture_default_str();
  sub.add_option("--frequency-penalty", p.frequency_penalty,
                 "subtracted per occurrence of a seen token; 0 = off")
      ->capture_default_str();
  sub.add_option("--seed", p.seed, "PRNG seed; -1 = random (chat prints the seed it used)")
      ->capture_default_str();
  // One value per --stop (repeat the flag for more), so `--stop a b` cannot eat a positional.
  sub.add_option("--stop", stops, "stop when the output contains this text (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

}  // namespace smolrt::app
