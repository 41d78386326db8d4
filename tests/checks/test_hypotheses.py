"""`cptest lint --evidence DIR`: every release rule tested against the archives of real runs.

The committed 0.5.17 archives are real tests of some rules; a copy whose generation held where the
table says it cannot shows what a refutation looks like (and exits 1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from cptest.checks.hypotheses import judge

ROOT = Path(__file__).resolve().parents[2]
KV4 = ROOT / "results" / "dcp2_llama_kv4" / "20261203T081109Z-733943a0"
PCP_NO_OP = ROOT / "results" / "pcp2_zigzag_llama_kv1" / "20261203T081917Z-e9c6fc26"
LLAMA_PCP = ROOT / "results" / "pcp2_zigzag_llama_kv2" / "20261203T143850Z-3d162b6e"


def rules(root: Path) -> dict[tuple[str, str], object]:
    return {(t.release, t.code): t for t in judge(root).rules}


def test_the_committed_archives_confirm_what_they_showed(tmp_path: Path) -> None:
    for a in (KV4, LLAMA_PCP):
        shutil.copytree(a, tmp_path / a.parent.name / a.name)
    judged = rules(tmp_path)
    crash, kv = judged["0.5.17", "llama_pcp"], judged["0.5.17", "mha_dcp_kv_not_replicated"]
    assert crash.status == "confirmed" and crash.seen[0][2] == "the server did not come up"  # type: ignore[attr-defined]
    assert kv.status == "confirmed" and kv.seen[0][2] == "generation failed"  # type: ignore[attr-defined]
    # what nobody ran stays untested, whatever the table says about it
    assert judged["0.5.17", "zigzag_short_prompt"].status == "untested"  # type: ignore[attr-defined]
    # 0.5.17's archives say nothing about 0.5.23
    assert judged["0.5.23", "llama_pcp"].seen == []  # type: ignore[attr-defined]


def test_rules_about_a_split_do_not_apply_where_the_release_never_splits(tmp_path: Path) -> None:
    # Llama's PCP on 0.5.17 is accepted and splits nothing (a CP-v2 class gate): its correct output
    # tests no rule about split attention, and the table's prediction says so today.
    shutil.copytree(PCP_NO_OP, tmp_path / PCP_NO_OP.parent.name / PCP_NO_OP.name)
    judged = rules(tmp_path)
    for code in ("llama_pcp_silent", "interleave_no_attention"):
        assert judged["0.5.17", code].seen == []  # type: ignore[attr-defined]


def test_an_archive_where_the_contract_held_refutes_the_rule_and_lint_exits_1(tmp_path: Path) -> None:
    copy = tmp_path / "dcp2_llama_kv4" / KV4.name
    shutil.copytree(KV4, copy)
    verdict = json.loads((copy / "verdict.json").read_text())
    for v in verdict["verdicts"]:
        if v["checker"] == "generation":  # declared violated: a pass is a seen violation; flip it
            v["status"] = "fail" if v["status"] == "pass" else "pass"
    (copy / "verdict.json").write_text(json.dumps(verdict))
    t = rules(tmp_path)["0.5.17", "mha_dcp_kv_not_replicated"]
    assert t.status == "refuted" and t.seen == [(str(copy), "refuted", "generation held")]  # type: ignore[attr-defined]
    done = subprocess.run([sys.executable, "-m", "cptest", "lint", "--evidence", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1
    assert f"refuted: 0.5.17 mha_dcp_kv_not_replicated by {copy}: generation held" in done.stdout
    as_json = json.loads(subprocess.run([sys.executable, "-m", "cptest", "lint", "--evidence", str(tmp_path),
                                         "--json"], capture_output=True, text=True, cwd=ROOT,
                                        timeout=120).stdout)
    row = next(r for r in as_json["rules"]
               if (r["release"], r["rule"]) == ("0.5.17", "mha_dcp_kv_not_replicated"))
    assert row["status"] == "refuted" and row["provenance"] == "observed" and as_json["archives"] == 1
