"""Issue 41: a participant's policy cannot break the engine. On every seam, a policy
without the seam's methods is refused when it is built, with a message naming the
option and what is missing; a wrong answer (an exception, None, a request that is not
waiting, a victim that is not a candidate, a frame that is not parked, a mutated
queue) raises a PolicyError naming the seam and the policy, after a step that ran with
the seam's default in its place. Then: the next step works, every request gets the
greedy tokens it gets alone, and no frame is held once everything is aborted.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.llm import policy as policy_type
from minipaged.policies import FCFS, Greedy, Newest, PolicyError
from minipaged.sampling import StructuredOutputsParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[1, 5 + i, 9, 13 + 2 * i, 7 + i, 3] * (1 + i % 3) for i in range(6)]
MAX_STEPS = 400


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from checkpoints import write_checkpoint

    folder = write_checkpoint(tmp_path_factory.mktemp("seams"), layers=2)
    return LLM(str(folder), device="cpu", num_blocks=64, block_size=4)


@pytest.fixture(scope="module")
def alone(llm):
    """Each prompt's greedy tokens run alone, with the default policies."""
    tokens = {}
    for i, prompt in enumerate(PROMPTS):
        engine = llm.new_engine(num_blocks=64, block_size=4)
        engine.add_request("r", {"prompt_token_ids": prompt}, GREEDY)
        tokens[f"r{i}"] = run(engine)["r"]
    return tokens


def run(engine, failures=None) -> dict[str, list[int]]:
    """Step until every request finished; each PolicyError's report is kept going."""
    done = {}
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished_requests():
            return done
        try:
            report = engine.step()
        except PolicyError as error:
            if failures is not None:
                failures.append(error)
            report = error.report
        for output in report.finished:
            done[output.request_id] = output.outputs[0].token_ids
    raise AssertionError(f"not finished in {MAX_STEPS} steps: {done.keys()}")


def serve_all(engine) -> tuple[dict, list[PolicyError]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, GREEDY)
    failures = []
    return run(engine, failures), failures


def assert_nothing_held(engine) -> None:
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    assert engine.blocks.num_free_frames == engine.blocks.num_frames


def assert_survives(llm, alone, option, bad, **options):
    """The engine with `bad` on `option`: it names the seam and the policy, every
    request gets its alone tokens, and no frame is held after an abort of all."""
    engine = llm.new_engine(block_size=4, **{option: bad}, **options)
    outputs, failures = serve_all(engine)
    assert failures, f"{bad!r} on {option} failed nowhere"
    for failure in failures:
        assert failure.option == option and type(bad).__name__ in str(failure)
    assert outputs == alone
    engine.add_request("late", {"prompt_token_ids": PROMPTS[0]}, GREEDY)
    try:  # a later step works (it may raise again: the policy is still wrong)
        engine.step()
    except PolicyError as error:
        assert error.report is not None
    assert_nothing_held(engine)


# ---- wrong policies, each seam -------------------------------------------------------
class RaisesOnce(FCFS):
    def __init__(self):
        self.calls = 0

    def pick(self, waiting, now):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("boom")
        return super().pick(waiting, now)


class PicksNone(FCFS):
    def pick(self, waiting, now):
        return None


class PicksTwice(FCFS):
    """Answers the first request it ever saw, even once it left the queue."""

    first = None

    def pick(self, waiting, now):
        if self.first is None:
            self.first = waiting[0]
        return self.first


class PopsTheQueue(FCFS):
    def pick(self, waiting, now):
        return waiting.pop()


@pytest.mark.parametrize("bad", [RaisesOnce, PicksNone, PicksTwice, PopsTheQueue])
def test_a_wrong_waiting_order_loses_and_doubles_nothing(llm, alone, bad):
    assert_survives(llm, alone, "scheduling_policy", bad(), num_blocks=64)


class VictimRaises(Newest):
    def choose(self, candidates):
        raise RuntimeError("boom")


class VictimNone(Newest):
    def choose(self, candidates):
        return None


class VictimElsewhere(Newest):
    def choose(self, candidates):
        return object()


class VictimMutates(Newest):
    def choose(self, candidates):
        victim = candidates[-1]
        candidates.clear()
        return victim


@pytest.mark.parametrize(
    "bad", [VictimRaises, VictimNone, VictimElsewhere, VictimMutates]
)
def test_a_wrong_victim_never_wedges_the_engine(llm, alone, bad):
    # 14 frames of 4 tokens: the six requests must preempt to fit
    assert_survives(llm, alone, "preemption_victim", bad(), num_blocks=14)


class GrowthRaises(Greedy):
    def growth(self, request, blocks, final_len):
        raise RuntimeError("boom")


class GrowthNegative(Greedy):
    def growth(self, request, blocks, final_len):
        return -3


@pytest.mark.parametrize("bad", [GrowthRaises, GrowthNegative])
def test_a_wrong_admission_is_stood_in_for(llm, alone, bad):
    assert_survives(llm, alone, "admission", bad(), num_blocks=64)


class Replacement:
    """LRU's bookkeeping, and a victim() of the test's choosing."""

    name = "test"

    def __init__(self, answer):
        self.answer = answer

    def entered(self, frame, block):
        pass

    def parked(self, frame):
        pass

    def left(self, frame):
        pass

    def victim(self, parked):
        return self.answer(parked)


def boom(parked):
    raise RuntimeError("boom")


def in_use(parked):
    return max(parked) + 1000  # no such parked frame


def pops(parked):
    return parked.popitem()[0]  # a read-only view: it cannot


@pytest.mark.parametrize("answer", [boom, lambda parked: None, in_use, pops])
def test_a_wrong_replacement_leaves_no_frame_held(llm, alone, answer):
    assert_survives(
        llm, alone, "prefix_cache_policy", Replacement(answer), num_blocks=12
    )


# ---- refused when built --------------------------------------------------------------
@pytest.mark.parametrize(
    "option, method",
    [
        ("scheduling_policy", "pick"),
        ("admission", "growth"),
        ("preemption_victim", "choose"),
        ("prefix_cache_policy", "entered"),
    ],
)
@pytest.mark.parametrize("given", [object(), collections.Counter(), len])
def test_an_object_without_the_seams_methods_is_refused(llm, option, method, given):
    with pytest.raises(ValueError, match=rf"{option}=.* has no {method}\(\) method"):
        llm.new_engine(num_blocks=16, block_size=4, **{option: given})


def test_a_class_that_cannot_be_built_is_one_line_with_its_reason(tmp_path):
    path = tmp_path / "my_policies.py"
    path.write_text(
        "class RaisesInInit:\n"
        "    def __init__(self):\n"
        "        raise RuntimeError('no luck')\n"
        "class NeedsAnArgument:\n"
        "    def __init__(self, x):\n"
        "        self.x = x\n"
        "    def pick(self, waiting, now):\n"
        "        return waiting[0]\n"
        "class LongestFirst:\n"
        "    def pick(self, waiting, now):\n"
        "        return max(waiting, key=lambda r: len(r.prompt_token_ids))\n"
    )
    parse = policy_type("scheduling_policy")
    with pytest.raises(argparse.ArgumentTypeError, match="RuntimeError: no luck"):
        parse(f"{path}:RaisesInInit")
    with pytest.raises(argparse.ArgumentTypeError, match="missing 1 required"):
        parse(f"{path}:NeedsAnArgument")
    assert parse(f"{path}:LongestFirst") == f"{path}:LongestFirst"  # a file's path


# ---- structured output's backend -----------------------------------------------------
class AnyToken:
    """A constraint that allows every token, whose advance() raises on its n-th call."""

    def __init__(self, vocab_size, fail_at):
        self.vocab_size = vocab_size
        self.fail_at = fail_at
        self.calls = 0

    def allowed(self):
        return np.ones(self.vocab_size, dtype=bool)

    def advance(self, token):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("lost my state")

    def fork(self):
        return AnyToken(self.vocab_size, self.fail_at)


class Backend:
    name = "test-backend"

    def __init__(self, vocab_size, fail_at=3, returns_none=False):
        self.vocab_size = vocab_size
        self.fail_at = fail_at
        self.returns_none = returns_none

    def compile(self, spec):
        if self.returns_none:
            return None
        return AnyToken(self.vocab_size, self.fail_at)


def test_a_backend_whose_compile_returns_none_refuses_the_request(llm):
    vocab = llm.model.config.vocab_size
    engine = llm.new_engine(
        num_blocks=32,
        block_size=4,
        structured_outputs_backend=Backend(vocab, returns_none=True),
    )
    params = SamplingParams(
        max_tokens=4, structured_outputs=StructuredOutputsParams(regex="a+")
    )
    with pytest.raises(ValueError, match="request 'x'.*has no allowed\\(\\) method"):
        engine.add_request("x", "hello", params)
    assert not engine.has_unfinished_requests()


def test_a_constraint_that_fails_cuts_its_request_short_and_only_it(llm, alone):
    vocab = llm.model.config.vocab_size
    engine = llm.new_engine(
        num_blocks=64, block_size=4, structured_outputs_backend=Backend(vocab)
    )
    params = SamplingParams(
        temperature=0,
        max_tokens=12,
        structured_outputs=StructuredOutputsParams(regex="a+"),
    )
    engine.add_request("held", {"prompt_token_ids": PROMPTS[0]}, params)
    outputs, failures = serve_all(engine)
    assert [f.option for f in failures] == ["structured_outputs_backend"]
    assert failures[0].request_ids == ["held"]
    assert "advance() raised RuntimeError: lost my state" in str(failures[0])
    assert "test-backend" in str(failures[0])
    held = outputs.pop("held")  # it ended at the failure: 3 tokens, then an end
    assert len(held) == 4 and held[-1] in engine.eos_token_ids
    assert outputs == alone
    assert_nothing_held(engine)


# ---- in the server's engine loop -----------------------------------------------------
def loop_run(engine, requests):
    """Run an EngineLoop over `requests` (id -> params); each request's last update."""
    import asyncio

    from minipaged.tools.serve.loop import EngineLoop

    async def run():
        loop = EngineLoop(engine)
        updates = asyncio.Queue()
        for request_id, (prompt, params) in requests.items():
            loop.add_request(request_id, prompt, params, updates)
        loop.start()
        last = {}
        try:
            while len(last) < len(requests):
                update = await asyncio.wait_for(updates.get(), timeout=30)
                if update.output is not None or update.error is not None:
                    last[update.request_id] = update
            return loop, last
        finally:
            loop.stop()

    return asyncio.run(run())


def test_the_server_serves_around_a_failing_policy(llm, alone):
    """A failing waiting order: every request is still answered with its alone tokens
    (the default stood in), and the failure is counted once per distinct message."""
    engine = llm.new_engine(num_blocks=64, block_size=4, scheduling_policy=PicksNone())
    requests = {
        f"r{i}": ({"prompt_token_ids": p}, GREEDY) for i, p in enumerate(PROMPTS)
    }
    loop, last = loop_run(engine, requests)
    answers = {rid: u.output.outputs[0].token_ids for rid, u in last.items()}
    assert answers == alone
    assert loop.error is None
    assert list(loop.policy_failures) == [
        f"scheduling_policy {PolicyError('x', PicksNone(), '').policy}:"
        " pick() returned None, not one of the waiting requests it was given"
    ]


def test_the_server_fails_only_the_request_whose_constraint_failed(llm, alone):
    vocab = llm.model.config.vocab_size
    engine = llm.new_engine(
        num_blocks=64, block_size=4, structured_outputs_backend=Backend(vocab)
    )
    held = SamplingParams(
        temperature=0,
        max_tokens=12,
        structured_outputs=StructuredOutputsParams(regex="a+"),
    )
    requests = {"held": ({"prompt_token_ids": PROMPTS[0]}, held)}
    requests |= {
        f"r{i}": ({"prompt_token_ids": p}, GREEDY) for i, p in enumerate(PROMPTS)
    }
    _, last = loop_run(engine, requests)
    assert "lost my state" in last.pop("held").error
    assert {rid: u.output.outputs[0].token_ids for rid, u in last.items()} == alone


class NeverReturns(FCFS):
    def __init__(self):
        import threading

        self.release = threading.Event()

    def pick(self, waiting, now):
        self.release.wait(timeout=20)
        return waiting[0]


def test_a_stuck_policy_shows_in_health_and_the_log(llm, caplog):
    import time

    order = NeverReturns()
    engine = llm.new_engine(num_blocks=64, block_size=4, scheduling_policy=order)
    seen = []

    def stuck(loop):
        deadline = time.monotonic() + 10
        while loop.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(loop.error)
        order.release.set()
        return False

    requests = {"r0": ({"prompt_token_ids": PROMPTS[0]}, GREEDY)}
    import asyncio
    import threading

    from minipaged.tools.serve.loop import EngineLoop

    async def run():
        loop = EngineLoop(engine, watchdog_seconds=0.5)
        updates = asyncio.Queue()
        loop.add_request("r0", *requests["r0"], updates)
        loop.start()
        watcher = threading.Thread(target=stuck, args=(loop,))
        watcher.start()
        try:
            while True:
                update = await asyncio.wait_for(updates.get(), timeout=30)
                if update.output is not None:
                    break
        finally:
            watcher.join(timeout=30)
            loop.stop()
        return loop

    with caplog.at_level("ERROR", logger="minipaged.serve"):
        loop = asyncio.run(run())
    assert seen and "past the watchdog's 0.5 s" in seen[0]
    assert "scheduling_policy=" in seen[0]
    assert loop.error is None  # it came back
    assert any("watchdog" in r.getMessage() for r in caplog.records)
