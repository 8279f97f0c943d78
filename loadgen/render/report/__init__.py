"""The run report: one run re-audited from its folder, rendered as HTML and Markdown.

Last stage of the pipeline, one step per module: `model.build_run_report` re-audits the run
from `run.json` and the records (never the stored summary), with its time windows,
per-class details and `figures` (PNG bytes); `document.document` lays it out as plain-text
`blocks`, one `class_section` per class; `html.render_html` and `markdown.render_markdown`
render the blocks, escaping every string from the records or the workload;
`folder.report_files` returns report.html (one self-contained file: inline CSS, PNGs as
data URIs, no network loads), report.md and its PNGs, which the command writes with
summary.json (`results.write.write_report`).
Everything a report shows is recomputable from the records.
"""
