"""`yt8m tune` and `yt8m tune-report`: hyperparameter search over `yt8m train` configs with Optuna,
resumable, pruned, parallel in processes or across machines sharing a database, with a report.
"""

from yt8m.tune.command import main
from yt8m.tune.report import report_main

__all__ = ["main", "report_main"]
