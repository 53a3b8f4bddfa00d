"""The documentation site and the report pages as a reader sees them: each page loaded in headless chromium (Debian's
`chromium` package; .ci/run installs it) at a laptop's and a phone's width, checked for what a person would notice:
examples shown as code (not as nested quotes), every image loaded, nothing fetched from another machine, a flag's
link landing on the flag, a search for a flag typed with its dashes finding it, the eval report's headline in the
first screen, the study page's sections. Screenshots of each page are left in the test's folder.

Without a browser the tests are skipped, unless YT8M_REQUIRE_BROWSER=1 (as .ci/run sets it): then they fail.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO_ROOT
from headless import DESKTOP, PHONE, Browser, browser_binary, left_the_machine
from tune_fixtures import shards, tune_file  # noqa: F401  (fixtures)
from yt8m import cli

pytestmark = pytest.mark.browser

# Every docstring example of the API (yt8m.api's functions and the registries), each a >>> block.
API_EXAMPLES = 12
HEADLINE = ("GAP", "mAP", "Hit@1", "PERR")

# What the page shows a reader, read in the page: visible text of elements, their boxes, the images' state.
PAGE_FACTS = """(() => {
  const visible = el => { const box = el.getBoundingClientRect(); return box.width > 0 && box.height > 0; };
  return {
    title: document.title,
    images: Array.from(document.images).map(img => [img.currentSrc.slice(0, 40), img.complete, img.naturalWidth]),
    blockquotes: document.querySelectorAll("article blockquote, body > blockquote").length,
    prompts_outside_code: Array.from(document.querySelectorAll("article p, article li, article blockquote"))
      .filter(el => el.textContent.includes(">>>")).length,
    examples: Array.from(document.querySelectorAll("article pre code"))
      .filter(el => el.textContent.trimStart().startsWith(">>>")).length,
    overflow: document.documentElement.scrollWidth - window.innerWidth,
    visible_headings: Array.from(document.querySelectorAll("h1, h2")).filter(visible).length,
  };
})()"""


def require_browser() -> str:
    binary = browser_binary()
    if binary is None:
        if os.environ.get("YT8M_REQUIRE_BROWSER") == "1":
            pytest.fail("YT8M_REQUIRE_BROWSER=1 and no chromium on PATH (apt-get install chromium)")
        pytest.skip("no headless browser (chromium) on PATH; apt-get install chromium to run the browser tests")
    return binary


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    opened = Browser(require_browser())
    try:
        yield opened
    finally:
        opened.close()


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """`folder` over HTTP on loopback (the site's search runs in a web worker, which a file:// page may not start)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[str]:
    """The documentation site, built as `make docs` builds it, served on loopback."""
    require_browser()
    folder = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    built = subprocess.run([str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(folder)], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr[-3000:]
    with served(folder) as url:
        yield url


def facts(browser: Browser, url: str, size: tuple[int, int], shot: Path) -> dict:
    """Open `url` at `size`, screenshot it to `shot`, and return PAGE_FACTS with the requests and errors it made."""
    browser.requests.clear()
    browser.open(url, size)
    browser.screenshot(str(shot))
    seen = browser.evaluate(PAGE_FACTS)
    return {**seen, "left": left_the_machine(browser.requests), "errors": browser.console_errors()}


@pytest.mark.parametrize("page", ["", "reference/api/", "reference/commands/", "how-to/tuning/", "troubleshooting/"])
def test_a_page_of_the_site_shows_code_as_code_loads_its_images_and_stays_on_this_machine(browser, site, page,
                                                                                           tmp_path):
    for size in (DESKTOP, PHONE):
        seen = facts(browser, site + page, size, tmp_path / f"{page.strip('/').replace('/', '_') or 'home'}"
                                                            f"-{size[0]}.png")
        assert seen["left"] == [] and seen["errors"] == [], seen
        assert seen["blockquotes"] == 0 and seen["prompts_outside_code"] == 0, seen  # no example as nested quotes
        assert all(complete and width > 0 for _, complete, width in seen["images"]), seen["images"]
        assert seen["overflow"] <= 0, f"{page} is wider than a {size[0]} px window by {seen['overflow']} px"
    if page == "reference/api/":
        assert seen["examples"] == API_EXAMPLES
    if page == "how-to/tuning/":
        assert len(seen["images"]) >= 2  # pictures of what the study's page shows


def test_the_api_page_lists_every_configs_settings_by_section(browser, site):
    browser.open(site + "reference/api/")
    tables = browser.evaluate("""Object.fromEntries(["TrainConfig", "EvalConfig", "PredictConfig"].map(name => [name,
        Array.from(document.querySelectorAll(`h3[id^="${name}."]`)).map(h => {
          let next = h.nextElementSibling;  // Material wraps a table in scrolling divs
          while (next && next.tagName !== "TABLE" && !next.querySelector("table")) next = next.nextElementSibling;
          const table = next && (next.tagName === "TABLE" ? next : next.querySelector("table"));
          return [h.id, table ? table.querySelectorAll("tbody tr").length : 0]; })]))""")
    for name, sections in tables.items():
        assert len(sections) >= 3 and all(rows > 0 for _, rows in sections), (name, sections)
    assert dict(tables["TrainConfig"])["TrainConfig.schedule"] >= 4
    entries = browser.evaluate("['yt8m.data.reading.spec.FeatureSpec', 'yt8m.data.reading.batch.Batch']"
                               ".map(id => !!document.getElementById(id))")
    assert entries == [True, True]


def test_a_flags_link_lands_on_it_and_a_search_with_its_dashes_finds_it(browser, site):
    browser.open(site + "reference/commands/#train--num_epochs", settle=1.0)
    landed = browser.evaluate("""(() => { const el = document.getElementById("train--num_epochs");
        const box = el.getBoundingClientRect();
        return [el.tagName, el.textContent.trim(), box.top >= 0 && box.bottom <= window.innerHeight]; })()""")
    assert landed == ["H4", "--num_epochs¶", True]
    browser.open(site + "?q=--num_epochs", settle=3.0)  # Material's search opens with ?q=, as if typed
    found = browser.evaluate("Array.from(document.querySelectorAll('.md-search-result__item a'))"
                             ".map(a => new URL(a.href).pathname + new URL(a.href).hash)")
    assert "/reference/commands/#train--num_epochs" in found[:3], found


@pytest.fixture(scope="module")
def pages(tmp_path_factory, shards) -> dict:  # noqa: F811
    """A two-trial study's page and its best trial's evaluation report, as `yt8m tune-report --report` writes them."""
    require_browser()
    folder = tmp_path_factory.mktemp("pages")
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        assert cli.main(["tune", "--config", tune_file(folder / "tune.yaml", shards, tune={"pruner": "none"}),
                         "--n_trials", "2"]) == 0
        assert cli.main(["tune-report", str(folder / "study"), "--report", str(folder / "study.html"),
                         "--vocabulary_file", str(shards / "vocabulary.csv")]) == 0
    return {"study": folder / "study.html", "evaluation": folder / "study_best_trial.html"}


def test_the_eval_reports_first_screen_shows_the_headline(browser, pages, tmp_path):
    for size in (DESKTOP, PHONE):
        seen = facts(browser, pages["evaluation"].as_uri(), size, tmp_path / f"evaluation-{size[0]}.png")
        assert seen["left"] == [] and seen["errors"] == [] and seen["overflow"] <= 0, seen
        assert len(seen["images"]) >= 3 and all(complete and width > 0 for _, complete, width in seen["images"])
        cards = browser.evaluate("""Array.from(document.querySelectorAll("[data-headline]")).map(card => [
            card.querySelector(".label").textContent, card.getBoundingClientRect().bottom <= window.innerHeight])""")
        if size == DESKTOP:  # GAP, mAP, Hit@1 and PERR without scrolling
            assert cards == [[label, True] for label in HEADLINE]
        assert [label for label, _ in cards] == list(HEADLINE)
    verdict = browser.evaluate("document.getElementById('verdict').textContent")
    assert verdict.startswith("GAP ") and "Read with care:" in verdict  # 16 steps: undertrained, said first


def test_the_study_page_shows_its_sections_and_figures(browser, pages, tmp_path):
    seen = facts(browser, pages["study"].as_uri(), DESKTOP, tmp_path / "study-1280.png")
    assert seen["left"] == [] and seen["errors"] == [], seen
    assert len(seen["images"]) == 2 and all(complete and width > 0 for _, complete, width in seen["images"])
    sections = browser.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
    assert sections[:2] == ["The best trial's evaluation: trial " + sections[0].rsplit(" ", 1)[-1], "Leaderboard"]
    assert {"Best so far", "What the pruner saw", "Hyper-parameter importances"} <= set(sections)
    rows = browser.evaluate("document.querySelectorAll('#leaderboard tr[data-trial]').length")
    assert rows == 2
    phone = facts(browser, pages["study"].as_uri(), PHONE, tmp_path / "study-390.png")
    assert phone["overflow"] <= 0, phone
