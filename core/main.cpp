// pdgate: an OpenAI-compatible gateway for disaggregated (prefill/decode)
// vLLM serving. See README.md.
#include <cstdio>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "core/server.hpp"

int main(int argc, char** argv) {
  auto parsed = pdgate::parse_command_line(argc, argv);
  if (!parsed) {
    std::fprintf(stderr, "pdgate: %s\nTry 'pdgate --help'.\n", parsed.error().c_str());
    return 2;
  }
  if (parsed->help) {
    std::fputs(pdgate::help_text().c_str(), stdout);
    return 0;
  }
  const pdgate::Config& cfg = parsed->config;
  // Logs go to stderr; stdout carries only the "listening" line, which
  // scripts and tests read to learn the port.
  spdlog::set_default_logger(spdlog::stderr_color_mt("pdgate"));
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));

  pdgate::Gateway gateway(cfg);
  auto port = gateway.bind();
  if (!port) {
    spdlog::critical("{}", port.error());
    return 1;
  }
  std::printf("pdgate listening on http://%s:%u\n", cfg.host.c_str(), static_cast<unsigned>(*port));
  std::fflush(stdout);
  spdlog::info("{} prefill, {} decode, {} encode instance(s); connector {}{}", cfg.prefill.size(),
               cfg.decode.size(), cfg.encode.size(), cfg.kv_connector,
               cfg.prefill_disabled ? " (prefill disabled: one hop to P+D)" : "");
  return gateway.run();
}
