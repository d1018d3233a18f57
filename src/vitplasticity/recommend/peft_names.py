"""How peft selects modules and parameters by name, written out so that the export
(:mod:`.export`) checks each name it writes against the model's own before peft reads it.

A ``target_modules`` (or ``target_parameters``) entry selects a name equal to it or ending in
``.`` + it. A ``modules_to_save`` entry is a plain suffix before peft 0.22 (``norm`` also
selects ``blocks.0.attn.q_norm``) and a dotted one from 0.22 on; the export's file is read by
whichever peft the user has, so its entries are checked under the plain rule, which selects
everything the dotted one does. peft leaves a target without an adapter when a
``modules_to_save`` entry covers it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def target_matches(module_names: Iterable[str], targets: Iterable[str]) -> list[str]:
    """The modules a ``target_modules`` list selects: a name equal to an entry or ending in
    ``.`` + an entry (peft's ``check_target_module_exists``)."""
    wanted = set(targets)
    found = []
    for name in module_names:
        parts = name.split(".")
        if any(".".join(parts[i:]) in wanted for i in range(len(parts))):
            found.append(name)
    return found


def modules_to_save_matches(module_names: Iterable[str], entries: Iterable[str]) -> list[str]:
    """The modules a ``modules_to_save`` list may select: a name ending in an entry, dot or not.

    That is peft's ``_set_trainable`` before 0.22; from 0.22 on it selects the dotted-suffix
    subset of these (:func:`target_matches`), so entries whose matches here are exactly the
    intended modules select exactly those under either version."""
    entries = tuple(entries)
    return [name for name in module_names if name.endswith(entries)]


def excluded_by_modules_to_save(target: str, entries: Iterable[str]) -> bool:
    """Whether peft leaves ``target`` without an adapter because a ``modules_to_save`` entry
    covers it (peft's pattern, entries unescaped as peft has them)."""
    return any(re.match(rf"(^|.*\.){entry}($|\..*)", target) for entry in entries)
