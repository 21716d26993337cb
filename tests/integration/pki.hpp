// Certificates for TLS tests, made on the fly with the openssl command: a
// root CA, an intermediate, server and client certificates, and a second
// CA no one trusts; and the shell helpers the tests run openssl, curl and
// redis-cli with.
#pragma once

#include <string>

namespace pdgate::test {

struct Run {
  int exit = -1;
  std::string out;
};

// Runs a shell command (every one given carries its own time limit) and
// returns its exit status and stdout.
Run run(const std::string& cmd);

// A file's whole text ("" when it cannot be read).
std::string slurp(const std::string& path);

// The certificates of every test, made once in a directory removed at the
// end. Names (NAME.pem and NAME.key in path()):
//   ca, other-ca   the trusted root, and a CA no one trusts
//   int            an intermediate under ca
//   server, server2  leaves under int (serverAuth, localhost and
//                  127.0.0.1); server-chain.pem, server2-chain.pem carry
//                  the intermediate after the leaf
//   engine         a leaf under ca (serverAuth, localhost and 127.0.0.1)
//   rogue          a leaf under other-ca
//   client         a leaf under ca (clientAuth)
//   elsewhere      a leaf under ca for DNS:engine.example only
class Pki {
 public:
  Pki();
  ~Pki();
  Pki(const Pki&) = delete;
  Pki& operator=(const Pki&) = delete;
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  static bool sh(const std::string& cmd);
  static bool write(const std::string& path, const std::string& text);
  bool leaf(const std::string& name, const std::string& ca, const std::string& serial,
            const std::string& usage,
            const std::string& san = "subjectAltName=DNS:localhost,IP:127.0.0.1");
  std::string dir_;
  bool ok_ = false;
};

}  // namespace pdgate::test
