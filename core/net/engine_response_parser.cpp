#include "core/net/engine_response_parser.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include <boost/beast/http/error.hpp>

#include "core/base/http_tokens.hpp"

namespace pdgate {

namespace {

using http_error = boost::beast::http::error;
using http_tokens::for_each_token;
using http_tokens::is_tchar;
using http_tokens::is_token;
using http_tokens::is_value_char;
using http_tokens::skip_value_chars;
using http_tokens::trim_ows;

// Whether token `a` equals `lower` (lower-case letters, digits and '-')
// ignoring case, eight bytes at a time. Setting bit 0x20 lower-cases a
// letter and keeps a digit or '-'; the only other byte it maps onto one of
// them is a control character, which no token holds.
bool iequals(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size())
    return false;
  std::size_t i = 0;
  for (; i + 8 <= a.size(); i += 8) {
    std::uint64_t x = 0;
    std::uint64_t y = 0;
    std::memcpy(&x, a.data() + i, 8);
    std::memcpy(&y, lower.data() + i, 8);
    if ((x | 0x2020202020202020ULL) != y)
      return false;
  }
  for (; i < a.size(); ++i) {
    if (static_cast<char>(a[i] | 0x20) != lower[i])
      return false;
  }
  return true;
}

// A chunk extension: *( OWS ";" OWS token [ OWS "=" OWS ( token /
// quoted-string ) ] ). Its meaning is ignored, its syntax checked.
bool valid_chunk_extension(std::string_view s) {
  std::size_t i = 0;
  auto skip_ows = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t'))
      ++i;
  };
  auto token = [&] {
    const std::size_t start = i;
    while (i < s.size() && is_tchar(s[i]))
      ++i;
    return i > start;
  };
  while (true) {
    if (i == s.size())
      return true;
    skip_ows();  // whitespace only before a ';', never at the end (as Beast)
    if (i == s.size() || s[i] != ';')
      return false;
    ++i;
    skip_ows();
    if (!token())
      return false;
    const std::size_t after_name = i;
    skip_ows();
    if (i < s.size() && s[i] == '=') {
      ++i;
      skip_ows();
      if (i < s.size() && s[i] == '"') {
        ++i;
        while (i < s.size() && s[i] != '"') {
          const char c = s[i];
          if (c == '\\') {
            if (++i == s.size() || !is_value_char(s[i]))
              return false;
          } else if (!is_value_char(c)) {
            return false;
          }
          ++i;
        }
        if (i == s.size())
          return false;
        ++i;
      } else if (!token()) {
        return false;
      }
    } else {
      i = after_name;  // the whitespace must lead to another ';'
    }
  }
}

// Reads one header or trailer field line starting at `at` in `s` (the
// caller knows a CRLF-terminated line is there): see read_field_line.
// Returns the offset after its CRLF, or npos if the line is malformed.
std::size_t read_field(std::string_view s, std::size_t at, std::string_view& name,
                       std::string_view& value) {
  const char* const next =
      http_tokens::read_field_line(s.data() + at, s.data() + s.size(), name, value);
  return next == nullptr ? std::string_view::npos : static_cast<std::size_t>(next - s.data());
}

}  // namespace

std::size_t EngineResponseParser::put(boost::asio::const_buffer bytes, error_code& ec) {
  const std::string_view in(static_cast<const char*>(bytes.data()), bytes.size());
  if (!in.empty())
    got_some_ = true;
  ec = {};
  std::size_t used = 0;
  while (true) {
    const std::string_view rest = in.substr(used);
    switch (state_) {
      case State::header: {
        used += parse_header(rest, ec);
        if (!ec && state_ == State::header)
          break;  // an interim answer was skipped: the final one follows
        if (ec || state_ == State::done || !eager_)
          return used;
        break;
      }
      case State::length:
      case State::chunk_data: {
        if (rest.empty()) {
          ec = http_error::need_more;
          return used;
        }
        const std::size_t want = static_cast<std::size_t>(
            std::min<std::uint64_t>(remaining_, static_cast<std::uint64_t>(rest.size())));
        const std::size_t got = take(rest.data(), want, ec);
        used += got;
        remaining_ -= got;
        if (remaining_ == 0) {
          if (state_ == State::length) {
            state_ = State::done;
            ec = {};
            return used;
          }
          state_ = State::chunk_crlf;
          break;
        }
        if (!ec)  // every byte given was body
          ec = http_error::need_more;
        return used;
      }
      case State::until_eof: {
        if (rest.empty()) {
          ec = http_error::need_more;
          return used;
        }
        used += take(rest.data(), rest.size(), ec);
        if (!ec)
          ec = http_error::need_more;
        return used;
      }
      case State::chunk_crlf: {
        if (rest.size() < 2) {
          ec = http_error::need_more;
          return used;
        }
        if (rest[0] != '\r' || rest[1] != '\n') {
          ec = http_error::bad_chunk;
          return used;
        }
        used += 2;
        state_ = State::chunk_size;
        break;
      }
      case State::chunk_size: {
        used += parse_chunk_size(rest, ec);
        if (ec || state_ == State::done)
          return used;
        break;
      }
      case State::done:
        return used;
    }
  }
}

void EngineResponseParser::put_eof(error_code& ec) {
  if (state_ == State::until_eof) {
    state_ = State::done;
    ec = {};
    return;
  }
  ec = state_ == State::done ? error_code{} : error_code(http_error::partial_message);
}

std::size_t EngineResponseParser::take(const char* p, std::size_t n, error_code& ec) {
  if (dst_ == nullptr || room_ == 0) {
    ec = http_error::need_buffer;
    return 0;
  }
  const std::size_t k = std::min(room_, n);
  std::memcpy(dst_, p, k);
  dst_ += k;
  room_ -= k;
  if (k < n) {
    ec = http_error::need_buffer;
  } else {
    ec = {};
  }
  return k;
}

std::size_t EngineResponseParser::parse_header(std::string_view s, error_code& ec) {
  // The whole header first: the status line and fields up to the empty
  // line. An answer's header arrives in one read nearly always, so a
  // header not there yet is simply looked for again with more bytes.
  // The search resumes where the last one stopped (the caller passes the
  // same bytes again with more), so a header trickling in byte by byte is
  // not scanned over and over.
  const std::size_t end = s.find("\r\n\r\n", std::min(header_scanned_, s.size()));
  if (end == std::string_view::npos) {
    header_scanned_ = s.size() < 3 ? 0 : s.size() - 3;
    ec = s.size() >= header_limit_ ? error_code(http_error::header_limit)
                                   : error_code(http_error::need_more);
    return 0;
  }
  const std::size_t header_size = end + 4;
  if (header_size > header_limit_) {
    ec = http_error::header_limit;
    return 0;
  }
  // status-line = HTTP-version SP 3DIGIT SP reason-phrase CRLF
  const std::size_t eol = s.find("\r\n");
  const std::string_view start = s.substr(0, eol);
  if (start.size() < 13 || start.compare(0, 5, "HTTP/") != 0 || start[5] != '1' ||
      start[6] != '.' || (start[7] != '0' && start[7] != '1')) {
    ec = http_error::bad_version;
    return 0;
  }
  if (start[8] != ' ') {
    ec = http_error::bad_version;
    return 0;
  }
  unsigned code = 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (start[i] < '0' || start[i] > '9') {
      ec = http_error::bad_status;
      return 0;
    }
    code = code * 10 + static_cast<unsigned>(start[i] - '0');
  }
  if (start[12] != ' ') {
    ec = http_error::bad_status;
    return 0;
  }
  if (skip_value_chars(start.data() + 13, start.data() + start.size()) !=
      start.data() + start.size()) {
    ec = http_error::bad_reason;
    return 0;
  }
  const bool http11 = start[7] == '1';
  status_ = code;

  // The fields, each line read in one pass, up to the empty line.
  const std::size_t fields_end = end + 2;
  std::size_t at = eol + 2;
  while (at < fields_end) {
    std::string_view name;
    std::string_view value;
    const std::size_t next = read_field(s.substr(0, fields_end), at, name, value);
    if (next == std::string_view::npos) {
      ec = http_error::bad_field;
      return 0;
    }
    if (!on_field(name, value, ec))
      return 0;
    at = next;
  }

  if (status_ / 100 == 1) {
    // An interim answer: skipped with its fields, and the parse goes on to
    // the final answer (RFC 9110 15.2). A 101 switches protocols, which
    // the gateway never asks for.
    if (status_ == 101 || ++interim_answers_ > kMaxInterimAnswers) {
      ec = http_error::bad_status;
      return 0;
    }
    chunked_ = has_length_ = has_encoding_ = close_ = keep_token_ = false;
    remaining_ = 0;
    content_type_.clear();
    cache_control_.clear();
    header_scanned_ = 0;
    status_ = 0;
    ec = {};
    return header_size;
  }

  // The framing (RFC 9112 6.3): no body for 204 and 304 answers.
  keep_alive_ = http11 ? !close_ : keep_token_;
  if (status_ == 204 || status_ == 304) {
    state_ = State::done;
  } else if (has_length_) {
    state_ = remaining_ == 0 ? State::done : State::length;
  } else if (chunked_) {
    state_ = State::chunk_size;
  } else {
    state_ = State::until_eof;
    keep_alive_ = false;
  }
  ec = {};
  return header_size;
}

bool EngineResponseParser::on_field(std::string_view name, std::string_view value, error_code& ec) {
  switch (name.size()) {
    case 10:  // Connection
    case 16:  // Proxy-Connection
      if (iequals(name, "connection") || iequals(name, "proxy-connection")) {
        const bool ok = for_each_token(value, [this](std::string_view t) {
          if (iequals(t, "close"))
            close_ = true;
          else if (iequals(t, "keep-alive"))
            keep_token_ = true;
        });
        if (!ok) {
          ec = http_error::bad_value;
          return false;
        }
      }
      return true;
    case 12:  // Content-Type
      if (iequals(name, "content-type"))
        content_type_.assign(value.data(), value.size());
      return true;
    case 13:  // Cache-Control
      if (iequals(name, "cache-control"))
        cache_control_.assign(value.data(), value.size());
      return true;
    case 14: {  // Content-Length
      if (!iequals(name, "content-length"))
        return true;
      // One decimal number, one field: lists and repeats (which Beast
      // takes when they agree) are refused with the conflicting cases.
      const auto n = http_tokens::decimal_length(value);
      if (has_length_ || has_encoding_ || !n) {
        ec = http_error::bad_content_length;
        return false;
      }
      has_length_ = true;
      remaining_ = *n;
      return true;
    }
    case 17: {  // Transfer-Encoding
      if (!iequals(name, "transfer-encoding"))
        return true;
      if (has_length_ || has_encoding_) {
        ec = http_error::bad_transfer_encoding;
        return false;
      }
      has_encoding_ = true;
      std::string_view last;
      const bool ok = for_each_token(value, [&last](std::string_view t) { last = t; });
      if (!ok) {
        ec = http_error::bad_transfer_encoding;
        return false;
      }
      // Chunked only as the last coding; otherwise the body runs to the
      // connection's close.
      chunked_ = iequals(last, "chunked");
      return true;
    }
    default:
      return true;
  }
}

std::size_t EngineResponseParser::parse_chunk_size(std::string_view s, error_code& ec) {
  const std::size_t eol = s.find("\r\n");
  if (eol == std::string_view::npos) {
    // A size line is a few bytes; one that goes on is not one.
    ec = s.size() >= header_limit_ ? error_code(http_error::bad_chunk)
                                   : error_code(http_error::need_more);
    return 0;
  }
  const std::string_view line = s.substr(0, eol);
  std::uint64_t size = 0;
  std::size_t i = 0;
  for (; i < line.size(); ++i) {
    const char c = line[i];
    unsigned digit = 0;
    if (c >= '0' && c <= '9')
      digit = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      digit = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      digit = static_cast<unsigned>(c - 'A' + 10);
    else
      break;
    if (size >> 60 != 0) {
      ec = http_error::bad_chunk;
      return 0;
    }
    size = size * 16 + digit;
  }
  if (i == 0 || !valid_chunk_extension(line.substr(i))) {
    ec = http_error::bad_chunk;
    return 0;
  }
  if (size != 0) {
    remaining_ = size;
    state_ = State::chunk_data;
    ec = {};
    return eol + 2;
  }
  // The last chunk: trailer fields (read and dropped) up to an empty line,
  // all of them needed before the answer is done.
  std::size_t at = eol + 2;
  while (true) {
    const std::size_t next = s.find("\r\n", at);
    if (next == std::string_view::npos) {
      ec = s.size() - eol >= header_limit_ ? error_code(http_error::header_limit)
                                           : error_code(http_error::need_more);
      return 0;
    }
    if (next - eol > header_limit_) {
      ec = http_error::header_limit;
      return 0;
    }
    if (next == at) {
      state_ = State::done;
      ec = {};
      return next + 2;
    }
    std::string_view name;
    std::string_view value;
    // Framing and connection fields have no place in trailers (RFC 9110
    // 6.5.1); Beast's parser applied them, this one refuses them.
    if (read_field(s.substr(0, next + 2), at, name, value) != next + 2 ||
        iequals(name, "content-length") || iequals(name, "transfer-encoding") ||
        iequals(name, "connection") || iequals(name, "proxy-connection") ||
        iequals(name, "upgrade")) {
      ec = http_error::bad_field;
      return 0;
    }
    at = next + 2;
  }
}

}  // namespace pdgate
