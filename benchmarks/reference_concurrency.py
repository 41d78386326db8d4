"""Reference engine at its declared concurrency: count transport errors over many runs.

Issue 14, "Drop requests with no fault injected": on the reference engine 3 of 64 baseline requests
of dcp4_llama (concurrency 16) failed with a transport error, and a rerun lost others. Done when:
"10 reference runs at concurrency 64: 0 transport errors".

Each run starts a reference server (TP2 DCP2 by default, `--tp`/`--dcp`, on the store's tiny
`llama-kv1`, through cptest's process launcher) on a free port, waits for readiness, and drives
`--requests` streaming requests at `--concurrency` with cptest's workload driver (one connection
per request, bench_serving's policy: D40), then SIGTERMs the server. A request that is not `ok` is
counted by its error; `transport` counts connection-level failures (refused, reset, disconnected,
payload cut).
`--backlog N` starts the server with another listen backlog (5 is socketserver's default, what
the reference engine had before issue 14): the control.

    python benchmarks/reference_concurrency.py --runs 10 --concurrency 64 --requests 192
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRANSPORT = ("ClientConnector", "ServerDisconnected", "ClientOSError", "ClientPayloadError",
             "Connection reset", "ReadError", "ConnectError", "RemoteProtocolError", "stream ended without")


def server_argv(model: str, port: int, backlog: int | None, tp: int = 2, dcp: int = 2) -> list[str]:
    args = ["--model-path", model, "--port", str(port), "--tp-size", str(tp), "--dcp-size", str(dcp)]
    if backlog is None:
        return ["python3", "-m", "cptest.reference.server", *args]
    code = ("import sys; import cptest.reference.server as s; "
            f"s.Server.request_queue_size = {int(backlog)}; sys.exit(s.main(sys.argv[1:]))")
    return [sys.executable, "-c", code, *args]


def one_run(i: int, model: str, n: int, concurrency: int, backlog: int | None,
            tmp: Path, tp: int = 2, dcp: int = 2) -> dict[str, object]:
    import httpx

    from cptest.plan.model import NodeLaunch, PlannedRequest, WorkloadPlan
    from cptest.retry import retry
    from cptest.run.driver import WorkloadDriver
    from cptest.run.evidence_writer import RecordWriter
    from cptest.run.process import ProcessLauncher, listening_pids

    port = _free_port()
    launcher = ProcessLauncher()
    node = NodeLaunch(node_rank=0, gpu_ids=[], env={}, port=port,
                      argv=server_argv(model, port, backlog, tp, dcp))
    handle = launcher.start(node, tmp / f"server-{i}.log", {"bench": "concurrency"})
    url = f"http://127.0.0.1:{port}"
    try:
        def ready(last: bool) -> bool:
            if handle.poll() is not None:
                raise SystemExit(f"the server exited: see {handle.log_path}")
            try:
                return httpx.get(url + "/health_generate", timeout=10).status_code == 200
            except httpx.HTTPError:
                return False

        retry(ready, 120, 0.2, "waiting for the reference server")
        assert listening_pids(port) == [handle.session], listening_pids(port)  # ranks hold no copy
        rng = random.Random(1000 + i)
        reqs = [PlannedRequest(index=k, max_new_tokens=rng.randrange(8, 33), sampling={"temperature": 0.0},
                               input_ids=[rng.randrange(2, 500) for _ in range(rng.randrange(64, 257))])
                for k in range(n)]
        workload = WorkloadPlan(seed=i, concurrency=concurrency, rate_per_s=None, timeout_s=300,
                                requests=reqs)
        writer = RecordWriter(tmp / f"runner-{i}.jsonl")
        t0 = time.monotonic()
        summary = WorkloadDriver(url, workload, role="main", writer=writer).run()
        wall = time.monotonic() - t0
    finally:
        info = launcher.teardown(handle, grace_s=30)
    errors = [r.error for r in summary.results if r.status != "ok"]
    transport = [e for e in errors if any(t in e for t in TRANSPORT)]
    return {"run": i, "port": port, "requests": n, "ok": summary.completed, "failed": summary.failed,
            "timeout": summary.timeout, "transport_errors": len(transport),
            "errors": dict(Counter(e.split(":")[0] for e in errors)), "wall_s": round(wall, 2),
            "left": info.leftover_pids}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--backlog", type=int, default=None, help="listen backlog of the server (control: 5)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dcp", type=int, default=2)
    ap.add_argument("--model", default=None, help="model dir (default: the store's llama-kv1)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    model = a.model
    if model is None:
        from cptest.run.models import make_named, store_dir

        model = str(make_named("llama-kv1", store_dir(None))[0])
    runs = []
    with tempfile.TemporaryDirectory(prefix="cptest-conc-") as tmpdir:
        for i in range(a.runs):
            r = one_run(i, model, a.requests, a.concurrency, a.backlog, Path(tmpdir), a.tp, a.dcp)
            runs.append(r)
            print(json.dumps(r), flush=True)
    summary = {"runs": len(runs), "concurrency": a.concurrency, "tp": a.tp, "dcp": a.dcp,
               "backlog": a.backlog or "engine default",
               "requests": sum(int(r["requests"]) for r in runs),  # type: ignore[call-overload]
               "ok": sum(int(r["ok"]) for r in runs),  # type: ignore[call-overload]
               "transport_errors": sum(int(r["transport_errors"]) for r in runs),  # type: ignore[call-overload]
               "other_failures": sum(int(r["failed"]) + int(r["timeout"]) - int(r["transport_errors"])  # type: ignore[call-overload]
                                     for r in runs)}
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    return 1 if summary["transport_errors"] or summary["other_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
