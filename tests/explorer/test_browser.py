"""The plan explorer in a real browser (Debian's chromium driven by Playwright): the question a user brings, which
plan for Llama 3.1 70B on 4 nodes of 8 H100s and how sure is it, answered from the page, then a broken config."""

import json
import os
from pathlib import Path

import pytest

from tests.explorer.conftest import REPO, REQUEST
from tests.serve.conftest import call

SCREENSHOT = Path(os.environ.get("PLANSIGHT_SCREENSHOT", REPO / "build" / "explorer.png"))
WAIT_MS = 120_000
VERIFY_WAIT_MS = 900_000  # a 70B plan traced (serve.verify.cost: POST /verify takes at most 300 s of estimate)


@pytest.fixture(scope="module")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright  # lazy: skipped (chromium_path) without Playwright

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start
        browser = p.chromium.launch(executable_path=chromium_path, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    page.close()
    assert errors == [], errors  # no script error on the way


def _choose(page, **fields) -> None:
    """Set the form's fields by id (underscores for dashes): a select takes its option, an input its text."""
    for name, value in fields.items():
        selector = "#" + name.replace("_", "-")
        tag = page.eval_on_selector(selector, "e => e.tagName")
        page.select_option(selector, value) if tag == "SELECT" else page.fill(selector, value)


def _answered_beside(page, error: str, **fields) -> str:
    """Set ``fields``, search, and read the message the page puts in the ``error`` element."""
    _choose(page, **fields)
    page.click("#run")
    page.wait_for_selector(f"#{error}:not(:empty)", timeout=WAIT_MS)
    return page.inner_text(f"#{error}")


def _cells(page, column: str) -> list[str]:
    return page.eval_on_selector_all(f"#plans tbody td.{column}", "cells => cells.map(c => c.innerText)")


def test_llama_70b_on_32_h100_from_the_page(browser, page, explorer):
    page.goto(explorer + "/")
    page.wait_for_selector("#workload option[value='llama-3.1-70b']", state="attached")
    _choose(page, workload="llama-3.1-70b", hardware="preset:h100-80gb", nodes="4", trials="200", top_k="10")
    with page.expect_request("**/searches") as sent:
        page.click("#run")
    assert json.loads(sent.value.post_data) == REQUEST
    page.wait_for_selector("#plans tbody tr", timeout=WAIT_MS)
    assert page.inner_text("#progress-text").startswith("200 of 200 trials")

    # the table is what POST /search answers for the same request: the same plans, in order, at the same times
    direct = call(explorer, "POST", "/search", REQUEST)[1]
    times = [float(t.split()[0]) for t in _cells(page, "time")]
    assert times == [round(r["prediction"]["iter_time_s"], 2) for r in direct["best"]]
    assert "Best plan" in page.inner_text("#answer") and f"{times[0]:.2f} s" in page.inner_text("#answer")
    # the warnings a plan carries are on the page, not only in the JSON
    warned = [r for r in direct["best"] if r["prediction"]["extrapolation"]]
    if warned:
        assert warned[0]["prediction"]["extrapolation"][0] in page.inner_text("#plans")
    assert page.locator("#scatter circle").count() > 10

    # the first plan of the ranking, clicked: its memory per pipeline rank and its simulated timeline
    page.click("#plans tbody tr[data-rank='1']")
    page.wait_for_selector("#timeline[src^='data:image/png']", timeout=WAIT_MS)
    assert page.locator("#memory-chart rect.part-weights").count() >= 1
    assert page.locator("#memory-chart rect.part-activations").count() >= 1
    assert "Plan 1" in page.inner_text("#detail-title")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    # verified: the plan traced under fake tensors (POST /verify), its exact peak said beside the prediction, or
    # why it could not be (a convention the collector does not run, such as FP8 or context parallelism)
    with page.expect_response("**/verify", timeout=VERIFY_WAIT_MS) as got:
        page.click("#verify")
    sent, verified = json.loads(got.value.request.post_data), got.value.json()
    assert sent["plans"] == [direct["best"][0]["plan"]] and sent["cluster"] == REQUEST["cluster"]
    page.wait_for_function("/^(traced peak|not traced)/.test(document.querySelector('#verify-result').innerText)")
    said, (plan,) = page.inner_text("#verify-result"), verified["plans"]
    if plan["status"] == "ok":
        assert said.startswith(f"traced peak {plan['traced_peak_bytes'] / 2**30:.1f} GiB") and "80% interval" in said
    else:
        assert said.startswith(f"not traced ({plan['status']}): {plan['error'][:40]}")

    # sorting by memory orders the rows by it
    page.click("#plans th[data-key=memory]")
    memory = [float(m.split()[0]) for m in _cells(page, "memory")]
    assert memory == sorted(memory)

    # downloads: the same JSON the API answers, and a CSV of the table
    with page.expect_download() as got:
        page.click("#download-json")
    assert json.loads(Path(got.value.path()).read_text())["best"] == direct["best"]
    with page.expect_download() as got:
        page.click("#download-csv")
    assert len(Path(got.value.path()).read_text().splitlines()) == 1 + len(direct["best"])

    # the state is in the URL: opened afresh, it shows the same ranking, sorted as it was
    url = page.url
    assert "run=1" in url and "sort=memory" in url
    again = browser.new_page()
    again.goto(url)
    again.wait_for_selector("#plans tbody tr", timeout=WAIT_MS)
    assert _cells(again, "memory") == _cells(page, "memory")
    again.close()


def test_a_broken_config_is_answered_next_to_its_field(page, explorer):
    page.goto(explorer + "/")
    page.wait_for_selector("#workload option[value='hf']", state="attached")
    config = '{"architectures": ["BertModel"], "hidden_size": 768}'
    assert "BertModel" in _answered_beside(page, "hf-error", workload="hf", hf=config, seq="2048", gbs="64")
    assert page.inner_text("#general-error") == ""
    page.fill("#hf", '{"architectures": ')
    page.click("#run")
    page.wait_for_function("document.querySelector('#hf-error').innerText.startsWith('not JSON')")
    # a plan space with nothing that fits: said beside the cluster
    nothing = dict(workload="llama-3.1-70b", hardware="preset:v100-16gb", nodes="1", trials="50")
    assert "No plan fits" in _answered_beside(page, "cluster-error", **nothing)
    # over the limits: the service's message, beside the trial budget
    assert "5000" in _answered_beside(page, "trials-error", workload="llama-3.1-8b", trials="6000")
