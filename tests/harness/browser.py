"""A real browser for the console's tests: Debian's chromium driven by Playwright.

Playwright never downloads a browser here: it launches /usr/bin/chromium
(`apt-get install chromium`; .ci/run installs it). Each page's console errors
are collected, so a Content-Security-Policy violation (a blocked inline script
or third-party load) fails the test that caused it. `snap` saves a screenshot
to test-artifacts/console/.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("AGENTRUN_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"


def require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install -y chromium (CI installs it)")


@dataclass
class Browser:
    page: Any  # playwright.async_api.Page
    base_url: str
    errors: list[str] = field(default_factory=list)

    def on_console(self, message: Any) -> None:
        url = str(message.location.get("url", ""))
        # The browser asks every origin for /favicon.ico by itself (the sandbox IdP has none).
        if message.type == "error" and not url.endswith("/favicon.ico"):
            self.errors.append(f"{message.text} ({url})")

    async def goto(self, path: str) -> Any:
        return await self.page.goto(f"{self.base_url}{path}")

    async def snap(self, name: str) -> Path:
        """A full-page screenshot, test-artifacts/console/<name>.png."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{re.sub(r'[^a-z0-9_-]+', '-', name.lower())}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        return path

    async def sign_in_with_key(self, key: str) -> None:
        await self.goto("/console/signin")
        await self.page.fill("#signin-key input[name=key]", key)
        await self.page.click("#signin-key button")
        await self.page.wait_for_url(re.compile(r".*/console/runs.*"))

    async def sign_in_with_sso(self, workspace: str, email: str) -> None:
        """Through the sandbox IdP's authorize page, as a test user."""
        await self.goto("/console/signin")
        await self.page.fill("#signin-oidc input[name=workspace]", workspace)
        await self.page.click("#signin-oidc button")
        await self.page.wait_for_url(re.compile(r".*/authorize\?.*"))
        await self.page.fill("input[name=email]", email)
        await self.page.click("button[type=submit]")
        await self.page.wait_for_url(re.compile(r".*/console/runs.*"))


@asynccontextmanager
async def chromium(base_url: str) -> AsyncIterator[Browser]:
    """A fresh browser context (no cookies) on the console at `base_url`."""
    require_chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await context.new_page()
            page.set_default_timeout(20_000)
            b = Browser(page, base_url)
            page.on("console", b.on_console)
            page.on("pageerror", lambda exc: b.errors.append(str(exc)))
            yield b
        finally:
            await browser.close()
