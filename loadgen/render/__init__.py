"""Render: terminal tables, plots, HTML/Markdown reports and the views of each command."""
