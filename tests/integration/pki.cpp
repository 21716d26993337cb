#include "tests/integration/pki.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace pdgate::test {

Run run(const std::string& cmd) {
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr)
    return r;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    r.out.append(buf, n);
  const int st = ::pclose(p);
  r.exit = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Pki::Pki() {
  char tmpl[] = "/tmp/pdgate-tls-XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  const std::string d = dir_ + "/";
  ok_ =
      sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
         "-keyout " +
         d + "ca.key -out " + d + "ca.pem -days 2 -subj /CN=pdgate-test-root") &&
      sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
         "-keyout " +
         d + "other-ca.key -out " + d +
         "other-ca.pem -days 2 "
         "-subj /CN=pdgate-test-untrusted") &&
      // An intermediate CA: the server's certificate file must carry it.
      sh("openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + d +
         "int.key -out " + d + "int.csr -subj /CN=pdgate-test-intermediate") &&
      write(d + "int.ext", "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign\n") &&
      sh("openssl x509 -req -in " + d + "int.csr -CA " + d + "ca.pem -CAkey " + d +
         "ca.key -set_serial 0x100 -days 2 -extfile " + d + "int.ext -out " + d + "int.pem") &&
      leaf("server", "int", "0x1001", "serverAuth") &&
      leaf("server2", "int", "0x1002", "serverAuth") &&
      leaf("engine", "ca", "0x2001", "serverAuth") &&
      leaf("rogue", "other-ca", "0x3001", "serverAuth") &&
      leaf("client", "ca", "0x4001", "clientAuth") &&
      leaf("elsewhere", "ca", "0x5001", "serverAuth", "subjectAltName=DNS:engine.example");
  // What the gateway serves: the leaf, then the intermediate.
  ok_ = ok_ && write(d + "server-chain.pem", slurp(d + "server.pem") + slurp(d + "int.pem")) &&
        write(d + "server2-chain.pem", slurp(d + "server2.pem") + slurp(d + "int.pem"));
}

Pki::~Pki() {
  std::system(("rm -rf " + dir_).c_str());
}

bool Pki::sh(const std::string& cmd) {
  return run("timeout 60 " + cmd + " 2>&1").exit == 0;
}

bool Pki::write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

bool Pki::leaf(const std::string& name, const std::string& ca, const std::string& serial,
               const std::string& usage, const std::string& san) {
  const std::string d = dir_ + "/";
  return sh("openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
            d + name + ".key -out " + d + name + ".csr -subj /CN=" + name) &&
         write(d + name + ".ext",
               san + "\nbasicConstraints=CA:FALSE\nextendedKeyUsage=" + usage + "\n") &&
         sh("openssl x509 -req -in " + d + name + ".csr -CA " + d + ca + ".pem -CAkey " + d + ca +
            ".key -set_serial " + serial + " -days 2 -extfile " + d + name + ".ext -out " + d +
            name + ".pem");
}

}  // namespace pdgate::test
