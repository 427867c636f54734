"""`agentserve route` flag handling and `serve --workers N` process management (fake workers)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from server import cli
from server.config import load_settings
from server.ports import free_port, wait_for_health
from server.routing.cluster import worker_settings_file
from tests.routing.conftest import ROOT

pytestmark = pytest.mark.timeout(60)


def test_route_flags_merge_with_the_yaml_routing_section(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("routing:\n  load_epsilon: 0.5\n  health_interval_s: 3.0\n")
    got = {}
    import server.routing.router_app as router_mod

    monkeypatch.setattr(router_mod, "serve_router", lambda s, w: got.update(settings=s, workers=w))
    argv = [
        "route",
        "--config",
        str(cfg),
        "--worker",
        "http://127.0.0.1:1",
        "--worker",
        "b=http://127.0.0.1:2",
    ]
    assert cli.main([*argv, "--policy", "round_robin"]) == 0
    r = got["settings"].routing
    assert (r.policy, r.load_epsilon, r.health_interval_s) == ("round_robin", 0.5, 3.0)
    assert got["workers"] == ["http://127.0.0.1:1", "b=http://127.0.0.1:2"]
    assert cli.main([*argv, "--load-epsilon", "0.1"]) == 0
    r = got["settings"].routing
    assert (r.policy, r.load_epsilon, r.health_interval_s) == ("affinity", 0.1, 3.0)


def test_route_rejects_a_bad_worker_url(capsys):
    assert cli.main(["route", "--worker", "127.0.0.1:8001"]) == 2
    assert "expected a base URL like http://" in capsys.readouterr().err


def test_worker_settings_file_reproduces_the_settings(tmp_path):
    settings = load_settings(workers=3, port=9000, default_max_tokens=7, routing={"load_epsilon": 0.4})
    path = worker_settings_file(settings, str(tmp_path))
    again = load_settings(path, port=9100, workers=1)
    assert again.default_max_tokens == 7 and again.routing.load_epsilon == 0.4
    assert (again.workers, again.host, again.port) == (1, "127.0.0.1", 9100)
    assert again.threads == max(1, (os.cpu_count() or 1) // 3)  # cores shared out on CPU
    pinned = load_settings(workers=3, threads=5)
    assert load_settings(worker_settings_file(pinned, str(tmp_path))).threads == 5


CLUSTER = textwrap.dedent("""
    import sys
    from server.config import load_settings
    from server.routing.cluster import serve_cluster

    def fake(i, port, config_path):
        return [sys.executable, "-m", "server.routing.fake_worker", "--id", f"w{i}", "--port", str(port)]

    settings = load_settings(workers=3, port=int(sys.argv[1]), routing={"health_interval_s": 0.2})
    serve_cluster(settings, command=fake)
""")


def test_cluster_starts_workers_routes_and_stops_them_on_sigterm():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", CLUSTER, str(port)], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url, 30, proc=proc, poll_s=0.05)
        workers = httpx.get(url + "/workers", timeout=5).json()["workers"]
        assert [w["id"] for w in workers] == ["w0", "w1", "w2"] and all(w["healthy"] for w in workers)
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "c1"}
        ids = {
            httpx.post(url + "/v1/chat/completions", json=body, timeout=5).headers["x-agentserve-worker"]
            for _ in range(3)
        }
        assert len(ids) == 1 and ids <= {"w0", "w1", "w2"}
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        err = proc.stderr.read()
        pids = [int(p) for p in re.findall(r"worker w\d pid (\d+)", err)]
        assert len(pids) == 3 and "3 workers ready" in err and "workers stopped" in err
        time.sleep(0.2)
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_cluster_reports_a_worker_that_dies_at_start(tmp_path):
    script = CLUSTER.replace('"-m", "server.routing.fake_worker"', '"-c", "import sys; sys.exit(3)"')
    proc = subprocess.run(
        [sys.executable, "-c", script, str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode != 0
    assert re.search(r"worker w\d \(pid \d+\) exited with code 3 before it was ready", proc.stderr)
