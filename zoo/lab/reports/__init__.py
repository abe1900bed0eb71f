"""A sweep's report: the table (Markdown and CSV), its sections and its plots."""
