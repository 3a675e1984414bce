"""Every rendering of lto's data for people, in one place.

* `markdown`: Markdown for every report kind (`lto report`, an artifact's report.md, the gate's
  CI summary), one section renderer per kind in `SECTION_RENDERERS`.
* `terminal`: rich tables and lines for terminals (measurements, gate, load, inspect).
* `common`: plain-text cells both share.
* `optimize_section`: the optimize report's section: its Summary, stage table and evidence.
* `plots`: matplotlib figures of a report (PNG), each captioned with the figures it draws.
* `html_page`: a self-contained page (the Markdown, rendered, with the plots embedded).

Library modules (report, gate, serve, inspection, bench) return data and never import rich.
"""
