"""Labs 8 and 9, beyond the generic lab tests: the payoff workload really thrashes under
greedy admission, each run refuses a participant's piece that decides differently from
the engine's (in one sentence), and the plugged pieces are unplugged after the run."""

from types import SimpleNamespace

import pytest

from minipaged import paging
from minipaged.paging import block_table, manager
from minipaged.policies import Greedy, WorkingSet
from minipaged.speculative import ngram
from minipaged.tools.lab import engine_run, speculation_lab, working_set_lab


@pytest.fixture(scope="module")
def llm():
    return engine_run.load_model(engine_run.RANDOM_MODEL)[0]


def test_the_burst_thrashes_under_greedy_admission_and_not_under_the_working_set():
    greedy = sum(
        working_set_lab.serve_burst(Greedy(), **working_set_lab.BURST)["preempted"]
    )
    window16 = sum(
        working_set_lab.serve_burst(WorkingSet(16), **working_set_lab.BURST)[
            "preempted"
        ]
    )
    whole = working_set_lab.serve_burst(WorkingSet(32), **working_set_lab.BURST)
    # the property's bound holds with room
    assert greedy >= 9 and window16 <= greedy // 3
    assert sum(whole["preempted"]) == 0 and not whole["short"]


def test_lab8_run_refuses_an_admission_that_preempts_differently(llm, tmp_path):
    class Halved(WorkingSet):
        def growth(self, request, blocks, final_len):
            return super().growth(request, blocks, final_len) // 2

    with pytest.raises(
        RuntimeError,
        match=r"your WorkingSet\(16\) preempted \d+ times?, the built-in 'working-set'",
    ):
        working_set_lab.run(SimpleNamespace(WorkingSet=Halved), llm, tmp_path)
    assert not (tmp_path / "lab8_thrashing.svg").exists()


def test_lab9_run_refuses_a_proposer_that_guesses_differently(llm, tmp_path):
    engines = ngram.ngram_propose

    def earliest(token_ids, k, min_n, max_n):
        for n in range(min(max_n, len(token_ids) - 1), min_n - 1, -1):
            for start in range(len(token_ids) - n):
                if token_ids[start : start + n] == token_ids[len(token_ids) - n :]:
                    return token_ids[start + n : start + n + k]
        return []

    assert earliest([1, 2, 7, 1, 2, 8, 1, 2], 1, 2, 2) != engines(
        [1, 2, 7, 1, 2, 8, 1, 2], 1, 2, 2
    )
    pieces = SimpleNamespace(ngram_propose=earliest, BlockTable=paging.BlockTable)
    with pytest.raises(
        RuntimeError,
        match=(
            r"your proposer's guesses: \d+ proposed, \d+ accepted; the built-in one's"
        ),
    ):
        speculation_lab.run(pieces, llm, tmp_path)
    # unplugged afterwards, even on the error
    assert ngram.ngram_propose is engines
    assert (
        manager.BlockTable is paging.BlockTable
        and block_table.BlockTable is paging.BlockTable
    )


def test_lab9_run_uses_the_participants_pieces(llm, tmp_path):
    calls = {"truncate": 0, "propose": 0}
    engines = ngram.ngram_propose

    class Counted(paging.BlockTable):
        def truncate(self, num_tokens):
            calls["truncate"] += 1
            super().truncate(num_tokens)

    def propose(token_ids, k, min_n, max_n):
        calls["propose"] += 1
        return engines(token_ids, k, min_n, max_n)

    lines = speculation_lab.run(
        SimpleNamespace(ngram_propose=propose, BlockTable=Counted), llm, tmp_path
    )
    assert calls["truncate"] > 0 and calls["propose"] > 0
    assert any(line.startswith("  guesses: ") and "accepted" in line for line in lines)
    assert f"picture: {tmp_path / 'lab9_speculation.svg'}" in lines and lines[
        -1
    ].endswith("lab9_rollback_after.svg")
    assert (tmp_path / "lab9_speculation.svg").read_text().startswith("<svg")
