"""The console's runs list at volume, in a real browser (Debian's chromium via Playwright).

A control plane in the test's event loop over a real Postgres holding 5,000 runs, admitted
through the store (tests/factories.py), several sharing each created_at instant so the
keyset must break ties by run id. Nobody runs them. The browser pages through all of them
forwards and back by the pages' own links; a run cancelled elsewhere shows in the open
list without a reload; at a phone's width nothing is wider than the screen.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from control_plane.store import runs as run_store
from tests import factories
from tests.harness import auth
from tests.harness.browser import Browser, chromium, require_chromium

RUNS = 5000
PAGE = 500
PHONE = {"width": 390, "height": 844}


async def _admitted(db_url: str, server, n: int):  # noqa: ANN001, ANN202
    require_chromium()
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=8)
    start = datetime.now(UTC) - timedelta(hours=2)
    admitted = await factories.many_runs(pool, n, start, same_instant=7)
    key = await auth.workspace_key(db_url, "ws", role="operator", principal="ops-pat")
    return pool, admitted, key, f"http://127.0.0.1:{server.http_port}"


@pytest.fixture
async def many(db_url, server):
    pool, *rest = await _admitted(db_url, server, RUNS)
    yield pool, *rest
    await pool.close()


@pytest.fixture
async def few(db_url, server):
    pool, *rest = await _admitted(db_url, server, 30)
    yield pool, *rest
    await pool.close()


async def listed(b: Browser) -> list[str]:
    return await b.page.eval_on_selector_all(
        "#run-rows tr[data-run]", "rows => rows.map(r => r.dataset.run)"
    )


async def test_page_through_5000_runs_forwards_and_back_with_no_row_twice_or_missing(many):
    pool, admitted, key, url = many
    newest_first = sorted(admitted, key=lambda r: (r.created_at, r.run_id), reverse=True)
    expected = [str(r.run_id) for r in newest_first]
    async with chromium(url) as b:
        await b.sign_in_with_key(key)
        await b.goto(f"/console/runs?size={PAGE}")
        assert await b.page.text_content("#run-counts [data-count=all]") == str(RUNS)
        assert await b.page.text_content("#run-counts [data-count=queued]") == str(RUNS)
        assert await b.page.locator("#prev").count() == 0  # the newest page: nothing newer
        pages = [await listed(b)]
        while await b.page.locator("#next").count():
            async with b.page.expect_navigation():
                await b.page.click("#next")
            pages.append(await listed(b))
        forwards = [run for page in pages for run in page]
        assert forwards == expected  # every run once, newest first, none missing
        assert len(pages) == RUNS // PAGE and all(len(p) == PAGE for p in pages)
        await b.snap("runs-last-page")

        back = [await listed(b)]
        while await b.page.locator("#prev").count():
            async with b.page.expect_navigation():
                await b.page.click("#prev")
            back.append(await listed(b))
        assert back == pages[::-1]  # the same pages, the same rows, going back
        assert b.errors == []


async def test_a_run_cancelled_elsewhere_shows_in_the_open_list_without_a_reload(few):
    pool, admitted, key, url = few
    victim = max(admitted, key=lambda r: (r.created_at, r.run_id))  # on the first page
    async with chromium(url) as b:
        await b.sign_in_with_key(key)
        await b.goto("/console/runs?status=cancelled")
        assert await listed(b) == []
        b.page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept("stopped")))
        await b.page.click("#save-view")  # kept in this browser, a link to the same filters
        saved = b.page.locator("#views-list a.view")
        await saved.wait_for()
        assert (await saved.text_content(), await saved.get_attribute("href")) == (
            "stopped",
            "?status=cancelled",
        )
        await b.page.evaluate("window.notReloaded = true")
        await run_store.cancel_run(pool, "ws", victim.run_id, "stopped from elsewhere")
        await b.page.wait_for_selector(f"#run-rows tr[data-run='{victim.run_id}']", timeout=10_000)
        assert await b.page.text_content("#run-counts [data-count=cancelled]") == "1"
        assert await b.page.evaluate("window.notReloaded") is True

        await b.goto("/console/runs")  # the unfiltered list: the row's status changes in place
        other = sorted(admitted, key=lambda r: (r.created_at, r.run_id))[-2]
        row = b.page.locator(f"#run-rows tr[data-run='{other.run_id}'] .badge")
        assert await row.text_content() == "queued"
        await b.page.evaluate("window.notReloaded = true")
        await run_store.cancel_run(pool, "ws", other.run_id, "stopped from elsewhere")
        await b.page.wait_for_selector(
            f"#run-rows tr[data-run='{other.run_id}'] .badge.cancelled", timeout=10_000
        )
        assert await b.page.evaluate("window.notReloaded") is True
        assert b.errors == []


async def test_the_runs_list_fits_a_phone(few):
    pool, admitted, key, url = few
    async with chromium(url) as b:
        await b.sign_in_with_key(key)
        await b.page.set_viewport_size(PHONE)
        await b.goto("/console/runs")
        width = await b.page.evaluate("document.documentElement.scrollWidth")
        await b.snap("runs-phone")
        assert width <= PHONE["width"]
        assert b.errors == []


def test_cursor_round_trips():
    from control_plane.http.console.runs import _cursor, cursor_of

    row = run_store.Run.__new__(run_store.Run)
    at = datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC)
    object.__setattr__(row, "created_at", at)
    object.__setattr__(row, "run_id", uuid.UUID(int=7))
    assert _cursor("after", cursor_of(row)) == (at, uuid.UUID(int=7))
