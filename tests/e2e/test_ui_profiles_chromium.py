"""The status page's profile switcher in a real headless Chromium: shown only when the config has profiles,
and a mouse click on a profile makes it the server's active profile (the switcher then shows it)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import aiohttp

from llmswap.config.model import ApiKey, Config, ProfileConfig
from tests.e2e import test_ui_chromium as ui
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import Served, serving

pytestmark = ui.pytestmark
KEY = "sk-ui-profiles-0123"


def with_profiles(*profiles: ProfileConfig) -> Config:
    base = exclusive_config(demo_config("a"), demo_config("b"))
    return Config(models=base.models, routing=base.routing, api_keys=(ApiKey(KEY),),
                  profiles=MappingProxyType({profile.id: profile for profile in profiles}))


async def active(http: aiohttp.ClientSession, served: Served) -> str | None:
    async with http.get(served.at("/api/profiles"), headers={"Authorization": f"Bearer {KEY}"}) as response:
        value = (await response.json())["active"]
        assert value is None or isinstance(value, str)
        return value


async def click(page: ui.DevTools, selector: str) -> None:
    """A real mouse click (pressed, released) at the middle of the element."""
    box = await page.evaluate(
        f"(() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect();"
        " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    for kind in ("mousePressed", "mouseReleased"):
        await page.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left",
                        clickCount=1)


async def test_clicking_a_profile_makes_it_active(tmp_path: Path) -> None:
    config = with_profiles(
        ProfileConfig("work", "office hours", MappingProxyType({"chat": "b"})),
        ProfileConfig("home", "", MappingProxyType({"chat": "a"})),
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_read=ui.WITHIN)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(config) as served,
        ui.chromium(tmp_path, http) as page,
    ):
        await page.call("Page.enable")
        await page.navigate(served.at(f"/ui#key={KEY}"))
        await page.wait_for("!document.getElementById('profiles').hidden", what="the switcher to show")
        names = await page.evaluate(
            "[...document.querySelectorAll('#profiles button')].map((b) => b.textContent)")
        assert names == ["none", "home", "work"]
        assert await active(http, served) is None

        await click(page, '#profiles button[data-profile="work"]')
        await page.wait_for(
            "document.querySelector('#profiles button[data-profile=\"work\"]')"
            ".getAttribute('aria-pressed') === 'true'", what="work shown active")
        assert await active(http, served) == "work"

        await click(page, '#profiles button[data-profile=""]')
        await page.wait_for("document.body.dataset.profile === ''", what="no profile shown active")
        assert await active(http, served) is None


async def test_the_switcher_stays_hidden_without_profiles(tmp_path: Path) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=ui.WITHIN)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(with_profiles()) as served,
        ui.chromium(tmp_path, http) as page,
    ):
        await page.call("Page.enable")
        await page.navigate(served.at(f"/ui#key={KEY}"))
        await page.wait_for("document.body.dataset.profile === ''", what="the profiles to be read")
        assert await page.evaluate("document.getElementById('profiles').hidden") is True
