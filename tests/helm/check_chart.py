"""Lints and renders helm/divvy offline for many value sets and checks every
rendered manifest against the Kubernetes schemas of the oldest and newest
Kubernetes the chart supports.

Run by tests/helm.rs with the venv that tests/run-all.sh installs
(helm-python-sdk: Helm's own engine, no helm binary; kubernetes-validate:
bundled Kubernetes JSON schemas). Helm's engine applies the chart's
values.schema.json itself, on lint and on render: the REFUSED value sets
below must fail with an error naming the key. The prometheus-operator custom
resources, which kubernetes-validate has no schema for, are checked against
tests/helm/servicemonitor.schema.json and prometheusrule.schema.json (the
fields the chart uses, as the CRDs define them), and every metric an alert
names must be one divvy's source defines. Exits non-zero on the first
problem. With `--render <values as JSON>`, prints the rendered documents as a
JSON list instead.
"""
import glob
import json
import os
import re
import sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
CHART = os.path.join(ROOT, "helm", "divvy")
# The oldest and the newest Kubernetes the chart is checked against
# (kubernetes-validate bundles both).
KUBE_VERSIONS = ["1.30.0", "1.35.0"]

RATELIMIT_CONFIG = {
    "domain": "edge",
    "descriptors": [{"key": "remote_address", "rate_limit": {"unit": "second", "requests_per_unit": 10}}],
}

VALUE_SETS = {
    "defaults": {},
    "redis-with-secret": {
        "redis": {
            "url": "redis+sentinel://sentinel-0.redis:26379,sentinel-1.redis:26379/mymaster",
            "existingSecret": "redis-auth",
            "existingSecretPasswordKey": "password",
            "onFailure": "deny",
        },
        "replicaCount": 3,
        "readinessRequiresStore": True,
        "rateLimitHeaders": "draft",
        "extraEnv": [{"name": "STATSD_HOST", "value": "statsd.monitoring"}, {"name": "STATSD_PORT", "value": "8125"}],
    },
    "admin-tokens-from-secret": {
        "admin": {"existingSecret": "divvy-admin", "tokenKey": "write", "readTokenKey": "read"},
    },
    "admin-token-only": {
        "admin": {"existingSecret": "divvy-admin", "readTokenKey": ""},
    },
    "autoscaling-and-servicemonitor": {
        "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 12, "targetCPUUtilizationPercentage": 60},
        "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
        "podDisruptionBudget": {"enabled": True, "minAvailable": 2},
        "existingConfigMap": "my-rules",
        "configFileName": "rules.ini",
    },
    "registry-image": {
        "image": {"repository": "registry.example.com/team/divvy", "tag": "0.2.0"},
        "imagePullSecrets": [{"name": "registry-credentials"}],
    },
    "image-digest": {
        "image": {
            "repository": "registry.example.com/team/divvy",
            "digest": "sha256:" + "ab" * 32,
        },
    },
    "grafana-dashboard": {
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "divvy"}},
    },
    "tls": {
        "tls": {
            "grpc": {"secretName": "divvy-grpc-tls", "clientCaSecretName": "envoy-ca", "clientSan": "spiffe://cluster.local/ns/edge/sa/envoy"},
            "admin": {"secretName": "divvy-admin-tls"},
        },
    },
    "network-policy": {
        "networkPolicy": {
            "enabled": True,
            "clients": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}}, "podSelector": {"matchLabels": {"app": "envoy"}}},
            "scrapers": {"namespaceSelector": None, "podSelector": {"matchLabels": {"app": "prometheus"}}},
            "egress": [
                {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                {"to": [{"podSelector": {"matchLabels": {"app": "redis"}}}], "ports": [{"port": 6379, "protocol": "TCP"}]},
            ],
        },
    },
    "prometheus-rule": {
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}, "alertLabels": {"team": "edge"}},
    },
    "headless-priority-extras": {
        "service": {"headless": True},
        "priorityClassName": "system-cluster-critical",
        "memoryLimit": "200Mi",
        "grpc": {"maxConnectionAge": "2m", "maxConnectionAgeGrace": "0"},
        "extraArgs": ["--max-counters=100000"],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"},
            {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"app": "other"}}},
        ],
        "startupProbe": {"enabled": False},
    },
    "openshift-security": {
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "securityContext": {"runAsUser": None, "runAsGroup": None},
        "topologySpreadConstraints": [],
    },
    "config-yaml": {
        "config": {"default": {"creditLimit": 5, "resetSeconds": 60}},
    },
    "config-json": {
        "configFormat": "json",
        "config": {"overrides": [{"operation": {"path": "/api/*"}, "creditLimit": 100, "resetSeconds": 60}], "default": {"creditLimit": 1, "resetSeconds": 0}},
    },
    "config-json-string": {
        "configFileName": "rules.json",
        "config": '{"default": {"creditLimit": 7, "resetSeconds": 60}}',
    },
    "config-ini": {
        "configFormat": "ini",
        "config": "[method=GET path=/status]\nlabel = status\ncreditLimit = 1000\nresetSeconds = 60\n\n[default]\ncreditLimit = 1\nresetSeconds = 0\n",
    },
    "config-ratelimit": {
        "configFormat": "ratelimit",
        "config": RATELIMIT_CONFIG,
    },
    "config-ratelimit-string": {
        "configFormat": "ratelimit",
        "configFileName": "edge.yml",
        "config": yaml.safe_dump(RATELIMIT_CONFIG),
    },
    "default-config-json": {"configFormat": "json"},
    "default-config-ini": {"configFormat": "ini"},
    "default-config-ratelimit": {"configFormat": "ratelimit"},
    # The other forms divvy's parsers take: a duration in days or
    # milliseconds, a size with a B.
    "durations-and-sizes": {
        "memoryLimit": "256MiB",
        "grpc": {"maxConnectionAge": "1d", "maxConnectionAgeGrace": "500ms"},
    },
}

# Values the chart must refuse, and a piece of the error that must name why.
REFUSED = {
    "typo-replicaCout": ({"replicaCout": 2}, "replicaCout"),
    "typo-onFailure-dney": ({"redis": {"onFailure": "dney"}}, "/redis/onFailure"),
    "typo-tls-enabled": ({"tls": {"enabled": True}}, "'enabled'"),
    "bad-configFormat": ({"configFormat": "toml"}, "/configFormat"),
    "config-a-list": ({"config": [1, 2]}, "/config"),
    "ini-config-a-map": ({"configFormat": "ini", "config": {"default": {"creditLimit": 1}}}, "configFormat is ini"),
    "ini-config-no-section": ({"configFormat": "ini", "config": "creditLimit = 1\n"}, "no [section]"),
    "json-config-not-json": ({"configFormat": "json", "config": "default: {creditLimit: 1}"}, "not a json map"),
    "yaml-config-a-list": ({"config": "- a\n- b\n"}, "not a yaml map"),
    "ratelimit-config-no-domain": ({"configFormat": "ratelimit", "config": {"descriptors": []}}, "needs a top-level domain"),
    "ratelimit-under-yaml": ({"config": RATELIMIT_CONFIG}, "set configFormat ratelimit"),
    "file-name-disagrees": ({"configFormat": "json", "configFileName": "rules.yaml"}, "must end in .json"),
    "bad-duration": ({"grpc": {"maxConnectionAge": "5 minutes"}}, "/grpc/maxConnectionAge"),
    # divvy's duration flags take one integer with one unit: no compound
    # Go-style durations, no decimals.
    "duration-compound": ({"grpc": {"maxConnectionAge": "1h30m"}}, "/grpc/maxConnectionAge"),
    "duration-decimal": ({"grpc": {"maxConnectionAgeGrace": "1.5m"}}, "/grpc/maxConnectionAgeGrace"),
    "duration-decimal-seconds": ({"grpc": {"maxConnectionAge": "0.5s"}}, "/grpc/maxConnectionAge"),
    # The ServiceMonitor CRD takes Prometheus durations: integers.
    "scrape-interval-decimal": ({"serviceMonitor": {"interval": "1.5m"}}, "/serviceMonitor/interval"),
    # divvy's size parser: Mi, not mi; and a YAML integer would render as a float.
    "memory-lowercase-mi": ({"memoryLimit": "256mi"}, "/memoryLimit"),
    "memory-integer": ({"memoryLimit": 268435456}, "/memoryLimit"),
    # A client CA or SAN without what it needs renders a pod divvy refuses
    # to start (or one that takes any client).
    "grpc-client-ca-without-tls": ({"tls": {"grpc": {"clientCaSecretName": "envoy-ca"}}}, "tls.grpc.clientCaSecretName needs tls.grpc.secretName"),
    "grpc-client-san-without-ca": ({"tls": {"grpc": {"secretName": "grpc-tls", "clientSan": "envoy"}}}, "tls.grpc.clientSan needs tls.grpc.clientCaSecretName"),
    "network-peer-empty": (
        {"networkPolicy": {"enabled": True, "clients": {"namespaceSelector": None, "podSelector": None}}},
        "a peer needs",
    ),
}

# The securityContext the default values render: the image's user
# (nonroot, 65532), nothing writable, nothing to escalate to.
NONROOT = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532}
CONTAINER_SECURITY = {
    **NONROOT,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
CRD_SCHEMAS = {"ServiceMonitor": "servicemonitor.schema.json", "PrometheusRule": "prometheusrule.schema.json"}


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


# How Helm splits a template's output into manifests (releaseutil's
# SplitManifests): on `---` lines, each document stripped of surrounding
# whitespace; an install then sends each one followed by a single newline.
HELM_SEPARATOR = re.compile(r"(?:^|\s*\n)---\s*")


def documents(manifests):
    """The documents of the rendered files, as the cluster receives them
    (so what Helm trims, e.g. trailing blank lines of a block scalar, is
    trimmed here too)."""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt") or os.path.basename(path).startswith("_"):
            continue
        for piece in HELM_SEPARATOR.split(text.strip()):
            piece = piece.strip()
            if not piece:
                continue
            doc = yaml.safe_load(piece + "\n")
            if doc:
                yield path, doc


def render(values):
    """Prints the manifests `values` (a JSON object) render to, as a JSON
    list of documents (for tests/helm.rs to inspect)."""
    chart = helm.Chart.load(CHART)
    manifests = chart.render(json.loads(values), name="divvy", namespace="divvy", is_install=True)
    print(json.dumps([doc for _, doc in documents(manifests)]))


def source_files():
    """divvy's source: {path: text} of src/**/*.rs."""
    files = {}
    for path in glob.glob(os.path.join(ROOT, "src", "**", "*.rs"), recursive=True):
        with open(path) as f:
            files[path] = f.read()
    return files


def string_literals(text):
    return set(re.findall(r'"([^"\\\n]*)"', text))


def metric_label_strings(files, metric):
    """The string literals of the files that define `metric` or set it:
    the field a metric struct holds it in (`reloads: counter_vec(&r,
    "divvy_reloads_total", ...)`) and every file that uses `.reloads`."""
    fields = set()
    for text in files.values():
        fields.update(re.findall(r'\b(\w+):\s*\w+\(\s*(?:&?\w+,\s*)?"' + re.escape(metric) + '"', text))
    if not fields:
        fail(f"cannot find the field that holds {metric} in src/: extend check_chart.py's scan")
    strings = set()
    for text in files.values():
        if any(re.search(r"\." + f + r"\b", text) or f'"{metric}"' in text for f in fields):
            strings |= string_literals(text)
    return strings


def exported_metrics():
    """Every `divvy_*` metric name a string literal of divvy's source holds
    (histograms add their _bucket, _sum and _count series)."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, "src", "**", "*.rs"), recursive=True):
        with open(path) as f:
            names.update(re.findall(r'"(divvy_[a-z0-9_]+)"', f.read()))
    if len(names) < 20:
        fail(f"found only {len(names)} metric names in src/: the scan is broken")
    return names | {n + s for n in names for s in ("_bucket", "_sum", "_count")}


# A PromQL label matcher: name, operator, quoted value.
MATCHER = re.compile(r'\b([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def check_alert_labels(name, alerts):
    """Every label an alert's expression matches on is one divvy's source
    names, with values the source files that set that metric write (a typo
    such as result="failed" would match nothing and the alert would never
    fire)."""
    files = source_files()
    everything = set().union(*(string_literals(t) for t in files.values()))
    checked = 0
    for alert in alerts:
        expr = str(alert["expr"])
        for metric, matchers in re.findall(r"\b(divvy_[a-z0-9_]+)\{([^}]*)\}", expr):
            strings = metric_label_strings(files, metric)
            for label, op, value in MATCHER.findall(matchers):
                if label not in everything:
                    fail(f"{name}: alert {alert['alert']} matches label {label!r} of {metric}, which divvy's source never names")
                for v in value.split("|") if op in ("=~", "!~") else [value]:
                    if v not in strings:
                        fail(f"{name}: alert {alert['alert']} matches {metric}{{{label}{op}\"{value}\"}}: "
                             f"no source file that sets {metric} writes \"{v}\"")
                checked += 1
    if checked == 0:
        fail(f"{name}: no label matchers found in the alerts: the scan is broken")
    return checked


def check_alerts(name, rule, metrics):
    """Every alert names only metrics divvy exports, and label values its
    source writes."""
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    want = {"DivvyStoreFailing", "DivvyStoreBreakerOpen", "DivvyConfigReloadFailing", "DivvyXdsUpdateRejected",
            "DivvyTlsCertificateExpiring", "DivvyXdsStreamDown", "DivvyGlobalQuotaFallback"}
    if {a["alert"] for a in alerts} != want:
        fail(f"{name}: alerts {sorted(a['alert'] for a in alerts)}, expected {sorted(want)}")
    for alert in alerts:
        used = set(re.findall(r"\bdivvy_[a-z0-9_]+", str(alert["expr"])))
        if not used:
            fail(f"{name}: alert {alert['alert']} names no divvy metric: {alert['expr']}")
        unknown = used - metrics
        if unknown:
            fail(f"{name}: alert {alert['alert']} uses {sorted(unknown)}, which divvy's source does not define")
    print(f"ok: alerts: {check_alert_labels(name, alerts)} label matchers name labels and values divvy's source writes")
    return len(alerts)


def check_refused(chart):
    for name, (values, needle) in REFUSED.items():
        try:
            chart.render(values, name="divvy", namespace="divvy", is_install=True)
        except helm.HelmError as e:
            if needle not in str(e):
                fail(f"refused {name}: the error does not name {needle!r}: {e}")
            first = str(e).strip().splitlines()[-1].strip()
            print(f"ok: refused: {name}: {first}")
            continue
        fail(f"refused {name}: {values} rendered, but the chart must refuse it")


def validate(name, path, doc, crd_schemas):
    kind = doc.get("kind")
    if kind in crd_schemas:
        try:
            jsonschema.validate(doc, crd_schemas[kind])
        except jsonschema.ValidationError as e:
            fail(f"{name}: {path}: {e.message}")
        return
    for kube in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except Exception as e:  # the library raises several error types
            fail(f"{name}: {path}: Kubernetes {kube}: {type(e).__name__}: {e}")


def main():
    crd_schemas = {}
    for kind, file in CRD_SCHEMAS.items():
        with open(os.path.join(HERE, file)) as f:
            crd_schemas[kind] = json.load(f)
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        app_version = yaml.safe_load(f)["appVersion"]
    metrics = exported_metrics()
    chart = helm.Chart.load(CHART)
    check_refused(chart)
    checked = 0
    for name, values in VALUE_SETS.items():
        for kube in KUBE_VERSIONS:
            report = helm.lint(CHART, values, strict=True, kube_version=f"v{kube}")
            problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
            if report.get("errors") or problems:
                fail(f"{name}: helm lint (Kubernetes {kube}): {report}")
        manifests = chart.render(values, name="divvy", namespace="divvy", is_install=True)
        kinds = {}
        for path, doc in documents(manifests):
            validate(name, path, doc, crd_schemas)
            kinds.setdefault(doc.get("kind"), []).append(doc)
            checked += 1
        deployment = (kinds.get("Deployment") or fail(f"{name}: no Deployment"))[0]
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        if name != "openshift-security":
            security = container["securityContext"]
            for key, want in CONTAINER_SECURITY.items():
                if security.get(key) != want:
                    fail(f"{name}: container securityContext {key} is {security.get(key)!r}, not {want!r}")
            for key, want in NONROOT.items():
                if pod["securityContext"].get(key) != want:
                    fail(f"{name}: pod securityContext {key} is {pod['securityContext'].get(key)!r}, not {want!r}")
        if container["imagePullPolicy"] != "IfNotPresent":
            fail(f"{name}: imagePullPolicy {container['imagePullPolicy']}")
        image = values.get("image", {})
        if image.get("digest"):
            want_image = f"{image['repository']}@{image['digest']}"
        else:
            want_image = f"{image.get('repository', 'divvy')}:{image.get('tag', app_version)}"
        if container["image"] != want_image:
            fail(f"{name}: image {container['image']}, expected {want_image}")
        check_probes(name, values, container)
        check_mounts(name, container, pod)
        services = {s["metadata"]["name"]: s for s in kinds["Service"]}
        ports = {p["name"]: p["port"] for p in services["divvy"]["spec"]["ports"]}
        if ports != {"grpc": 8081, "divvy": 8321, "http": 8080}:
            fail(f"{name}: service ports {ports}")
        args = container["args"]
        env = {e["name"]: e for e in container["env"]}
        check_common_args(name, values, args, env)
        check_test_pod(name, values, kinds, args)
        check_set(name, values, kinds, deployment, pod, container, args, env, metrics)
        print(f"ok: {name}: lint clean, {len(kinds)} kinds rendered and valid for Kubernetes "
              f"{' and '.join(KUBE_VERSIONS)}, image {container['image']}")
    print(f"{checked} manifests valid")


def check_probes(name, values, container):
    scheme = "HTTPS" if values.get("tls", {}).get("admin", {}).get("secretName") else "HTTP"
    probes = {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    if values.get("startupProbe", {}).get("enabled", True):
        probes["startupProbe"] = "/healthz"
    elif "startupProbe" in container:
        fail(f"{name}: startupProbe disabled but rendered")
    for probe, path in probes.items():
        get = (container.get(probe) or fail(f"{name}: no {probe}"))["httpGet"]
        if get["path"] != path or get["port"] != "http" or get.get("scheme") != scheme:
            fail(f"{name}: {probe} is {get}, expected {path} on http over {scheme}")


def check_mounts(name, container, pod):
    """The rules and every Secret mounted as directories: no subPath."""
    mounts = container["volumeMounts"]
    if any("subPath" in m or "subPathExpr" in m for m in mounts):
        fail(f"{name}: a mount uses subPath, so updates would never reach the pod: {mounts}")
    if mounts[0] != {"name": "rules", "mountPath": "/etc/divvy", "readOnly": True}:
        fail(f"{name}: the rules must be mounted as the directory /etc/divvy: {mounts[0]}")
    volumes = {v["name"] for v in pod["volumes"]}
    missing = {m["name"] for m in mounts} - volumes
    if missing:
        fail(f"{name}: mounts without a volume: {missing}")


def check_common_args(name, values, args, env):
    if "--ready-without-store" in args:
        fail(f"{name}: --ready-without-store is a no-op; the chart must not pass it")
    requires = values.get("readinessRequiresStore", False)
    if ("--ready-requires-store" in args) != requires:
        fail(f"{name}: readinessRequiresStore {requires}: args {args}")
    grpc = {"maxConnectionAge": "5m", "maxConnectionAgeGrace": "30s", **values.get("grpc", {})}
    for flag, key in (("--grpc-max-connection-age", "maxConnectionAge"), ("--grpc-max-connection-age-grace", "maxConnectionAgeGrace")):
        if f"{flag}={grpc[key]}" not in args:
            fail(f"{name}: {flag}={grpc[key]} missing: {args}")
    memory = env.get("DIVVY_MEMORY_LIMIT") or fail(f"{name}: no DIVVY_MEMORY_LIMIT")
    if values.get("memoryLimit"):
        if memory != {"name": "DIVVY_MEMORY_LIMIT", "value": values["memoryLimit"]}:
            fail(f"{name}: memoryLimit {memory}")
    else:
        ref = memory.get("valueFrom", {}).get("resourceFieldRef", {})
        if (ref.get("containerName"), ref.get("resource")) != ("divvy", "limits.memory"):
            fail(f"{name}: DIVVY_MEMORY_LIMIT must come from the downward API's limits.memory: {memory}")
    refs = {k: env[k]["valueFrom"]["secretKeyRef"] for k in ("DIVVY_ADMIN_TOKEN", "DIVVY_ADMIN_READ_TOKEN") if k in env}
    want_refs = {
        "admin-tokens-from-secret": {
            "DIVVY_ADMIN_TOKEN": {"name": "divvy-admin", "key": "write"},
            "DIVVY_ADMIN_READ_TOKEN": {"name": "divvy-admin", "key": "read"},
        },
        "admin-token-only": {"DIVVY_ADMIN_TOKEN": {"name": "divvy-admin", "key": "admin-token"}},
    }.get(name, {})
    if refs != want_refs:
        fail(f"{name}: admin token references {refs}, expected {want_refs}")


def check_test_pod(name, values, kinds, args):
    """The helm test pod checks the rules the pods read, then asks the Service for /readyz."""
    tests = [p for p in kinds.get("Pod", []) if p["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    if len(tests) != 1:
        fail(f"{name}: {len(tests)} helm test pods")
    spec = tests[0]["spec"]
    config = next(a.split("=", 1)[1] for a in args if a.startswith("--config="))
    check = spec["initContainers"][0]
    if check["args"] != ["check", config]:
        fail(f"{name}: the test pod checks {check['args']}, the pods read {config}")
    if check["volumeMounts"][0]["mountPath"] != "/etc/divvy" or spec["volumes"][0]["configMap"]["name"] != values.get("existingConfigMap", "divvy"):
        fail(f"{name}: the test pod must mount the rules' ConfigMap at /etc/divvy")
    probe = spec["containers"][0]["args"]
    tls = bool(values.get("tls", {}).get("admin", {}).get("secretName"))
    url = f"{'https' if tls else 'http'}://divvy.divvy.svc:8080/readyz"
    if probe[0] != "probe" or probe[-1] != url or (("--ca=/etc/divvy-tls/admin/ca.crt" in probe) != tls):
        fail(f"{name}: the test pod's probe is {probe}, expected {url}")


def check_set(name, values, kinds, deployment, pod, container, args, env, metrics):
    """What one value set is about."""
    if name == "defaults":
        config_map = (kinds.get("ConfigMap") or fail("defaults: no rules ConfigMap"))[0]
        if "divvy.yaml" not in config_map["data"] or "--config=/etc/divvy/divvy.yaml" not in args:
            fail("defaults: the inline rules ConfigMap is missing")
        if deployment["spec"]["replicas"] != 1:
            fail("defaults: one replica with the memory store")
        if any(a.startswith("--redis-url") for a in args):
            fail("defaults: redis must be off")
        for kind in ("HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule", "NetworkPolicy"):
            if kind in kinds:
                fail(f"defaults: {kind} is opt-in")
        if len(kinds["Service"]) != 1:
            fail("defaults: one Service")
        spread = pod.get("topologySpreadConstraints") or fail("defaults: no topology spread")
        want = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                 "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}}]
        if spread != want:
            fail(f"defaults: topology spread {spread}, expected {want}")
        if "priorityClassName" in pod:
            fail("defaults: no priorityClassName")
        # divvy sizes its counters to limits.memory and uses it: a smaller
        # request would make the pod Burstable and evictable under pressure.
        resources = container["resources"]
        if resources["requests"].get("memory") != resources["limits"].get("memory"):
            fail(f"defaults: the memory request must equal the limit: {resources}")
    if name == "redis-with-secret":
        ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        if ref != {"name": "redis-auth", "key": "password"}:
            fail(f"redis-with-secret: password reference {ref}")
        for want in ("--redis-url=redis+sentinel://sentinel-0.redis:26379,sentinel-1.redis:26379/mymaster",
                     "--on-store-failure=deny", "--rate-limit-headers=draft", "--redis-batches-in-flight=1"):
            if want not in args:
                fail(f"redis-with-secret: {want} missing: {args}")
    if name == "autoscaling-and-servicemonitor":
        hpa = (kinds.get("HorizontalPodAutoscaler") or fail("no HPA"))[0]
        if hpa["spec"]["maxReplicas"] != 12 or "replicas" in deployment["spec"]:
            fail("autoscaling: the HPA owns the replica count")
        if "ServiceMonitor" not in kinds:
            fail("no ServiceMonitor")
        if "ConfigMap" in kinds:
            fail("existingConfigMap: the chart must not create one")
        if pod["volumes"][0]["configMap"]["name"] != "my-rules":
            fail("existingConfigMap is not mounted")
        if "--config=/etc/divvy/rules.ini" not in args:
            fail(f"configFileName: args {args}")
        if kinds["PodDisruptionBudget"][0]["spec"].get("minAvailable") != 2:
            fail("PDB minAvailable")
    if name == "registry-image" and pod.get("imagePullSecrets") != [{"name": "registry-credentials"}]:
        fail(f"registry-image: imagePullSecrets {pod.get('imagePullSecrets')}")
    if name == "tls":
        check_tls(args, container, pod)
    if name == "network-policy":
        check_network_policy((kinds.get("NetworkPolicy") or fail("network-policy: none rendered"))[0])
    if name == "prometheus-rule":
        rule = (kinds.get("PrometheusRule") or fail("prometheus-rule: none rendered"))[0]
        if rule["metadata"]["labels"].get("release") != "prometheus":
            fail("prometheus-rule: labels")
        if any(r["labels"].get("team") != "edge" for g in rule["spec"]["groups"] for r in g["rules"]):
            fail("prometheus-rule: alertLabels")
        expiring = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "DivvyTlsCertificateExpiring"]
        if not expiring or "< 604800" not in expiring[0]["expr"]:
            fail(f"prometheus-rule: certificates must alert 7 days ahead: {expiring}")
        print(f"ok: alerts: {check_alerts(name, rule, metrics)} alerts name only metrics divvy exports")
    if name == "headless-priority-extras":
        headless = [s for s in kinds["Service"] if s["metadata"]["name"] == "divvy-headless"]
        if len(headless) != 1 or headless[0]["spec"].get("clusterIP") != "None":
            fail(f"headless: {kinds['Service']}")
        if pod.get("priorityClassName") != "system-cluster-critical":
            fail("priorityClassName")
        if "--max-counters=100000" not in args:
            fail(f"extraArgs: {args}")
        if {"name": "scratch", "emptyDir": {}} not in pod["volumes"] or not any(m["name"] == "scratch" for m in container["volumeMounts"]):
            fail("extraVolumes / extraVolumeMounts")
        spread = pod["topologySpreadConstraints"]
        if spread[0]["labelSelector"] != {"matchLabels": deployment["spec"]["selector"]["matchLabels"]} or spread[1]["labelSelector"] != {"matchLabels": {"app": "other"}}:
            fail(f"topology spread label selectors: {spread}")
    if name == "openshift-security":
        for ctx, keys in ((pod["securityContext"], ("runAsUser", "runAsGroup", "fsGroup")), (container["securityContext"], ("runAsUser", "runAsGroup"))):
            if any(k in ctx for k in keys) or ctx.get("runAsNonRoot") is not True:
                fail(f"openshift-security: null must drop the uid and gid and keep the rest: {ctx}")
        if "topologySpreadConstraints" in pod:
            fail("openshift-security: [] turns the topology spread off")


def check_tls(args, container, pod):
    """The Secrets mounted as directories, the flags naming files in them, probes over HTTPS."""
    want_args = [
        "--grpc-tls-cert=/etc/divvy-tls/grpc/tls.crt",
        "--grpc-tls-key=/etc/divvy-tls/grpc/tls.key",
        "--grpc-tls-client-ca=/etc/divvy-tls/grpc-client-ca/ca.crt",
        "--grpc-tls-client-san=spiffe://cluster.local/ns/edge/sa/envoy",
        "--http-tls-cert=/etc/divvy-tls/admin/tls.crt",
        "--http-tls-key=/etc/divvy-tls/admin/tls.key",
    ]
    missing = [a for a in want_args if a not in args]
    if missing:
        fail(f"tls: args {missing} missing: {args}")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    want = {"/etc/divvy-tls/grpc": "divvy-grpc-tls", "/etc/divvy-tls/grpc-client-ca": "envoy-ca", "/etc/divvy-tls/admin": "divvy-admin-tls"}
    got = {path: secrets.get(mounts.get(path)) for path in want}
    if got != want:
        fail(f"tls: Secret mounts {got}, expected {want}")


def check_network_policy(policy):
    spec = policy["spec"]
    if spec["policyTypes"] != ["Ingress", "Egress"] or len(spec["egress"]) != 2:
        fail(f"network-policy: egress rules must be applied: {spec}")
    clients, admin = spec["ingress"]
    if {p["port"] for p in clients["ports"]} != {"grpc", "divvy"} or [p["port"] for p in admin["ports"]] != ["http"]:
        fail(f"network-policy: ports {spec['ingress']}")
    if clients["from"] != [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}}, "podSelector": {"matchLabels": {"app": "envoy"}}}]:
        fail(f"network-policy: clients {clients['from']}")
    if admin["from"][0] != {"podSelector": {"matchLabels": {"app": "prometheus"}}}:
        fail(f"network-policy: scrapers {admin['from']} (a null namespaceSelector is left out)")
    if admin["from"][1]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") != "helm-test":
        fail("network-policy: the helm test pod must reach the admin port")


if len(sys.argv) == 3 and sys.argv[1] == "--render":
    render(sys.argv[2])
else:
    main()
