"""Aggregation, statistics, LaTeX tables and figures of the finetuning and plasticity results.

Modules: :mod:`.aggregate` (runs table, selected LR), :mod:`.stats` (Wilcoxon, t-test),
:mod:`.tables` (booktabs LaTeX), :mod:`.figures` (seaborn), :mod:`.style` (colours, theme).
seaborn and matplotlib are imported only inside :mod:`.figures` and :mod:`.style` functions.
"""
