"""State a client can grow is bounded by bytes, not only by entries: the session table kept 4,096
full previous prompts per worker (~2 MiB each at 30k tokens) and the fingerprint store 1,024 per
tenant, whatever their size."""

from __future__ import annotations

from array import array

from server.cache_diag.baselines import BaselineTable, FingerprintStore, fingerprint_bytes
from server.cache_diag.diagnosis import Prompt
from server.cache_diag.fingerprint import Fingerprint
from server.cache_diag.reporter import CacheReporter


def _fp(n_tokens: int) -> Fingerprint:
    return Fingerprint(
        model="m",
        settings=(),
        system=None,
        tools=(),
        messages=(("user", b"x" * 16),),
        n_tokens=n_tokens,
        core_tokens=n_tokens,
        blocks=array("Q", [0] * (n_tokens // 32)),
        marks=array("H", [0] * n_tokens),
        segments=(),
    )


def test_the_session_table_is_bounded_by_bytes():
    table: BaselineTable[bytes] = BaselineTable(4096, max_bytes=10_000, size=len)
    for i in range(100):
        table.put(f"s{i}", b"x" * 997)  # + the key's 3 characters: 1,000 bytes each
    assert len(table) == 10 and table.bytes <= 10_000
    assert table.get("s99") is not None and table.get("s0") is None
    entry, seen = table.lookup("s0")
    assert entry is None and seen  # dropped, but remembered as seen ("unavailable", not "first")


def test_session_keys_are_counted_in_the_session_tables_bytes():
    # issue 37 item 10: a prompt_cache_key is client text of any length (up to the body limit);
    # 4,096 sessions of 8 MiB keys were 32 GiB outside the byte budget
    table: BaselineTable[bytes] = BaselineTable(4096, max_bytes=10_000, size=len)
    for i in range(20):
        table.put(f"{i:04d}" + "k" * 2_996, b"x" * 10)  # 3,000-character keys, 10-byte values
    assert table.bytes <= 10_000 and len(table) == 3


def test_the_reporter_keeps_at_most_its_byte_budget_of_previous_prompts():
    rep = CacheReporter(block_size=32, sessions=4096, sessions_bytes=2**20, responses_bytes_per_tenant=2**19)
    text = "word " * 30_000
    for i in range(50):  # 50 sessions with a 30k-token prompt each: ~1.5 MB apiece
        fp = _fp(30_000)
        prompt = Prompt(fp, array("l", range(30_000)), text, array("l", range(30_000)))
        rep.report(session=f"s{i}", tenant="t", response_id=f"r{i}", prompt=prompt, cached_tokens=0)
    assert rep.sessions.bytes <= 2**20
    assert rep.responses.bytes("t") <= 2**19
    assert len(rep.responses) < 50


def test_fingerprints_are_bounded_per_tenant_by_bytes():
    store = FingerprintStore(per_tenant=1024, bytes_per_tenant=10 * fingerprint_bytes(_fp(1000)))
    for i in range(100):
        store.put("a", f"r{i}", _fp(1000))
    store.put("b", "r0", _fp(1000))
    assert store.bytes("a") <= 10 * fingerprint_bytes(_fp(1000)) and store.get("a", "r99") is not None
    assert store.get("b", "r0") is not None  # one tenant's flood does not evict another's


def test_pause_statistics_are_bounded_in_tool_names():
    from server.kvcache.retention import MAX_TOOLS_TRACKED, PauseEstimator

    est = PauseEstimator(cap_s=600)
    est.observe(["shell_exec"], 2.0)
    for i in range(5 * MAX_TOOLS_TRACKED):  # a client that invents a tool name per call
        est.observe([f"tool_{i}"], 1.0)
        if i % 100 == 0:
            est.observe(["shell_exec"], 2.0)  # a tool in use stays
    assert len(est.snapshot()) <= MAX_TOOLS_TRACKED and len(est._recent) <= MAX_TOOLS_TRACKED
    assert "shell_exec" in est.snapshot()


def test_one_tenants_session_flood_evicts_its_own_sessions_not_anothers():
    table: BaselineTable[bytes] = BaselineTable(4096, max_bytes=20_000, size=len, bytes_per_tenant=5_000)
    for i in range(5):
        table.put(f"b{i}", b"x" * 998, tenant="b")  # + the key's 2 characters
    for i in range(200):  # tenant a floods the table
        table.put(f"a{i}", b"x" * 998, tenant="a")
    assert table.tenant_bytes("a") <= 5_000 and table.get("a199") is not None and table.get("a0") is None
    assert all(table.get(f"b{i}") is not None for i in range(5))  # b kept all of its sessions
    assert table.bytes <= 20_000 and table.tenant_bytes("b") == 5_000
    table.put("b0", b"x" * 3000, tenant="b")  # a session re-put larger: b now evicts its own oldest
    assert table.tenant_bytes("b") <= 5_000 and table.get("b0") is not None and table.get("b1") is None
    # without a quota (the default) the flood takes the whole table
    shared: BaselineTable[bytes] = BaselineTable(4096, max_bytes=20_000, size=len)
    for i in range(5):
        shared.put(f"b{i}", b"x" * 1000, tenant="b")
    for i in range(200):
        shared.put(f"a{i}", b"x" * 1000, tenant="a")
    assert shared.get("b0") is None


def test_the_service_passes_the_per_tenant_quota(hf_engine):
    from server.chat.service import ChatService
    from server.config import load_settings
    from server.metrics import Metrics

    service = ChatService(hf_engine, load_settings(device="cpu", session_table_tenant_mb=3), Metrics())
    assert service.cache_report.sessions.bytes_per_tenant == 3 * 2**20


def test_stored_responses_expire_after_the_ttl():
    # issue 37 item 9: stored responses were kept until the count or byte bound pushed them out
    from server.config import ResponsesSettings
    from server.dialects.responses.response_store import ResponseStore

    assert ResponsesSettings().store_ttl_s == 86400.0
    now = [1000.0]
    store = ResponseStore(max_responses=100, max_bytes=3_000, ttl_s=60, clock=lambda: now[0])
    big = [{"role": "user", "content": "x" * 1_000}]
    for i in range(2):  # stored at 1000 and 1030
        assert store.put("t", big, {"id": f"resp_{i}", "output": []})
        now[0] += 30
    assert store.get("t", "resp_0") is not None  # 1060: 60 s old, still there
    now[0] += 1  # 1061: resp_0 is past the TTL, resp_1 (31 s) is not
    assert store.get("t", "resp_0") is None and store.get("t", "resp_1") is not None
    assert store.delete("t", "resp_0") is False
    now[0] += 100
    # a put drops the expired entries first: their bytes are free for the new ones
    assert store.put("t", big, {"id": "resp_2", "output": []})
    assert store.put("t", big, {"id": "resp_3", "output": []})
    assert store.get("t", "resp_2") is not None and store.get("t", "resp_1") is None
