"""Example yt8m plugins: MLP and AttentionPooling (models), asymmetric_loss (a loss) and MicroF1 (a metric).

Nothing here imports yt8m: a model is a plain nn.Module, a loss a function, a metric a class with update, compute and
merge. yt8m finds them through the entry points in pyproject.toml, or by import path without installing
(`--model yt8m_example_plugins.models:MLP`).
"""
