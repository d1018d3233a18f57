"""Plumbing every layer shares: atomic files and the one reader, progress, optional packages, local GPU slots."""
