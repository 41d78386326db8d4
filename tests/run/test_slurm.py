"""The slurm launcher (cptest/run/slurm.py) on a real Slurm cluster, and the pieces it is built from.

The cluster is `.ci/slurm-cluster.sh start`: slurmctld, two slurmd (n1, n2) on this host, MUNGE. The
tests that need it skip with the reason when no cluster answers, and fail instead when
CPTEST_REQUIRE_SLURM=1 (CI sets it: there the cluster is the point). Nothing here fakes Slurm: jobs,
steps, signals and cancellations are Slurm's own.

The runs name no ports: each claims a free port slot host-wide as every `cptest run` without
`--ports` does, so another copy of the test suite on this host cannot collide with them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cptest.errors import EvidenceError
from cptest.plan.model import NodeLaunch
from cptest.run.reaper import ident
from cptest.run.slurm import SlurmLauncher, exit_status, key_values, nodes_of, preflight_causes, with_job
from cptest.store import Layout, node_named

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "reference_two_node_kill_rank.cps"


def _cluster() -> str | None:
    """Why no cluster can be used here, or None when sinfo lists two idle-or-usable nodes."""
    if shutil.which("sinfo") is None:
        return "no Slurm client installed (.ci/slurm-cluster.sh start installs and starts a test cluster)"
    try:
        r = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], capture_output=True,
                           text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s"
    nodes = [line.split() for line in r.stdout.splitlines() if len(line.split()) == 2]
    if r.returncode != 0 or len(nodes) < 2:
        return f"no Slurm cluster of two nodes answers (sinfo: {(r.stderr or r.stdout).strip()[:200]}); " \
               "run: set -a; eval \"$(.ci/slurm-cluster.sh start)\"; set +a"
    return None


WHY = _cluster()
if WHY is not None and os.environ.get("CPTEST_REQUIRE_SLURM") == "1":
    # CI sets this (slurm-cluster.sh prints it): there a missing cluster is a failure, not a skip.
    raise RuntimeError(f"CPTEST_REQUIRE_SLURM=1 but {WHY}")
needs_cluster = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def _jobs_named(prefix: str) -> list[str]:
    r = subprocess.run(["squeue", "--noheader", "--format=%i %j"], capture_output=True, text=True, timeout=20)
    return [line for line in r.stdout.splitlines() if line.split()[-1].startswith(prefix)]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cancel_jobs_of(results: Path) -> list[str]:
    """Cancel every job of the runs under `results` (the launcher's own crash-recovery `sweep`, by
    run id) and wait until squeue lists none of them; the jobs squeue still lists after 30 s."""
    runs = [run.name for run in results.glob("*/*") if run.is_dir()]
    prefixes = tuple(f"cptest-{run}-" for run in runs)
    for run in runs:
        SlurmLauncher().sweep({"cptest.run": run})

    def listed() -> list[str]:
        return [line for line in _jobs_named("cptest-") if line.split()[-1].startswith(prefixes)]

    deadline = time.monotonic() + 30
    while listed() and time.monotonic() < deadline:
        time.sleep(0.5)
    return listed()


def _story(results: Path) -> str:
    """What the runs under `results` recorded: their lifecycle events and the tail of each log."""
    lines = []
    for runner in sorted(results.glob("*/*/evidence/*/runner.jsonl")):
        for r in _records(runner):
            lines.append(f"{r.get('t', 0):8.2f} {r.get('event') or r.get('kind')} "
                         f"{json.dumps(r.get('detail', {}))[:300]}")
    for log in sorted(results.glob("*/*/logs/*.log")):
        lines.append(f"-- {log.name}, last lines:")
        lines.extend(log.read_text(errors="replace").splitlines()[-15:])
    return "\n".join(lines)


def _cptest_run(argv: list[str], results: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`python -m cptest <argv>`. One that overruns is killed with its Slurm jobs, and the test fails
    with what it had said and recorded: a hung run must not leave its servers on the ports that the
    tests after it claim."""
    proc = subprocess.Popen([sys.executable, "-m", "cptest", *argv], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        left = _cancel_jobs_of(results)
        pytest.fail(f"cptest {' '.join(argv[:2])} did not end within {timeout_s:.0f} s; jobs left after "
                    f"scancel: {left}\n-- its stderr:\n{err[-4000:]}\n-- its records:\n{_story(results)}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ------------------------------------------------------------------------------ pure pieces
def test_the_rendezvous_flags_come_from_the_job_and_the_port_from_the_plan() -> None:
    argv = ["python3", "-m", "x", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.0.1:30050"]
    assert with_job(argv, 2, 1, "10.1.2.3")[-6:] == ["--nnodes", "2", "--node-rank", "1",
                                                    "--dist-init-addr", "10.1.2.3:30050"]
    assert with_job(argv, 2, 1, "fe80::1")[-1] == "[fe80::1]:30050"
    assert with_job(["python3", "-m", "x"], 1, 0, "h") == ["python3", "-m", "x"]  # one node: nothing to set
    node = NodeLaunch(node_rank=0, gpu_ids=[], env={}, argv=argv, port=1)
    assert nodes_of(node) == 2 and nodes_of(node.model_copy(update={"argv": ["a"]})) == 1


def test_sruns_exit_codes_read_as_the_process_launchers_statuses() -> None:
    assert [exit_status(c) for c in (0, 3, 137, 143, None)] == [0, 3, -9, -15, None]


def test_scontrol_one_liners_are_read_as_key_values() -> None:
    kv = key_values("NodeName=n1 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=localhost Version=22.05.8")
    assert kv["NodeAddr"] == "127.0.0.1" and kv["NodeHostName"] == "localhost"


def test_without_a_slurm_client_preflight_says_unknown_never_fail(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from cptest.lang import parse_file
    from cptest.plan import plan

    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo, srun, ... on it
    causes = preflight_causes(plan(parse_file(SCENARIO)))
    assert [c.code for c in causes] == ["slurm_missing"]
    assert "unknown (slurm_missing)" in causes[0].line() and ".ci/slurm-cluster.sh start" in causes[0].line()


def test_the_archive_reads_rank_files_and_logs_kept_under_node_names(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.make_dirs(["main"])
    for name, world in (("n1", 0), ("n2", 1)):
        d = node_named(layout.role_dir("main"), name)
        d.mkdir()
        (d / f"rank{world}.jsonl").write_text("")
        node_named(layout.log("main", world), name).write_text(f"log of {name}\n")
    assert {w: layout.relative(p) for w, p in layout.rank_files("main").items()} == {
        0: "evidence/main/n1/rank0.jsonl", 1: "evidence/main/n2/rank1.jsonl"}
    assert layout.relative(layout.node_log("main", 1)) == "logs/main-node1-n2.log"
    (layout.role_dir("main") / "rank1.jsonl").write_text("")  # the same rank twice: refused
    with pytest.raises(EvidenceError, match="rank 1 has two probe files"):
        layout.rank_files("main")
    with pytest.raises(ValueError, match="cannot name a file"):
        node_named(layout.log("main", 0), "../x")


# ------------------------------------------------------------------------------ on the cluster
@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    return tmp_path_factory.mktemp("models")


def _archive(results: Path) -> Path:
    found = [p for p in results.glob("*/*") if p.is_dir() and not p.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]


@needs_cluster
def test_a_two_node_run_with_a_rank_kill_goes_through_slurm_and_passes_check(tmp_path: Path,
                                                                               models: Path) -> None:
    results = tmp_path / "runs"
    t0 = time.monotonic()
    run = _cptest_run(["run", str(SCENARIO), "--launcher", "slurm", "--engine", "reference", "--results",
                       str(results), "--models", str(models), "--no-baseline-cache"], results, 300)
    took = time.monotonic() - t0
    assert run.returncode == 0, run.stdout + run.stderr
    archive = _archive(results)
    check = subprocess.run([sys.executable, "-m", "cptest", "check", str(archive), "--json"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    verdicts = {v["checker"]: v["status"] for v in json.loads(check.stdout)["verdicts"]}
    assert verdicts and set(verdicts.values()) == {"pass"}, verdicts
    assert {"rows", "serving", "shutdown", "log"} <= set(verdicts)
    verify = subprocess.run([sys.executable, "-m", "cptest", "verify", str(archive)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    # Each node's logs and rank files under its name; the job and the nodes recorded.
    layout = Layout(archive)
    assert {w: layout.relative(p) for w, p in layout.rank_files("main").items()} == {
        0: "evidence/main/n1/rank0.jsonl", 1: "evidence/main/n2/rank1.jsonl"}
    assert sorted(p.name for p in (archive / "logs").iterdir()) == ["main-node0-n1.log", "main-node1-n2.log"]
    records = _records(layout.runner_file("main"))
    where = [r["detail"]["where"] for r in records if r.get("event") == "launched"]
    assert [w["node_name"] for w in where] == ["n1", "n2"]
    assert [w["job_nodes"] for w in where] == [["n1", "n2"], ["n1", "n2"]]
    job = where[0]["job"]
    assert job and job.isdigit() and {w["job"] for w in where} == {job}
    assert [w["step"].split(".")[0] for w in where] == [job, job]
    fault = next(r["detail"] for r in records if r.get("event") == "fault")
    assert fault["via"] == "srun" and fault["node_name"] == "n2"
    assert fault["title"] == "cptest-ref::scheduler_TP1"
    assert "error" not in fault
    exited = {r["detail"]["node"]: r["detail"]["status"] for r in records if r.get("event") == "exited"}
    assert exited == {0: -9, 1: -9}  # both nodes end by their own SIGKILL after the rank's death
    assert not _jobs_named(where[0]["job_name"]), "the job outlived the run"
    print(f"two-node run through Slurm: {took:.1f} s, verdicts {verdicts}")


@needs_cluster
def test_sigkill_of_cptest_mid_run_leaves_no_job_and_no_engine_process(tmp_path: Path, models: Path) -> None:
    # The same two nodes, no fault, requests enough to be running when cptest is killed.
    scenario = tmp_path / "long.cps"
    text = SCENARIO.read_text().replace("fault kill rank 1 after 4 requests", "")
    text = text.replace("requests 16", "requests 2000").replace("of 16", "of 2000")
    text = text.replace('extends "defaults/tiny.cps"', f'extends "{REPO / "scenarios/defaults/tiny.cps"}"')
    scenario.write_text(text.replace("reference_two_node_kill_rank", "slurm_sigkill"))
    results = tmp_path / "runs"
    err = tmp_path / "cptest.stderr"  # what cptest said, should it end before its server is ready
    proc = subprocess.Popen([sys.executable, "-m", "cptest", "run", str(scenario), "--launcher", "slurm",
                             "--engine", "reference", "--results", str(results), "--models", str(models),
                             "--no-baseline-cache"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err.open("wb"),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        launched: list[dict] = []
        while time.monotonic() < deadline:
            runner = [p for p in results.glob("*/*/evidence/main/runner.jsonl")]
            if runner:
                recs = _records(runner[0])
                if any(r.get("event") == "ready" for r in recs):
                    launched = [r["detail"] for r in recs if r.get("event") == "launched"]
                    break
            assert proc.poll() is None, (
                f"cptest ended before its server was ready: {err.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        assert len(launched) == 2, "the server did not become ready"
        name = launched[0]["where"]["job_name"]
        assert _jobs_named(name), "no job while the server runs"
        archive = _archive(results)
        ranks = [r["rank"]["pid"] for w in (0, 1)
                 for r in _records(next(archive.glob(f"evidence/main/*/rank{w}.jsonl")))
                 if r["kind"] == "geometry"]
        engine = {pid: ident(pid) for pid in [d["pid"] for d in launched] + ranks if pid}
        assert len(engine) == 4 and all(engine.values())  # two node mains, two ranks, alive
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        t_kill = time.monotonic()
        while _jobs_named(name) and time.monotonic() - t_kill < 60:
            time.sleep(0.2)
        gone_after = time.monotonic() - t_kill
        assert not _jobs_named(name), f"squeue still lists the job {60} s after SIGKILL of cptest"
        while any(ident(p) == c for p, c in engine.items()) and time.monotonic() - t_kill < 60:
            time.sleep(0.2)
        left = [p for p, c in engine.items() if ident(p) == c]
        assert not left, f"engine processes {left} outlived cptest"
        print(f"squeue empty {gone_after:.1f} s after SIGKILL of cptest")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _cancel_jobs_of(results)  # whatever failed above, no server of this run outlives the test


@needs_cluster
def test_the_reaper_cancels_a_job_cptest_never_learnt_the_id_of(tmp_path: Path) -> None:
    # cptest killed while salloc waited: the reaper knows only the name it was told first.
    name = f"cptest-reapertest-{os.getpid()}"
    me = psutil.Process(os.getpid())
    reaper = subprocess.Popen([sys.executable, "-m", "cptest.run.reaper", "slurm", str(me.pid),
                               repr(me.create_time()), name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, start_new_session=True, cwd=REPO)
    try:
        assert reaper.stdout is not None and reaper.stdout.readline().strip() == b"ready"
        r = subprocess.run(["salloc", "--no-shell", f"--job-name={name}", "--nodes=1", "--time=5"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert _jobs_named(name)
        assert reaper.stdin is not None
        reaper.stdin.close()  # what cptest's death does to the lifeline
        assert reaper.wait(timeout=60) == 0
        assert not _jobs_named(name)
    finally:
        if reaper.poll() is None:
            reaper.kill()
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, timeout=30)
