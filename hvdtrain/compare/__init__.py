"""``hvdtrain compare``: sync against async and SSP on the same workers, model, data and budget.

plan.py lists the runs, runner.py launches them (skipping finished ones, recording failures),
results.py reads their logs into one row each, report.py writes the CSV and the Markdown report,
plots.py the figures.
"""
