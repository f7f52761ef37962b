#!/usr/bin/env python3
"""Offline checks of deploy/: the container image's Dockerfile and the Helm chart. No cluster, no
Docker daemon, no network (beyond installing deploy/requirements.txt, which the callers do).

    python deploy/check.py                 # every check; exit 1 listing every failure
    python deploy/check.py --write         # re-render deploy/manifests/ from the chart
    python deploy/check.py --runtime DIR   # the default render's config file and environment, for
                                           # tests/e2e/deploy.rs to start the real binary with

Helm: the `helm` CLI is in none of the package registries this project installs from, so the
chart is linted and rendered by Helm's own Go SDK (v4) through `helm-python-sdk`, whose wheel
carries it as a shared library: the same loader, linter and template engine as `helm lint` and
`helm template`. The rendered stream is assembled as `helm template` prints it (install order,
`# Source:` headers), so a `helm template` with the command in each manifest's header gives the
same documents.

Schemas: every rendered object is validated against Kubernetes' own OpenAPI schemas
(`kubernetes-validate`, strict: unknown fields fail) for the chart's oldest supported Kubernetes and
the newest bundled; the ServiceMonitor against the Prometheus Operator's CRD (its pydantic models,
plus a walk that rejects fields the CRD does not have).
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "switchyard"
MANIFESTS = DEPLOY / "manifests"
DOCKERFILE = DEPLOY / "Dockerfile"
CONTAINER_CONFIG = DEPLOY / "container" / "switchyard.yaml"

RELEASE = "switchyard"
NAMESPACE = "default"
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
# The chart's kubeVersion floor (Chart.yaml) and the newest schemas kubernetes-validate bundles.
KUBE_VERSIONS = ["1.25.0", "1.37.0"]
# `helm lint` warns about dependencies declared but not under charts/: the optional Redis and
# PostgreSQL charts are fetched by `helm dependency build` only by those who enable them.
ALLOWED_LINT_WARNINGS = [re.compile(r"^chart directory is missing these dependencies: redis,postgresql$")]


class Render:
    """One named set of values and what the chart renders from it."""

    def __init__(self, name: str, values: dict[str, Any], api_versions: list[str], committed: str | None):
        self.name = name
        self.values = values
        self.api_versions = api_versions
        # The file under deploy/manifests/ this render must equal, if any.
        self.committed = committed
        self.templates: dict[str, str] = {}
        self.docs: list[dict[str, Any]] = []

    def helm_command(self) -> str:
        args = ["helm", "template", RELEASE, "deploy/helm/switchyard"]
        if self.committed == "switchyard-fleet.yaml":
            args += ["-f", "deploy/helm/switchyard/ci/fleet-values.yaml"]
        for api in self.api_versions:
            args += ["--api-versions", api]
        return " ".join(args)


def fleet_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "ci" / "fleet-values.yaml").read_text())


def renders() -> list[Render]:
    """The committed renders first, then value sets that exercise the other branches."""
    inline_urls = {
        "replicaCount": 2,
        "externalDatabase": {"url": "postgres://switchyard:pw@pg:5432/switchyard"},
        "externalRedis": {"url": "redis://redis:6379"},
        "metrics": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
    }
    subcharts = {"postgresql": {"enabled": True}, "redis": {"enabled": True}, "replicaCount": 3}
    persistent = {"persistence": {"enabled": True, "storageClass": "standard"}}
    return [
        Render("defaults", {}, [], "switchyard.yaml"),
        Render("fleet", fleet_values(), [SERVICE_MONITOR_API], "switchyard-fleet.yaml"),
        Render("fleet without the Prometheus Operator", fleet_values(), [], None),
        Render("inline database and redis urls", inline_urls, [], None),
        Render("in-cluster postgresql and redis", subcharts, [], None),
        Render("sqlite on a volume", persistent, [], None),
    ]


# ---------------------------------------------------------------------------------------------
# Helm


def helm_render(values: dict[str, Any], api_versions: list[str]) -> dict[str, str]:
    import helm_python as helm
    from helm_python import _native

    # Chart.render() does not pass api_versions; the library's render options do (they mirror
    # `helm template --api-versions`).
    opts = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True, "api_versions": api_versions}
    with helm.Chart.load(CHART) as chart:
        rendered = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
    templates: dict[str, str] = json.loads(rendered)
    return templates


# Helm's install order (pkg/release/util/kind_sorter.go), the order `helm template` prints in.
INSTALL_ORDER = [
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
    "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
    "ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList",
    "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController",
    "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
    "IngressClass", "Ingress", "APIService", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
]


def manifest_stream(render: Render) -> str:
    """The templates as `helm template` prints them: non-empty manifests in install order."""
    manifests = []
    for path in sorted(render.templates):
        if path.endswith("NOTES.txt") or Path(path).name.startswith("_"):
            continue
        content = render.templates[path].strip()
        if not content:
            continue
        kind = yaml.safe_load(content)["kind"]
        rank = INSTALL_ORDER.index(kind) if kind in INSTALL_ORDER else len(INSTALL_ORDER)
        manifests.append((rank, path, content))
    manifests.sort(key=lambda m: m[0])  # stable: file order within a kind, as Helm does
    return "".join(f"---\n# Source: {path}\n{content}\n" for _, path, content in manifests)


def committed_text(render: Render) -> str:
    header = (
        "# Rendered from deploy/helm/switchyard by `cargo xtask deploy-manifests` (Helm v4's template\n"
        "# engine, see deploy/check.py): do not edit by hand. With the helm CLI, the same render is\n"
        f"#   {render.helm_command()}\n"
        "# (after `helm dependency build`). tests/e2e/deploy.rs fails when this file and the chart\n"
        "# disagree.\n"
    )
    return header + manifest_stream(render)


def lint(failures: list[str]) -> None:
    import helm_python as helm

    for name, values in [("defaults", None), ("fleet", fleet_values())]:
        report = helm.lint(CHART, values, kube_version="v1.25.0")
        for message in report["messages"]:
            severity, text = message["severity"], message["error"]
            if severity < 2:  # info ("icon is recommended")
                continue
            if severity == 2 and any(p.match(text) for p in ALLOWED_LINT_WARNINGS):
                continue
            failures.append(f"helm lint ({name} values): {message['path']}: {text}")


# ---------------------------------------------------------------------------------------------
# Schemas


def validate_schemas(render: Render, failures: list[str]) -> None:
    import kubernetes_validate

    for doc in render.docs:
        where = f"{render.name}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            failures.extend(f"{where}: {e}" for e in validate_service_monitor(doc))
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                failures.append(f"{where}: Kubernetes {version} schema: {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                failures.append(f"{where}: {e.message}")


def validate_service_monitor(doc: dict[str, Any]) -> list[str]:
    """Against the Prometheus Operator CRD's models: types, patterns, required fields, and (the
    models ignore extra fields) a walk that reports every field the CRD does not define."""
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor
    from pydantic import BaseModel, ValidationError

    if doc.get("kind") != "ServiceMonitor":
        return [f"unexpected kind {doc.get('kind')}"]
    try:
        model = ServiceMonitor.model_validate(doc)
    except ValidationError as e:
        return [f"ServiceMonitor CRD: {e}"]

    errors: list[str] = []

    def walk(value: Any, data: Any, path: str) -> None:
        if isinstance(value, BaseModel) and isinstance(data, dict):
            by_key = {(f.alias or n): n for n, f in type(value).model_fields.items()}
            by_key.update({n: n for n in type(value).model_fields})
            for key, item in data.items():
                if key not in by_key:
                    errors.append(f"ServiceMonitor CRD: {path}{key}: not a field of {type(value).__name__}")
                    continue
                walk(getattr(value, by_key[key]), item, f"{path}{key}.")
        elif isinstance(value, list) and isinstance(data, list):
            for i, (v, d) in enumerate(zip(value, data)):
                walk(v, d, f"{path}{i}.")

    walk(model, doc, "")
    return errors


# ---------------------------------------------------------------------------------------------
# What the chart's objects must say to each other and to the gateway


def find(render: Render, kind: str) -> dict[str, Any] | None:
    return next((d for d in render.docs if d["kind"] == kind), None)


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def consistency(render: Render, failures: list[str]) -> None:
    def fail(text: str) -> None:
        failures.append(f"{render.name}: {text}")

    values = merged_values(render.values)
    deployment = find(render, "Deployment")
    configmap = find(render, "ConfigMap")
    service = find(render, "Service")
    if not (deployment and configmap and service):
        fail("a Deployment, a ConfigMap and a Service are always rendered")
        return
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    container = spec["containers"][0]
    config = yaml.safe_load(configmap["data"]["switchyard.yaml"])
    server = config["server"]

    # Probes: readiness is the load balancers' endpoint, liveness the process's.
    probe_path = lambda probe: container.get(probe, {}).get("httpGet", {}).get("path")  # noqa: E731
    if probe_path("readinessProbe") != "/health/ready":
        fail(f"readinessProbe asks {probe_path('readinessProbe')}, not /health/ready")
    if probe_path("livenessProbe") != "/health":
        fail(f"livenessProbe asks {probe_path('livenessProbe')}, not /health")

    # Ports: the config's listeners are the container's ports and the Service's targets.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if ports.get("http") != port_of(server["listen"]):
        fail(f"server.listen {server['listen']} is not the container's http port {ports.get('http')}")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    for name, port in service_ports.items():
        if port["targetPort"] not in ports:
            fail(f"Service port {name} targets {port['targetPort']}, which the container does not name")
    if "metrics_listen" in server:
        if ports.get("metrics") != port_of(server["metrics_listen"]):
            fail(f"server.metrics_listen {server['metrics_listen']} is not the container's metrics port")
        if "metrics" not in service_ports:
            fail("the metrics listener is not exposed by the Service")
    elif "metrics" in ports:
        fail("the container names a metrics port but the config has no metrics_listen")
    monitor = find(render, "ServiceMonitor")
    if monitor:
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint.get("port") not in service_ports:
                fail(f"the ServiceMonitor scrapes port {endpoint.get('port')}, which the Service lacks")
        if monitor["spec"]["selector"]["matchLabels"].items() - service["metadata"]["labels"].items():
            fail("the ServiceMonitor's selector does not select the Service")
    if service["spec"]["selector"].items() - pod["metadata"]["labels"].items():
        fail("the Service's selector does not select the pods")

    # Shutdown: Kubernetes must not kill the process while it drains.
    grace = float(server.get("shutdown_grace_seconds", 30))
    if not spec["terminationGracePeriodSeconds"] > grace:
        fail(f"terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} is not above "
             f"server.shutdown_grace_seconds {grace}")

    # Security: non-root, read-only root, nothing to escalate.
    if spec["securityContext"].get("runAsNonRoot") is not True or not spec["securityContext"].get("runAsUser"):
        fail("the pod does not run as a non-root user")
    context = container["securityContext"]
    if context.get("readOnlyRootFilesystem") is not True or context.get("allowPrivilegeEscalation") is not False:
        fail("the container's root filesystem is not read-only, or it may escalate privileges")

    # What the process writes must be a mounted volume.
    env = {e["name"]: e for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    writable = [p for p, m in mounts.items() if not m.get("readOnly")]
    database = env.get("SWITCHYARD_DATABASE_URL", {}).get("value", "")
    if config["database"]["url"] != "${SWITCHYARD_DATABASE_URL}":
        fail(f"database.url is {config['database']['url']}, not the Deployment's SWITCHYARD_DATABASE_URL")
    if database.startswith("sqlite://"):
        directory = str(Path(database.removeprefix("sqlite://")).parent)
        if directory not in writable:
            fail(f"the SQLite file's folder {directory} is not a writable volume")
    cache = env.get("SWITCHYARD_CACHE_DIR", {}).get("value")
    if cache not in writable:
        fail(f"SWITCHYARD_CACHE_DIR {cache} is not a writable volume")
    if "/tmp" not in writable:
        fail("/tmp is not a writable volume")

    # The config file is where SWITCHYARD_CONFIG says, from the ConfigMap.
    config_path = Path(env.get("SWITCHYARD_CONFIG", {}).get("value", ""))
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = mounts.get(str(config_path.parent))
    if not mount or volumes[mount["name"]].get("configMap", {}).get("name") != configmap["metadata"]["name"]:
        fail(f"SWITCHYARD_CONFIG {config_path} is not in the ConfigMap's mount")
    elif config_path.name not in configmap["data"]:
        fail(f"the ConfigMap has no key {config_path.name}")

    # Every ${VAR} without a default is set: by an env entry or by a key of the chart's Secret.
    secret = find(render, "Secret")
    secret_keys = set((secret or {}).get("data", {}))
    from_existing = not values["secrets"]["create"]
    for var in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", configmap["data"]["switchyard.yaml"]):
        if var not in env and var not in secret_keys and not from_existing:
            fail(f"the config reads ${{{var}}}, which neither the Deployment nor the Secret sets")
    for entry in env.values():
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["name"] == (secret or {}).get("metadata", {}).get("name") and ref["key"] not in secret_keys:
            fail(f"env {entry['name']} reads key {ref['key']} that the chart's Secret lacks")

    # The RouteWise single-process guard sees the replicas.
    autoscaling = values["autoscaling"]
    replicas = autoscaling["maxReplicas"] if autoscaling["enabled"] else values["replicaCount"]
    if env.get("SWITCHYARD_REPLICAS", {}).get("value") != str(replicas):
        fail(f"SWITCHYARD_REPLICAS is {env.get('SWITCHYARD_REPLICAS')}, not {replicas}")
    hpa = find(render, "HorizontalPodAutoscaler")
    if bool(hpa) != autoscaling["enabled"] or (hpa and "replicas" in deployment["spec"]):
        fail("the HPA and the Deployment's replicas disagree with autoscaling.enabled")
    pdb = find(render, "PodDisruptionBudget")
    if pdb and pdb["spec"]["selector"]["matchLabels"].items() - pod["metadata"]["labels"].items():
        fail("the PodDisruptionBudget does not select the pods")

    # The checksum annotation is the rendered ConfigMap's, so a config change rolls the pods.
    annotation = pod["metadata"].get("annotations", {}).get("checksum/config")
    raw = render.templates["switchyard/templates/configmap.yaml"]
    if annotation != hashlib.sha256(raw.encode()).hexdigest():
        fail("checksum/config is not the sha256 of the rendered ConfigMap")


def merged_values(overrides: dict[str, Any]) -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(base: dict[str, Any], top: dict[str, Any]) -> None:
        for key, value in top.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value

    merge(values, copy.deepcopy(overrides))
    return values


def behaviour(failures: list[str]) -> None:
    """What values do, render against render."""
    default = {n: yaml.safe_load(t) for n, t in helm_render({}, []).items() if n.endswith(".yaml") and t.strip()}
    changed = helm_render({"config": {"server": {"shutdown_grace_seconds": 90}}}, [])
    changed = {n: yaml.safe_load(t) for n, t in changed.items() if n.endswith(".yaml") and t.strip()}
    deployment = "switchyard/templates/deployment.yaml"
    before = default[deployment]["spec"]["template"]
    after = changed[deployment]["spec"]["template"]
    if before["metadata"]["annotations"]["checksum/config"] == after["metadata"]["annotations"]["checksum/config"]:
        failures.append("a config change leaves checksum/config unchanged: pods would not roll")
    if after["spec"]["terminationGracePeriodSeconds"] <= 90:
        failures.append("terminationGracePeriodSeconds does not follow shutdown_grace_seconds")
    if "switchyard/templates/servicemonitor.yaml" in default:
        failures.append("a ServiceMonitor is rendered with serviceMonitor.enabled false")

    # Combinations that cannot work are refused with the value to change.
    refused = [
        ({"persistence": {"enabled": True}, "replicaCount": 2}, "persistence.enabled keeps the SQLite file"),
        ({"serviceMonitor": {"enabled": True}, "metrics": {"enabled": False}}, "serviceMonitor.enabled scrapes"),
        ({"secrets": {"create": False}}, "secrets.existingSecret is required"),
        ({"postgresql": {"enabled": True}, "externalDatabase": {"url": "postgres://x"}}, "choose one"),
        # values.schema.json: a misspelt key fails instead of being ignored.
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    ]
    for values, message in refused:
        try:
            helm_render(values, [])
            failures.append(f"values {values} render, but must be refused ({message}…)")
        except Exception as e:  # HelmRenderError / HelmValuesError
            if message not in str(e):
                failures.append(f"values {values} are refused without saying `{message}`: {e}")


# ---------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        word, _, rest = current.partition(" ")
        instructions.append((word.upper(), rest.strip()))
        current = ""
    return instructions


def dockerfile_stages(instructions: list[tuple[str, str]]) -> list[dict[str, Any]]:
    stages: list[dict[str, Any]] = []
    for word, rest in instructions:
        if word == "FROM":
            image, _, name = rest.partition(" AS ")
            stages.append({"image": image.strip(), "name": name.strip(), "body": []})
        elif stages:
            stages[-1]["body"].append((word, rest))
    return stages


def dockerignore_patterns() -> list[tuple[bool, str]]:
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        patterns.append((negated, line.lstrip("!").strip("/")))
    return patterns


def dockerignore_regex(pattern: str) -> str:
    """Go's filepath.Match per path segment (`*` and `?` stay within a segment), plus `**`: any
    number of segments."""
    segments = pattern.split("/")
    regex = ""
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
            continue
        regex += "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in segment)
        regex += "" if last else "/"
    return regex


def dockerignored(path: str, patterns: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a parent folder excludes
    everything under it."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negated, pattern in patterns:
        regex = dockerignore_regex(pattern)
        if any(re.fullmatch(regex, c) for c in candidates):
            ignored = not negated
    return ignored


def check_dockerfile(hadolint: Path, failures: list[str]) -> None:
    def fail(text: str) -> None:
        failures.append(f"deploy/Dockerfile: {text}")

    result = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        fail(f"hadolint:\n{result.stdout}{result.stderr}")

    text = DOCKERFILE.read_text()
    instructions = dockerfile_instructions(text)
    stages = dockerfile_stages(instructions)
    if len(stages) < 2:
        fail(f"{len(stages)} stage(s): a builder and a runtime stage are expected")
        return
    builder, runtime = stages[0], stages[-1]
    build_steps = " ".join(rest for word, rest in builder["body"] if word == "RUN")
    for needed in ["rustup target add wasm32-wasip2", "cargo xtask build-strategies", "cargo xtask build-pgo",
                   "cargo build --release --locked"]:
        if needed not in build_steps:
            fail(f"the builder stage does not run `{needed}`")
    xtask = (ROOT / "xtask" / "src" / "main.rs").read_text()
    for wasm in re.findall(r"target/strategies/([a-z_]+\.wasm)", build_steps):
        if f'dir: "strategies",\n        file: "{wasm}"' not in xtask:
            fail(f"the builder copies {wasm}, which `cargo xtask build-strategies` does not build as a built-in")
    if not re.search(r"slim", runtime["image"]):
        fail(f"the runtime stage is {runtime['image']}, not a slim image")

    body = runtime["body"]
    users = [rest for word, rest in body if word == "USER"]
    if not users or users[-1].split(":")[0] in ("", "0", "root") or not users[-1].split(":")[0].isdigit():
        fail(f"the runtime stage's USER is {users[-1] if users else 'unset'}: a numeric non-root uid is expected "
             "(Kubernetes' runAsNonRoot can only verify a number)")
    checks = [rest for word, rest in body if word == "HEALTHCHECK"]
    if not checks or "/health" not in checks[-1] or "/health/" in checks[-1]:
        fail("no HEALTHCHECK against /health")
    env = {}
    for word, rest in body:
        if word == "ENV":
            for token in shlex.split(rest):
                name, _, value = token.partition("=")
                env[name] = value
    exposed = {p.split("/")[0] for word, rest in body if word == "EXPOSE" for p in rest.split()}
    volumes = [v for word, rest in body if word == "VOLUME" for v in json.loads(rest)]

    # Every COPY from the build context exists and is not excluded by .dockerignore.
    patterns = dockerignore_patterns()
    stage_names = {s["name"] for s in stages if s["name"]}
    copied_to: dict[str, str] = {}
    for stage in stages:
        for word, rest in stage["body"]:
            if word not in ("COPY", "ADD"):
                continue
            tokens = shlex.split(rest)
            flags = [t for t in tokens if t.startswith("--")]
            paths = [t for t in tokens if not t.startswith("--")]
            sources, destination = paths[:-1], paths[-1]
            source_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
            if source_stage is not None:
                if source_stage not in stage_names:
                    fail(f"COPY --from={source_stage}: no such stage")
                continue
            for source in sources:
                if source == ".":
                    continue
                if not (ROOT / source).exists():
                    fail(f"COPY {source}: not in the repository")
                elif dockerignored(source, patterns):
                    fail(f"COPY {source}: excluded from the build context by .dockerignore")
                copied_to[source] = destination
    # What the build needs is in the context; what it must not see is not.
    for needed in ["Cargo.toml", "Cargo.lock", "host/src/main.rs", "strategies/fixed/src/lib.rs", "migrations/sqlite",
                   "wit/since_v0.2.0/router.wit", "xtask/src/main.rs", ".cargo/config.toml", "tests/e2e/main.rs"]:
        if dockerignored(needed, patterns):
            fail(f".dockerignore excludes {needed}, which the build needs")
    for excluded in ["target/debug/switchyard", ".git/HEAD", "switchyard.db"]:
        if not dockerignored(excluded, patterns):
            fail(f".dockerignore lets {excluded} into the build context")

    # The defaults agree with the config the image starts with.
    config_destination = copied_to.get(str(CONTAINER_CONFIG.relative_to(ROOT)))
    if env.get("SWITCHYARD_CONFIG") != config_destination:
        fail(f"SWITCHYARD_CONFIG is {env.get('SWITCHYARD_CONFIG')}, but the starting config is copied to {config_destination}")
    config_text = CONTAINER_CONFIG.read_text()
    listen = re.search(r'listen: "0\.0\.0\.0:\$\{SWITCHYARD_PORT:-(\d+)\}"', config_text)
    if not listen or env.get("SWITCHYARD_PORT") != listen.group(1) or listen.group(1) not in exposed:
        fail("the starting config's listen port, SWITCHYARD_PORT and EXPOSE disagree")
    sqlite = re.search(r"sqlite://(/[^}\"]+)", config_text)
    if not sqlite or str(Path(sqlite.group(1)).parent) not in volumes:
        fail("the starting config's SQLite file is not in a VOLUME")
    if env.get("SWITCHYARD_CACHE_DIR") not in volumes:
        fail(f"SWITCHYARD_CACHE_DIR {env.get('SWITCHYARD_CACHE_DIR')} is not a VOLUME")
    builtin = env.get("SWITCHYARD_BUILTIN_STRATEGIES")
    if not any(word == "COPY" and rest.rstrip("/").endswith(builtin or "\0") for word, rest in body):
        fail(f"SWITCHYARD_BUILTIN_STRATEGIES {builtin} is not where the strategies are copied")


# ---------------------------------------------------------------------------------------------


def runtime_files(out: Path) -> None:
    """How the chart's pod and the image's container start the gateway, for tests/e2e/deploy.rs,
    which starts the real binary that way: `chart/` (the default render's config file, the
    container's environment with the Secret's keys, its probes, ports, uid and writable mounts) and
    `image/` (the image's starting config, ENV, USER, VOLUMEs and HEALTHCHECK path)."""
    render = renders()[0]
    render.templates = helm_render(render.values, render.api_versions)
    render.docs = [d for d in yaml.safe_load_all(manifest_stream(render)) if d]
    configmap, deployment, secret = (find(render, k) for k in ("ConfigMap", "Deployment", "Secret"))
    assert configmap and deployment and secret, "the default render has a ConfigMap, a Deployment and a Secret"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config_path = env["SWITCHYARD_CONFIG"]
    chart = {
        "config_path": config_path,
        "env": env,
        "args": container["args"],
        "writable": [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")],
        "port": ports["http"],
        "metrics_port": ports.get("metrics"),
        "readiness": container["readinessProbe"]["httpGet"]["path"],
        "liveness": container["livenessProbe"]["httpGet"]["path"],
        "uid": pod["securityContext"]["runAsUser"],
        # The default values route to a remote provider: ready without a request.
        "ready_status": 200,
    }
    write_runtime(out / "chart", configmap["data"][Path(config_path).name], chart)

    stages = dockerfile_stages(dockerfile_instructions(DOCKERFILE.read_text()))
    body = stages[-1]["body"]
    image_env = {}
    for word, rest in body:
        if word == "ENV":
            for token in shlex.split(rest):
                name, _, value = token.partition("=")
                image_env[name] = value
    user = [rest for word, rest in body if word == "USER"][-1]
    healthcheck = [rest for word, rest in body if word == "HEALTHCHECK"][-1]
    image = {
        "config_path": image_env["SWITCHYARD_CONFIG"],
        "env": image_env,
        "entrypoint": json.loads([rest for word, rest in body if word == "ENTRYPOINT"][-1]),
        "args": json.loads([rest for word, rest in body if word == "CMD"][-1]),
        "writable": [v for word, rest in body if word == "VOLUME" for v in json.loads(rest)] + ["/tmp"],
        "port": int(image_env["SWITCHYARD_PORT"]),
        "metrics_port": None,
        "readiness": "/health/ready",
        "liveness": re.search(r"(/health\S*?)[\s\"]", healthcheck).group(1),
        "uid": int(user.split(":")[0]),
        # The starting config publishes no model.
        "ready_status": 503,
    }
    write_runtime(out / "image", CONTAINER_CONFIG.read_text(), image)


def write_runtime(out: Path, config: str, spec: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / Path(spec["config_path"]).name).write_text(config)
    (out / "runtime.json").write_text(json.dumps(spec, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="re-render deploy/manifests/")
    parser.add_argument("--runtime", type=Path, help="write the default render's config and environment here")
    options = parser.parse_args()
    if options.runtime:
        runtime_files(options.runtime)
        return 0

    failures: list[str] = []
    checks: list[tuple[str, Callable[[], None]]] = []
    all_renders = renders()
    for render in all_renders:
        render.templates = helm_render(render.values, render.api_versions)
        render.docs = [d for d in yaml.safe_load_all(manifest_stream(render)) if d]
        if render.committed is None:
            continue
        path = MANIFESTS / render.committed
        text = committed_text(render)
        if options.write:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
        elif not path.exists() or path.read_text() != text:
            failures.append(f"{path.relative_to(ROOT)} differs from the chart's render: run `cargo xtask deploy-manifests`")
    if options.write:
        return 0

    hadolint = Path(sys.executable).parent / "hadolint"
    checks.append(("helm lint", lambda: lint(failures)))
    for render in all_renders:
        checks.append((f"schemas ({render.name})", lambda r=render: validate_schemas(r, failures)))
        checks.append((f"consistency ({render.name})", lambda r=render: consistency(r, failures)))
    checks.append(("values behaviour", lambda: behaviour(failures)))
    checks.append(("Dockerfile", lambda: check_dockerfile(hadolint, failures)))
    for name, check in checks:
        before = len(failures)
        check()
        print(f"{'ok' if len(failures) == before else 'FAILED'}: {name}")

    documents = sum(len(r.docs) for r in all_renders)
    if failures:
        print(f"\n{len(failures)} problem(s):", file=sys.stderr)
        for failure in failures:
            print(f"- {failure}", file=sys.stderr)
        return 1
    print(f"deploy checks passed: {len(all_renders)} renders, {documents} objects, Dockerfile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
