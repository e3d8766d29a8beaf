"""The charts draw the numbers they are given: bar lengths and point positions in
proportion, one mark per value, and standalone SVG files that parse as XML."""

import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from minipaged.paging import BlockManager
from minipaged.tools.viz import BarChart, FrameMap, LineChart, PageTableView, Timeline
from minipaged.tools.viz.charts import BAR_W, PLOT_W, _ticks
from minipaged.tools.viz.svg import FONT

SVG = "{http://www.w3.org/2000/svg}"


def breakdown() -> BarChart:
    return BarChart(
        "where the memory goes",
        ["static", "paged"],
        {"tokens": [20.0, 98.0], "waste": [0.0, 2.0], "reserved": [80.0, 0.0]},
        unit="%",
        width=50,
    )


def test_bar_text_bars_are_proportional_and_stack_one_character_per_segment():
    title, static, paged, legend = str(breakdown()).splitlines()
    assert title == "where the memory goes"
    assert static.split()[1] == "█" * 10 + "▒" * 40  # 20% and 80% of 50 characters
    assert paged.split()[1] == "█" * 49 + "▓"  # 98% and 2%
    assert static.endswith("tokens 20.0%, waste 0.0%, reserved 80.0%")
    assert legend == "█ tokens  ▓ waste  ▒ reserved"


def test_bar_text_of_one_segment_scales_to_the_longest_bar():
    chart = BarChart(
        "requests by length",
        ["short", "long"],
        {"requests": [300, 75]},
        digits=0,
        width=20,
    )
    _, short, long = str(chart).splitlines()
    assert short.split() == ["short", "█" * 20, "300"]
    assert long.split() == ["long", "█" * 5, "75"]


def test_bar_svg_has_a_rect_per_value_with_widths_in_proportion():
    root = ET.fromstring(breakdown().svg())
    rects = root.findall(f"{SVG}g/{SVG}rect")
    tooltips = [g.find(f"{SVG}title").text for g in root.findall(f"{SVG}g")]
    assert tooltips == [
        "static: tokens 20.0%",
        "static: waste 0.0%",
        "static: reserved 80.0%",
        "paged: tokens 98.0%",
        "paged: waste 2.0%",
        "paged: reserved 0.0%",
    ]
    widths = [float(r.get("width")) for r in rects]
    percent = [20, 0, 80, 98, 2, 0]  # the longest bar, 100%, is BAR_W px
    assert widths == pytest.approx([BAR_W * p / 100 for p in percent], abs=0.05)
    x = [float(r.get("x")) for r in rects]
    # segments stack left to right
    assert x[1] == x[0] + widths[0] and x[2] == x[0] + widths[0]


def test_bar_chart_refuses_values_it_cannot_draw():
    with pytest.raises(ValueError, match="'a' has 1 values for 2 labels"):
        BarChart("t", ["x", "y"], {"a": [1]})
    with pytest.raises(ValueError, match="negative"):
        BarChart("t", ["x"], {"a": [-1]})


def test_ticks_are_round_steps_covering_the_range():
    assert _ticks(0, 98.3) == [0, 20, 40, 60, 80, 100]
    assert _ticks(0, 512) == [0, 200, 400, 600]
    assert _ticks(41, 70) == [40, 50, 60, 70]
    assert _ticks(0, 0.9) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def block_sizes() -> LineChart:
    return LineChart(
        "waste by block size",
        [1, 2, 4, 8, 16],
        {
            "waste": [0.0, 0.1, 0.4, 0.8, 1.7],
            "table": [400.0, 200.0, 100.0, 50.0, 25.0],
        },
        x_label="block size",
        y_label="various",
        log_x=True,
    )


def test_line_text_is_a_table_of_every_point():
    lines = str(block_sizes()).splitlines()
    assert lines[0] == "waste by block size (various)"
    assert lines[1].split() == ["block", "size", "waste", "table"]
    assert [line.split() for line in lines[2:]] == [
        ["1", "0.0", "400.0"],
        ["2", "0.1", "200.0"],
        ["4", "0.4", "100.0"],
        ["8", "0.8", "50.0"],
        ["16", "1.7", "25.0"],
    ]


def test_line_text_thins_long_series_keeping_the_ends():
    chart = LineChart(
        "growth",
        list(range(100)),
        {"tokens": [float(x) for x in range(100)]},
        max_rows=5,
    )
    lines = str(chart).splitlines()
    assert [line.split()[0] for line in lines[2:-1]] == ["0", "25", "50", "74", "99"]
    assert lines[-1] == "(5 of 100 points shown)"


def test_line_svg_places_points_by_value_with_log_x_evenly_spaced():
    root = ET.fromstring(block_sizes().svg())
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2 and len(root.findall(f"{SVG}g/{SVG}circle")) == 10
    points = [tuple(map(float, p.split(","))) for p in lines[1].get("points").split()]
    xs, ys = zip(*points)
    # powers of two, evenly
    assert [round(b - a, 6) for a, b in zip(xs, xs[1:])] == [PLOT_W / 4] * 4
    grid = sorted(
        float(line.get("y1"))
        for line in root.findall(f"{SVG}line")
        if line.get("stroke") == "#ddd"
    )
    assert len(grid) == 5  # y ticks 0, 100, ..., 400
    top, bottom = grid[0], grid[-1]
    assert ys[0] == top and ys[4] == pytest.approx(bottom - (bottom - top) * 25 / 400)


def test_line_chart_refuses_values_it_cannot_draw():
    with pytest.raises(ValueError, match="2 values for 3 x values"):
        LineChart("t", [1, 2, 3], {"y": [1, 2]})
    with pytest.raises(ValueError, match="log_x"):
        LineChart("t", [0, 1], {"y": [1, 2]}, log_x=True)
    with pytest.raises(ValueError, match="negative"):
        LineChart("t", [0, 1], {"y": [1, -2]})


def two_sequences() -> BlockManager:
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate("a", range(4))  # frame 0
    manager.allocate("b", range(10, 13))  # frame 1
    manager.append_slot("a", 4)  # frame 2: a's block 1
    return manager


def test_the_svg_of_a_frame_map_has_its_title_picture_and_legend():
    picture = FrameMap(two_sequences())
    root = ET.fromstring(picture.svg())
    texts = [t.text for t in root.findall(f"{SVG}text")]
    assert texts[0] == picture.title()
    legend = str(picture).splitlines()[-2:]
    entries = [entry for line in texts[1:] for entry in line.split("  ")]
    # the legend, no entry cut
    assert entries == [entry for line in legend for entry in line.split("  ")]
    # wrapped to fit
    assert all(len(line) <= 60 for line in texts[1:]) and len(texts[1:]) > len(legend)
    inner = root.find(f"{SVG}svg")
    assert len(inner.findall(f"{SVG}g/{SVG}rect")) == 8  # the frame map itself
    assert float(root.get("width")) >= float(inner.get("width"))


def test_the_svg_of_a_page_table_view_has_its_caption_and_arrows():
    document = PageTableView(two_sequences(), ["a", "b"]).svg()
    root = ET.fromstring(document)
    assert root.find(f"{SVG}text").text.startswith("page tables (A = 'a', B = 'b')")
    assert len(root.findall(f"{SVG}svg/{SVG}line")) == 3  # a: 2 blocks, b: 1
    assert "&#x27;a&#x27; block 1 -&gt; frame 2" in document


def test_a_notebook_shows_each_picture_as_its_svg():
    pictures = [
        breakdown(),
        block_sizes(),
        FrameMap(two_sequences()),
        PageTableView(two_sequences(), ["a"]),
    ]
    assert all(picture._repr_html_() == picture.svg() for picture in pictures)


def test_ipython_shows_the_text_chart_where_it_cannot_show_html():
    from IPython.lib.pretty import pretty

    assert pretty(breakdown()) == str(breakdown())
    assert pretty(block_sizes()) == str(block_sizes())


def font_sizes(document: str) -> list[float]:
    return [
        float(t.get("font-size")) for t in ET.fromstring(document).iter(f"{SVG}text")
    ]


def test_every_picture_is_drawn_for_a_projector():
    """Text of at least 14 px (the labels FONT px), and drawn wide enough to be shown
    large; it
    shrinks to fit a narrower page (viewBox and max-width), so nothing is cut off."""
    # what Timeline reads
    report = SimpleNamespace(ran=[("r0", 0, "prefill", 5)], padded=[], preempted=[])
    pictures = [
        breakdown(),
        block_sizes(),
        FrameMap(two_sequences()),
        PageTableView(two_sequences(), ["a", "b"]),
        Timeline([report] * 3),
    ]
    for picture in pictures:
        document = picture.svg()
        root = ET.fromstring(document)
        assert min(font_sizes(document)) >= 14 and FONT in font_sizes(document), type(
            picture
        ).__name__
        assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"
        assert "max-width: 100%" in root.get("style")
    assert float(ET.fromstring(block_sizes().svg()).get("width")) >= PLOT_W
