"""The HTML summary page of one run (``index.html``), linking its plots, history, results and
node logs."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any


def write_index(directory: Path, results: dict[str, Any]) -> Path:
    test = results.get("test", {})
    valid = results.get("valid")
    color = "#2a9d8f" if valid is True else "#e63946" if valid is False else "#e9c46a"
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(json.dumps(v))}</td></tr>"
        for k, v in test.items() if k not in ("notes",))
    counts = results.get("anomaly_counts", {})
    anomalies = "".join(
        f"<li><b>{html.escape(name)}</b>: {counts.get(name, len(ex))}"
        f"<pre>{html.escape(json.dumps(ex[:2], indent=1)[:4000])}</pre></li>"
        for name, ex in results.get("anomalies", {}).items()) or "<li>none</li>"
    plots = "".join(f'<p><img src="{html.escape(p)}" alt="{html.escape(p)}"></p>'
                    for p in results.get("plots", []))
    logs = "".join(f'<li><a href="{p.name}">{p.name}</a></li>'
                   for p in sorted(directory.glob("n*.log")))
    metrics = ('<li><a href="metrics.jsonl">metrics.jsonl</a> (the nodes\' metrics, scraped '
               'every second)</li>' if (directory / "metrics.jsonl").exists() else "")
    notes = "".join(f"<li>{html.escape(str(n))}</li>" for n in test.get("notes", []))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>jepsen {html.escape(directory.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td{{padding:2px 8px;border-bottom:1px solid #ddd}}
pre{{background:#f6f6f6;padding:6px;overflow:auto;max-height:20em}}</style></head><body>
<h1>{html.escape(directory.name)}</h1>
<p style="font-size:1.4em">valid: <b style="color:{color}">{html.escape(str(valid))}</b></p>
<h2>Anomalies</h2><ul>{anomalies}</ul>
<h2>Plots</h2>{plots or "<p>(no plots: matplotlib missing)</p>"}
<h2>Files</h2><ul><li><a href="history.jsonl">history.jsonl</a></li>{metrics}
<li><a href="results.json">results.json</a></li>{logs}</ul>
<h2>Test</h2><table>{rows}</table>
<h2>Notes</h2><ul>{notes or "<li>none</li>"}</ul>
<h2>Stats</h2><pre>{html.escape(json.dumps(results.get("stats", {}), indent=1)[:20000])}</pre>
</body></html>
"""
    path = directory / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
