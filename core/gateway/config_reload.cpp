#include "core/gateway/config_reload.hpp"

#include <set>

#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>

#include "core/upstream/instance_address.hpp"

namespace pdgate {

namespace net = boost::asio;

namespace {

struct Listed {
  Role role;
  const std::vector<UpstreamSpec>* before;
  const std::vector<UpstreamSpec>* after;
};

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items)
    out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

net::awaitable<ClusterIds> cluster_ids_for(const Registry& registry, const Config& after) {
  std::vector<NewInstance> fresh;
  for (const auto* list : {&after.prefill, &after.decode, &after.encode}) {
    for (const auto& spec : *list) {
      if (!registry.find(spec.role, spec.url))
        fresh.push_back({spec, {}, 1, true});
    }
  }
  co_await registry.take_cluster_ids(fresh);
  ClusterIds ids;
  for (const auto& n : fresh) {
    if (n.id != 0)
      ids.emplace(cluster_id_key(n.spec.role, n.spec.url, n.spec.dp_size), n.id);
  }
  co_return ids;
}

InstanceChanges reconcile_instances(Registry& registry, const Config& before, const Config& after,
                                    const ClusterIds& ids) {
  InstanceChanges out;
  const Listed lists[] = {{Role::prefill, &before.prefill, &after.prefill},
                          {Role::decode, &before.decode, &after.decode},
                          {Role::encode, &before.encode, &after.encode}};
  std::vector<NewInstance> added;
  for (const auto& l : lists) {
    std::set<std::string> wanted;
    for (const auto& spec : *l.after) {
      wanted.insert(spec.url);
      if (auto inst = registry.find(l.role, spec.url)) {
        const bool meta_changed = *inst->labels() != spec.labels || inst->weight() != spec.weight;
        if (meta_changed) {
          (void)registry.update(inst->id, spec.labels, spec.weight);
          out.lines.push_back(std::string(to_string(l.role)) + " " + spec.url + " (id " +
                              std::to_string(inst->id) + "): labels/weight updated");
        }
        // An instance the previous config removed and this one lists again
        // while it still drains: back in service under its id.
        if (inst->remove_when_idle.load() || inst->draining.load()) {
          auto undrained = registry.undrain(inst->id);
          if (undrained.error) {
            // Being removed: a fresh instance takes its place once gone.
            out.lines.push_back(std::string(to_string(l.role)) + " " + spec.url +
                                " is still being removed; list it again in a later reload");
          } else {
            out.lines.push_back(std::string(to_string(l.role)) + " " + spec.url + " (id " +
                                std::to_string(inst->id) + "): back in service");
          }
        }
        continue;
      }
      const auto id = ids.find(cluster_id_key(spec.role, spec.url, spec.dp_size));
      added.push_back({spec, spec.labels, spec.weight, true, id != ids.end() ? id->second : 0});
    }
    for (const auto& spec : *l.before) {
      if (wanted.count(spec.url) != 0)
        continue;
      if (auto inst = registry.find(l.role, spec.url)) {
        (void)registry.drain(inst->id, true);
        out.lines.push_back(std::string(to_string(l.role)) + " " + spec.url + " (id " +
                            std::to_string(inst->id) +
                            "): removed (draining its in-flight requests)");
      }
    }
  }
  const auto outcomes = registry.add(std::move(added));
  for (const auto& o : outcomes) {
    if (o.instance) {
      out.lines.push_back(std::string(to_string(o.instance->spec.role)) + " " +
                          o.instance->spec.url + " (id " + std::to_string(o.instance->id) +
                          "): added");
    } else {
      out.lines.push_back("not added: " + o.error->message);
    }
  }
  return out;
}

ConfigReloader::ConfigReloader(net::any_io_executor control, Config running, Hooks hooks)
    : control_(std::move(control)),
      running_(std::make_shared<const Config>(std::move(running))),
      hooks_(std::move(hooks)) {}

void ConfigReloader::reload() {
  if (busy_) {
    again_ = true;
    return;
  }
  busy_ = true;
  net::co_spawn(control_, run(), net::detached);
}

net::awaitable<void> ConfigReloader::run() {
  do {
    again_ = false;
    auto r = co_await once();
    if (r) {
      ++applied_;
    } else {
      ++refused_;
      spdlog::error("SIGHUP: configuration refused, nothing changed:\n{}", r.error());
      if (hooks_.refused)
        hooks_.refused(r.error());
    }
  } while (again_);
  busy_ = false;
}

net::awaitable<Result<bool>> ConfigReloader::once() {
  auto read = hooks_.read();
  if (!read)
    co_return fail(read.error());
  const Config& before = *running_;
  const ConfigDiff diff = diff_config(before, *read);
  Config merged = reloadable_part(before, std::move(*read));
  auto valid = validate(std::move(merged));
  if (!valid)
    co_return fail(valid.error());
  auto next = std::make_shared<const Config>(std::move(*valid));
  // Names resolve off every loop (Asio's resolver thread), bounded like an
  // admin add's.
  auto ex = co_await net::this_coro::executor;
  auto dups = co_await resolved_duplicates(
      ex, *next, std::chrono::steady_clock::now() + next->model_check_timeout);
  if (!dups.empty()) {
    std::string all;
    for (const auto& d : dups)
      all += (all.empty() ? "" : "\n") + d;
    co_return fail(all);
  }
  // Before the policies switch: a certificate that does not load refuses
  // the reload with nothing changed.
  std::function<void()> install_tls;
  if (hooks_.prepare_tls) {
    auto t = hooks_.prepare_tls();
    if (!t)
      co_return fail("TLS: " + t.error());
    install_tls = std::move(*t);
  }
  std::function<void()> install_keys;
  if (hooks_.prepare_keys) {
    auto k = hooks_.prepare_keys();
    if (!k)
      co_return fail("API keys: " + k.error());
    install_keys = std::move(*k);
  }
  if (hooks_.reload_policies) {
    if (auto p = hooks_.reload_policies(*next); !p)
      co_return fail("policies: " + p.error());
  }
  if (install_tls) {
    install_tls();
    spdlog::info("SIGHUP: TLS certificate and key reloaded; new connections use them");
  }
  if (install_keys)
    install_keys();
  if (!next->log_level.empty() && next->log_level != before.log_level)
    spdlog::set_level(spdlog::level::from_str(next->log_level));
  ClusterIds ids;
  if (hooks_.cluster_ids)
    ids = co_await hooks_.cluster_ids(*next);
  auto previous = running_;
  running_ = next;
  if (hooks_.apply)
    hooks_.apply(*previous, next, diff.restart_needed, ids);
  if (diff.applied.empty() && diff.restart_needed.empty())
    spdlog::info("SIGHUP: configuration unchanged");
  if (!diff.applied.empty())
    spdlog::info("SIGHUP: applied {}", joined(diff.applied));
  for (const auto& key : diff.restart_needed) {
    spdlog::warn("SIGHUP: {} changed but needs a restart; still running with {}", key, [&] {
      for (const auto& e : effective_config(*previous)) {
        // "prefill-servers-urls (disable)" names its key first.
        if (key == e.key || key.starts_with(e.key + " "))
          return joined(e.values);
      }
      return std::string("its old value");
    }());
  }
  co_return true;
}

}  // namespace pdgate
