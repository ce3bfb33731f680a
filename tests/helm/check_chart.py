"""Lints and renders helm/divvy offline for several value sets and checks
every rendered manifest against the Kubernetes schemas.

Run by tests/helm.rs with the venv that tests/run-all.sh installs
(helm-python-sdk: Helm's own engine, no helm binary; kubernetes-validate:
bundled Kubernetes JSON schemas). The ServiceMonitor, a prometheus-operator
custom resource that kubernetes-validate has no schema for, is checked
against tests/helm/servicemonitor.schema.json (the fields the chart uses, as
the CRD defines them). Exits non-zero on the first problem. With
`--render <values as JSON>`, prints the rendered documents as a JSON list
instead.
"""
import json
import os
import sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "..", "..", "helm", "divvy")
KUBE = "1.33.0"

VALUE_SETS = {
    "defaults": {},
    "redis-with-secret": {
        "redis": {
            "url": "redis+sentinel://sentinel-0.redis:26379,sentinel-1.redis:26379/mymaster",
            "existingSecret": "redis-auth",
            "existingSecretPasswordKey": "password",
            "onFailure": "deny",
        },
        "readinessRequiresStore": False,
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
    "grafana-dashboard": {
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "divvy"}},
    },
}

# The securityContext every value set must render: the image's user
# (nonroot, 65532), nothing writable, nothing to escalate to.
NONROOT = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532}
CONTAINER_SECURITY = {
    **NONROOT,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def documents(manifests):
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def render(values):
    """Prints the manifests `values` (a JSON object) render to, as a JSON
    list of documents (for tests/helm.rs to inspect)."""
    chart = helm.Chart.load(CHART)
    manifests = chart.render(json.loads(values), name="divvy", namespace="divvy", is_install=True)
    print(json.dumps([doc for _, doc in documents(manifests)]))


def main():
    with open(os.path.join(HERE, "servicemonitor.schema.json")) as f:
        servicemonitor_schema = json.load(f)
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        app_version = yaml.safe_load(f)["appVersion"]
    chart = helm.Chart.load(CHART)
    checked = 0
    for name, values in VALUE_SETS.items():
        report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE}")
        problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        if report.get("errors") or problems:
            fail(f"{name}: helm lint: {report}")
        manifests = chart.render(values, name="divvy", namespace="divvy", is_install=True)
        kinds = {}
        for path, doc in documents(manifests):
            kind = doc.get("kind")
            kinds[kind] = doc
            if kind == "ServiceMonitor":
                try:
                    jsonschema.validate(doc, servicemonitor_schema)
                except jsonschema.ValidationError as e:
                    fail(f"{name}: {path}: {e.message}")
            else:
                try:
                    kubernetes_validate.validate(doc, KUBE, strict=True)
                except Exception as e:  # the library raises several error types
                    fail(f"{name}: {path}: {type(e).__name__}: {e}")
            checked += 1
        deployment = kinds.get("Deployment") or fail(f"{name}: no Deployment")
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
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
        want_image = f"{image.get('repository', 'divvy')}:{image.get('tag', app_version)}"
        if container["image"] != want_image:
            fail(f"{name}: image {container['image']}, expected {want_image}")
        if container["livenessProbe"]["httpGet"]["path"] != "/healthz":
            fail(f"{name}: liveness probe")
        if container["readinessProbe"]["httpGet"]["path"] != "/readyz":
            fail(f"{name}: readiness probe")
        mount = container["volumeMounts"][0]
        if "subPath" in mount or mount["mountPath"] != "/etc/divvy":
            fail(f"{name}: the rules must be mounted as a directory without subPath")
        ports = {p["name"]: p["port"] for p in kinds["Service"]["spec"]["ports"]}
        if ports != {"grpc": 8081, "divvy": 8321, "http": 8080}:
            fail(f"{name}: service ports {ports}")
        args = container["args"]
        env = {e["name"]: e for e in container["env"]}
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
        if name == "defaults":
            if "ConfigMap" not in kinds or "divvy.yaml" not in kinds["ConfigMap"]["data"]:
                fail("defaults: the inline rules ConfigMap is missing")
            if any(a.startswith("--redis-url") for a in args):
                fail("defaults: redis must be off")
            if "HorizontalPodAutoscaler" in kinds or "ServiceMonitor" in kinds:
                fail("defaults: HPA and ServiceMonitor are opt-in")
        if name == "redis-with-secret":
            env = {e["name"]: e for e in container["env"]}
            ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
            if ref != {"name": "redis-auth", "key": "password"}:
                fail(f"redis-with-secret: password reference {ref}")
            if "--redis-url=redis+sentinel://sentinel-0.redis:26379,sentinel-1.redis:26379/mymaster" not in args:
                fail(f"redis-with-secret: args {args}")
            if "--ready-without-store" not in args:
                fail(f"redis-with-secret: readinessRequiresStore false: args {args}")
            if "--on-store-failure=deny" not in args or "--rate-limit-headers=draft" not in args:
                fail(f"redis-with-secret: args {args}")
            if "--redis-batches-in-flight=1" not in args:
                fail(f"redis-with-secret: redis.batchesInFlight default: args {args}")
        if name == "autoscaling-and-servicemonitor":
            hpa = kinds.get("HorizontalPodAutoscaler") or fail("no HPA")
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
            if kinds["PodDisruptionBudget"]["spec"].get("minAvailable") != 2:
                fail("PDB minAvailable")
        if name == "registry-image" and pod.get("imagePullSecrets") != [{"name": "registry-credentials"}]:
            fail(f"registry-image: imagePullSecrets {pod.get('imagePullSecrets')}")
        print(f"ok: {name}: lint clean, {len(kinds)} kinds rendered and valid, image {container['image']}")
    print(f"{checked} manifests valid")


if len(sys.argv) == 3 and sys.argv[1] == "--render":
    render(sys.argv[2])
else:
    main()
