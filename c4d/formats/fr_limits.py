"""What one Flight Recorder dump may cost before and while it is read: the untrusted-input
limits that the loader (fr_load: unpickling, the native reader) and the column maker
(fr_columns: the fields read from the entries) both check, and the one-line errors they raise.

A dump is a file c4d did not write: a pickle built to cost far more than it weighs (shared
lists referenced by every entry, opcodes that build a container a byte) is refused while it is
read, within what is left of ``--max-import-bytes`` (c4d/formats/budget.py)."""

from __future__ import annotations

import gc
from typing import Any

from c4d.formats.budget import Budget, HostileFile, human

# A dump's cost is counted as references: each reference to a shared object counts that object's
# whole structure again (what every reader that walks the entries pays); NODE_COST bytes each.
NODE_COST = 8
EXPAND_PER_BYTE = 64  # references per byte of pickle past which a dump is hostile (real ones: < 2)
BUILT_PER_BYTE = 64  # bytes of Python objects unpickling may build per byte (real dumps: < 16)
FREE = 64 << 20  # what any dump may expand to or build before those ratios count
ENTRY_COST = 512  # memory an entry (each reference in ``entries``) costs while its columns are made
COLUMN_COST = 128  # an entry's share of the columns kept per dump (13 numpy columns)
JSON_COST = 16  # json.load of a JSON dump: Python objects per byte of text, at worst
MAX_RANK = 1 << 17  # c4d.intake.validate's C4D_MAX_RANKS: a rank number or group past it is not a job's
CHECK_EVERY = 1 << 18  # bytes of pickle between two checks of the clock and the memory built
_EXPAND_STEP = 1 << 16  # references listed at once while counting


def expanded_size(root: Any, limit: int) -> int:
    """References in ``root``'s structure as if nothing in it were shared (a list two entries
    share counts twice), counted at C speed and stopping past ``limit``: the work any walk of
    the entries would do, known before one is done. Plain data only (what fr_load's unpickler
    builds)."""
    total = 1
    stack: list[list[Any]] = [[root]] if gc.is_tracked(root) else []
    while stack:
        chunk = stack.pop()
        try:
            least = sum(map(len, chunk))  # a lower bound of the chunk's references
        except TypeError:
            least = 0
        if total + least > limit:
            return total + least
        if least > _EXPAND_STEP and len(chunk) > 1:
            h = len(chunk) // 2
            stack.append(chunk[h:])
            stack.append(chunk[:h])
            continue
        refs = gc.get_referents(*chunk)
        total += len(refs)
        if total > limit:
            return total
        inner = list(filter(gc.is_tracked, refs))
        del refs
        for i in range(0, len(inner), 4096):
            stack.append(inner[i : i + 4096])
    return total


def walk_limit(size: int, budget: Budget) -> int:
    """References reading a dump of ``size`` bytes may walk (``expanded_size``'s limit)."""
    return min(budget.left() // NODE_COST, EXPAND_PER_BYTE * size + FREE // NODE_COST)


def check_walk(parts: list[Any], limit: int | None, name: str) -> None:
    """``HostileFile`` if reading ``parts`` (the values taken from the entries) would walk more than
    ``limit`` references: a value shared by many entries counts once per entry, as each read of it
    costs. Values c4d never reads (stack frames, pg_status) are never walked, so never counted."""
    if limit is None:
        return
    refs = expanded_size(parts, limit)
    if refs > limit:
        raise expands(name, limit)


def expands(name: str, limit: int) -> HostileFile:
    """The error for a dump whose structure walks past ``limit`` references."""
    return HostileFile(
        f"{name}: its structure expands to more than {limit:,} references (shared parts counted each "
        f"time they are used; {EXPAND_PER_BYTE} a byte of pickle allowed, within what is left of "
        "--max-import-bytes): not read"
    )


def built_too_much(name: str, grown: int, pos: int, limit: int) -> HostileFile:
    """The error for a pickle that built ``grown`` bytes from its first ``pos`` bytes, past ``limit``."""
    return HostileFile(
        f"{name}: unpickling it built {human(grown)} from {human(pos)} of pickle, over "
        f"the {human(limit)} allowed ({BUILT_PER_BYTE} bytes a byte, and within what is left "
        "of --max-import-bytes): not read"
    )
