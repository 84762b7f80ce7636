"""Our servers (and a stock one) as nodes of the released router, on loopback.

Runtime: about 25 s on 2 cores (three nodes start; the stock node's start dominates)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from evolve.loop import server_concurrency
from evolve.preflight import health_gpus
from kcoral import Client, Program
from kcoral.errors import RemoteError
from tests.kcoral.compat.stock_for_client import install as install_stock
from tests.kcoral_server.router.routerproc import RELEASE, RouterProcess, StockNode, kill_server, our_node
from tests.serverproc import REPO_ROOT, ServerProcess


def sleeper(seconds: float) -> Program:
    p = Program()
    mod = p.upload(kind="module", source="import time\ndef main(s):\n    time.sleep(s)\n    return 42\n")
    fn = p.get_function(module=mod, name="main", cpu_only=True)
    p.return_(key="out", value=p.run(fn=fn, args=[seconds]))
    return p


def test_nodes_join_and_work_spreads_over_them(router_binary, tmp_path):
    router = RouterProcess(router_binary).start()
    nodes = []
    try:
        nodes = [our_node(router, "cpu-a"), our_node(router, "cpu-b")]
        health = router.wait_capacity(2)
        # What evolve sizes its concurrency from: the router's slots (no worker list, no GPUs).
        assert server_concurrency(health) == 2 and health_gpus(health) == 0
        assert health["versions"]["kcoral-evolve"]       # the nodes' own report, passed on

        client = Client(router.url)
        with ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(lambda _: client.execute(sleeper(0.4), timeout_seconds=60), range(6)))
        assert all(o.status == "COMPLETED" and o.results["out"] == 42 for o in outcomes)
        ours = {n.instance_id: name for n, name in zip(nodes, ("cpu-a", "cpu-b"))}
        assert {o.server_instance for o in outcomes} == set(ours)      # both nodes ran work
        for o in outcomes:                                             # each says where it ran
            assert o.node_id == ours[o.server_instance] and o.worker_id == "cpu/w0"

        # Our nodes' extensions reach the client through the router (builtins, 3600 s timeouts).
        caps = Client(router.url).capabilities()
        assert caps.ours and caps.has("builtins") and caps.max_timeout == 3600
        z = Program()
        z.return_(key="z", value=z.run(fn="builtin.zeros", args=[[3], "float32"]))
        assert Client(router.url).execute(z, timeout_seconds=60).results["z"].tolist() == [0.0, 0.0, 0.0]

        # The node token is the node's secret: no program sees it in its environment.
        spy = Program()
        m = spy.upload(kind="module", source="import os\ndef f():\n    return sorted(k for k, v in os.environ.items()"
                                                " if 'NODE_TOKEN' in k or v == %r)\n" % router.token)
        spy.return_(key="seen", value=spy.run(fn=spy.get_function(module=m, name="f", cpu_only=True)))
        assert Client(router.url).execute(spy, timeout_seconds=60).results["seen"] == []

        # kcoral tools through the router.
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "hello.py").write_text("print('hello from', 6 * 7)\n")
        out = subprocess.run([sys.executable, "-m", "kcoral.cli", "python", "--remote", router.url,
                              "--send", str(tmp_path / "app"), "--", "hello.py"],
                             capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        assert out.returncode == 0 and "hello from 42" in out.stdout, out.stderr[-2000:]
        status = subprocess.run([sys.executable, "-m", "kcoral.cli", "status", "--remote", router.url, "--json"],
                                capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert status.returncode == 0 and json.loads(status.stdout)["load"]["request_capacity"] == 2
    finally:
        for n in nodes:
            n.stop()
        router.kill()


def test_a_stock_node_serves_and_the_router_keeps_one_cohort(router_binary):
    """A released server joins the released way and serves our client through the router.
    The router admits one cohort (the first node's reported target and versions): our node,
    whose environment differs, is kept out of its capacity rather than mixed in."""
    try:
        paths = install_stock(RELEASE.value)
    except RuntimeError as exc:
        pytest.skip(f"stock server dependencies unavailable: {str(exc)[:300]}")
    router = RouterProcess(router_binary).start()
    stock = node = None
    try:
        stock = StockNode(paths, router, "stock-a").start()
        router.wait_capacity(1)
        done = Client(router.url).execute(sleeper(0.1), timeout_seconds=60)
        assert done.status == "COMPLETED" and done.results["out"] == 42 and done.node_id is None
        assert not Client(router.url).capabilities().ours       # released nodes: the released protocol
        node = our_node(router, "cpu-b")
        time.sleep(4)                                   # several status rounds
        health = router.health()
        assert health["load"]["request_capacity"] == 1 and health["versions"] == {}
    finally:
        if node:
            node.stop()
        if stock:
            stock.stop()
        router.kill()


def test_router_loss_midrequest_is_an_unknown_outcome_and_nodes_rejoin(router_binary):
    """The router crashes while our node runs a program: the node cancels it and logs the
    outcome as unknown, the client raises OutcomeUnknown (nothing reruns it), and the node
    rejoins the restarted router by itself."""
    router = RouterProcess(router_binary).start()
    node = None
    try:
        node = our_node(router, "cpu-a")
        router.wait_capacity(1)
        failure: list[BaseException] = []

        def call() -> None:
            try:
                Client(router.url).execute(sleeper(20), timeout_seconds=60)
            except RemoteError as exc:
                failure.append(exc)

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 30
        while node.health()["active_requests"] == 0:
            assert time.monotonic() < deadline, node.log()[-3000:]
            time.sleep(0.05)
        router.kill()
        t.join(30)
        # The client learns the outcome is unknown, and does not send it again.
        assert failure and failure[0].kind == "outcome_unknown", failure
        deadline = time.monotonic() + 30
        while not any(e.get("event") == "tunnel_lost" for e in node.events()):
            assert time.monotonic() < deadline, node.log()[-3000:]
            time.sleep(0.1)
        lost = next(e for e in node.events() if e.get("event") == "tunnel_lost")
        assert lost["outcome"] == "unknown" and lost["node_id"] == "cpu-a"
        deadline = time.monotonic() + 30
        while not [r for r in node.request_logs() if r.get("status") == "CANCELLED"]:
            assert time.monotonic() < deadline, node.log()[-3000:]      # the program was stopped
            time.sleep(0.1)
        assert node.health()["active_requests"] == 0

        router.start()                     # same port: the node reconnects with backoff
        router.wait_capacity(1, timeout=60)
        done = Client(router.url).execute(sleeper(0.1), timeout_seconds=60)
        assert done.status == "COMPLETED" and done.node_id == "cpu-a"
        # the node writes a request's log line once its answer is sent, so the client can
        # hold the answer a moment before the line exists
        deadline = time.monotonic() + 10
        while len(node.request_logs()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(node.request_logs()) == 2            # the lost program ran once, then this one
    finally:
        if node:
            node.stop()
        router.kill()


def test_node_crash_midrequest_is_reported_not_rerun(router_binary):
    """A node dies while running a program: the client learns the outcome is unknown
    (OutcomeUnknown), and the other node never ran it."""
    from kcoral.errors import OutcomeUnknown

    router = RouterProcess(router_binary).start()
    nodes = []
    try:
        nodes = [our_node(router, "cpu-a"), our_node(router, "cpu-b")]
        router.wait_capacity(2)
        caught: list[BaseException] = []
        t = threading.Thread(target=lambda: _record(caught, lambda: Client(router.url).execute(
            sleeper(20), timeout_seconds=60)))
        t.start()
        deadline = time.monotonic() + 30
        while not any(n.health()["active_requests"] for n in nodes):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        busy = next(n for n in nodes if n.health()["active_requests"])
        other = next(n for n in nodes if n is not busy)
        kill_server(busy)
        t.join(30)
        assert caught and isinstance(caught[0], OutcomeUnknown), caught
        assert caught[0].status_code == 502
        time.sleep(0.5)
        assert other.health()["active_requests"] == 0 and not other.request_logs()   # not rerun there
    finally:
        for n in nodes:
            n.stop()
        router.kill()


def _record(into: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        into.append(exc)


def test_join_settings_are_checked(tmp_path, monkeypatch):
    from kcoral_server.cli import build_parser, join_from_args

    def refusal(*args: str) -> str:
        with pytest.raises(SystemExit) as exc:
            join_from_args(build_parser().parse_args(["--cpu-workers", "1", *args]))
        return str(exc.value)
    monkeypatch.delenv("KCORAL_NODE_TOKEN", raising=False)
    assert "--router needs --node-id" in refusal("--router", "http://127.0.0.1:9")
    assert "need --router" in refusal("--node-id", "x")
    assert "must be an http" in refusal("--router", "grpc://h:1", "--node-id", "x")
    empty = tmp_path / "tok"
    empty.write_text("\n")
    assert "is empty" in refusal("--router", "http://127.0.0.1:9", "--node-id", "x", "--node-token-file", str(empty))
    good = tmp_path / "good"
    good.write_text("s3cret\n")
    join = join_from_args(build_parser().parse_args(["--router", "http://127.0.0.1:9", "--node-id", "x",
                                                     "--node-token-file", str(good)]))
    assert join is not None and join.token == "s3cret" and "s3cret" not in repr(join)


def test_a_node_with_the_wrong_token_is_refused_and_says_so(router_binary):
    router = RouterProcess(router_binary).start()
    node = None
    try:
        node = ServerProcess(["--cpu-workers", "1", "--router", router.url, "--node-id", "intruder"],
                             env={"KCORAL_NODE_TOKEN": "not-the-router-token"}).start()
        deadline = time.monotonic() + 30
        while not any(e.get("hint") for e in node.events() if e.get("event") == "router_disconnected"):
            assert time.monotonic() < deadline, node.log()[-3000:]
            time.sleep(0.1)
        refused = next(e for e in node.events() if e.get("hint"))
        assert refused["error"].startswith("UNAUTHENTICATED") and "KCORAL_NODE_TOKEN" in refused["hint"]
        assert router.health()["load"]["request_capacity"] == 0
    finally:
        if node:
            node.stop()
        router.kill()


def test_a_draining_node_answers_its_request_and_leaves(router_binary):
    """SIGTERM: the node stops taking work from the router, answers the program it runs,
    closes its slots (a slot that served before included) and exits 0."""
    import signal

    router = RouterProcess(router_binary).start()
    node = None
    try:
        node = our_node(router, "cpu-a")
        router.wait_capacity(1)
        assert Client(router.url).execute(sleeper(0.1), timeout_seconds=60).status == "COMPLETED"
        answers: list = []
        t = threading.Thread(target=lambda: _record(answers, lambda: answers.append(
            Client(router.url).execute(sleeper(2), timeout_seconds=60))))
        t.start()
        deadline = time.monotonic() + 30
        while node.health()["active_requests"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        node.proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert answers and getattr(answers[0], "results", None) == {"out": 42}, answers
        assert node.proc.wait(30) == 0
        assert "router_node_stopped" in [e.get("event") for e in node.events()]
        assert not [e for e in node.events() if e.get("event") == "tunnel_lost"]
    finally:
        if node:
            node.stop()
        router.kill()
