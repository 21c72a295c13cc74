// `gradnorm stream`: the reference stream of ragged steps as a scenario file (tools/src/stream.cpp).
#include "../command_line.hpp"
#include "../stream.hpp"
#include "gradnorm/scenarios/files.hpp"

namespace gradnorm::tools {
namespace {

class StreamCommand : public Subcommand {
 public:
  explicit StreamCommand(CLI::App& app) : Subcommand(nullptr) {
    app_ = app.add_subcommand(
        "stream", "write the reference stream of ragged steps (the speed workload) as a scenario file");
    app_->footer("The guide: docs/speed.md.");
    // At most about 400 bytes a case (8 ranks x 4 counts): 100,000 cases stay within the
    // 64 MiB a scenario file may hold, so `run -f` reads every stream this writes.
    app_->add_option("--cases", options_.cases, "scenarios in the stream (default 300, at most 100000)")
        ->check(CLI::Range(1, 100000));
    app_->add_option("--seed", options_.seed, "the stream's seed (default 1)")
        ->check(seed_number());
    app_->add_option("--out", options_.out, "the TOML file to write (default: standard output)");
  }

  int run() override {
    options_.out = scenarios::absolute_path(options_.out);
    return stream_command(options_);
  }

 private:
  StreamOptions options_;
};

}  // namespace

std::unique_ptr<Subcommand> add_stream_command(CLI::App& app) { return std::make_unique<StreamCommand>(app); }

}  // namespace gradnorm::tools
