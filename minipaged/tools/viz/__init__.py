"""Pictures of minipaged's state, for people who would rather look than read: paged
memory (pages.py), charts of numbers (charts.py), the batch timeline (timeline.py). Each
picture is a small object: str() gives terminal text, svg() a standalone SVG (shown
inline in notebooks).
"""

from minipaged.tools.viz.charts import BarChart, LineChart
from minipaged.tools.viz.pages import FrameMap, PageTableView
from minipaged.tools.viz.svg import PALETTE
from minipaged.tools.viz.timeline import Timeline

__all__ = ["BarChart", "FrameMap", "LineChart", "PALETTE", "PageTableView", "Timeline"]
