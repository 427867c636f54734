"""deploy/kubernetes validated offline: Kubernetes JSON schemas (kubernetes-validate, strict) plus
the cross-references a schema cannot see (names, ports, probes, the router's CLI arguments)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from server import cli

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def resources() -> list[dict]:
    kust = docs("kustomization.yaml")[0]
    return [d for f in kust["resources"] for d in docs(f)]


def by_kind(kind: str, name: str) -> dict:
    return next(d for d in resources() if d["kind"] == kind and d["metadata"]["name"] == name)


def test_every_manifest_is_valid_against_the_kubernetes_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    files = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    kust = docs("kustomization.yaml")[0]
    assert set(kust["resources"]) == set(files) - {
        "secret.example.yaml"
    }  # every file applied, but the example
    seen = []
    for name in files:
        for doc in docs(name):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on any error
            seen.append(doc["kind"])
    assert sorted(seen) == sorted(
        [
            "Service",
            "StatefulSet",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "ConfigMap",
            "Secret",
        ]
    )


def test_schema_validation_catches_a_broken_manifest():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    broken = by_kind("StatefulSet", "agentserve-worker")
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    typo = by_kind("Deployment", "agentserve-router")
    typo["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


def test_workers_are_a_gpu_statefulset_behind_a_headless_service_with_health_probes():
    svc = by_kind("Service", "agentserve-workers")
    sts = by_kind("StatefulSet", "agentserve-worker")
    assert svc["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert svc["spec"]["ports"][0]["port"] == c["ports"][0]["containerPort"] == 8000
    for probe in ("startupProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health", probe
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"  # a dead engine, not load
    # the image's entrypoint serves configs/vllm.yaml (shipped in the package, by name), whose port
    # the Service targets
    dockerfile = (DEPLOY.parents[1] / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["agentserve", "serve", "--config", "vllm"]' in dockerfile
    vllm = yaml.safe_load((DEPLOY.parents[1] / "configs" / "vllm.yaml").read_text())
    assert vllm["engine"] == "vllm" and vllm["port"] == 8000 and vllm["vllm"]["tensor_parallel_size"] == 1


def test_router_discovers_the_workers_service_and_its_arguments_parse(monkeypatch):
    dep = by_kind("Deployment", "agentserve-router")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    name, port = c["args"][c["args"].index("--workers-dns") + 1].split(":")
    svc = by_kind("Service", name)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["ports"][0]["port"] == int(port)
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "tcpSocket" in c["livenessProbe"]  # /health fails while no worker is up: not a liveness check
    front = by_kind("Service", "agentserve")
    assert front["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # the container's arguments are accepted by `agentserve route` (the image's entrypoint)
    import server.routing.router_app as router_mod

    got = {}
    monkeypatch.setattr(
        router_mod, "serve_router", lambda s, w, workers_dns=None: got.update(dns=workers_dns)
    )
    assert cli.main(["route", "--host", "0.0.0.0", "--port", "8000", *c["args"]]) == 0
    assert got["dns"] == f"{name}:{port}"


def test_only_routers_and_prometheus_reach_the_workers_and_the_scrape_config_parses():
    pol = by_kind("NetworkPolicy", "agentserve-workers")
    sources = [p["podSelector"]["matchLabels"] for p in pol["spec"]["ingress"][0]["from"]]
    assert {"app.kubernetes.io/name": "agentserve", "app.kubernetes.io/component": "router"} in sources
    prom = yaml.safe_load(by_kind("ConfigMap", "agentserve-prometheus-scrape")["data"]["prometheus.yml"])
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert set(jobs) == {"agentserve-router", "agentserve-workers"}
    for job, component in (("agentserve-router", "router"), ("agentserve-workers", "worker")):
        keep = jobs[job]["relabel_configs"][0]
        assert keep["action"] == "keep" and keep["regex"] == f"agentserve;{component}"
        assert jobs[job]["metrics_path"] == "/metrics"


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_secrets_are_required_and_workers_require_the_router():
    worker = by_kind("StatefulSet", "agentserve-worker")["spec"]["template"]["spec"]["containers"][0]
    router = by_kind("Deployment", "agentserve-router")["spec"]["template"]["spec"]["containers"][0]
    for c in (worker, router):
        for e in c["env"]:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            assert ref is None or not ref.get("optional", False), e["name"]  # no secret: no start
    assert "valueFrom" in _env(worker)["AGENTSERVE_AUTH__ROUTER_TOKEN"]
    assert _env(worker)["AGENTSERVE_AUTH__REQUIRE_ROUTER"]["value"] == "true"
    assert {"AGENTSERVE_AUTH__API_KEYS", "AGENTSERVE_AUTH__ROUTER_TOKEN"} <= set(_env(router))
    # what those settings mean passes the start checks of each side
    from server.auth import check_router_auth, check_worker_auth
    from server.config import AuthSettings

    check_worker_auth(AuthSettings(router_token="t", require_router=True))
    check_router_auth(AuthSettings(router_token="t", api_keys={"a": "k"}))


def test_the_network_policy_admits_only_routers_and_one_namespaces_scraper():
    pol = by_kind("NetworkPolicy", "agentserve-workers")
    rules = pol["spec"]["ingress"]
    peers = [peer for rule in rules for peer in rule["from"]]
    for peer in peers:
        ns = peer.get("namespaceSelector")
        assert ns != {}, "an empty namespaceSelector admits every namespace"
        assert ns is None or ns["matchLabels"].get("kubernetes.io/metadata.name"), peer
        assert peer.get("podSelector", {}).get("matchLabels"), peer  # never a whole namespace
    assert sum(1 for p in peers if "namespaceSelector" in p) == 1
    for rule in rules:
        assert [p["port"] for p in rule["ports"]] == [8000]


@pytest.mark.parametrize(
    ("kind", "name"), [("StatefulSet", "agentserve-worker"), ("Deployment", "agentserve-router")]
)
def test_pods_run_unprivileged_on_a_read_only_root(kind, name):
    pod = by_kind(kind, name)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    for vol in pod.get("volumes", []):
        if "emptyDir" in vol:
            assert vol["emptyDir"].get("sizeLimit"), vol["name"]  # a bounded scratch space
    mounts = {m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
    assert "/tmp" in mounts  # a read-only root still has a writable /tmp


def test_every_image_stage_runs_as_a_non_root_user():
    dockerfile = (DEPLOY.parents[1] / "Dockerfile").read_text()
    stages = dockerfile.split("\nFROM ")[1:]
    built = [s for s in stages if " AS " in s.splitlines()[0]]
    assert len(built) == 3  # worker, router, cpu
    for stage in built:
        users = [line.split()[1] for line in stage.splitlines() if line.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("0", "root"), stage.splitlines()[0]
