// The deployment files (deploy/) against the program they deploy: every
// flag and configuration key they use is one pdgate accepts, the probes
// they point at answer, and `cmake --install` lays out the files the
// container image and the systemd unit expect.
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/integration/harness.hpp"

namespace pdgate::test {
namespace {

namespace fs = std::filesystem;

// What a shell command printed on stdout.
std::string run(const std::string& command) {
  std::string out;
  if (FILE* p = ::popen(command.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
      out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

// Every long flag `pdgate --help` documents.
std::set<std::string> documented_flags() {
  const std::string help = run(build_dir() + "/pdgate --help");
  std::set<std::string> flags;
  static const std::regex flag(R"((?:^|[\s,])(--[a-z][a-z0-9-]*))");
  for (std::sregex_iterator it(help.begin(), help.end(), flag), end; it != end; ++it)
    flags.insert((*it)[1]);
  EXPECT_GT(flags.size(), 40u) << help;
  return flags;
}

// The kustomize base's objects (deploy/kubernetes/base; the overlays are
// rendered and checked against the Kubernetes schemas by
// kubernetes/manifests.test.mjs).
std::vector<YAML::Node> manifests() {
  std::vector<YAML::Node> docs;
  for (const auto& f : fs::directory_iterator(source_dir() + "/deploy/kubernetes/base")) {
    if (f.path().extension() != ".yaml" || f.path().filename() == "kustomization.yaml")
      continue;
    for (auto& d : YAML::LoadAllFromFile(f.path().string()))
      docs.push_back(d);
  }
  EXPECT_GT(docs.size(), 5u);
  return docs;
}

YAML::Node find_kind(const std::vector<YAML::Node>& docs, const std::string& kind,
                     const std::string& name) {
  for (const auto& d : docs) {
    if (d["kind"].as<std::string>() == kind && d["metadata"]["name"].as<std::string>() == name)
      return d;
  }
  ADD_FAILURE() << "no " << kind << " " << name;
  return YAML::Node();
}

YAML::Node pdgate_container(const std::vector<YAML::Node>& docs) {
  const auto dep = find_kind(docs, "Deployment", "pdgate");
  for (const auto& c : dep["spec"]["template"]["spec"]["containers"]) {
    if (c["name"].as<std::string>() == "pdgate")
      return c;
  }
  ADD_FAILURE() << "no pdgate container";
  return YAML::Node();
}

// The manifests' container arguments and their ConfigMap's keys are all
// flags pdgate documents (a renamed flag would break the deployment).
TEST(Deploy, KubernetesFlagsAndKeysExist) {
  const auto flags = documented_flags();
  const auto docs = manifests();
  for (const auto& arg : pdgate_container(docs)["args"]) {
    const auto a = arg.as<std::string>();
    if (a.rfind("--", 0) == 0) {
      EXPECT_TRUE(flags.count(a)) << a << " is not in pdgate --help";
    }
  }
  const auto cfg = YAML::Load(
      find_kind(docs, "ConfigMap", "pdgate-config")["data"]["pdgate.yaml"].as<std::string>());
  ASSERT_TRUE(cfg.IsMap());
  for (const auto& kv : cfg) {
    std::string key = "--" + kv.first.as<std::string>();
    std::replace(key.begin(), key.end(), '_', '-');
    EXPECT_TRUE(flags.count(key)) << key << " (ConfigMap key) is not in pdgate --help";
  }
}

// pdgate starts with the ConfigMap's configuration (listener, Redis and
// the API-keys file overridden for this machine), and the probes the
// Deployment declares answer: liveness 200, readiness 200 or 503 (its
// engines do not resolve here), never 404. The ServiceMonitor's port and
// path serve the metrics, without the admin key, among them the one the
// autoscaler follows.
TEST(Deploy, KubernetesProbesAnswer) {
  const auto docs = manifests();
  const std::string dir =
      fs::temp_directory_path() / ("pdgate-deploy-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir + "/pdgate.yaml")
      << find_kind(docs, "ConfigMap", "pdgate-config")["data"]["pdgate.yaml"].as<std::string>();
  std::ofstream(dir + "/key") << "test-admin-key\n";
  std::ofstream(dir + "/keys.yaml") << "keys: []\n";
  Process gw("pdgate",
             {build_dir() + "/pdgate", "--config", dir + "/pdgate.yaml", "--admin-key-file",
              dir + "/key", "--api-keys", dir + "/keys.yaml", "--host", "127.0.0.1", "--port", "0",
              "--admin-host", "127.0.0.1", "--admin-port", "0", "--redis",
              "redis://127.0.0.1:" + std::to_string(closed_port())});
  const auto client_port = gw.wait_listening();
  const auto admin_port = gw.wait_listening();
  const auto c = pdgate_container(docs);
  // The probes ask the port they name: the client's ("http") or the
  // admin's (which answers them without the key).
  auto port_of = [&](const char* probe) {
    return c[probe]["httpGet"]["port"].as<std::string>() == "admin" ? admin_port : client_port;
  };
  const auto live =
      get(port_of("livenessProbe"), c["livenessProbe"]["httpGet"]["path"].as<std::string>());
  EXPECT_EQ(live.status, 200) << live.body;
  const auto ready =
      get(port_of("readinessProbe"), c["readinessProbe"]["httpGet"]["path"].as<std::string>());
  EXPECT_TRUE(ready.status == 200 || ready.status == 503) << ready.status << " " << ready.body;

  const auto monitor = find_kind(docs, "ServiceMonitor", "pdgate");
  const auto endpoint = monitor["spec"]["endpoints"][0];
  ASSERT_EQ(endpoint["port"].as<std::string>(), "admin");
  const auto metrics = get(admin_port, endpoint["path"].as<std::string>());
  EXPECT_EQ(metrics.status, 200);
  for (const auto& m : find_kind(docs, "HorizontalPodAutoscaler", "pdgate")["spec"]["metrics"]) {
    if (m["type"].as<std::string>() != "Pods")
      continue;
    const auto name = m["pods"]["metric"]["name"].as<std::string>();
    EXPECT_NE(metrics.body.find("\n" + name + " "), std::string::npos) << name;
  }
  fs::remove_all(dir);
}

// The reload sidecar's script as the Deployment gives it to its shell:
// Kubernetes turns `$$` into `$` (and would expand `$(VAR)`, which the
// script does not use).
std::string reload_script(const std::vector<YAML::Node>& docs) {
  const auto dep = find_kind(docs, "Deployment", "pdgate");
  for (const auto& c : dep["spec"]["template"]["spec"]["containers"]) {
    if (c["name"].as<std::string>() != "reload")
      continue;
    const std::string text = c["command"][2].as<std::string>();
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
      out += text[i];
      if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '$')
        ++i;
    }
    return out;
  }
  ADD_FAILURE() << "no reload container";
  return "";
}

// The reload sidecar, run for real: its script from the Deployment (the
// mount paths under a temporary directory, the interval shortened through
// RELOAD_INTERVAL) and pdgate in one PID namespace, as
// shareProcessNamespace gives the pod. A change of the ConfigMap's file
// (written as the kubelet does: a new directory, the ..data link swapped)
// reaches pdgate as a SIGHUP and is in force on /admin/config; a new key in
// the API-keys Secret is accepted after the next one. The namespace also
// keeps the script's `kill -HUP` away from every other pdgate on this
// machine.
TEST(Deploy, ReloadSidecarSignalsPdgateWhenMountedFilesChange) {
  if (run("unshare --pid --fork --mount-proc true 2>&1 && echo ok") != "ok\n")
    GTEST_SKIP() << "no PID namespace can be made here (unshare needs root)";
  const auto docs = manifests();
  const std::string script = reload_script(docs);
  ASSERT_NE(script.find("kill -HUP"), std::string::npos) << script;
  const std::string root =
      fs::temp_directory_path() / ("pdgate-reload-" + std::to_string(::getpid()));
  fs::remove_all(root);
  // A mounted ConfigMap or Secret: files are links into ..data, itself a
  // link to a timestamped directory, swapped whole on a change.
  int generation = 0;
  auto mount = [&](const std::string& path, const std::map<std::string, std::string>& files) {
    const std::string dir = root + path;
    fs::create_directories(dir);
    const std::string gen = "..gen" + std::to_string(++generation);
    fs::create_directories(dir + "/" + gen);
    for (const auto& [name, text] : files) {
      std::ofstream(dir + "/" + gen + "/" + name) << text;
      if (!fs::exists(fs::symlink_status(dir + "/" + name)))
        fs::create_symlink("..data/" + name, dir + "/" + name);
    }
    fs::create_symlink(gen, dir + "/..data_tmp");
    fs::rename(dir + "/..data_tmp", dir + "/..data");
  };
  Sim p("prefill"), d("decode");
  auto config = [&](const std::string& timeout) {
    return "prefill: [" + p.hostport() + "]\ndecode: [" + d.hostport() +
           "]\nhost: 127.0.0.1\nport: 0\nadmin-host: 127.0.0.1\nadmin-port: 0\n"
           "first-byte-timeout: " +
           timeout + "\n";
  };
  const std::string key = "sidecar-test-key";
  const std::string hash = run("printf %s " + key + " | sha256sum").substr(0, 64);
  mount("/etc/pdgate", {{"pdgate.yaml", config("600s")}});
  mount("/etc/pdgate-keys", {{"keys.yaml", "keys: []\n"}});
  mount("/etc/pdgate-admin", {{"key", "admin-key\n"}});
  std::string paths = script;
  for (std::size_t at = 0; (at = paths.find("/etc/pdgate", at)) != std::string::npos;
       at += root.size() + 1)
    paths.insert(at, root);
  // pdgate in the background, the sidecar's shell in the foreground as the
  // namespace's first process: when it ends, so does pdgate.
  const std::string pod = build_dir() + "/pdgate --config " + root +
                          "/etc/pdgate/pdgate.yaml --admin-key-file " + root +
                          "/etc/pdgate-admin/key --api-keys " + root +
                          "/etc/pdgate-keys/keys.yaml & exec /bin/sh -c \"$RELOAD_SCRIPT\"";
  Process pods(
      "reload-pod",
      {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "/bin/sh", "-c", pod},
      {{"RELOAD_SCRIPT", paths}, {"RELOAD_INTERVAL", "0.2"}});
  // unshare passes no SIGTERM on (and the namespace's first process
  // ignores it): SIGKILL ends unshare, and --kill-child the namespace.
  struct EndPod {
    Process& p;
    ~EndPod() {
      p.signal(SIGKILL);
      p.wait();
    }
  } end_pod{pods};
  const auto client_port = pods.wait_listening();
  const auto admin_port = pods.wait_listening();
  auto admin_config = [&] {
    return http_request(admin_port, "GET", "/admin/config", "", {{"X-API-Key", "admin-key"}})
        .json();
  };
  auto models = [&] {
    return http_request(client_port, "GET", "/v1/models", "", {{"Authorization", "Bearer " + key}})
        .status;
  };
  ASSERT_EQ(admin_config()["first-byte-timeout"], "600s") << admin_config().dump();
  EXPECT_EQ(models(), 401);

  const auto t0 = Clock::now();
  mount("/etc/pdgate", {{"pdgate.yaml", config("45s")}});
  EXPECT_TRUE(eventually([&] { return admin_config()["first-byte-timeout"] == "45s"; },
                         std::chrono::seconds(5)))
      << admin_config().dump() << pods.log();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(admin_config()["reloads"]["applied"], 1);

  mount("/etc/pdgate-keys",
        {{"keys.yaml", "keys:\n  - name: sidecar\n    sha256: " + hash + "\n"}});
  EXPECT_TRUE(eventually([&] { return models() == 200; }, std::chrono::seconds(5)))
      << models() << " " << pods.log();
  EXPECT_EQ(admin_config()["reloads"]["applied"], 2);
  // Nothing changed: no more signals.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(admin_config()["reloads"]["applied"], 2);
  fs::remove_all(root);
}

// The systemd unit's ExecStart uses flags pdgate documents.
TEST(Deploy, SystemdUnitFlagsExist) {
  const auto flags = documented_flags();
  std::ifstream in(source_dir() + "/deploy/systemd/pdgate.service");
  std::string line;
  bool seen = false;
  while (std::getline(in, line)) {
    if (line.rfind("ExecStart=", 0) != 0)
      continue;
    seen = true;
    std::istringstream words(line.substr(10));
    for (std::string w; words >> w;) {
      if (w.rfind("--", 0) == 0) {
        EXPECT_TRUE(flags.count(w)) << w;
      }
    }
  }
  EXPECT_TRUE(seen);
}

// `cmake --install` puts the programs, the example configuration the
// image's CMD names, the shipped policies and the unit where deploy/
// expects them.
TEST(Deploy, InstallLayout) {
  const std::string prefix =
      fs::temp_directory_path() / ("pdgate-install-" + std::to_string(::getpid()));
  const std::string out = run(std::string(PDGATE_CMAKE_COMMAND) + " --install " + build_dir() +
                              " --prefix " + prefix + " 2>&1");
  for (const char* f :
       {"bin/pdgate", "bin/pdgate-sim", "etc/pdgate/pdgate.example.yaml",
        "share/pdgate/policies/round_robin.lua", "share/pdgate/policies/prefix_affinity.lua",
        "share/pdgate/systemd/pdgate.service", "share/doc/pdgate/README.md",
        "share/doc/pdgate/docs/protocol.md"}) {
    EXPECT_TRUE(fs::exists(prefix + "/" + f)) << f << "\n" << out;
  }
  // The Dockerfile's CMD names the installed example configuration.
  std::ifstream df(source_dir() + "/deploy/Dockerfile");
  const std::string dockerfile((std::istreambuf_iterator<char>(df)), {});
  EXPECT_NE(dockerfile.find("/opt/pdgate/etc/pdgate/pdgate.example.yaml"), std::string::npos);
  EXPECT_NE(dockerfile.find("--prefix /opt/pdgate"), std::string::npos);
  // The installed program runs.
  EXPECT_NE(run(prefix + "/bin/pdgate --help").find("--prefill"), std::string::npos);
  fs::remove_all(prefix);
}

}  // namespace
}  // namespace pdgate::test
