// How an option's text is set into its Config field: the setter each entry
// of the option table (options.cpp) names. The templates serve every field
// of one kind (a size, a duration, a switch, ...); the others are written
// for one option each, in fields.cpp. Internal to core/config/.
#pragma once

#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "core/base/result.hpp"
#include "core/base/text.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/values.hpp"

namespace pdgate::config_detail {

template <auto Field>
Result<bool> set_text(Config& c, std::string_view v) {
  c.*Field = std::string(v);
  return true;
}

template <auto Field>
Result<bool> set_trimmed(Config& c, std::string_view v) {
  c.*Field = std::string(trim(v));
  return true;
}

template <auto Field>
Result<bool> set_name(Config& c, std::string_view v) {
  if (trim(v).empty())
    return fail("must not be empty");
  c.*Field = std::string(trim(v));
  return true;
}

template <auto Field>
Result<bool> set_size(Config& c, std::string_view v) {
  auto n = parse_size(v);
  if (!n)
    return fail(n.error());
  c.*Field = *n;
  return true;
}

template <auto Field>
Result<bool> set_duration(Config& c, std::string_view v) {
  auto d = parse_duration(v);
  if (!d)
    return fail(d.error());
  c.*Field = std::chrono::duration_cast<std::remove_reference_t<decltype(c.*Field)>>(*d);
  return true;
}

// A duration, or "off" (or 0) for never.
template <auto Field>
Result<bool> set_interval(Config& c, std::string_view v) {
  const std::string word = lower(trim(v));
  if (word == "off" || word == "0") {
    c.*Field = std::chrono::milliseconds(0);
    return true;
  }
  return set_duration<Field>(c, v);
}

template <auto Field>
Result<bool> set_switch(Config& c, std::string_view v) {
  auto b = parse_switch(v);
  if (!b)
    return fail(b.error());
  c.*Field = *b;
  return true;
}

template <auto Field, std::uint64_t Max>
Result<bool> set_uint(Config& c, std::string_view v) {
  auto n = parse_uint(trim(v), Max);
  if (!n)
    return fail(n.error());
  c.*Field = static_cast<std::remove_reference_t<decltype(c.*Field)>>(*n);
  return true;
}

// Counts of health checks and failures: 1 to 1000.
template <auto Field>
Result<bool> set_count(Config& c, std::string_view v) {
  unsigned n = 0;
  const std::string t(trim(v));
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
  if (ec != std::errc() || p != t.data() + t.size() || n < 1 || n > 1000)
    return fail("not a count from 1 to 1000");
  c.*Field = n;
  return true;
}

template <auto Field>
Result<bool> set_fraction(Config& c, std::string_view v) {
  const std::string t(trim(v));
  char* end = nullptr;
  const double f = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !(f >= 0.0 && f <= 1.0))
    return fail("not a fraction from 0 to 1");
  c.*Field = f;
  return true;
}

// The setters written for one option each (fields.cpp).
Result<bool> set_tokenizer(Config& c, std::string_view v);
// open or closed: what a limit check does when Redis cannot answer.
Result<bool> set_fail_mode(Config& c, std::string_view v);
Result<bool> set_tls_version(Config& c, std::string_view v);
Result<bool> set_host(Config& c, std::string_view v);
Result<bool> set_port(Config& c, std::string_view v);
Result<bool> set_kv_connector(Config& c, std::string_view v);
// RFC 9110 token characters only (anything else cannot be a header
// name), lower-cased.
Result<bool> set_scope_header(Config& c, std::string_view v);
Result<bool> set_expose_kv_params(Config& c, std::string_view v);
Result<bool> set_policy_budget(Config& c, std::string_view v);
// Setting the admin port turns the admin listener on.
Result<bool> set_admin_port(Config& c, std::string_view v);
Result<bool> set_access_log(Config& c, std::string_view v);
Result<bool> set_access_log_format(Config& c, std::string_view v);
Result<bool> set_log_level(Config& c, std::string_view v);
Result<bool> set_otlp_endpoint(Config& c, std::string_view v);

}  // namespace pdgate::config_detail
