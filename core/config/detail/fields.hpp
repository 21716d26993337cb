// How an option's value moves between its text and its Config field: the
// binding each entry of the option table (options.cpp) names, made of a
// setter (text to field), a printer (field to text, for the effective
// config) and a copier (a reload keeping the running value). The templates
// serve every field of one kind (a size, a duration, a switch, ...); the
// setters and printers written for one option each are in fields.cpp.
// Internal to core/config/.
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
#include <vector>

#include "core/base/result.hpp"
#include "core/base/text.hpp"
#include "core/config/config.hpp"
#include "core/config/detail/option_table.hpp"
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

// The printers and the copier that serve every field of a kind.
template <auto Field>
std::vector<std::string> show_text(const Config& c) {
  return {c.*Field};
}

template <auto Field>
std::vector<std::string> show_number(const Config& c) {
  return {std::to_string(c.*Field)};
}

// The field as its one value, written by `Print` (size_text, duration_text,
// ...; a duration in seconds is printed as the milliseconds it is).
template <auto Field, auto Print>
std::vector<std::string> show_as(const Config& c) {
  return {Print(c.*Field)};
}

template <auto Field>
std::vector<std::string> show_list(const Config& c) {
  return c.*Field;
}

template <auto Field>
void copy_field(Config& to, const Config& from) {
  to.*Field = from.*Field;
}

// The bindings of one field each, by the kind of field: its setter, its
// printer and its copier.
template <auto Field>
inline constexpr Binding text_field{&set_text<Field>, &show_text<Field>, &copy_field<Field>};
template <auto Field>
inline constexpr Binding trimmed_field{&set_trimmed<Field>, &show_text<Field>, &copy_field<Field>};
template <auto Field>
inline constexpr Binding name_field{&set_name<Field>, &show_text<Field>, &copy_field<Field>};
template <auto Field>
inline constexpr Binding size_field{&set_size<Field>, &show_as<Field, &size_text>,
                                    &copy_field<Field>};
template <auto Field>
inline constexpr Binding duration_field{&set_duration<Field>, &show_as<Field, &duration_text>,
                                        &copy_field<Field>};
template <auto Field>
inline constexpr Binding interval_field{&set_interval<Field>, &show_as<Field, &interval_text>,
                                        &copy_field<Field>};
template <auto Field>
inline constexpr Binding switch_field{&set_switch<Field>, &show_as<Field, &bool_text>,
                                      &copy_field<Field>};
template <auto Field, std::uint64_t Max>
inline constexpr Binding uint_field{&set_uint<Field, Max>, &show_number<Field>, &copy_field<Field>};
template <auto Field>
inline constexpr Binding count_field{&set_count<Field>, &show_number<Field>, &copy_field<Field>};
template <auto Field>
inline constexpr Binding fraction_field{&set_fraction<Field>, &show_as<Field, &fraction_text>,
                                        &copy_field<Field>};
// A text field whose option has a setter of its own, which checks or
// rewrites the text.
template <Apply Set, auto Field>
inline constexpr Binding checked_text_field{Set, &show_text<Field>, &copy_field<Field>};
// A list option that apply_raw() reads itself.
template <auto Field>
inline constexpr Binding list_field{nullptr, &show_list<Field>, &copy_field<Field>};

// The setters written for one option each (fields.cpp).
Result<bool> set_tokenizer(Config& c, std::string_view v);
// open or closed: what a limit check does when Redis cannot answer.
Result<bool> set_fail_mode(Config& c, std::string_view v);
Result<bool> set_tls_version(Config& c, std::string_view v);
Result<bool> set_host(Config& c, std::string_view v);
Result<bool> set_port(Config& c, std::string_view v);
Result<bool> set_kv_connector(Config& c, std::string_view v);
Result<bool> set_nixl_transfer_mode(Config& c, std::string_view v);
Result<bool> set_mooncake_legs(Config& c, std::string_view v);
Result<bool> set_mooncake_bootstrap_port(Config& c, std::string_view v);
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

// The printers written for one option each (fields.cpp). The engine forms
// that are other spellings of the same lists (multi-turn, EPD) show those
// lists; an instance shows its URL, then what a YAML entry added to it.
std::vector<std::string> show_prefill(const Config& c);
std::vector<std::string> show_decode(const Config& c);
std::vector<std::string> show_prefiller_hosts(const Config& c);
std::vector<std::string> show_prefiller_ports(const Config& c);
std::vector<std::string> show_decoder_hosts(const Config& c);
std::vector<std::string> show_decoder_ports(const Config& c);
std::vector<std::string> show_encode_urls(const Config& c);
std::vector<std::string> show_prefill_urls(const Config& c);
std::vector<std::string> show_decode_urls(const Config& c);
std::vector<std::string> show_kv_events(const Config& c);
std::vector<std::string> show_data_parallel(const Config& c);
// Values may be credentials: names only.
std::vector<std::string> show_set_headers(const Config& c);
std::vector<std::string> show_policy_log_levels(const Config& c);
std::vector<std::string> show_tls_version(const Config& c);
std::vector<std::string> show_fail_mode(const Config& c);
std::vector<std::string> show_policy_budget(const Config& c);
// The URL with its passwords masked.
std::vector<std::string> show_redis(const Config& c);
// The port, or off when the admin listener is.
std::vector<std::string> show_admin_port(const Config& c);
// The port and whether the admin listener is on, as set_admin_port sets them.
void keep_admin_port(Config& to, const Config& from);

}  // namespace pdgate::config_detail
