"""report.html in a real browser: Debian's chromium driven by Playwright (its own browser download is
never used: `executable_path` is the system's chromium, `$CPTEST_CHROMIUM` or `chromium` on PATH).

Opens the report of the committed SGLang DCP2 archive, of the committed fault run, of a reference
archive made here by `cptest run --engine reference` (the page that run wrote itself), and of a copy
of the DCP2 archive whose scenario and evidence hold markup. Checks that the verdict rows, the
plots (at a nonzero size) and the ownership map render, that nothing is fetched from the network,
and that hostile text stays text: no script runs (`window.__pwned` stays undefined), the markup is
shown literally.

Screenshots (full pages and a few sections, PNG) are kept as artifacts of the test run, in
`$CPTEST_ARTIFACTS/report-html/` or else `test-artifacts/report-html/` in the checkout (git-ignored):
report-dcp2.png, report-dcp2-ownership.png, report-fault.png, report-fault-outcomes.png,
report-reference.png, report-hostile.png.

Skipped, with the reason, only when no chromium is installed; CI installs it (.ci/run) and sets
CPTEST_REQUIRE_BROWSER=1, which turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from cptest import store
from cptest.report.html import render_html
from tests.reference.conftest import ensure_tiny_models

REPO = Path(__file__).resolve().parents[2]
DCP2 = next((REPO / "results/dcp2_llama_kv1").iterdir())
FAULT = next((REPO / "results/fault_kill_rank_dcp2").iterdir())
SCRIPT = "<script>window.__pwned=1</script>"
IMG = '<img src=x onerror="window.__pwned=2">'
HOSTILE = SCRIPT + IMG


def _chromium() -> str | None:
    named = os.environ.get("CPTEST_CHROMIUM")
    if named:
        return named
    return next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)


CHROMIUM = _chromium()
if CHROMIUM is None:
    if os.environ.get("CPTEST_REQUIRE_BROWSER"):
        raise RuntimeError("CPTEST_REQUIRE_BROWSER is set and no chromium was found "
                           "(apt-get install chromium)")
    pytest.skip("no chromium on this machine (apt-get install chromium, or set CPTEST_CHROMIUM)",
                allow_module_level=True)


def artifacts() -> Path:
    root = Path(os.environ.get("CPTEST_ARTIFACTS") or REPO / "test-artifacts")
    out = root / "report-html"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Root in a container has no user namespace for chromium's sandbox.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=args)
        yield b
        b.close()


class Opened:
    """A page with what it asked the network for and what it logged as an error."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))


def open_report(browser: Browser, path: Path, shot: str) -> Opened:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    opened = Opened(page)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=str(artifacts() / f"{shot}.png"), full_page=True)
    return opened


def assert_offline_and_quiet(o: Opened, path: Path) -> None:
    foreign = [u for u in o.requests if u != path.as_uri() and not u.startswith("data:")]
    assert foreign == [], f"the page fetched {foreign}"
    assert o.errors == [], o.errors  # a CSP violation or a script error would be logged here


def assert_plots_drawn(page: Page, count: int) -> None:
    plots = page.locator("figure.plot svg")
    assert plots.count() == count
    for i in range(count):
        box = plots.nth(i).bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100, (i, box)


def assert_verdict_rows(page: Page, archive: Path) -> None:
    verdicts = json.loads((archive / "verdict.json").read_text())["verdicts"]
    rows = page.locator("#verdict-table tbody tr")
    assert rows.count() == len(verdicts)
    for i, v in enumerate(verdicts):
        row = rows.nth(i)
        assert row.locator("td").nth(1).inner_text().startswith(v["checker"])
        assert row.locator("td").nth(2).inner_text() == v["status"].upper()
        assert row.locator("td").nth(4).inner_text() == (v["source"] or "—")


def assert_ownership_map(page: Page) -> None:
    image = page.locator("#ownership figure.plot svg image")
    assert image.count() == 1
    box = image.bounding_box()
    assert box is not None and box["width"] > 200 and box["height"] > 100, box


def test_the_sglang_dcp2_report_renders_its_verdicts_plots_and_ownership_map(browser: Browser,
                                                                               tmp_path: Path) -> None:
    path = tmp_path / "dcp2.html"
    path.write_text(render_html(DCP2), encoding="utf-8")
    o = open_report(browser, path, "report-dcp2")
    page = o.page
    assert page.title() == "dcp2_llama_kv1: FAIL"
    assert_verdict_rows(page, DCP2)
    assert_plots_drawn(page, 5)
    assert_ownership_map(page)
    assert "rank 0: 19158; rank 1: 19125" in page.locator("#ownership table").inner_text()
    assert page.locator("#capacity table").inner_text().count("65536") >= 2
    assert page.locator("#pins").inner_text().count("0.5.17") >= 1
    page.locator("#ownership").screenshot(path=str(artifacts() / "report-dcp2-ownership.png"))
    assert_offline_and_quiet(o, path)


def test_the_fault_report_shows_the_fault_over_the_request_outcomes(browser: Browser, tmp_path: Path) -> None:
    path = tmp_path / "fault.html"
    path.write_text(render_html(FAULT), encoding="utf-8")
    o = open_report(browser, path, "report-fault")
    page = o.page
    assert_verdict_rows(page, FAULT)
    assert_plots_drawn(page, 5)
    assert_ownership_map(page)
    outcomes = page.locator("#outcomes")
    text = outcomes.inner_text()
    assert '"action": "kill"' in text and "Request outcomes: error 24, ok 8." in text
    assert "ClientPayloadError" in text  # the in-flight requests of the killed server
    # the fault's line is drawn in the timeline: its label is SVG text
    assert outcomes.locator("svg text", has_text="fault").count() >= 1
    outcomes.screenshot(path=str(artifacts() / "report-fault-outcomes.png"))
    assert_offline_and_quiet(o, path)


REFERENCE_SCENARIO = """\
cptest 1
scenario browser_reference_dcp2 {{
  extends "{defaults}"
  engine reference "builtin"
  model local "{model}"
  facts {{ architecture "LlamaForCausalLM" layers 4 hidden 256 heads 8 kv_heads 1 head_dim 64 vocab 4096 }}
  topology {{ gpus 2 tp 2 dcp 2 }}
  baseline none
  workload {{ requests 6 concurrency 3 prompt_tokens uniform(16, 128) output_tokens 6 }}
  expect {{
    rows kv_owner position % 2
    capacity logical == 2 * physical
  }}
}}
"""


@pytest.fixture(scope="module")
def reference_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of the CPU reference engine (DCP2, 6 requests, no baseline: seconds on 2 cores)."""
    folder = tmp_path_factory.mktemp("reference")
    scenario = folder / "browser_reference_dcp2.cps"
    scenario.write_text(REFERENCE_SCENARIO.format(defaults=REPO / "scenarios/defaults/tiny.cps",
                                                  model=ensure_tiny_models() / "llama-kv1"))
    done = subprocess.run([sys.executable, "-m", "cptest", "run", str(scenario), "--results",
                           str(folder / "results"), "--models", str(ensure_tiny_models()), "--json"],
                          cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["engine"] == "reference", done.stderr[-2000:]
    return Path(out["archive"])


def test_a_reference_archive_opens_the_page_its_run_wrote(browser: Browser, reference_archive: Path) -> None:
    path = reference_archive / "report.html"
    o = open_report(browser, path, "report-reference")
    page = o.page
    assert page.locator("#not-sglang").is_visible()
    assert_verdict_rows(page, reference_archive)
    assert_plots_drawn(page, 5)
    assert_ownership_map(page)
    assert_offline_and_quiet(o, path)


def _rewrite_jsonl(path: Path, change: Any) -> None:
    # The archive may store the file packed (`<name>.xz`); the store reads it back either way.
    lines = [json.loads(line) for line in store.read_bytes(path).decode().splitlines() if line.strip()]
    store.packed(path).unlink(missing_ok=True)
    path.write_text("".join(json.dumps(change(d)) + "\n" for d in lines))


def hostile_copy(tmp_path: Path) -> Path:
    """The DCP2 archive with markup in its scenario, a verdict's reason, a request id of the probe's
    K/V writes, a request's error and a lifecycle event's detail."""
    d = tmp_path / "hostile"
    shutil.copytree(DCP2, d)
    scenario = d / "scenario.cps"
    scenario.write_text(f"# {HOSTILE}\n" + scenario.read_text())
    verdict = json.loads((d / "verdict.json").read_text())
    verdict["verdicts"][0]["reason"] = HOSTILE
    (d / "verdict.json").write_text(json.dumps(verdict))
    first_rid = None

    def rename(rec: dict[str, Any]) -> dict[str, Any]:
        nonlocal first_rid
        for key in ("kv_written", "seq_positions"):
            if rec.get(key):
                first_rid = first_rid or next(iter(rec[key]))
                rec[key] = {HOSTILE if r == first_rid else r: v for r, v in rec[key].items()}
        return rec

    for w in (0, 1):
        _rewrite_jsonl(d / f"evidence/main/rank{w}.jsonl", rename)

    def runner(rec: dict[str, Any]) -> dict[str, Any]:
        if rec["kind"] == "request" and rec["index"] == 3:
            rec.update(status="error", error=HOSTILE)
        if rec["kind"] == "lifecycle" and rec["event"] == "signal":
            rec["detail"]["why"] = HOSTILE
        return rec

    _rewrite_jsonl(d / "evidence/main/runner.jsonl", runner)
    return d


def test_hostile_text_in_an_archive_stays_text(browser: Browser, tmp_path: Path) -> None:
    archive = hostile_copy(tmp_path)
    path = tmp_path / "hostile.html"
    path.write_text(render_html(archive), encoding="utf-8")
    o = open_report(browser, path, "report-hostile")
    page = o.page
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("script").count() == 0 and page.locator("img").count() == 0
    reason = page.locator("#verdict-table tbody tr").first.locator("td").nth(3).inner_text()
    assert reason.startswith(HOSTILE)
    assert HOSTILE in page.locator("#scenario-L1").inner_text()
    assert HOSTILE in page.locator("#outcomes").inner_text()  # the request's error and the event's detail
    # the request id in the ownership map's labels: matplotlib's SVG text, shortened
    assert page.locator("#ownership svg text", has_text="<script>w").count() >= 1
    assert_plots_drawn(page, 5)
    assert_offline_and_quiet(o, path)
