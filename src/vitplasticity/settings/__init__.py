"""How a stage declares its settings once: fields, CLI flags, checks, rule params (each stage's own settings live beside the stage)."""
