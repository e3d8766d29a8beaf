"""Lab 13, the directory (meeting 17): a router's directory of which replica holds which
prefix-cache block, fed by the replicas' KV events (BlockStored, BlockRemoved,
AllBlocksCleared), asked how many leading blocks of a prompt each replica holds, and
where locality-aware request distribution (LARD) sends the prompt. The properties grade
a participant's Directory on scripts of events, then three engines serve conversations
routed by it, and its answers are held against the engines' own prefix caches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from minipaged.paging.prefix_cache import POOL
from minipaged.sampling import SamplingParams
from minipaged.tools.lab.engine_run import MAX_STEPS, QUESTIONS, SYSTEM
from minipaged.tools.lab.grading import Failed, Property, in_one_line, time_limit
from minipaged.tools.serve import kv_events
from minipaged.tools.viz import BarChart
from minipaged.tools.viz.svg import (
    CELL,
    CHAR_W,
    FREE,
    PALETTE,
    SHARED,
    _framed,
    _svg_text,
)


class Directory:
    """The router's directory of KV blocks (Censier and Feautrier's directory, with
    replicas for caches): for each block a replica published, the replicas that hold
    it. Fed by the replicas' KV events; asked how many leading full blocks of a prompt
    each replica holds, and, by LARD's rule, which replica serves the prompt: the one
    whose cache holds most of it, unless that one is overloaded."""

    def __init__(self, num_replicas: int, block_size: int, low: int = 2, high: int = 4):
        """An empty directory of `num_replicas` replicas whose blocks hold `block_size`
        tokens; LARD's load thresholds `low` and `high` (written for you)."""
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.low = low
        self.high = high
        # (parent block's hash or None, the block's token ids) -> the block's hash,
        # as the events named it: the router follows the replicas' own names
        self.name_of: dict[tuple, int] = {}
        self.holders: dict[int, set[int]] = {}  # block hash -> replicas holding it

    def stored(self, replica: int, block_hashes, parent_block_hash, token_ids) -> None:
        """BlockStored from `replica`: the blocks named `block_hashes`, in order, now
        hold `token_ids` (`block_size` tokens each), the first chained to
        `parent_block_hash` (None: it starts a prompt), each next one to the one
        before. Name each block (`name_of`) and add `replica` to its holders."""
        parent = parent_block_hash
        for i, block_hash in enumerate(block_hashes):
            block = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            self.name_of[(parent, block)] = block_hash
            self.holders.setdefault(block_hash, set()).add(replica)
            parent = block_hash

    def removed(self, replica: int, block_hashes) -> None:
        """BlockRemoved from `replica`: it no longer holds these blocks (one it never
        held changes nothing; the other replicas keep theirs)."""
        for block_hash in block_hashes:
            self.holders.get(block_hash, set()).discard(replica)

    def cleared(self, replica: int) -> None:
        """AllBlocksCleared from `replica`: it holds no block any more."""
        for replicas in self.holders.values():
            replicas.discard(replica)

    def matches(self, token_ids) -> list[int]:
        """For each replica, how many leading full blocks of `token_ids` it holds: the
        run from the prompt's first block, stopping at the first block it does not
        hold (a partial last block never counts)."""
        counts = [0] * self.num_replicas
        running = set(range(self.num_replicas))
        parent = None
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            block = tuple(token_ids[start : start + self.block_size])
            block_hash = self.name_of.get((parent, block))
            if block_hash is None:
                break
            running &= self.holders.get(block_hash, set())
            if not running:
                break
            for replica in running:
                counts[replica] += 1
            parent = block_hash
        return counts

    def route(self, token_ids, loads) -> int:
        """LARD: the replica holding the most leading blocks of `token_ids` (ties: the
        least loaded, then the first), or, when none holds any, the least loaded (ties:
        the first). `loads[r]` is replica r's unfinished requests. The target moves to
        the least loaded replica when it is over `high` while another is under `low`,
        or at twice `high` or more."""
        counts = self.matches(token_ids)
        replicas = range(self.num_replicas)
        least = min(replicas, key=lambda r: (loads[r], r))
        # with no match anywhere, the most matched of equals is the least loaded
        target = min(replicas, key=lambda r: (-counts[r], loads[r], r))
        overloaded = loads[target] > self.high and loads[least] < self.low
        if overloaded or loads[target] >= 2 * self.high:
            return least
        return target

    def feed(self, replica: int, events) -> None:
        """Apply `replica`'s KV events in order, each as vLLM's msgpack decodes it: a
        dict with its "type" (BlockStored, BlockRemoved, AllBlocksCleared) and vLLM's
        fields ("block_hashes", "parent_block_hash", "token_ids", "medium", ...). The
        directory keeps the pools: a block in a replica's tier (medium "CPU") is left
        out (written for you)."""
        for event in events:
            if event.get("medium", "GPU") != "GPU":
                continue  # a block in the replica's tier, not in its pool
            kind = event["type"]
            if kind == "BlockStored":
                hashes = event["block_hashes"]
                self.stored(
                    replica, hashes, event["parent_block_hash"], event["token_ids"]
                )
            elif kind == "BlockRemoved":
                self.removed(replica, event["block_hashes"])
            elif kind == "AllBlocksCleared":
                self.cleared(replica)


def solution() -> dict:
    return {"Directory": Directory}


# ---- scripts of KV events, played on theirs and on the reference --------------------
# Blocks of BLOCK tokens. ("stored", replica, prompt, first, count): the replica names
# `count` blocks of the prompt from block `first` on, chained to block first - 1;
# ("removed", replica, prompt, [block indexes]); ("cleared", replica). Prompts are
# named (PROMPTS) so that a failure reads as a story, and every new prefix gets a new
# hash, as a chain hash gives it.

BLOCK = 2
PROMPTS = {
    "A": [1, 2, 3, 4, 5, 6, 7],  # three full blocks and one token
    "B": [1, 2, 3, 4, 8, 9, 10, 11],  # A's first two blocks, then its own
    "C": [3, 4, 5, 6, 7, 8],  # A's second and third blocks' tokens, at the start
}


class Names:
    """The hash each prefix's last full block gets (a new number per new prefix)."""

    def __init__(self):
        self.of: dict[tuple, int] = {}

    def chain(self, tokens) -> list[int]:
        hashes = []
        for end in range(BLOCK, len(tokens) + 1, BLOCK):
            prefix = tuple(tokens[:end])
            hashes.append(self.of.setdefault(prefix, 1000 + len(self.of)))
        return hashes


def said(script: list[tuple]) -> str:
    words = []
    for event, replica, *args in script:
        if event == "stored":
            prompt, first, count = args
            blocks = ", ".join(str(b) for b in range(first, first + count))
            words.append(f"replica {replica} stored {prompt}'s blocks {blocks}")
        elif event == "removed":
            prompt, indexes = args
            blocks = ", ".join(map(str, indexes))
            words.append(f"replica {replica} removed {prompt}'s blocks {blocks}")
        else:
            words.append(f"replica {replica} cleared all")
    return "; ".join(words) or "no event"


def play(directory, script: list[tuple], names: Names) -> None:
    """The script's events, as a replica's KV events say them, into `directory`."""
    for event, replica, *args in script:
        if event == "cleared":
            directory.cleared(replica)
            continue
        tokens = PROMPTS[args[0]]
        hashes = names.chain(tokens)
        if event == "removed":
            directory.removed(replica, [hashes[i] for i in args[1]])
            continue
        first, count = args[1], args[2]
        parent = None
        if first > 0:
            parent = hashes[first - 1]
        directory.stored(
            replica,
            hashes[first : first + count],
            parent,
            tokens[first * BLOCK : (first + count) * BLOCK],
        )


def expect_matches(
    m, script: list[tuple], asked: list[str], why: str, replicas: int = 3
) -> None:
    """After the script, matches() of each asked prompt on theirs equals the
    reference's."""
    given = said(script)
    names = Names()
    theirs, ours = m.Directory(replicas, BLOCK), Directory(replicas, BLOCK)
    play(theirs, script, names)
    play(ours, script, names)
    for prompt in asked:
        got = theirs.matches(list(PROMPTS[prompt]))
        want = ours.matches(list(PROMPTS[prompt]))
        if got != want:
            raise Failed(
                given,
                f"matches({prompt}) gave {got!r}, expected {want} (blocks held by"
                f" replicas 0, 1, 2){why}",
            )


def found_by_its_tokens(m) -> None:
    expect_matches(
        m,
        [("stored", 0, "A", 0, 2)],
        ["A", "B"],
        ": a stored block is found again by its tokens, on the replica that stored it",
    )
    expect_matches(
        m,
        [("stored", 0, "A", 0, 2), ("stored", 0, "A", 2, 1), ("stored", 1, "B", 0, 1)],
        ["A", "B"],
        ": a block stored later continues the chain from its parent, and each"
        " replica counts its own blocks",
    )


def longest_run_from_the_start(m) -> None:
    expect_matches(
        m,
        [("stored", 0, "A", 0, 3), ("removed", 0, "A", [1])],
        ["A"],
        ": a replica's match stops at its first missing block, even if it holds"
        " later ones",
    )
    expect_matches(
        m,
        [("stored", 0, "A", 0, 3), ("stored", 1, "B", 0, 4)],
        ["A", "B", "C"],
        ": the partial last block never counts, the match of B on A's replica stops"
        " where B's tokens leave A's, and C's blocks (A's tokens after another"
        " start) are other blocks",
    )


def removed_from_one_replica(m) -> None:
    expect_matches(
        m,
        [
            ("stored", 0, "A", 0, 3),
            ("stored", 1, "A", 0, 3),
            ("removed", 1, "A", [2]),
            ("removed", 2, "A", [0]),
            ("removed", 1, "A", [2]),
        ],
        ["A"],
        ": a removed block leaves only the replica that removed it; removing a block"
        " never held, or twice, changes nothing",
    )


def cleared_one_replica(m) -> None:
    expect_matches(
        m,
        [
            ("stored", 0, "A", 0, 3),
            ("stored", 1, "B", 0, 4),
            ("stored", 2, "A", 0, 2),
            ("cleared", 1),
            ("stored", 1, "B", 0, 1),
        ],
        ["A", "B"],
        ": AllBlocksCleared empties one replica (the others keep theirs), and a block"
        " it stores again is found",
    )


def expect_route(
    m, script: list[tuple], prompt: str, loads: list[int], why: str, **thresholds
) -> None:
    given = f"{said(script)}; loads {loads}"
    if thresholds:
        given += ", " + ", ".join(f"{k} {v}" for k, v in thresholds.items())
    names = Names()
    theirs = m.Directory(len(loads), BLOCK, **thresholds)
    ours = Directory(len(loads), BLOCK, **thresholds)
    play(theirs, script, names)
    play(ours, script, names)
    got = theirs.route(list(PROMPTS[prompt]), list(loads))
    want = ours.route(list(PROMPTS[prompt]), list(loads))
    if got != want:
        raise Failed(given, f"route({prompt}) gave {got!r}, expected {want}{why}")


def sent_where_it_is_cached(m) -> None:
    held = [("stored", 0, "A", 0, 1), ("stored", 2, "A", 0, 3)]
    expect_route(
        m, held, "A", [1, 0, 2], ": the replica holding the most of the prompt wins"
    )
    expect_route(
        m,
        [("stored", 0, "A", 0, 2), ("stored", 2, "A", 0, 2)],
        "A",
        [2, 0, 1],
        ": equal matches go to the less loaded",
    )
    expect_route(
        m,
        [("stored", 0, "A", 0, 2), ("stored", 2, "A", 0, 2)],
        "A",
        [1, 0, 1],
        ": equal matches and loads go to the first",
    )
    expect_route(
        m,
        held,
        "C",
        [2, 1, 1],
        ": when no replica holds any of the prompt, the least loaded (the first of"
        " equals)",
    )


def moved_only_past_the_thresholds(m) -> None:
    held = [("stored", 1, "A", 0, 3)]
    cases = [
        ([0, 4, 0], ": at high (4), not over it, the prompt stays where it is cached"),
        ([2, 5, 3], ": over high, but no replica under low (2): it stays"),
        ([3, 5, 1], ": over high while replica 2 is under low: to the least loaded"),
        ([7, 8, 7], ": at twice high (8): to the least loaded, whatever their loads"),
    ]
    for loads, why in cases:
        expect_route(m, held, "A", loads, why)
    expect_route(
        m,
        held,
        "A",
        [0, 3, 0],
        ": with low 1 and high 2, 3 is over high while another is under low",
        low=1,
        high=2,
    )


def random_scripts(m) -> None:
    rng = random.Random(13)
    for case in range(40):
        script, held = [], []
        for _ in range(rng.randint(1, 12)):
            roll = rng.random()
            replica = rng.randrange(3)
            prompt = rng.choice("ABC")
            if roll < 0.6 or not held:
                first = rng.randint(0, 2)
                count = rng.randint(1, len(PROMPTS[prompt]) // BLOCK - first)
                script.append(("stored", replica, prompt, first, count))
                held.append((replica, prompt))
            elif roll < 0.9:
                replica, prompt = rng.choice(held)
                blocks = len(PROMPTS[prompt]) // BLOCK
                script.append(("removed", replica, prompt, [rng.randrange(blocks)]))
            else:
                script.append(("cleared", replica))
        expect_matches(m, script, list(PROMPTS), f" (random script {case + 1} of 40)")
        loads = [rng.randint(0, 9) for _ in range(3)]
        expect_route(
            m,
            script,
            rng.choice("ABC"),
            loads,
            f" (random script {case + 1} of 40)",
        )


MATCHES = (
    "matches finds a stored block again by its tokens, on the replica that stored it,"
    " its chain continued by later events"
)
RUN = (
    "a replica's match is its run of full blocks from the prompt's first, stopping at"
    " its first missing block"
)
REMOVED = "BlockRemoved takes one replica off a block, and nothing else"
CLEARED = "AllBlocksCleared empties one replica, and the others keep their blocks"
TARGET = (
    "route sends a prompt to the replica holding most of it (ties: the least loaded,"
    " then the first); none: the least loaded"
)
THRESHOLDS = (
    "LARD's thresholds: the target moves to the least loaded only when over high while"
    " another is under low, or at twice high"
)
RANDOM = "random scripts of three replicas' events leave the directory's answers"

PROPERTIES = [
    Property(MATCHES, found_by_its_tokens, "replica 0 stored A's first blocks"),
    Property(RUN, longest_run_from_the_start, "A's blocks with one removed"),
    Property(REMOVED, removed_from_one_replica, "A stored on two replicas"),
    Property(CLEARED, cleared_one_replica, "three replicas, one cleared"),
    Property(TARGET, sent_where_it_is_cached, "A held by replicas 0 and 2"),
    Property(THRESHOLDS, moved_only_past_the_thresholds, "A held by replica 1"),
    Property(RANDOM, random_scripts, "random scripts on three replicas"),
]


# ---- replicas in one process: engines of one model, routed by a rule ---------------

ENGINE = dict(block_size=4, num_blocks=128, max_num_seqs=4, enable_prefix_caching=True)
REPLICAS = 3
USERS = 8  # conversations, each with a system prompt of its own
TURNS = 4


class Cluster:
    """`count` replicas of one model in one process: each an engine with its own KV pool
    and prefix cache, whose KV events wait in a list until the router takes them. A
    router only sees what a real one sees: the requests it sent where, and the
    events."""

    def __init__(self, llm, count: int = REPLICAS, **options):
        self.engines = [llm.new_engine(**dict(ENGINE, **options)) for _ in range(count)]
        self.block_size = self.engines[0].config.block_size
        self.recorders = []
        for engine in self.engines:
            recorder = Recorder(self.block_size)
            engine.blocks.add_cache_listener(recorder)
            self.recorders.append(recorder)

    def take_events(self, directory) -> None:
        """Every replica's events so far, into `directory` (and gone from here)."""
        for replica, recorder in enumerate(self.recorders):
            directory.feed(replica, recorder.take())

    def cached_blocks(self, token_ids) -> list[int]:
        """For each replica, how many leading full blocks of `token_ids` its own prefix
        cache holds: what a directory must answer."""
        return [len(engine.blocks.cached_frames(token_ids)) for engine in self.engines]


@dataclass(slots=True)
class Served:
    """What one routing rule did with the conversations."""

    # (turn, user) -> the replica it was sent to
    sent: dict[tuple[int, int], int] = field(default_factory=dict)
    prompt_tokens: int = 0  # of every turn's prompt
    cached: int = 0  # of those, found in the replicas' prefix caches
    texts: dict[tuple[int, int], str] = field(default_factory=dict)
    # user -> its conversation at the end (every prompt and answer), as token ids
    history: dict[int, list[int]] = field(default_factory=dict)

    @property
    def computed(self) -> int:
        """Prompt tokens the replicas computed: the rest were prefix-cache hits."""
        return self.prompt_tokens - self.cached

    @property
    def hit_rate(self) -> float:
        return self.cached / self.prompt_tokens

    def users_per_replica(self, count: int = REPLICAS) -> list[int]:
        """How many users' turns each replica served most of."""
        users = {user for _, user in self.sent}
        counts = [0] * count
        for user in users:
            turns = [r for (t, u), r in self.sent.items() if u == user]
            counts[max(set(turns), key=turns.count)] += 1
        return counts


def conversations(tokenizer, users: int) -> tuple[list[list[int]], list[list[int]]]:
    """Each user's system prompt (the lab's words in an order of its own) and the
    questions of its turns, as token ids."""
    words = SYSTEM.split()
    systems = []
    for user in range(users):
        shift = user % len(words)  # each starts with another word: no block shared
        order = words[shift:] + words[:shift]
        systems.append(tokenizer.encode(" ".join(order)))
    questions = [tokenizer.encode(" " + q) for q in QUESTIONS]
    return systems, questions


def converse(
    cluster: Cluster,
    route,
    users: int = USERS,
    turns: int = TURNS,
    max_tokens: int = 4,
    directory=None,
    check=None,
) -> Served:
    """`turns` rounds: in each, every user's next turn (its conversation so far and a
    question) is sent where `route(user, token_ids, loads)` says, then the replicas run
    it to the end. `loads[r]` counts the requests sent to replica r and not finished
    (what a router knows). The replicas' events go into `directory` before every
    decision; `check(token_ids)` runs before each one too."""
    tokenizer = cluster.engines[0].tokenizer
    systems, questions = conversations(tokenizer, users)
    history = [list(s) for s in systems]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    served = Served()
    for turn in range(turns):
        loads = [0] * len(cluster.engines)
        asked = {}
        for user in range(users):
            token_ids = history[user] + questions[turn % len(questions)]
            if directory is not None:
                cluster.take_events(directory)
            if check is not None:
                check(token_ids)
            replica = route(user, list(token_ids), list(loads))
            cluster.engines[replica].add_request(
                f"t{turn}u{user}", {"prompt_token_ids": token_ids}, params
            )
            loads[replica] += 1
            served.sent[(turn, user)] = replica
            served.prompt_tokens += len(token_ids)
            asked[f"t{turn}u{user}"] = (user, token_ids)
        for engine in cluster.engines:
            for _ in range(MAX_STEPS):
                if not engine.has_unfinished_requests():
                    break
                report = engine.step()
                served.cached += report.cached_tokens
                for output in report.finished:
                    user, token_ids = asked[output.request_id]
                    answer = output.outputs[0]
                    history[user] = token_ids + list(answer.token_ids)
                    served.texts[(turn, user)] = answer.text
    if directory is not None:
        cluster.take_events(directory)
    served.history = dict(enumerate(history))
    return served


class DirectoryMap:
    """The directory, drawn: one row per conversation, one cell per full block of it in
    chain order, coloured by the replica that holds it (dark: several; blank: none).
    str() is the same as text: the replica's digit, '*' for several, '.' for none."""

    def __init__(self, directory, rows: dict[str, list[int]], title: str = ""):
        self.title = title or "the directory: which replica holds each block"
        self.rows = {}
        for label, token_ids in rows.items():
            self.rows[label] = holders_of(directory, token_ids)
        self.count = directory.num_replicas

    def __str__(self) -> str:
        pad = max(map(len, self.rows), default=0)
        lines = [self.title]
        for label, cells in self.rows.items():
            marks = []
            for replicas in cells:
                if not replicas:
                    marks.append(".")
                elif len(replicas) > 1:
                    marks.append("*")
                else:
                    marks.append(str(next(iter(replicas))))
            lines.append(f"{label:>{pad}}  {''.join(marks)}")
        return "\n".join(lines)

    def svg(self) -> str:
        pad = max(map(len, self.rows), default=0)
        left = CHAR_W * pad + 12
        size = CELL
        body = []
        for k, (label, cells) in enumerate(self.rows.items()):
            y = k * (size + 4)
            body.append(_svg_text(left - 8, y + size * 0.75, label, anchor="end"))
            for i, replicas in enumerate(cells):
                body.append(self._cell(left + i * (size + 2), y, size, replicas))
        # the legend: a cell of each colour, and what it means
        y = len(self.rows) * (size + 4) + 8
        x = 0
        keys = [({r}, f"replica {r}") for r in range(self.count)]
        keys += [(set(range(self.count)), "several"), (set(), "none")]
        for replicas, meaning in keys:
            body.append(self._cell(x, y, size, replicas))
            body.append(_svg_text(x + size + 6, y + size * 0.75, meaning))
            x += size + 18 + CHAR_W * len(meaning)
        longest = max((len(c) for c in self.rows.values()), default=0)
        width = max(left + longest * (size + 2) + 6, x)
        return _framed(self.title, width, y + size + 4, body)

    @staticmethod
    def _cell(x: float, y: float, size: int, replicas: set) -> str:
        """One block: the colour of the replica that holds it, dark for several,
        blank for none."""
        if not replicas:
            color = FREE
        elif len(replicas) > 1:
            color = SHARED
        else:
            color = PALETTE[next(iter(replicas)) % len(PALETTE)]
        return (
            f'<rect x="{x:.1f}" y="{y}" width="{size}" height="{size}" fill="{color}"'
            ' stroke="#999"/>'
        )

    def _repr_html_(self) -> str:
        return self.svg()

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))


def holders_of(directory, token_ids) -> list[set[int]]:
    """For each full block of `token_ids` the directory has a name for, in chain order,
    the replicas it says hold it."""
    cells, parent = [], None
    size = directory.block_size
    for start in range(0, len(token_ids) - size + 1, size):
        block = tuple(token_ids[start : start + size])
        block_hash = directory.name_of.get((parent, block))
        if block_hash is None:
            break
        cells.append(set(directory.holders.get(block_hash, ())))
        parent = block_hash
    return cells


def round_robin(count: int = REPLICAS):
    """The rule that knows nothing: request i goes to replica i mod count."""
    sent = []

    def route(user, token_ids, loads):
        sent.append(user)
        return (len(sent) - 1) % count

    return route


def lard(directory):
    """The rule that asks the directory: LARD's route (`Directory.route`)."""

    def route(user, token_ids, loads):
        return directory.route(token_ids, loads)

    return route


def directory_pictures(llm) -> dict:
    """The conversations routed round robin and by LARD on fresh replicas, each with a
    directory listening: rule -> (what it did, the directory drawn). The pictures of
    note 17 (scripts/make_figures.py)."""
    drawn = {}
    for name in ("round robin", "LARD"):
        cluster = Cluster(llm)
        directory = Directory(REPLICAS, cluster.block_size)
        if name == "LARD":
            route = lard(directory)
        else:
            route = round_robin()
        served = converse(cluster, route, directory=directory)
        rows = {f"user {u}": token_ids for u, token_ids in served.history.items()}
        title = (
            f"{name}: {served.computed:,} of {served.prompt_tokens:,} prompt tokens"
            " computed"
        )
        drawn[name] = (served, DirectoryMap(directory, rows, title))
    return drawn


def serve_lab13(pieces, llm, pictures: Path) -> list[str]:
    """Conversations on three replicas, routed by LARD on their Directory fed by the
    replicas' KV events: before each decision, their matches must be what each
    replica's prefix cache holds and their route the reference's; then the prompt
    tokens computed beside round robin's."""
    cluster = Cluster(llm)
    theirs = pieces.Directory(REPLICAS, cluster.block_size)
    ours = Directory(REPLICAS, cluster.block_size)
    asked = []

    def check(token_ids):
        cluster.take_events(ours)
        asked.append(token_ids)
        held = cluster.cached_blocks(token_ids)
        found = theirs.matches(list(token_ids))
        if found != held:
            raise RuntimeError(
                f"before request {len(asked)}, your directory's matches gave {found},"
                f" but the replicas' prefix caches hold {held} leading blocks of it"
            )

    def route(user, token_ids, loads):
        mine = theirs.route(list(token_ids), list(loads))
        want = ours.route(list(token_ids), list(loads))
        if mine != want:
            raise RuntimeError(
                f"request {len(asked)} (user {user}, loads {loads}): your route gave"
                f" {mine!r}, LARD on the same directory gives {want}"
            )
        return mine

    try:
        with time_limit(300):
            lard = converse(cluster, route, directory=theirs, check=check)
    except RuntimeError:
        raise
    except Exception as error:
        raise RuntimeError(
            f"routing with your Directory failed: {in_one_line(error)}"
        ) from None
    blind = converse(Cluster(llm), round_robin())
    rows = {f"user {user}": token_ids for user, token_ids in lard.history.items()}
    computed = {"round robin": blind.computed, "LARD, your directory": lard.computed}
    lines = [
        f"  {len(lard.sent)} turns of {USERS} conversations on {REPLICAS} replicas:"
        " your directory answered as each replica's prefix cache, and routed as LARD"
        " does",
        f"  prompt tokens computed: {blind.computed} with round robin (hit rate"
        f" {blind.hit_rate:.0%}), {lard.computed} with your directory (hit rate"
        f" {lard.hit_rate:.0%}), of {lard.prompt_tokens}",
        f"  users per replica: {lard.users_per_replica()}",
    ]
    chart = BarChart(
        f"prompt tokens computed, {len(lard.sent)} turns on {REPLICAS} replicas",
        list(computed),
        {"computed": list(computed.values())},
        unit=" tokens",
        digits=0,
    )
    drawn = DirectoryMap(theirs, rows, "your directory: which replica holds each block")
    pictures.mkdir(parents=True, exist_ok=True)
    chart_path = pictures / "lab13_computed.svg"
    chart_path.write_text(chart.svg())
    map_path = pictures / "lab13_directory.svg"
    map_path.write_text(drawn.svg())
    return lines + [
        "",
        str(chart),
        "",
        str(drawn),
        f"picture: {chart_path}",
        f"picture: {map_path}",
    ]


class Recorder:
    """A prefix-cache listener that keeps its replica's events in a list, in the order
    they happened, until the router takes them (the publisher of
    tools/serve/kv_events.py sends the same over ZMQ to a router in another process)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.raw: list[tuple] = []

    def stored(
        self, block: int, parent: int | None, token_ids, medium: str = POOL
    ) -> None:
        self.raw.append(("stored", block, parent, tuple(token_ids), medium))

    def removed(self, block: int, medium: str = POOL) -> None:
        self.raw.append(("removed", block, medium))

    def cleared(self) -> None:
        self.raw.append(("cleared",))

    def take(self) -> list[dict]:
        """The events since the last take, as vLLM's KV events (one BlockStored per run
        of a chain), and gone from here."""
        raw = self.raw
        self.raw = []
        return kv_events.batch_of(raw, self.block_size)
