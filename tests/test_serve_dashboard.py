"""The live dashboard: request colours and letters, prefix-cache counts at admission, a
tokens/s window, each client's service, and the page itself in a real browser (headless
Chromium, Debian's package, driven by Playwright) in projector mode at 1280x720, and
idle, before the first request: the pool and the queues drawn within a second.
Screenshots go to tmp; MINIPAGED_UPDATE_FIGURES=1 also writes them to docs/figures/
(dashboard.png, dashboard-projector.png, dashboard-static.png).
"""

import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from checkpoints import WORDS, write_checkpoint

from minipaged import LLM, SamplingParams, policies
from minipaged.outputs import StepReport
from minipaged.paging import BlockManager
from minipaged.tools.serve.api import Server, ServerConfig
from minipaged.tools.serve.cli import ServerThread
from minipaged.tools.serve.clients import OTHER, ClientNames, client_name
from minipaged.tools.serve.dashboard import (
    LETTERS,
    PALETTE,
    WINDOW,
    Dashboard,
    Styles,
    ink,
    luminance,
)
from minipaged.tools.serve.metrics import Metrics

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FIGURES = Path(__file__).parent.parent / "docs" / "figures"
PREAMBLE = "you are a helpful assistant who explains the paged kv cache and its frames "
PROJECTOR = {"width": 1280, "height": 720}


# ---- colours and letters -------------------------------------------------------------


def lab(colour: str) -> tuple[float, float, float]:
    """sRGB '#rrggbb' -> CIE L*a*b* (D65): distances in it follow what eyes tell
    apart."""
    rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = [
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
    ]
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_the_palette_holds_colours_a_room_tells_apart():
    pairs = {
        (a, b): math.dist(lab(a), lab(b)) for a, b in itertools.combinations(PALETTE, 2)
    }
    assert min(pairs.values()) >= 35, min(pairs.items(), key=lambda kv: kv[1])
    greys = [
        "#e4e4e4",
        "#ffffff",
        "#dddddd",
        "#333333",
        "#000000",
    ]  # free, cached, padding, shared, preempted
    assert min(math.dist(lab(c), lab(g)) for c in PALETTE for g in greys) >= 25
    # the check sees two teals as one
    assert math.dist(lab("#76b7b2"), lab("#86bcb6")) < 10
    contrast = {
        c: (
            (max(luminance(c), luminance(ink(c))) + 0.05)
            / (min(luminance(c), luminance(ink(c))) + 0.05)
        )
        for c in PALETTE
    }
    # a letter reads on its colour (WCAG asks 4.5 of small text)
    assert min(contrast.values()) >= 4.4, contrast


def test_live_requests_get_distinct_colours_in_arrival_order():
    styles = Styles()
    first = [styles.of(f"r{i}") for i in range(len(PALETTE))]
    assert [colour for colour, _ in first] == list(range(len(PALETTE)))
    assert [letter for _, letter in first] == list(LETTERS[: len(PALETTE)])
    assert styles.of("r3") == first[3]  # a request keeps its colour for its whole life
    styles.release("r2"), styles.release("r5")
    # the free colours, in turn
    assert styles.of("new1")[0] == 2 and styles.of("new2")[0] == 5
    # more live requests than colours: the least used goes next
    for i in range(3 * len(PALETTE)):
        styles.of(f"more{i}")
        used = [
            sum(c == k for c, _ in styles.live.values()) for k in range(len(PALETTE))
        ]
        assert max(used) - min(used) <= 1, used
    letters = [letter for _, letter in styles.live.values()]
    # short labels stay unique among live requests
    assert len(set(letters)) == len(letters)


def test_a_colour_given_back_waits_its_turn():
    styles = Styles()
    a, b, _ = styles.of("a"), styles.of("b"), styles.of("c")
    styles.release("a")
    # not a's colour, just given back
    assert styles.of("d")[0] == 3 and styles.of("d")[1] == "D"
    styles.release("b")
    assert styles.of("e")[0] not in (a[0], b[0])


def test_a_request_keeps_its_colour_and_letter_to_its_last_step(tiny_llm):
    engine, dashboard = (
        tiny_llm.new_engine(num_blocks=32, block_size=4),
        Dashboard("tiny", interval=0),
    )
    for rid in "ab":
        engine.add_request(
            rid,
            "one two three",
            SamplingParams(max_tokens=3 if rid == "a" else 6, ignore_eos=True),
        )
    while engine.has_unfinished_requests():
        report = engine.step()
        # the engine loop's order: finished(), then stepped()
        for output in report.finished:
            dashboard.finished(output, None)
        dashboard.stepped(engine, report, idle=not engine.has_unfinished_requests())
    styles = {
        (entry[0], entry[4], entry[5])
        for row in dashboard.timeline
        for entry in row["ran"]
    }
    assert styles == {("a", 0, "A"), ("b", 1, "B")}
    assert dashboard.styles.live == {}  # all given back
    assert dashboard.latest["counters"]["tokens_per_s"] == 0  # idle


# ---- counters ------------------------------------------------------------------------


def test_prefix_cache_hits_are_counted_when_a_sequence_is_admitted():
    blocks = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(100, 118))  # 18 tokens: 4 full blocks and a tail
    assert blocks.allocate("a", prompt) == 0
    assert (blocks.prefix_cache_queries, blocks.prefix_cache_hits) == (18, 0)
    blocks.allocate("b", prompt[:16] + [7, 8, 9])  # shares a's 4 full blocks
    assert (blocks.prefix_cache_queries, blocks.prefix_cache_hits) == (18 + 19, 16)
    off = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    off.allocate("a", prompt), off.allocate("b", prompt)
    # no cache, no look-ups
    assert (off.prefix_cache_queries, off.prefix_cache_hits) == (
        0,
        0,
    )


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    return LLM(
        str(write_checkpoint(tmp_path_factory.mktemp("dashboard") / "tiny")),
        device="cpu",
        num_blocks=16,
        block_size=4,
    )


def test_dashboard_and_metrics_count_prefix_hits_before_anything_finishes(tiny_llm):
    engine = tiny_llm.new_engine(num_blocks=32, block_size=4)
    dashboard, metrics = Dashboard("tiny", interval=0), Metrics("tiny")
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine.add_request("a", PREAMBLE + "one", params)
    for watcher in (dashboard, metrics):
        watcher.stepped(engine, engine.step(), idle=False)
    engine.add_request("b", PREAMBLE + "two three", params)
    report = engine.step()
    for watcher in (dashboard, metrics):
        watcher.stepped(engine, report, idle=False)
    counters = dashboard.latest["counters"]
    assert not report.finished and counters["finished"] == 0
    a, b = (engine.requests[r].prompt_token_ids for r in "ab")
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    hits = common // 4 * 4  # the full blocks of the preamble both prompts start with
    assert counters["prefix_cache_hits"] == hits and counters["prefix_hit_rate"] > 0
    text = metrics.render().decode()
    assert (
        f'minipaged:prefix_cache_hits_total{{model_name="tiny"}} {float(hits)}' in text
    )
    assert (
        'minipaged:prefix_cache_queries_total{model_name="tiny"}'
        f" {float(counters['prefix_cache_queries'])}" in text
    )


def test_the_dashboard_and_metrics_count_guesses_kept_and_rolled_back(tiny_llm):
    """With speculative decoding, each step's timeline row lists each speculating row's
    guesses and how many were kept, and the totals match the engine's own counts and
    vLLM's counters.
    """
    engine = tiny_llm.new_engine(
        num_blocks=64,
        block_size=4,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 2,
        },
    )
    dashboard, metrics = Dashboard("tiny", interval=0), Metrics("tiny")
    engine.add_request(
        "a",
        {"prompt_token_ids": [5, 6, 7, 8] * 6},
        SamplingParams(temperature=0, max_tokens=24),
    )
    engine.add_request(
        "b",
        {"prompt_token_ids": [9, 10, 11] * 5},
        SamplingParams(temperature=0, max_tokens=24),
    )
    guessed = kept = 0
    while engine.has_unfinished_requests():
        step = engine.step()
        for watcher in (dashboard, metrics):
            watcher.stepped(engine, step, idle=False)
        row = dashboard.timeline[-1]
        assert all(
            0 <= k <= g <= 3 and rid in "ab" for rid, _, g, k in row["guesses"]
        ), row
        assert sum(g for _, _, g, _ in row["guesses"]) == step.guessed
        guessed, kept = (
            guessed + step.guessed,
            kept + sum(k for *_, k in row["guesses"]),
        )
    counters = dashboard.latest["counters"]
    assert (
        guessed > 0
        and counters["guessed"] == guessed
        and counters["guesses_kept"] == kept
    )
    assert 0 < kept < guessed, (
        "a random model over repeated prompts keeps some guesses, not all"
    )
    text = metrics.render().decode()
    assert (
        'minipaged:spec_decode_num_draft_tokens_total{model_name="tiny"}'
        f" {float(guessed)}" in text
    )
    assert (
        'minipaged:spec_decode_num_accepted_tokens_total{model_name="tiny"}'
        f" {float(kept)}" in text
    )


def report(step: int, rows: int) -> StepReport:
    return StepReport(
        step=step,
        ran=[(f"r{i}", 0, "decode", 1) for i in range(rows)],
        frames_taken=0,
        frames_freed=0,
        free_frames=0,
        copies=0,
        swapped_out=0,
        swapped_in=0,
        cached_tokens=0,
        preempted=[],
        finished=[],
        seconds=0.1,
    )


def test_tokens_per_s_is_a_sliding_window_that_falls_to_zero():
    dashboard = Dashboard("tiny")
    for step in range(100):  # 10 s at 10 steps a second: 4 rows for 5 s, then 8 rows
        dashboard._record(report(step, 4 if step < 50 else 8), now=1000 + step / 10)
    # only the last 5 s
    assert dashboard.tokens_per_s(1000 + 9.95) == pytest.approx(80, rel=0.03)
    # sliding out
    assert dashboard.tokens_per_s(1000 + 12) == pytest.approx(8 * 30 / WINDOW, rel=0.03)
    assert dashboard.tokens_per_s(1000 + 20) == 0
    fresh = Dashboard("tiny")
    for step in range(10):  # a busy spell of 1 s is not diluted by a window of 5
        fresh._record(report(step, 4), now=2000 + step / 10)
    assert fresh.tokens_per_s(2000 + 0.95) == pytest.approx(40, rel=0.1)


# ---- each client's service -----------------------------------------------------------


def test_a_client_is_shown_by_address_and_a_hash_of_its_key_never_the_key():
    alice, bob = (
        client_name("10.0.0.7 Bearer sk-alice-secret"),
        client_name("10.0.0.7 Bearer sk-bob-secret"),
    )
    assert (
        alice.startswith("10.0.0.7 #")
        and "alice" not in alice
        and "secret" not in alice
    )
    # the same key, the same name
    assert alice != bob and alice == client_name("10.0.0.7 Bearer sk-alice-secret")
    assert (
        client_name("10.0.0.8 ") == "10.0.0.8"
        and client_name("alice") == "alice"
        and client_name("") == "(none)"
    )
    names = ClientNames(limit=3)
    assert [names.of(f"10.0.0.{i} ") for i in range(5)] == [
        "10.0.0.0",
        "10.0.0.1",
        "10.0.0.2",
        OTHER,
        OTHER,
    ]
    # known ones keep their names
    assert names.of("10.0.0.1 ") == "10.0.0.1" and len(names.known) == 3
    assert [names.rank(n) for n in ("10.0.0.2", "10.0.0.0", OTHER)] == [2, 0, 3]


def test_each_clients_service_is_counted_while_it_runs_and_when_it_leaves(tiny_llm):
    """Two clients under fair queuing, 2 rows: after every step each client's running
    and waiting requests, tokens served so far (a prompt once it ran, one token per row
    that ran) and the fair order's counter are what the engine says; at the end, what
    was asked.
    """
    engine = tiny_llm.new_engine(
        num_blocks=32, block_size=4, max_num_seqs=2, scheduling_policy="fair"
    )
    dashboard = Dashboard("tiny", interval=0)
    asks = {
        "alice": [([5, 6, 7, 8, 9], 4), ([5, 6, 7], 3), ([9, 8, 7, 6], 2)],
        "bob": [([10, 11], 6)],
    }
    for client, requests in asks.items():
        for i, (ids, max_tokens) in enumerate(requests):
            engine.add_request(
                f"{client}{i}",
                {"prompt_token_ids": ids},
                SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                client=client,
            )
    prompts = {
        f"{c}{i}": len(ids)
        for c, requests in asks.items()
        for i, (ids, _) in enumerate(requests)
    }
    started, rows_ran, steps = set(), {"alice": 0, "bob": 0}, 0
    while engine.has_unfinished_requests() and steps < 100:
        report, steps = engine.step(), steps + 1
        # the engine loop's order: finished(), then stepped()
        for output in report.finished:
            dashboard.finished(output, None)
        dashboard.stepped(engine, report, idle=not engine.has_unfinished_requests())
        started |= {rid for rid, *_ in report.ran}
        for rid, *_ in report.ran:
            # each row samples one token (no speculation here)
            rows_ran[rid.rstrip("0123456789")] += 1
        s, rows = engine.scheduler, {r["name"]: r for r in dashboard.latest["clients"]}
        for client in asks:
            row = rows[client]
            assert row["running"] == sum(r.client == client for r in s.running), (
                steps,
                row,
            )
            assert row["waiting"] == sum(
                r.client == client for r in [*s.waiting, *s.swapped]
            ), (steps, row)
            assert row["prompt_tokens"] == sum(
                n
                for rid, n in prompts.items()
                if rid in started and rid.startswith(client)
            )
            assert row["output_tokens"] == rows_ran[client], (steps, row)
            assert row["counter"] == round(s.order.counters[client], 1)
        # busy: the window's tokens are all someone's
        if engine.has_unfinished_requests():
            assert sum(r["share"] for r in rows.values()) == pytest.approx(1, abs=1e-3)
    assert not engine.has_unfinished_requests(), "not done in 100 steps"
    final = {r["name"]: r for r in dashboard.latest["clients"]}
    assert {
        c: (
            r["prompt_tokens"],
            r["output_tokens"],
            r["running"],
            r["waiting"],
            r["share"],
        )
        for c, r in final.items()
    } == {
        "alice": (5 + 3 + 4, 4 + 3 + 2, 0, 0, 0.0),
        "bob": (2, 6, 0, 0, 0.0),
    }  # idle: no recent tokens
    assert dashboard.client_of == {}  # nothing kept of requests that left


def test_a_clients_share_is_of_the_tokens_computed_in_the_last_window():
    engine = SimpleNamespace(
        requests={
            "a": SimpleNamespace(client="alice"),
            "b": SimpleNamespace(client="bob"),
        },
        scheduler=SimpleNamespace(order=policies.FCFS()),
    )  # an order with no counters
    dashboard = Dashboard("tiny")
    # 10 s at 10 steps a second: alice alone (4 tokens a step), then alice 1 and
    # bob 3
    for step in range(100):
        ran = (
            [("a", 0, "decode", 4)]
            if step < 50
            else [("a", 0, "decode", 1), ("b", 0, "prefill", 3)]
        )
        dashboard._record_clients(
            engine,
            StepReport(step, ran, 0, 0, 0, 0, 0, 0, 0, [], [], 0.1),
            now=1000 + step / 10,
        )
    # only the last 5 s
    rows = {r["name"]: r for r in dashboard._clients(engine, {}, now=1000 + 9.95)}
    assert (rows["alice"]["share"], rows["bob"]["share"]) == (0.25, 0.75)
    assert (rows["alice"]["recent_tokens"], rows["bob"]["recent_tokens"]) == (50, 150)
    assert rows["alice"]["counter"] is None  # fcfs keeps no counter
    # 20 s later nothing of theirs ran lately, and none of their requests is here or has
    # left
    assert dashboard._clients(engine, {}, now=1000 + 30) == []


# ---- in a browser --------------------------------------------------------------------


def chromium() -> str:
    """Debian's Chromium, or a skip that says why; as root (CI) a missing browser is a
    failure: `make test` installs it there."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    message = (
        "no chromium on PATH: install Debian's chromium package (`make test` does so"
        " when run as root)"
    )
    if os.environ.get("CI") or os.geteuid() == 0:
        pytest.fail(message)
    pytest.skip(message)


def load(
    url: str, stop: threading.Event, seconds: float, clients: int, max_tokens=(20, 120)
) -> None:
    """Clients sending requests that share a preamble (their prompt blocks are shared
    frames), until `stop` or `seconds` (bounded), whichever comes first."""
    rng = random.Random(3)

    async def client(http):
        while not stop.is_set():
            prompt = PREAMBLE + " ".join(
                rng.choice(WORDS[5:]) for _ in range(rng.randint(1, 12))
            )
            await http.post(
                "/v1/completions",
                json={
                    "prompt": prompt,
                    "max_tokens": rng.randint(*max_tokens),
                    "temperature": 0.8,
                    "ignore_eos": True,
                },
            )

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            tasks = [asyncio.create_task(client(http)) for _ in range(clients)]
            await asyncio.wait(tasks, timeout=seconds)
            stop.set()
            await asyncio.wait(tasks, timeout=60)

    asyncio.run(run())


# What the page shows, read in the page: each piece of text with its box (clipped by
# every ancestor that hides overflow, and by the screen) and its computed font size; the
# colour and letter of each live request's chip, and of the frames each request maps.
LOOK = """() => {
  const texts = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let n = 0;
  for (let node = walker.nextNode(); node; node = walker.nextNode(), n++) {
    const e = node.parentElement;
    if (!node.textContent.trim() || e.closest("script, style, title")) continue;
    let clip = {l: 0, t: 0, r: innerWidth, b: innerHeight};
    for (let a = e; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.display === "none" || s.visibility === "hidden") { clip = null; break; }
      if (s.overflow !== "visible" || a === e) {
        const r = a.getBoundingClientRect();
        clip = {l: Math.max(clip.l, r.left), t: Math.max(clip.t, r.top), r: Math.min(clip.r, r.right), b: Math.min(clip.b, r.bottom)};
      }
    }
    if (!clip) continue;
    const range = document.createRange(); range.selectNodeContents(node);
    for (const r of range.getClientRects()) {
      const box = {l: Math.max(clip.l, r.left), t: Math.max(clip.t, r.top), r: Math.min(clip.r, r.right), b: Math.min(clip.b, r.bottom)};
      if (box.r - box.l > 1 && box.b - box.t > 1)
        texts.push({node: n, text: node.textContent.trim().slice(0, 40), font: parseFloat(getComputedStyle(e).fontSize),
                    where: e.className || e.tagName, ...box});
    }
  }
  const chips = [...document.querySelectorAll(".queue .chip:not(.new)")].map(c => ({
    id: c.dataset.request, colour: getComputedStyle(c).backgroundColor, letter: c.textContent.split(" ")[0]}));
  const frames = [...document.querySelectorAll("#frames .frame")].filter(f => f.dataset.request).map(f => ({
    id: f.dataset.request, colour: getComputedStyle(f).backgroundColor, letter: f.textContent}));
  const counter = (name) => document.querySelector(`.counter[data-name="${name}"] b`)?.textContent;
  return {texts, chips, frames, tokens: counter("tokens/s"), hits: counter("prefix hits"),
          swapped: document.querySelectorAll("#q-swapped .chip").length,
          preempted: document.querySelectorAll("#timeline .slot.preempted").length,
          padding: document.querySelectorAll("#timeline .slot.padding").length,
          multi: document.querySelectorAll("#frames .frame.multi").length,
          rows: document.querySelectorAll("#timeline .tl-row").length,
          clients: [...document.querySelectorAll("#clients .cl-row:not(.head)")].map(r => r.dataset.client),
          newest: Number(document.querySelector("#timeline .tl-row")?.dataset.step ?? -1),
          page: [document.documentElement.scrollWidth, document.documentElement.scrollHeight]};
}"""


def overlaps(texts: list[dict]) -> list:
    return [
        (a["text"], b["text"])
        for a, b in itertools.combinations(texts, 2)
        if a["node"] != b["node"]
        and min(a["r"], b["r"]) - max(a["l"], b["l"]) > 0.5
        and min(a["b"], b["b"]) - max(a["t"], b["t"]) > 0.5
    ]


def check_view(view: dict, projector: bool) -> None:
    """Colours and letters of live requests distinct and the same everywhere; no text on
    other
    text; in projector mode every text at least 18 px, the page within the screen."""
    colours = {c["id"]: c["colour"] for c in view["chips"]}
    letters = {c["id"]: c["letter"] for c in view["chips"]}
    assert len(set(colours.values())) == len(colours), (
        f"live requests share a colour: {colours}"
    )
    assert len(set(letters.values())) == len(letters), (
        f"live requests share a letter: {letters}"
    )
    for frame in view["frames"]:
        if frame["id"] in colours:
            assert frame["colour"] == colours[frame["id"]], (
                frame,
                colours[frame["id"]],
            )
            assert frame["letter"] in ("", letters[frame["id"]]), (
                frame,
                letters[frame["id"]],
            )
    assert not overlaps(view["texts"]), overlaps(view["texts"])[:5]
    if projector:
        small = [t for t in view["texts"] if t["font"] < 18]
        assert not small, f"text under 18 px in projector mode: {small[:5]}"
        assert (
            view["page"][0] <= PROJECTOR["width"]
            and view["page"][1] <= PROJECTOR["height"]
        ), view["page"]


def watch(
    page, until, seconds: float, projector: bool, hold: bool = False
) -> list[dict]:
    """Look at the page four times a second, checking each view, until `until(views)` or
    `seconds`. With `hold`, the space bar then holds the picture still, and it must
    still show `until`.
    """
    views, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        views.append(page.evaluate(LOOK))
        check_view(views[-1], projector)
        if until(views):
            if not hold:
                break
            # the page may have moved on since: look again, held
            page.keyboard.press(" ")
            views.append(page.evaluate(LOOK))
            check_view(views[-1], projector)
            if until(views):
                break
            page.keyboard.press(" ")
        time.sleep(0.25)
    return views


@contextlib.contextmanager
def serve_in_browser(
    tmp_path, engine_options: dict, clients: int, max_tokens=(20, 120)
):
    """A tiny random model served with `engine_options`, `clients` clients sending
    requests, and headless Chromium: gives (browser, url, stop)."""
    executable = chromium()
    # the test extra (make test): missing, this fails
    import playwright.sync_api as playwright

    # a slightly larger random model, so that a step lasts a few ms and the pictures
    # move visibly
    folder = write_checkpoint(
        tmp_path / "model", hidden=128, layers=4, intermediate=256, max_positions=512
    )
    llm = LLM(str(folder), device="cpu", num_blocks=16, block_size=4)
    server = Server(
        llm.new_engine(**engine_options),
        llm.tokenizer,
        ServerConfig(model_name="tiny-dashboard"),
    )
    stop = threading.Event()
    with ServerThread(server) as url, playwright.sync_playwright() as p:
        # the load lasts until the test stops it (at most 120 s: the preemption test may
        # wait 90 s for its picture when two test processes and the browser share two
        # cores)
        thread = threading.Thread(
            target=load, args=(url, stop, 120.0, clients, max_tokens), daemon=True
        )
        thread.start()
        browser = p.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield browser, url, stop
        finally:
            browser.close()
            stop.set()
            thread.join(timeout=70)


def save(page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name))
    assert (tmp_path / name).stat().st_size > 10_000
    if os.environ.get("MINIPAGED_UPDATE_FIGURES"):
        shutil.copy(tmp_path / name, FIGURES / name)


# The idle page is drawn: the frame map's cells, no "connecting…", the queues said
# empty.
DRAWN = """() => document.querySelectorAll("#frames .frame").length > 0
  && !document.getElementById("title").textContent.includes("connecting")
  && document.getElementById("n-running").textContent === "(0)"
  && document.querySelector("#q-waiting .empty") !== null"""


def test_an_idle_dashboard_draws_its_pool_and_queues_within_a_second(tmp_path):
    """Before any request (what a projector shows as a meeting starts): the snapshot is
    the idle engine's, its empty pool, its queues and its model; the event stream sends
    it as the page connects; and Chromium draws the pool and the queues within a second
    of the page's start, in both modes, "connecting…" gone. A page whose events cannot
    connect still says "connecting…"."""
    executable = chromium()
    import playwright.sync_api as playwright

    llm = LLM(str(write_checkpoint(tmp_path / "model")), device="cpu", num_blocks=16)
    server = Server(
        llm.new_engine(num_blocks=48, block_size=8),
        llm.tokenizer,
        ServerConfig(model_name="tiny-idle"),
    )
    with ServerThread(server) as url:
        snapshot = httpx.get(f"{url}/dashboard/snapshot", timeout=10).json()
        assert snapshot["model"] == "tiny-idle" and snapshot["step"] == 0
        assert snapshot["frames"] == [None] * 48 and snapshot["free_frames"] == 48
        assert snapshot["queues"] == {"running": [], "waiting": [], "swapped": []}
        with httpx.stream("GET", f"{url}/dashboard/events", timeout=10) as events:
            first = next(e for e in events.iter_lines() if e.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["num_frames"] == 48
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=executable, headless=True, args=CHROMIUM_FLAGS
            )
            try:
                for projector in (False, True):
                    page = browser.new_page(viewport=PROJECTOR)
                    page.goto(
                        url + ("/?projector=1" if projector else "/"),
                        wait_until="commit",
                    )
                    page.wait_for_function(DRAWN, polling=20, timeout=10_000)
                    # milliseconds since the page's navigation started
                    took = page.evaluate("performance.now()")
                    assert took < 1000, f"the idle page took {took:.0f} ms to draw"
                    check_view(page.evaluate(LOOK), projector)
                    text = page.inner_text("body")
                    assert "tiny-idle: 48 KV frames of 8 tokens" in text, text
                    assert "0 of 48 in use" in text and "no request running" in text
                    assert page.inner_text("#n-waiting") == "(0)"
                    save(page, tmp_path, f"idle-{projector}.png")
                    page.close()
                page = browser.new_page(viewport=PROJECTOR)
                page.route("**/dashboard/*", lambda route: route.abort())
                page.goto(url + "/")
                page.wait_for_timeout(500)
                assert page.inner_text("#title") == "connecting…"
            finally:
                browser.close()


def test_dashboard_shows_shared_frames_and_a_growing_timeline(tmp_path):
    with serve_in_browser(
        tmp_path, dict(num_blocks=160, block_size=8, max_num_seqs=12), 12
    ) as (browser, url, _):
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url + "/")
        # a loaded CI machine is slow
        page.wait_for_selector("#frames .frame", timeout=60_000)
        views = watch(
            page,
            lambda vs: (
                max(v["multi"] for v in vs) > 0
                and len({f["id"] for v in vs for f in v["frames"]}) >= 4
                and vs[-1]["newest"] > vs[0]["newest"] + 5
            ),
            15,
            projector=False,
        )
        assert max(v["multi"] for v in views) > 0, (
            "no frame was ever drawn as mapped by two or more requests"
        )
        assert len({f["id"] for v in views for f in v["frames"]}) >= 4, (
            "the frame map showed fewer than 4 requests"
        )
        assert views[-1]["newest"] > views[0]["newest"] and views[-1]["rows"] > 0, (
            "the timeline did not grow"
        )
        assert "127.0.0.1" in {c for v in views for c in v["clients"]}, (
            "the load's client has no row in Clients"
        )
        save(page, tmp_path, "dashboard.png")


def test_dashboard_on_a_projector_during_a_preemption(tmp_path):
    """A pool of 40 frames and long answers: requests are preempted while others share
    the preamble's frames. In projector mode at 1280x720 every text is 18 px or more, no
    text lies on other text, live requests have distinct colours; prefix hits show
    before any request ends, and tokens/s is 0 once the server is idle."""
    options = dict(
        num_blocks=40,
        block_size=8,
        max_num_seqs=8,
        preemption_mode="swap",
        swap_space=64,
    )
    with serve_in_browser(tmp_path, options, 8, max_tokens=(120, 200)) as (
        browser,
        url,
        stop,
    ):
        page = browser.new_page(viewport=PROJECTOR)
        page.goto(url + "/?projector=1")
        # a loaded CI machine is slow
        page.wait_for_selector("#frames .frame", timeout=60_000)
        views = watch(
            page,
            lambda vs: (
                vs[-1]["swapped"] > 0
                and vs[-1]["preempted"] > 0
                and vs[-1]["multi"] > 0
            ),
            90,
            projector=True,
            hold=True,
        )
        assert views[-1]["swapped"] > 0 and views[-1]["preempted"] > 0, (
            "no preemption seen in 90 s"
        )
        assert views[-1]["multi"] > 0, (
            "no frame mapped by two requests while they share a preamble"
        )
        assert float(views[-1]["hits"].rstrip("%")) > 0, (
            "prefix hits at 0% while requests share the preamble"
        )
        assert float(views[-1]["tokens"]) > 0
        save(page, tmp_path, "dashboard-projector.png")
        smallest = min(t["font"] for t in views[-1]["texts"])
        print(
            f"smallest text in projector mode: {smallest} px over"
            f" {len(views[-1]['texts'])} pieces of text"
        )
        page.keyboard.press(" ")  # go on
        stop.set()
        idle = watch(
            page,
            lambda vs: vs[-1]["tokens"] == "0.0" and vs[-1]["chips"] == [],
            70,
            True,
        )
        assert idle[-1]["tokens"] == "0.0", (
            f"tokens/s stayed at {idle[-1]['tokens']} with nothing running"
        )
        check_long_rows_and_a_big_pool(page)
        check_guess_marks(page)
        check_a_room_of_clients(page)


def check_guess_marks(page) -> None:
    """Speculative decoding on the timeline: a row that guessed 3 tokens and kept 1
    shows its letter, one kept mark in its colour and two rolled-back marks; the
    counters say 33% kept.
    """
    page.evaluate(
        """() => {
      const id = "cmpl-7-ab-0", ran = [[id, 0, "decode", 4, 2, "C"], ["cmpl-8-ab-0", 0, "decode", 1, 3, "D"]];
      const timeline = [{step: 200000, ms: 12.5, ran, preempted: [], padded: [], guesses: [[id, 0, 3, 1]]}];
      draw({...last, timeline, counters: {...last.counters, guessed: 3, guesses_kept: 1}}); }"""
    )
    check_view(page.evaluate(LOOK), projector=True)
    row = page.evaluate(
        """() => {
      const r = document.querySelector('#timeline .tl-row[data-step="200000"]');
      const colour = (sel) => [...r.querySelectorAll(sel)].map(e => [e.textContent, getComputedStyle(e).backgroundColor]);
      return {slots: [...r.querySelectorAll('.slot')].map(e => e.className.replace('slot ', '') + ':' + e.textContent),
              kept: colour('.guess-kept'), letter: colour('.slot.decode')[0],
              counter: document.querySelector('.counter[data-name="guesses kept"] b')?.textContent}; }"""
    )
    assert row["slots"] == [
        "decode:C",
        "guess-kept:✓",
        "guess-rejected:✗",
        "guess-rejected:✗",
        "decode:D",
    ], row
    assert row["kept"][0][1] == row["letter"][1], (
        "a kept guess is not drawn in its request's colour"
    )
    assert row["counter"] == "33%", row


def check_a_room_of_clients(page) -> None:
    """A room of 40 clients under fair queuing, drawn from a made-up snapshot: the
    active ones first, whole rows only and the title says how many are shown; each row's
    numbers are its client's, its share bar as wide as its share, and the text still
    fits a projector.
    """
    page.evaluate("""() => {
      const clients = [...Array(40).keys()].map(i => ({name: `10.0.0.${i + 10} #${(0xa00 + i).toString(16)}`,
        prompt_tokens: 1000 * i + 7, output_tokens: 23 * i, running: i % 5 === 3 ? 1 : 0, waiting: i % 5 === 3 ? 2 : 0,
        recent_tokens: i % 5 === 3 ? 10 * i : 0, share: i % 5 === 3 ? i / 180 : 0, counter: 3.5 * i}));
      draw({...last, clients}); }""")
    check_view(page.evaluate(LOOK), projector=True)
    shown = page.evaluate(
        """() => [...document.querySelectorAll('#clients .cl-row:not(.head)')].map(r => ({
      cells: [...r.children].map(c => c.textContent),
      bar: r.querySelector('.bar').getBoundingClientRect().width / r.querySelector('.share').getBoundingClientRect().width}))"""
    )
    title = page.evaluate("() => document.getElementById('clients-title').textContent")
    assert 3 <= len(shown) < 40 and title == f"(40, {len(shown)} shown)", (
        title,
        len(shown),
    )
    # 8 active clients: they come first, in arrival order
    active = [i for i in range(40) if i % 5 == 3]

    def count(n):
        return str(n) if n < 10000 else f"{n / 1000:.1f}k"

    for k, row in enumerate(shown):
        i = (
            active[k]
            if k < len(active)
            else [j for j in range(40) if j % 5 != 3][k - len(active)]
        )
        share = i / 180 if i % 5 == 3 else 0
        assert row["cells"] == [
            f"10.0.0.{i + 10} #{0xA00 + i:x}",
            f"{100 * share:.0f}%",
            count(1000 * i + 7),
            str(23 * i),
            str(int(i % 5 == 3)),
            str(2 * (i % 5 == 3)),
            str(int(3.5 * i + 0.5)),
        ], (k, row)
        assert row["bar"] == pytest.approx(share, abs=0.02), (k, row)


def check_long_rows_and_a_big_pool(page) -> None:
    """With the live feed closed, draw made-up snapshots: a timeline past step 100,000
    with decimal times and wide batches stays one line a row; a default-sized pool of
    728 frames with 30 in use gives the frames in use a fair share of the panel, each
    with its letter.
    """
    page.evaluate(
        """() => { events.close();
      const ran = [...Array(40).keys()].map(i => [`cmpl-${i}-ab-0`, 0, "decode", 1, i % 12, "ABCDEFGHIJKL"[i % 12]]);
      const timeline = [...Array(30).keys()].map(i => ({step: 123450 + i, ms: 1234.5 + i / 10, ran, preempted: [], padded: []}));
      const frames = Array(728).fill(null);
      const requests = [...Array(6).keys()].map(i => ({id: `cmpl-${i}-ab-0`, status: "running", colour: i, label: "ABCDEF"[i], seqs: []}));
      for (let f = 0; f < 30; f++) frames[100 + 13 * f] = [1, f % 6];
      draw({...last, frames, requests, timeline, num_frames: 728, queues: {running: requests.map(r => r.id), waiting: [], swapped: []}}); }"""
    )
    view = page.evaluate(LOOK)
    check_view(view, projector=True)
    rows = page.evaluate(
        """() => [...document.querySelectorAll('#timeline .tl-row')].map(r => {
      const b = r.getBoundingClientRect(), mid = (c) => (c.top + c.bottom) / 2;
      const off = [...r.children].map(c => Math.abs(mid(c.getBoundingClientRect()) - mid(b)));
      return {height: b.height, off: Math.max(...off), label: r.firstChild.getBoundingClientRect().height,
              slots: r.children.length}; })"""
    )
    # one line each: every label and slot centred on its row (a wrapped one would sit a
    # row lower)
    assert rows and all(
        r["off"] < 2 and r["height"] < 30 and r["label"] < 30 and r["slots"] == 41
        for r in rows
    ), rows[:3]
    share = page.evaluate(
        """() => {
      const box = document.getElementById('frames').getBoundingClientRect();
      const used = [...document.querySelectorAll('#frames .frame.one')].map(f => f.getBoundingClientRect());
      return {n: used.length, area: used.reduce((s, r) => s + r.width * r.height, 0) / (box.width * box.height),
              labelled: used.length && [...document.querySelectorAll('#frames .frame.one')].every(f => f.textContent.length)}; }"""
    )
    assert share["n"] == 30 and share["labelled"], share
    assert share["area"] > 0.15, (
        f"30 frames in use cover {share['area']:.1%} of the frame map"
    )


def test_dashboard_of_static_batching_shows_padding_rows(tmp_path):
    """The "before" picture: static batching reserves a region of max_model_len slots
    per
    request; rows of a batch that finished early are still computed (grey padding)."""
    options = dict(scheduler="static", num_blocks=80, block_size=8, max_model_len=160)
    with serve_in_browser(tmp_path, options, 6, max_tokens=(10, 120)) as (
        browser,
        url,
        _,
    ):
        page = browser.new_page(viewport=PROJECTOR)
        page.goto(url + "/?projector=1")
        # a loaded CI machine is slow
        page.wait_for_selector("#frames .frame", timeout=60_000)
        views = watch(
            page,
            lambda vs: vs[-1]["padding"] >= 6 and len(vs[-1]["frames"]) == 4,
            25,
            projector=True,
            hold=True,
        )
        assert views[-1]["padding"] >= 6, (
            "no padding rows in the timeline of static batching"
        )
        # 640 slots: 4 regions of 160, each with its request's letter
        assert len(views[-1]["frames"]) == 4
        save(page, tmp_path, "dashboard-static.png")
