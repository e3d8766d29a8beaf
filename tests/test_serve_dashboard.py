"""The live dashboard in a real browser: headless Chromium (Debian's package) driven by Playwright.

While clients send requests that share a preamble, the page must show frames mapped by more than
one request (the prefix cache at work) and a batch timeline that grows. It saves a screenshot;
MINIPAGED_UPDATE_FIGURES=1 also writes it to docs/figures/dashboard.png.
"""

import asyncio
import os
import random
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from checkpoints import WORDS, write_checkpoint
from minipaged import LLM
from minipaged.serve.api import Server, ServerConfig
from minipaged.serve.cli import ServerThread

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FIGURE = Path(__file__).parent.parent / "docs" / "figures" / "dashboard.png"


def chromium() -> str:
    """Debian's Chromium, or a skip that says why; as root (CI) a missing browser is a failure:
    `make test` installs it there."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    message = "no chromium on PATH: install Debian's chromium package (`make test` does so when run as root)"
    if os.environ.get("CI") or os.geteuid() == 0:
        pytest.fail(message)
    pytest.skip(message)


def load(url: str, stop: threading.Event, seconds: float) -> None:
    """12 clients, requests sharing a preamble (their prompt blocks are shared frames), until
    `stop` or `seconds` (bounded), whichever comes first."""
    rng = random.Random(3)
    preamble = "you are a helpful assistant who explains the paged kv cache and its frames "

    async def client(http):
        while not stop.is_set():
            prompt = preamble + " ".join(rng.choice(WORDS[5:]) for _ in range(rng.randint(1, 12)))
            await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": rng.randint(20, 120),
                                                     "temperature": 0.8, "ignore_eos": True})

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            tasks = [asyncio.create_task(client(http)) for _ in range(12)]
            await asyncio.wait(tasks, timeout=seconds)
            stop.set()
            await asyncio.wait(tasks, timeout=30)

    asyncio.run(run())


def test_dashboard_in_a_browser_shows_shared_frames_and_a_growing_timeline(tmp_path):
    executable = chromium()
    import playwright.sync_api as playwright   # the test extra (make test): missing, this fails
    # a slightly larger random model, so that a step lasts a few ms and the pictures move visibly
    folder = write_checkpoint(tmp_path / "model", hidden=128, layers=4, intermediate=256, max_positions=512)
    llm = LLM(str(folder), device="cpu", num_blocks=16, block_size=4)
    engine = llm.new_engine(num_blocks=160, block_size=8, max_num_seqs=12)
    server = Server(engine, llm.tokenizer, ServerConfig(model_name="tiny-dashboard"))
    stop = threading.Event()
    with ServerThread(server) as url, playwright.sync_playwright() as p:
        clients = threading.Thread(target=load, args=(url, stop, 25.0), daemon=True)
        clients.start()
        browser = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/")
            page.wait_for_selector("#frames .frame", timeout=15_000)
            most_shared, steps, owners_seen = 0, [], set()
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline and (most_shared == 0 or len(steps) < 5 or len(owners_seen) < 4):
                view = page.evaluate("""() => ({
                    shared: document.querySelectorAll('#frames .frame.multi').length,
                    owners: [...document.querySelectorAll('#frames .frame[title*=" of "]')].map(f => f.title.split(" of ")[1]),
                    rows: document.querySelectorAll('#timeline .tl-row').length,
                    newest: Number(document.querySelector('#timeline .tl-row')?.dataset.step ?? -1)})""")
                most_shared = max(most_shared, view["shared"])
                owners_seen |= set(view["owners"])
                steps.append((view["rows"], view["newest"]))
                time.sleep(0.25)
            assert most_shared > 0, "no frame was ever drawn as mapped by two or more requests"
            assert len(owners_seen) >= 4, f"the frame map showed only {owners_seen}"
            assert steps[-1][1] > steps[0][1] and steps[-1][0] > 0, f"the timeline did not grow: {steps}"
            page.screenshot(path=str(tmp_path / "dashboard.png"))
        finally:
            browser.close()
            stop.set()
            clients.join(timeout=40)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    if os.environ.get("MINIPAGED_UPDATE_FIGURES"):
        shutil.copy(tmp_path / "dashboard.png", FIGURE)
