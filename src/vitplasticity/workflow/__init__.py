"""What the Snakefile imports (no torch): config keys and cross-checks, the run grid, packs, runtime."""
