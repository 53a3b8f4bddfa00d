"""Hyperparameter search over `yt8m train` configs with Optuna (`yt8m tune`, `yt8m tune-report`): the search space
and its file (space.py), the study (study.py), one trial (objective.py), running a study (runner.py), the report."""
