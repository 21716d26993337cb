// deploy/kubernetes rendered as an operator would (`kubectl kustomize` of
// each overlay, with Secrets made from stand-in files) and checked:
// every object against the Kubernetes API's schema (kubernetes-models,
// ServiceMonitor against the Prometheus Operator's CRD), then what a
// production deployment of pdgate needs (issue 29, item 9). helm and a
// cluster are not needed: kubectl renders offline (scripts/install-deps.sh
// installs Debian's kubernetes-client where there is no kubectl).
//
// Run: PDGATE_SOURCE_DIR=... node --test (ctest: kubernetes_manifests).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseAllDocuments, parse } from "yaml";

import { ConfigMap, Secret, Service } from "kubernetes-models/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const source = resolve(process.env.PDGATE_SOURCE_DIR ?? "../../..");
const kubectl = process.env.PDGATE_KUBECTL ?? "kubectl";

// The schema of each kind the manifests may use; any other kind fails.
const models = {
  "v1/ConfigMap": ConfigMap,
  "v1/Secret": Secret,
  "v1/Service": Service,
  "apps/v1/Deployment": Deployment,
  "autoscaling/v2/HorizontalPodAutoscaler": HorizontalPodAutoscaler,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "networking.k8s.io/v1/NetworkPolicy": NetworkPolicy,
  "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor,
};

// The overlay rendered from a copy of deploy/kubernetes whose secrets/
// holds stand-in files (the real ones are never in git); once per overlay.
const rendered = new Map();
function render(overlay) {
  if (!rendered.has(overlay)) rendered.set(overlay, renderOnce(overlay));
  return structuredClone(rendered.get(overlay));
}

function renderOnce(overlay) {
  const dir = mkdtempSync(join(tmpdir(), "pdgate-k8s-"));
  try {
    cpSync(join(source, "deploy/kubernetes"), dir, { recursive: true });
    const secrets = join(dir, "overlays", overlay, "secrets");
    mkdirSync(secrets, { recursive: true });
    writeFileSync(join(secrets, "admin-key"), "stand-in-admin-key\n");
    writeFileSync(join(secrets, "keys.yaml"), "keys: []\n");
    writeFileSync(join(secrets, "tls.crt"), "stand-in certificate\n");
    writeFileSync(join(secrets, "tls.key"), "stand-in key\n");
    const out = execFileSync(kubectl, ["kustomize", join(dir, "overlays", overlay)], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    });
    return parseAllDocuments(out).map((d) => d.toJS());
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// Checks one object against its kind's schema; throws what is wrong.
// kubernetes-models' validators are compiled from the API's OpenAPI
// schemas, which (as the API server without --validate=strict) let any
// field the schema does not define pass. So the check also watches what
// the validator reads: a compiled validator reads each property its
// schema defines (`data.name`) and enumerates the keys of a map (labels,
// a ConfigMap's data); a key of an object that it neither read nor
// enumerated is a field the schema does not have, a typo.
function checkSchema(d) {
  const Model = models[`${d.apiVersion}/${d.kind}`];
  assert.ok(Model, `no schema known for ${d.apiVersion} ${d.kind}`);
  new Model(d).validate();
  const read = new Map(); // object -> the keys the validator read of it
  const enumerated = new Set(); // objects whose keys it listed: maps
  const watched = (value) => {
    if (value === null || typeof value !== "object") return value;
    return new Proxy(value, {
      get(target, key, receiver) {
        if (typeof key === "string") {
          if (!read.has(target)) read.set(target, new Set());
          read.get(target).add(key);
        }
        return watched(Reflect.get(target, key, receiver));
      },
      has(target, key) {
        if (!read.has(target)) read.set(target, new Set());
        read.get(target).add(String(key));
        return Reflect.has(target, key);
      },
      ownKeys(target) {
        enumerated.add(target);
        return Reflect.ownKeys(target);
      },
    });
  };
  const plain = structuredClone(d);
  Model.prototype.validate.call(watched(plain));
  const unknown = [];
  const walk = (value, path) => {
    if (value === null || typeof value !== "object") return;
    if (Array.isArray(value)) {
      value.forEach((v, i) => walk(v, `${path}[${i}]`));
      return;
    }
    for (const [key, v] of Object.entries(value)) {
      if (!enumerated.has(value) && !read.get(value)?.has(key)) unknown.push(`${path}.${key}`);
      else walk(v, `${path}.${key}`);
    }
  };
  walk(plain, "");
  if (unknown.length > 0)
    throw new Error(`fields the ${d.kind} schema does not define: ${unknown.join(", ")}`);
}

function find(docs, kind, name) {
  const d = docs.find((o) => o.kind === kind && o.metadata.name === name);
  assert.ok(d, `no ${kind} ${name}`);
  return d;
}

const container = (dep, name) => {
  const c = dep.spec.template.spec.containers.find((x) => x.name === name);
  assert.ok(c, `no container ${name}`);
  return c;
};

const matches = (selector, labels) =>
  Object.entries(selector).every(([k, v]) => labels?.[k] === v);

// Metric names pdgate documents (docs/admin.md's table).
const documentedMetrics = () =>
  new Set(
    [...readFileSync(join(source, "docs/admin.md"), "utf8").matchAll(/`(pdgate_[a-z_]+)`/g)].map(
      (m) => m[1],
    ),
  );

for (const overlay of ["dev", "production"]) {
  test(`${overlay}: every object passes its Kubernetes schema`, () => {
    const docs = render(overlay);
    assert.ok(docs.length >= 10, `only ${docs.length} objects`);
    for (const d of docs) {
      assert.doesNotThrow(() => checkSchema(d), `${d.kind} ${d.metadata.name}`);
      assert.equal(d.metadata.namespace, "llm", `${d.kind} ${d.metadata.name}`);
    }
  });

  test(`${overlay}: every ConfigMap and Secret mounted is defined`, () => {
    const docs = render(overlay);
    for (const dep of docs.filter((d) => d.kind === "Deployment")) {
      for (const v of dep.spec.template.spec.volumes ?? []) {
        if (v.secret) find(docs, "Secret", v.secret.secretName);
        if (v.configMap) find(docs, "ConfigMap", v.configMap.name);
      }
    }
    find(docs, "Secret", "pdgate-admin-key");
    find(docs, "Secret", "pdgate-api-keys");
  });

  test(`${overlay}: pdgate's pod drains, reloads and sizes its workers`, () => {
    const docs = render(overlay);
    const dep = find(docs, "Deployment", "pdgate");
    const pod = dep.spec.template.spec;
    const gw = container(dep, "pdgate");
    const config = parse(find(docs, "ConfigMap", "pdgate-config").data["pdgate.yaml"]);

    // Images pinned: a tag, never latest.
    for (const c of docs.flatMap((d) => d.spec?.template?.spec?.containers ?? [])) {
      const tag = c.image.includes("@") ? "digest" : c.image.split(":")[1];
      assert.ok(tag && tag !== "latest", `${c.name}: image ${c.image} is not pinned`);
    }

    // preStop before SIGTERM, and the grace period longer than it plus
    // --shutdown-timeout.
    const preStop = gw.lifecycle?.preStop;
    assert.ok(preStop, "no preStop");
    const pause = Number(preStop.exec?.command?.[1] ?? preStop.sleep?.seconds);
    assert.ok(pause > 0, JSON.stringify(preStop));
    const shutdown = Number(String(config["shutdown-timeout"]).replace(/s$/, ""));
    assert.ok(pod.terminationGracePeriodSeconds > pause + shutdown);

    // workers from the CPU limit: --workers $(VAR), VAR the limit, never
    // `workers: 0` (one per node core).
    assert.equal(config.workers, undefined);
    const at = gw.args.indexOf("--workers");
    assert.ok(at >= 0, "no --workers");
    const ref = gw.args[at + 1].match(/^\$\(([A-Z_]+)\)$/);
    assert.ok(ref, gw.args[at + 1]);
    const env = gw.env.find((e) => e.name === ref[1]);
    assert.equal(env?.valueFrom?.resourceFieldRef?.resource, "limits.cpu");
    assert.equal(env.valueFrom.resourceFieldRef.containerName, "pdgate");
    assert.ok(gw.resources.limits.cpu, "no CPU limit");

    // Probes on the admin port (plain, no key, no client certificate).
    assert.equal(gw.livenessProbe.httpGet.path, "/livez");
    assert.equal(gw.readinessProbe.httpGet.path, "/readyz");
    assert.equal(gw.readinessProbe.httpGet.port, "admin");

    // The reload sidecar shares the PID namespace, watches every
    // ConfigMap and Secret pdgate reads on SIGHUP, and sends SIGHUP.
    assert.equal(pod.shareProcessNamespace, true);
    const reload = container(dep, "reload");
    assert.match(reload.command.join(" "), /kill -HUP/);
    const watched = new Set(reload.volumeMounts.map((m) => m.name));
    for (const m of gw.volumeMounts) {
      if (m.name !== "admin-key") assert.ok(watched.has(m.name), `reload does not watch ${m.name}`);
    }
    for (const m of reload.volumeMounts) assert.match(reload.command.join(" "), new RegExp(m.mountPath));

    // Replicas spread across nodes.
    const anti = pod.affinity?.podAntiAffinity;
    const terms = [
      ...(anti?.requiredDuringSchedulingIgnoredDuringExecution ?? []),
      ...(anti?.preferredDuringSchedulingIgnoredDuringExecution ?? []).map((p) => p.podAffinityTerm),
    ];
    assert.ok(
      terms.some(
        (t) =>
          t.topologyKey === "kubernetes.io/hostname" &&
          matches(t.labelSelector.matchLabels, dep.spec.template.metadata.labels),
      ),
      "no anti-affinity across nodes",
    );
  });

  test(`${overlay}: autoscaled on pdgate's metrics, disruptions bounded`, () => {
    const docs = render(overlay);
    const dep = find(docs, "Deployment", "pdgate");
    const hpa = find(docs, "HorizontalPodAutoscaler", "pdgate");
    assert.equal(hpa.spec.scaleTargetRef.name, "pdgate");
    assert.ok(hpa.spec.minReplicas >= 2);
    const own = hpa.spec.metrics.filter((m) => m.type === "Pods").map((m) => m.pods.metric.name);
    assert.ok(own.length > 0, "no metric of the gateway's own");
    const documented = documentedMetrics();
    for (const name of own) assert.ok(documented.has(name), `${name} is not a pdgate metric`);
    const pdb = find(docs, "PodDisruptionBudget", "pdgate");
    assert.ok(matches(pdb.spec.selector.matchLabels, dep.spec.template.metadata.labels));
  });

  test(`${overlay}: the admin port stays inside the cluster`, () => {
    const docs = render(overlay);
    const dep = find(docs, "Deployment", "pdgate");
    const labels = dep.spec.template.metadata.labels;
    const admin = container(dep, "pdgate").ports.find((p) => p.name === "admin");
    // The client Service (the one a load balancer fronts) has no admin port.
    const client = find(docs, "Service", "pdgate");
    for (const p of client.spec.ports) {
      assert.notEqual(p.targetPort, "admin");
      assert.notEqual(p.targetPort, admin.containerPort);
      assert.notEqual(p.port, admin.containerPort);
    }
    // Every other Service that reaches the admin port is internal.
    for (const s of docs.filter((d) => d.kind === "Service" && matches(d.spec.selector, labels))) {
      if (s.spec.ports.some((p) => p.targetPort === "admin" || p.port === admin.containerPort)) {
        assert.ok(!["LoadBalancer", "NodePort"].includes(s.spec.type), s.metadata.name);
      }
    }
    // The NetworkPolicy admits the admin port only from pods (no ipBlock,
    // no rule open to all), and the client port from anywhere.
    const np = docs.find(
      (d) => d.kind === "NetworkPolicy" && matches(d.spec.podSelector.matchLabels, labels),
    );
    assert.ok(np, "no NetworkPolicy for pdgate");
    assert.ok(np.spec.policyTypes.includes("Ingress"));
    const rules = np.spec.ingress.filter((r) =>
      (r.ports ?? []).some((p) => p.port === "admin" || p.port === admin.containerPort),
    );
    assert.ok(rules.length > 0, "no rule for the admin port");
    for (const r of rules) {
      assert.ok(r.from?.length > 0, "the admin port is open to all");
      for (const f of r.from) assert.equal(f.ipBlock, undefined);
    }
    for (const r of np.spec.ingress) assert.ok(r.ports?.length > 0, "a rule open on every port");
  });

  test(`${overlay}: Prometheus scrapes each replica once`, () => {
    const docs = render(overlay);
    const sm = find(docs, "ServiceMonitor", "pdgate");
    const targets = docs.filter(
      (d) => d.kind === "Service" && matches(sm.spec.selector.matchLabels, d.metadata.labels),
    );
    assert.equal(targets.length, 1, targets.map((t) => t.metadata.name).join(", "));
    for (const e of sm.spec.endpoints) {
      assert.ok(targets[0].spec.ports.some((p) => p.name === e.port), e.port);
      assert.equal(e.path, "/metrics");
    }
  });

  test(`${overlay}: the engines' headless Services are the ones configured and documented`, () => {
    const docs = render(overlay);
    const config = parse(find(docs, "ConfigMap", "pdgate-config").data["pdgate.yaml"]);
    const readme = readFileSync(join(source, "README.md"), "utf8");
    for (const [role, name] of [
      ["prefill", "vllm-prefill-headless"],
      ["decode", "vllm-decode-headless"],
    ]) {
      const svc = find(docs, "Service", name);
      assert.equal(svc.spec.clusterIP, "None", `${name} is not headless`);
      const url = `dns://${name}.${svc.metadata.namespace}.svc.cluster.local:${svc.spec.ports[0].port}`;
      assert.deepEqual(config[role], [url]);
      assert.ok(readme.includes(url), `README does not name ${url}`);
    }
  });
}

test("production: clients over TLS through a load balancer", () => {
  const docs = render("production");
  const tls = find(docs, "Secret", "pdgate-tls");
  assert.equal(tls.type, "kubernetes.io/tls");
  const dep = find(docs, "Deployment", "pdgate");
  const gw = container(dep, "pdgate");
  const mount = gw.volumeMounts.find((m) => m.name === "tls").mountPath;
  assert.equal(gw.args[gw.args.indexOf("--tls-cert") + 1], `${mount}/tls.crt`);
  assert.equal(gw.args[gw.args.indexOf("--tls-key") + 1], `${mount}/tls.key`);
  const lb = find(docs, "Service", "pdgate");
  assert.equal(lb.spec.type, "LoadBalancer");
  assert.deepEqual(
    lb.spec.ports.map((p) => p.targetPort),
    ["http"],
  );
  assert.ok(find(docs, "HorizontalPodAutoscaler", "pdgate").spec.minReplicas >= 3);
});

// A misspelt field is the mistake a schema check is for: the API server
// drops it (or refuses it under --validate=strict), and the setting it
// meant silently never applies. Each of these must fail the check, at any
// depth and in the custom resource too; a map's keys (labels, a
// ConfigMap's data) are anyone's to choose and must not.
test("a field the schema does not know fails the check", () => {
  const docs = render("production");
  const typos = [
    ["Deployment", "pdgate", (d) => (d.spec.replica = 3), /replica\b/],
    [
      "Deployment",
      "pdgate",
      (d) => (d.spec.template.spec.containers[0].imagePulPolicy = "Always"),
      /imagePulPolicy/,
    ],
    [
      "Deployment",
      "pdgate",
      (d) => (d.spec.template.spec.containers[0].resources.limit = { cpu: "1" }),
      /limit\b/,
    ],
    ["Service", "pdgate", (d) => (d.spec.ports[0].targetport = "http"), /targetport/],
    ["ServiceMonitor", "pdgate", (d) => (d.spec.endpoints[0].intervall = "15s"), /intervall/],
    ["HorizontalPodAutoscaler", "pdgate", (d) => (d.spec.minReplica = 2), /minReplica\b/],
  ];
  for (const [kind, name, typo, named] of typos) {
    const d = structuredClone(find(docs, kind, name));
    typo(d);
    assert.throws(() => checkSchema(d), named, `${kind} ${name}: ${typo}`);
  }
  const d = structuredClone(find(docs, "Deployment", "pdgate"));
  d.metadata.labels["example.com/any-name"] = "x";
  d.spec.template.metadata.annotations = { "example.com/any-name": "x" };
  assert.doesNotThrow(() => checkSchema(d));
  const cm = structuredClone(find(docs, "ConfigMap", "pdgate-config"));
  cm.data["any-file.yaml"] = "x: 1\n";
  assert.doesNotThrow(() => checkSchema(cm));
});
