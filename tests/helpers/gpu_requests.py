"""The GPU request forms the shipped workflow profile offers, and the one edit that switches it.

workflow/profiles/default/profile.yaml writes its GPU request once, on the finetune entry, as the
YAML anchor ``&gpu_request {...}`` that every GPU rule merges in; its header comment lists the
forms a user may put there instead (``#   {gres: "gpu:1", cpus_per_task: 8}  sbatch ...``).
"""

from __future__ import annotations

import re

import yaml

ANCHOR = re.compile(r"(<<: &gpu_request )(\{[^}\n]*\})")
FORM_LINE = re.compile(r"^#\s+(\{[^}\n]*\})\s", re.M)


def gpu_request_forms(profile_text: str) -> list[dict]:
    """The forms listed in the profile's comment, parsed, in order (the shipped one first)."""
    return [yaml.safe_load(form) for form in FORM_LINE.findall(profile_text)]


def shipped_gpu_request(profile_text: str) -> dict:
    """The form the profile's anchor holds."""
    (match,) = ANCHOR.findall(profile_text)
    return yaml.safe_load(match[1])


def with_gpu_request(profile_text: str, form: dict) -> str:
    """The profile with its one GPU request replaced by ``form``: the user's one edit."""
    flow = yaml.safe_dump(form, default_flow_style=True, sort_keys=False).strip()
    edited, count = ANCHOR.subn(lambda m: m[1] + flow, profile_text)
    assert count == 1, "the workflow profile holds no single &gpu_request anchor"
    return edited
