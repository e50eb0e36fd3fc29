"""The console's table headers wrap between words, never inside one (issue 28: `PARTITIO/N`),
while long ids in cells still break anywhere - in headless Chromium with the console's own CSS,
a table as wide as the pipelines page's in a narrow window."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HEADERS = ("worker", "topic", "partition", "committed", "high water", "lag", "state", "message id")
LONG_ID = "0190a6f0-3b1e-7c8e-9d2a-5f4e3c2b1a00-0190a6f0-3b1e-7c8e-9d2a-5f4e3c2b1a00"

#: For every word of every <th>: how many line boxes it spans (1: whole on one line).
SPANS = """
const out = [];
for (const th of document.querySelectorAll('th')) {
  const node = th.firstChild; const text = node.textContent; let at = 0;
  for (const word of text.split(' ')) {
    const r = document.createRange(); r.setStart(node, at); r.setEnd(node, at + word.length);
    const tops = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
    out.push([word, tops.size]); at += word.length + 1;
  }
}
const td = document.querySelector('td.id');
return [out, td.getBoundingClientRect().width <= window.innerWidth, document.body.scrollWidth <= window.innerWidth + 1];
"""


def test_headers_wrap_between_words_only(browser: Any, tmp_path: Path) -> None:
    css = (ROOT / "app/console/static/console.css").read_text()
    head = "".join(f"<th{' class=r' if h in ('partition', 'committed', 'lag') else ''}>{h}</th>" for h in HEADERS)
    row = "".join(f"<td class=id>{LONG_ID}</td>" if h == "message id" else f"<td>{h}-{LONG_ID[:12]}</td>"
                  for h in HEADERS)
    page = f"<!doctype html><html><head><style>{css}</style></head><body><main><table><tr>{head}</tr>" \
           f"<tr>{row}</tr></table></main></body></html>"
    browser.set_window_size(760, 800)
    browser.get("data:text/html;base64," + base64.b64encode(page.encode()).decode())
    spans, id_fits, no_overflow = browser.execute_script(SPANS)
    browser.save_screenshot(str(tmp_path / "narrow-table.png"))
    broken = [word for word, lines in spans if lines != 1]
    assert not broken, f"header words broken across lines: {broken}"
    assert sorted(w for w, _ in spans) == sorted(w for h in HEADERS for w in h.split())
    assert id_fits and no_overflow  # the long id still breaks inside its cell; the page does not scroll sideways
