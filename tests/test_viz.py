"""The pictures show the state they claim to: one cell per frame, the right owner and
ref count, one arrow per logical block to its frame."""

import re

from minipaged.paging import BlockManager, ContiguousBlockManager
from minipaged.tools.viz import FrameMap, PageTableView


def forked_manager(num_blocks: int = 12) -> BlockManager:
    """a and b share two full blocks and have private last blocks; c shares a's first
    block; d was freed, leaving one cached block."""
    manager = BlockManager(num_blocks=num_blocks, block_size=4)
    manager.allocate("a", range(10))  # frames 0, 1, 2
    manager.fork("a", "b")
    manager.append_slot("a", 10)  # copy-on-write: a's block 2 -> frame 3
    manager.allocate("c", [0, 1, 2, 3, 9, 9])  # hits frame 0; frame 4
    manager.allocate("d", [7] * 5)  # frames 5, 6
    manager.free("d")  # frame 5 stays cached, 6 is free
    return manager


def test_frame_map_text_has_one_cell_per_frame_by_owner():
    text = str(FrameMap(forked_manager()))
    title, row, *legend = text.splitlines()
    assert (
        title == "frame map: 12 frames × 4 slots; 5 used (2 shared), 1 cached, 6 free"
    )
    assert row.split() == [
        "0",
        "3",
        "2",
        "B",
        "A",
        "C",
        "c",
        ".",
        ".",
        ".",
        ".",
        ".",
        ".",
    ]
    assert "A = 'a' (3 frames)  B = 'b' (3 frames)  C = 'c' (2 frames)" in legend[0]


def test_frame_map_wraps_rows_at_per_row():
    rows = str(FrameMap(forked_manager(num_blocks=10), per_row=4)).splitlines()[1:4]
    assert [r.split()[0] for r in rows] == ["0", "4", "8"]
    assert [len(r.split()) - 1 for r in rows] == [4, 4, 2]


def test_frame_map_html_is_an_svg_with_a_rect_and_a_tooltip_per_frame():
    html = FrameMap(forked_manager())._repr_html_()
    # the figure, the cells drawn in it
    assert html.count("<svg") == 2 and html.count("<rect") == 12
    tooltips = re.findall(r"<title>(.*?)</title>", html)
    assert (
        tooltips[0]
        == "frame 0: shared by 3: &#x27;a&#x27;, &#x27;b&#x27;, &#x27;c&#x27;"
    )
    assert tooltips[5].startswith("frame 5: cached") and tooltips[6] == "frame 6: free"


def test_a_contiguous_chunk_shows_its_reserved_frames():
    manager = ContiguousBlockManager(num_blocks=8, block_size=2)
    manager.allocate("a", range(3), final_len=8)  # a chunk of 4 frames, 2 written
    title, row, *legend = str(FrameMap(manager)).splitlines()
    assert title == "frame map: 8 frames × 2 slots; 4 used (0 shared), 0 cached, 4 free"
    assert row.split()[1:] == ["A", "A", "r", "r", ".", ".", ".", "."]
    assert "r = reserved, not written yet" in legend[-1]


def test_page_table_text_lists_each_block_its_frame_fill_and_sharing():
    lines = str(PageTableView(forked_manager(), ["a"])).splitlines()
    assert lines[0] == "page table of 'a': 11 tokens in 3 blocks"
    assert [line.split() for line in lines[1:]] == [
        ["block", "0", "->", "frame", "0", "4/4", "shared", "×3"],
        ["block", "1", "->", "frame", "1", "4/4", "shared", "×2"],
        ["block", "2", "->", "frame", "3", "3/4"],
    ]


def test_page_table_html_draws_one_arrow_per_block_to_its_frame():
    manager = forked_manager()
    html = PageTableView(manager, ["a", "b"])._repr_html_()
    assert html.count("<line") == 6
    arrows = re.findall(r"&#x27;(\w)&#x27; block (\d) -&gt; frame (\d+)", html)
    assert [(s, int(b), int(f)) for s, b, f in arrows] == [
        ("a", 0, 0),
        ("a", 1, 1),
        ("a", 2, 3),
        ("b", 0, 0),
        ("b", 1, 1),
        ("b", 2, 2),
    ]
    assert html.count("<rect") == 6 + 12  # the blocks, and every frame of a small pool


def test_page_table_html_of_a_large_pool_draws_only_the_mapped_frames():
    manager = BlockManager(num_blocks=1000, block_size=16)
    manager.allocate("long", range(100))  # 7 frames
    html = PageTableView(manager, ["long"])._repr_html_()
    assert html.count("<rect") == 7 + 7


def test_a_swapped_out_page_table_lists_its_host_frames():
    manager = BlockManager(num_blocks=4, block_size=4, num_host_blocks=4)
    manager.allocate("a", range(6))
    manager.fork("a", "b")
    manager.swap_out("a", "b")
    lines = str(PageTableView(manager, ["a"])).splitlines()
    assert (
        lines[0] == "page table of 'a': 6 tokens in 2 blocks (swapped out: host frames)"
    )
    assert lines[1].split()[-2:] == ["shared", "×2"]  # b maps the same host frames
    # no device frame is theirs now;
    title, row, legend = str(FrameMap(manager)).splitlines()
    # the full one is cached
    assert row.split()[1:] == ["c", ".", ".", "."] and legend.startswith("2-9 = shared")
