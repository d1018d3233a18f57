"""Datasets: sources, downloads, the prepared on-disk store, and loaders."""
