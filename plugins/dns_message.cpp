#include "plugins/dns_message.hpp"

#include <algorithm>

#include <boost/asio/ip/address.hpp>

namespace pdgate {

namespace net = boost::asio;

namespace {

constexpr std::uint16_t kClassIn = 1;

void put16(std::string& out, std::uint16_t v) {
  out += static_cast<char>(v >> 8);
  out += static_cast<char>(v & 0xff);
}

// Reads big-endian fields and (possibly compressed) names from a message,
// never past its end.
class Reader {
 public:
  explicit Reader(std::string_view m) : m_(m) {}
  bool u16(std::uint16_t& v) {
    if (pos_ + 2 > m_.size())
      return false;
    v = static_cast<std::uint16_t>(static_cast<unsigned char>(m_[pos_]) << 8 |
                                   static_cast<unsigned char>(m_[pos_ + 1]));
    pos_ += 2;
    return true;
  }
  bool u32(std::uint32_t& v) {
    std::uint16_t hi = 0, lo = 0;
    if (!u16(hi) || !u16(lo))
      return false;
    v = static_cast<std::uint32_t>(hi) << 16 | lo;
    return true;
  }
  // Skips a name: labels up to a zero byte or a compression pointer (the
  // pointer's target is not read: only the answers' data matter here).
  bool skip_name() {
    for (int labels = 0; labels < 128; ++labels) {
      if (pos_ >= m_.size())
        return false;
      const auto len = static_cast<unsigned char>(m_[pos_]);
      if (len == 0) {
        ++pos_;
        return true;
      }
      if ((len & 0xc0) == 0xc0) {
        if (pos_ + 2 > m_.size())
          return false;
        pos_ += 2;
        return true;
      }
      if ((len & 0xc0) != 0 || pos_ + 1 + len > m_.size())
        return false;
      pos_ += 1 + len;
    }
    return false;
  }
  bool take(std::size_t n, std::string_view& out) {
    if (pos_ + n > m_.size())
      return false;
    out = m_.substr(pos_, n);
    pos_ += n;
    return true;
  }

 private:
  std::string_view m_;
  std::size_t pos_ = 0;
};

}  // namespace

Result<std::string> dns_query(std::uint16_t id, std::string_view name, DnsType type) {
  if (!name.empty() && name.back() == '.')
    name.remove_suffix(1);
  if (name.empty() || name.size() > 253)
    return fail("invalid DNS name '" + std::string(name) + "'");
  std::string out;
  put16(out, id);
  put16(out, 0x0100);  // a standard query, recursion desired
  put16(out, 1);       // one question
  put16(out, 0);
  put16(out, 0);
  put16(out, 0);
  while (!name.empty()) {
    const auto dot = name.find('.');
    const std::string_view label = name.substr(0, dot);
    if (label.empty() || label.size() > 63)
      return fail("invalid DNS name: empty or over-long label");
    out += static_cast<char>(label.size());
    out.append(label);
    name = dot == std::string_view::npos ? std::string_view{} : name.substr(dot + 1);
  }
  out += '\0';
  put16(out, static_cast<std::uint16_t>(type));
  put16(out, kClassIn);
  return out;
}

Result<DnsAnswer> dns_parse_response(std::string_view message, std::uint16_t id, DnsType type) {
  Reader r(message);
  std::uint16_t got_id = 0, flags = 0, qd = 0, an = 0, ns = 0, ar = 0;
  if (!r.u16(got_id) || !r.u16(flags) || !r.u16(qd) || !r.u16(an) || !r.u16(ns) || !r.u16(ar))
    return fail("DNS answer too short");
  if (got_id != id)
    return fail("DNS answer to another query");
  if ((flags & 0x8000) == 0)
    return fail("not a DNS answer");
  if ((flags & 0x0200) != 0)
    return fail("DNS answer truncated");
  DnsAnswer out;
  const unsigned rcode = flags & 0x0f;
  if (rcode == 3) {
    out.no_such_name = true;
    return out;
  }
  if (rcode != 0)
    return fail("DNS server answered error code " + std::to_string(rcode));
  for (unsigned i = 0; i < qd; ++i) {
    std::uint16_t qtype = 0, qclass = 0;
    if (!r.skip_name() || !r.u16(qtype) || !r.u16(qclass))
      return fail("malformed DNS question");
  }
  for (unsigned i = 0; i < an; ++i) {
    std::uint16_t rtype = 0, rclass = 0, len = 0;
    std::uint32_t ttl = 0;
    std::string_view data;
    if (!r.skip_name() || !r.u16(rtype) || !r.u16(rclass) || !r.u32(ttl) || !r.u16(len) ||
        !r.take(len, data))
      return fail("malformed DNS answer record");
    if (rclass != kClassIn || rtype != static_cast<std::uint16_t>(type))
      continue;  // a CNAME on the way, or another class
    if (type == DnsType::a && data.size() == 4) {
      net::ip::address_v4::bytes_type b;
      std::copy(data.begin(), data.end(), reinterpret_cast<char*>(b.data()));
      out.addresses.push_back(net::ip::address_v4(b).to_string());
    } else if (type == DnsType::aaaa && data.size() == 16) {
      net::ip::address_v6::bytes_type b;
      std::copy(data.begin(), data.end(), reinterpret_cast<char*>(b.data()));
      out.addresses.push_back(net::ip::address_v6(b).to_string());
    } else {
      return fail("malformed DNS address record");
    }
  }
  return out;
}

std::string first_nameserver(std::string_view text) {
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    constexpr std::string_view kw = "nameserver";
    if (line.substr(0, kw.size()) != kw || line.size() == kw.size() ||
        (line[kw.size()] != ' ' && line[kw.size()] != '\t'))
      continue;
    line.remove_prefix(kw.size());
    const auto b = line.find_first_not_of(" \t");
    if (b == std::string_view::npos)
      continue;
    line.remove_prefix(b);
    return std::string(line.substr(0, line.find_first_of(" \t\r#")));
  }
  return {};
}

}  // namespace pdgate
