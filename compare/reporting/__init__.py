"""Building report.json from the runs and records, rendering report.md and the terminal tables, the
plots, and writing them."""
