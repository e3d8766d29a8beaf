"""Per file pass / fail / not applicable from results/<label>/*.xml (errors count as failures)."""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def tally(label):
    out = {}
    for xml in sorted(Path("results", label).glob("*.xml")):
        p = f = s = 0
        fails = []
        for case in ET.parse(xml).iter("testcase"):
            kids = {c.tag for c in case}
            name = case.get("name")
            if "skipped" in kids:
                s += 1
            elif kids & {"failure", "error"}:
                f += 1
                el = case.find("failure") if case.find("failure") is not None else case.find("error")
                msg = (el.get("message") or "").replace("\n", " ")[:220]
                fails.append(f"{name}: {msg}")
            else:
                p += 1
        out[xml.stem.replace("__", "/") + ".py"] = (p, f, s, fails)
    return out


if __name__ == "__main__":
    before, after, fixed = tally("before"), tally("after"), tally("fixed")
    for name in sorted(set(before) | set(after)):
        b = before.get(name, ("-", "-", "-", []))
        a = after.get(name, ("-", "-", "-", []))
        f = fixed.get(name, ("-", "-", "-", []))
        line = f"{name}: before {b[0]} pass / {b[1]} fail / {b[2]} not applicable; after {a[0]}/{a[1]}/{a[2]}"
        print(line + (f"; after+fixes {f[0]}/{f[1]}/{f[2]}" if fixed else ""))
    if "-v" in sys.argv:
        for label, res in (("AFTER+FIXES", fixed), ("AFTER", after), ("BEFORE", before)):
            print(f"\n## failing in {label}")
            for name, (_, _, _, fails) in sorted(res.items()):
                for line in fails:
                    print(f"- {name}::{line}")
