"""Leader election's pure rules (`may_acquire`, `lease_body`, the timing's invariants) and the
fence: writes refused before a byte is sent, by the Kubernetes client and by kopf's aiohttp
session alike, while reads go through.  The election against a real API server (two operators,
one paused) is tests/cluster/test_operator_leader.py."""

from __future__ import annotations

import asyncio
import http.server
import math
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clef_operator import cli
from clef_operator.manager import leader
from clef_operator.manager.leader import Fence, Fenced, LeaseRecord, LeaseTiming, lease_body, may_acquire

T = LeaseTiming(duration=15, renew_deadline=10, retry_period=2)
HELD = LeaseRecord(holder="a", duration_seconds=15, transitions=3, resource_version="41")


@pytest.mark.parametrize(
    ("record", "seen_for", "ok"),
    [
        (None, 0, True),  # no Lease yet
        (LeaseRecord("", 15, 3, "41"), 0, True),  # released: nobody holds it
        (HELD, 14.9, False),  # a full lease duration has not passed since we saw this record
        (HELD, 15.0, True),
        (LeaseRecord("a", 40, 3, "41"), 20, False),  # the holder's longer duration counts
        (LeaseRecord("a", 5, 3, "41"), 10, False),  # ... and never shortens ours
        (LeaseRecord("b", 15, 3, "41"), 0, True),  # ours already (a renew)
    ],
)
def test_may_acquire(record: LeaseRecord | None, seen_for: float, ok: bool):
    assert may_acquire(record, "b", seen_since=100.0, now=100.0 + seen_for, timing=T) is ok


def test_the_old_leader_stops_writing_before_a_newcomer_may_start():
    """The fence closes renew_deadline after a renew was *sent*; a newcomer waits the lease
    duration after it *saw* that renew, which is later: the gap is at least duration - deadline."""
    sent = 1000.0
    fence_closes = sent + T.renew_deadline
    seen = sent + 0.001
    first_acquire = next(
        t / 100
        for t in range(int(seen * 100), int((seen + 60) * 100))
        if may_acquire(HELD, "b", seen, t / 100, T)
    )
    assert first_acquire - fence_closes >= T.duration - T.renew_deadline - 0.01


@pytest.mark.parametrize(
    ("timing", "flag"),
    [
        ((15, 15, 2), "--leader-elect-lease-duration"),
        ((15, 10, 10), "--leader-elect-renew-deadline"),
        ((15, 10, 0), "--leader-elect-retry-period"),
    ],
)
def test_timing_invariants_name_the_flag(timing: tuple[float, float, float], flag: str):
    with pytest.raises(ValueError, match=flag):
        LeaseTiming(*timing)


def test_lease_body_takes_renews_and_compares_and_swaps():
    now = datetime(2026, 12, 1, 18, 0, 0, tzinfo=UTC)
    created = lease_body("clef-operator", "clef-system", "b", T, None, now)
    assert created["spec"] == {
        "holderIdentity": "b",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-12-01T18:00:00.000000Z",
        "acquireTime": "2026-12-01T18:00:00.000000Z",
        "leaseTransitions": 0,
    }
    assert "resourceVersion" not in created["metadata"]
    taken = lease_body("clef-operator", "clef-system", "b", T, HELD, now)
    assert taken["metadata"]["resourceVersion"] == "41", "a write only over the record we judged"
    assert taken["spec"]["leaseTransitions"] == 4 and "acquireTime" in taken["spec"]
    renewed = lease_body("clef-operator", "clef-system", "a", T, HELD, now)
    assert renewed["spec"]["leaseTransitions"] == 3 and "acquireTime" not in renewed["spec"]
    odd = LeaseTiming(duration=7.5, renew_deadline=5, retry_period=1)
    assert lease_body("l", "n", "a", odd, None, now)["spec"]["leaseDurationSeconds"] == 8, "rounded up"


def test_fence_opens_until_a_deadline_and_closes():
    fence = Fence()
    assert fence.may_write(), "no election: always open"
    fence.open_until(time.monotonic() + 60)
    fence.check("PATCH", "/x")
    fence.open_until(time.monotonic() - 0.001)
    assert not fence.may_write()
    fence.check("GET", "/x")  # reads need no lease
    with pytest.raises(Fenced, match="refused POST /x"):
        fence.check("post", "/x")
    fence.open_until(math.inf)
    fence.close()
    with pytest.raises(Fenced):
        fence.check("DELETE", "/x")


class Recorder:
    """A local HTTP server that answers every request 404 and notes its method: what got past
    the fence is what it saw."""

    def __init__(self) -> None:
        seen = self.seen = []  # type: list[str]

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append(self.command)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b'{"kind":"Status","code":404}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


def test_the_kubernetes_client_refuses_writes_before_sending_them(recorder: Recorder):
    fence = Fence()
    fence.close()
    core = client.CoreV1Api(
        leader.FencedApiClient(fence, configuration=client.Configuration(host=recorder.url))
    )
    for write in (
        lambda: core.create_namespaced_config_map("ns", {"metadata": {"name": "x"}}),
        lambda: core.patch_namespaced_service("s", "ns", {"spec": {}}),
        lambda: core.delete_namespaced_pod("p", "ns"),
    ):
        with pytest.raises(Fenced):
            write()
    with pytest.raises(ApiException):
        core.read_namespaced_service("s", "ns")
    assert recorder.seen == ["GET"], "reads go out, writes never left the process"
    fence.open_until(math.inf)
    with pytest.raises(ApiException):
        core.delete_namespaced_pod("p", "ns")
    assert recorder.seen == ["GET", "DELETE"]


def test_kopfs_session_refuses_writes_before_sending_them(recorder: Recorder):
    fence = Fence()
    fence.close()

    async def go() -> None:
        async with aiohttp.ClientSession(trace_configs=[leader.fence_trace(fence)]) as session:
            with pytest.raises(Fenced):
                await session.patch(f"{recorder.url}/apis/x", json={})
            (await session.get(f"{recorder.url}/apis/x")).release()
            fence.open_until(math.inf)
            (await session.post(f"{recorder.url}/apis/x", json={})).release()

    asyncio.run(go())
    assert recorder.seen == ["GET", "POST"]


def test_bad_election_flags_stop_the_operator_before_it_connects(capsys: pytest.CaptureFixture[str]):
    code = cli.main(["run", "--leader-elect", "--leader-elect-lease-duration=5", "--kubeconfig=/nonexistent"])
    assert code == 2
    assert (
        "--leader-elect-lease-duration (5.0) must exceed --leader-elect-renew-deadline"
        in capsys.readouterr().err
    )


def test_election_flags_default_to_client_gos_and_read_the_environment(monkeypatch: pytest.MonkeyPatch):
    args = cli.build_parser().parse_args(["run"])
    assert (args.leader_elect, args.leader_elect_lease_duration, args.leader_elect_renew_deadline) == (
        False,
        15,
        10,
    )
    assert (args.leader_elect_retry_period, args.leader_elect_lease_name) == (2, "clef-operator")
    monkeypatch.setenv("CLEF_LEADER_ELECT", "1")
    monkeypatch.setenv("CLEF_LEADER_ELECT_LEASE_DURATION", "30")
    args = cli.build_parser().parse_args(["run"])
    assert args.leader_elect and args.leader_elect_lease_duration == 30


@pytest.mark.parametrize(
    ("identity", "in_a_pod", "refused"),
    [
        ("", True, False),  # the default: the pod's name and a suffix
        ("clef-operator-7d9f-x2", True, False),
        ("clef-operator-7d9f-x2_blue", True, False),
        ("clef-operator-7d9f-x2blue", True, True),  # a prefix that is not the pod's name
        ("op-a", True, True),
        ("op-a", False, False),  # on a host the token names no pod: the fence policy does not apply
    ],
)
def test_an_identity_the_fence_policy_would_refuse_stops_the_operator(
    identity: str, in_a_pod: bool, refused: bool
):
    why = leader.identity_refused(identity, "clef-operator-7d9f-x2", in_a_pod)
    assert bool(why) == refused
    if refused:
        assert why.startswith("--leader-elect-identity: ") and "clef-operator-7d9f-x2_" in why


def _refusal(status: int, body: str) -> ApiException:
    e = ApiException(status=status, reason="Forbidden")
    e.body = body
    return e


def test_a_standbys_dry_run_says_whether_the_fence_is_in_force():
    fenced = '{"message": "ValidatingAdmissionPolicy \'clef-operator-fence\' ... denied request"}'
    assert leader.fence_refused(_refusal(403, fenced)) is True
    assert leader.fence_refused(None) is False, "admitted: the fence does not cover this replica"
    assert leader.fence_refused(_refusal(403, '{"message": "cannot create events (RBAC)"}')) is None
    assert leader.fence_refused(_refusal(500, fenced)) is None


def test_a_standby_checks_the_fence_once_a_lease_duration_and_only_while_another_holds_it(
    caplog: pytest.LogCaptureFixture,
):
    answers = [False, True, False]
    said: list[bool] = []
    e = leader.Elector(
        client.ApiClient(), "clef-system", "op-b", LeaseTiming(15, 10, 2), fence=Fence(),
        check_fence=lambda: answers.pop(0), on_fence=said.append,
    )  # fmt: skip
    e._standby_check()
    assert said == [], "nobody holds the Lease: nothing to be fenced from"
    e._holder = "op-b"
    e._standby_check()
    assert said == [], "we hold it"
    e._holder = "op-a"
    with caplog.at_level("INFO", logger="clef.leader"):
        e._standby_check()
        e._standby_check()
        assert said == [False], "once a lease duration"
        assert "does not cover this replica" in caplog.text and "130887" in caplog.text
        for expected in ([False, True], [False, True, False]):
            e._fence_checked -= 15
            e._standby_check()
            assert said == expected
    assert caplog.text.count("does not cover this replica") == 2, "said when it changes, not every time"


class _Leases:
    """A Lease store that answers as the API server does: a replace must carry the stored
    resourceVersion (else 409); `renew_between` simulates the election thread's renew landing
    between the hand-back's read and its write, once."""

    def __init__(self, holder: str, renew_between: bool) -> None:
        self.holder, self.version, self.renew_between = holder, 1, renew_between

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        spec = client.V1LeaseSpec(holder_identity=self.holder, lease_duration_seconds=15)
        return client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, resource_version=str(self.version)), spec=spec
        )

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Any:
        if self.renew_between:
            self.renew_between = False
            self.version += 1
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise ApiException(status=409, reason="Conflict")
        self.holder, self.version = body["spec"]["holderIdentity"] or "", self.version + 1
        return body


@pytest.mark.parametrize("renew_between", [False, True], ids=["quiet", "a-renew-lands-in-between"])
def test_a_clean_stop_hands_the_lease_back_even_when_a_renew_lands_meanwhile(renew_between: bool):
    e = leader.Elector(client.ApiClient(), "clef-system", "op-a", LeaseTiming(15, 10, 2), fence=Fence())
    leases = _Leases("op-a", renew_between)
    e.leases = leases  # type: ignore[assignment]
    e.leading.set()
    e.release()
    assert leases.holder == "", "handed back: a standby takes it at its next look"
